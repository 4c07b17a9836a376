package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/socket"
)

// The shim cases run the daemon in this process (its rings in namespace A)
// and the application on package socket, so datagrams take the full client
// path: Unix-socket control, memfd queues, eventfd wake-ups.

type shimLab struct {
	d      *daemon.Daemon
	c      *socket.Client
	dir    string
	cancel context.CancelFunc
	served chan error
}

func (b *bench) openShim(cpu int) (*shimLab, error) {
	dir, err := os.MkdirTemp("", "udpbench-")
	if err != nil {
		return nil, err
	}
	s := &shimLab{dir: dir, served: make(chan error, 1)}
	cfg := config.Config{
		Interfaces: []config.Interface{{Name: b.p.A.Name}},
		SocketPath: filepath.Join(dir, "bypassd.sock"),
		RunDir:     dir,
		StatsDir:   filepath.Join(dir, "stats"),
		RXPoll:     b.o.poll,
		EnginePoll: b.o.poll,
		CPUs:       b.engineCPUs(cpu),
	}
	if b.statsOff {
		cfg.StatsInterval = -1
	}
	if err := b.p.A.NS.Do(func() error {
		var err error
		s.d, err = daemon.New(cfg, zap.NewNop())
		return err
	}); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	go func() { s.served <- s.d.Serve(ctx) }()
	if s.c, err = socket.Dial(cfg.SocketPath); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *shimLab) txPackets() uint64 { return s.d.Rings()[0].Stats().TXPackets.Load() }

func (s *shimLab) close() {
	if s.c != nil {
		s.c.Close()
	}
	s.cancel()
	s.d.Close()
	<-s.served
	os.RemoveAll(s.dir)
}

func (b *bench) txShim() (sample, error) {
	sink, dst, err := b.sink()
	if err != nil {
		return sample{}, err
	}
	defer sink.close()
	s, err := b.openShim(b.sendCPU)
	if err != nil {
		return sample{}, err
	}
	defer s.close()
	conn, err := s.c.ListenUDP("udp4", netip.AddrPortFrom(b.addrA(), 0))
	if err != nil {
		return sample{}, err
	}
	defer conn.Close()
	// Let the engine set up the destination before measuring.
	if _, err := conn.WriteToUDPAddrPort(make([]byte, b.o.size), dst); err != nil {
		return sample{}, err
	}
	time.Sleep(100 * time.Millisecond)
	msgs := b.batch()
	return b.measureTX(sink, b.recvCPU, func() (int, error) {
		return conn.WriteBatch(msgs, dst)
	}, s.txPackets)
}

func (b *bench) rxShim() (sample, error) {
	s, err := b.openShim(b.recvCPU)
	if err != nil {
		return sample{}, err
	}
	defer s.close()
	conn, err := s.c.ListenUDP("udp4", netip.AddrPortFrom(b.addrA(), 0))
	if err != nil {
		return sample{}, err
	}
	defer conn.Close()
	if b.shimTS {
		if err := conn.SetTimestamping(socket.TimestampAll); err != nil {
			return sample{}, err
		}
	}
	msgs := make([]socket.Message, b.o.batch)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 2048)
	}
	local, ok := conn.LocalAddr().(interface{ AddrPort() netip.AddrPort })
	if !ok {
		return sample{}, fmt.Errorf("local address %v", conn.LocalAddr())
	}
	return b.receive(local.AddrPort(), func() (int, error) {
		_ = conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		n, err := conn.ReadBatch(msgs)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, nil
		}
		return n, err
	})
}
