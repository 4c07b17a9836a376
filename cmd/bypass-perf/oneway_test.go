package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestOneWayOptions(t *testing.T) {
	t.Parallel()
	o, err := parseArgs([]string{"sr", "--one-way"}, new(bytes.Buffer))
	if err != nil || !o.OneWay {
		t.Fatalf("server --one-way: %+v %v", o, err)
	}
	o, err = parseArgs([]string{"pp", "-i", "10.0.0.2", "-m", "64", "--send-time"}, new(bytes.Buffer))
	if err != nil || !o.Client.SendTime {
		t.Fatalf("ping-pong --send-time: %+v %v", o, err)
	}
	if _, err := parseArgs([]string{"pp", "-i", "10.0.0.2", "--send-time"}, new(bytes.Buffer)); !errors.Is(err, errUsage) {
		t.Fatalf("--send-time with 14-byte messages: %v", err)
	}
	// Kernel sockets report no receive timestamps here: said plainly.
	c, err := kernelTransport{}.ListenUDP("udp4", netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := enableRXTimestamps(c); err == nil || !strings.Contains(err.Error(), "--kernel") {
		t.Fatalf("--one-way on a kernel socket: %v", err)
	}
}

func TestOneWaySummary(t *testing.T) {
	t.Parallel()
	var s oneWayStats
	sent := time.Unix(0, 1_700_000_000_000_000_000)
	for i := range 100 {
		b := newMessage(64, flagClient)
		putSendTimeAt(b, sent)
		s.add(b, sent.Add(time.Duration(i+1)*time.Microsecond), false)
	}
	s.add(newMessage(headerSize, flagClient), time.Now(), false) // no send time
	var out bytes.Buffer
	s.write(&printer{w: &out})
	for _, want := range []string{"software receive stamp): 100 samples, avg 50.500 usec", "<MAX> observation =  100.000",
		"percentile 50.000 =   50.000", "<MIN> observation =    1.000", "1 requests without a send time"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// putSendTimeAt writes a given send time, as putSendTime writes now.
func putSendTimeAt(msg []byte, t time.Time) {
	binary.BigEndian.PutUint64(msg[sendTimeOffset:], uint64(t.UnixNano()))
}

// A --send-time client in namespace B (kernel sockets) against a --one-way
// server on the shim in A: every request yields a one-way latency from the
// software receive stamp (veth has no hardware ones), and it is positive:
// the stamp is taken after the send on the same clock.
func TestShimOneWay(t *testing.T) {
	t.Parallel()
	l := newShimLab(t)
	tr := l.shim(t)
	conn, err := tr.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	if err := enableRXTimestamps(conn); err != nil {
		t.Fatal(err)
	}
	srv := conn.(*shimConn).LocalAddr().(*net.UDPAddr).AddrPort()
	st, ow := new(serverStats), new(oneWayStats)
	done := make(chan error, 1)
	go func() { done <- serve(conn, st, ow) }()

	var out bytes.Buffer
	var stop atomic.Bool
	err = l.p.B.NS.Do(func() error {
		c, err := kernelTransport{}.ListenUDP("udp4", netip.AddrPortFrom(l.p.B.Addr4(), 0))
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = pingPong(clientConfig{Mode: modePingPong, Server: srv, MsgSize: 64, Duration: 300 * time.Millisecond,
			ReplyTimeout: 100 * time.Millisecond, SendTime: true}, c, newClock(), &stop)
		return err
	})
	conn.Close()
	if serr := <-done; !errors.Is(serr, net.ErrClosed) {
		t.Errorf("serve: %v", serr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if len(ow.samples) == 0 || uint64(len(ow.samples)) != st.Received.Load() || ow.hardware != 0 || ow.missing != 0 {
		t.Fatalf("%d samples (%d hardware, %d missing) for %d requests", len(ow.samples), ow.hardware, ow.missing, st.Received.Load())
	}
	for i, d := range ow.samples {
		if d <= 0 {
			t.Fatalf("sample %d: one-way latency %v, not after the send", i, d)
		}
	}
	ow.write(&printer{w: &out})
	t.Logf("%s", out.String())
}
