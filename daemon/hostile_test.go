package daemon

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/sockq"
)

// TestHostileClientMemory: a client that tries to shrink or grow its memfd
// is refused by the seals; one that scribbles over its queues, unmaps them
// and drops its descriptors hurts only its own socket. The daemon and its
// ring keep serving everyone else.
func TestHostileClientMemory(t *testing.T) {
	t.Parallel()
	// A small session memory, so the test can scribble over all of it.
	l := newLab(t, config.Config{QueueBytes: 1 << 16, MaxSockets: 64, MaxQueueMemory: 1 << 20})
	bad := newClient(t, l.cfg.SocketPath)
	hr, err := bad.ok(ctlproto.CodeHello, 0, ctlproto.NewHello("hostile"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { closeAll(hr.fds) }() // hr.fds is emptied once closed below: no double close
	size := int(hr.m.(*ctlproto.HelloReply).SessionSize)
	r, err := bad.ok(ctlproto.CodeOpen, 0, ctlproto.Open{Family: unix.AF_INET, Type: unix.SOCK_DGRAM})
	if err != nil {
		t.Fatal(err)
	}
	id := r.h.Socket
	if _, err := bad.ok(ctlproto.CodeBind, id, ctlproto.Bind{Addr: netip.AddrPortFrom(l.p.A.Addr4(), 0)}); err != nil {
		t.Fatal(err)
	}
	memfd := hr.fds[ctlproto.FDSession]
	for _, sz := range []int64{0, int64(size) / 2, 2 * int64(size)} {
		if err := unix.Ftruncate(memfd, sz); !errors.Is(err, unix.EPERM) {
			t.Fatalf("ftruncate(memfd, %d): %v, want EPERM (sealed)", sz, err)
		}
	}
	mem, err := unix.Mmap(memfd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 50; round++ {
		// Garbage everywhere: header, bitmaps (announcing slots that are
		// no sockets), sleep flags, queues.
		for i := range mem {
			mem[i] = byte(rng.Uint32())
		}
		// Ring the engine's doorbell so it looks at the garbage.
		var one [8]byte
		one[0] = 1
		_, _ = unix.Write(hr.fds[ctlproto.FDDoorbell], one[:])
		time.Sleep(time.Millisecond)
	}
	if err := unix.Munmap(mem); err != nil {
		t.Fatal(err)
	}
	closeAll(hr.fds)
	hr.fds = nil

	// Another client is served as before.
	good := helloClient(t, l)
	s := openSocket(t, good, unix.AF_INET)
	local, err := good.bind(s, netip.AddrPortFrom(l.p.A.Addr4(), 0), false)
	if err != nil {
		t.Fatal(err)
	}
	peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	deadline := time.Now().Add(10 * time.Second)
	out := []byte("still served")
	if n, err := s.conn.SendBatch([][]byte{out}, peer.LocalAddr().(*net.UDPAddr).AddrPort(), deadline); n != 1 || err != nil {
		t.Fatalf("send: %d %v", n, err)
	}
	_ = peer.SetReadDeadline(deadline)
	buf := make([]byte, 64)
	n, _, err := peer.ReadFromUDPAddrPort(buf)
	if err != nil || !bytes.Equal(buf[:n], out) {
		t.Fatalf("kernel receive: %q %v", buf[:n], err)
	}
	if _, err := peer.WriteToUDPAddrPort([]byte("back"), local); err != nil {
		t.Fatal(err)
	}
	msgs := []sockq.Message{{Buf: make([]byte, 64)}}
	if n, err := s.conn.RecvBatch(msgs, deadline); n != 1 || err != nil || string(msgs[0].Buf[:msgs[0].N]) != "back" {
		t.Fatalf("receive: %d %v", n, err)
	}

	// The hostile client's session still answers, and CLOSE releases its
	// socket (the daemon's own mapping was never at risk).
	if _, err := bad.ok(ctlproto.CodeClose, id, ctlproto.Empty{}); err != nil {
		t.Fatalf("close the scribbled socket: %v", err)
	}
	if l.d.Rings()[0].Err() != nil {
		t.Fatalf("ring engine stopped: %v", l.d.Rings()[0].Err())
	}
}
