package bpf

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// TestOtherQueue: a flow homed at slot 1 whose frames arrive on queue 0
// goes to queue 0's socket, tagged with home 1 (the receiving ring hands it
// on); without a socket on queue 0 it goes to the kernel, counted as
// NoQueueSocket, instead of being lost at slot 1's socket of another queue.
func TestOtherQueue(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{})
	if p.Slots() != MaxSockets {
		t.Fatalf("Slots() = %d on a 1-queue veth, want the default %d", p.Slots(), MaxSockets)
	}
	x := newTestXSK(t, lab.A.NS, lab.A.Index) // bound to queue 0
	// Slot 1 stands for the home ring's socket: any socket marks the slot
	// as served.
	for _, slot := range []uint32{0, 1} {
		if err := p.SetSocket(slot, x.fd); err != nil {
			t.Fatal(err)
		}
	}
	kernel := lab.A.NS.ListenUDP(t, netip.AddrPortFrom(lab.A.Addr4(), 0))
	dst := netip.AddrPortFrom(lab.A.Addr4(), localPort(kernel))
	if err := p.AddFlow(Flow{Proto: unix.IPPROTO_UDP, Dst: dst}, 1); err != nil {
		t.Fatal(err)
	}
	sender := lab.B.NS.ListenUDP(t, netip.AddrPortFrom(lab.B.Addr4(), 0))

	before := counters(t, p)
	send(t, sender, dst, []byte("homed-elsewhere"))
	var frames, metas [][]byte
	deadline := time.Now().Add(ioTimeout)
	for len(frames) < 1 && time.Now().Before(deadline) {
		f, m := x.metaFrames()
		frames, metas = append(frames, f...), append(metas, m...)
		_, _ = unix.Poll([]unix.PollFd{{Fd: int32(x.fd), Events: unix.POLLIN}}, 50)
	}
	if len(frames) != 1 || !bytes.HasSuffix(frames[0], []byte("homed-elsewhere")) {
		t.Fatalf("queue 0's socket received %d frames, want the datagram", len(frames))
	}
	if home, ok := ParseFlowMeta(metas[0][RXMetaSize:]); !ok || home != 1 {
		t.Fatalf("flow tag % x: present %v home %d, want home 1", metas[0], ok, home)
	}
	if d := counters(t, p).sub(before); d.Redirected != 1 || d.OtherQueue != 1 || d.NoSocket != 0 {
		t.Fatalf("counter delta %+v, want Redirected 1, OtherQueue 1", d)
	}

	// No ring on the receiving queue: the kernel gets it, counted.
	if err := p.ClearSocket(0); err != nil {
		t.Fatal(err)
	}
	before = counters(t, p)
	send(t, sender, dst, []byte("no-ring-here"))
	if got := recvUDP(t, kernel, 1)[0]; string(got) != "no-ring-here" {
		t.Fatalf("kernel got %q", got)
	}
	if d := counters(t, p).sub(before); d.NoQueueSocket != 1 || d.Redirected != 0 {
		t.Fatalf("counter delta %+v, want NoQueueSocket 1", d)
	}
}

// TestSlotsFollowQueues: the xsks map gets a slot per queue on a NIC with
// more queues than the default.
func TestSlotsFollowQueues(t *testing.T) {
	t.Parallel()
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{Queues: 200})
	if p.Slots() != 200 {
		t.Fatalf("Slots() = %d, want 200", p.Slots())
	}
	x := newTestXSK(t, lab.A.NS, lab.A.Index)
	if err := p.SetSocket(199, x.fd); err != nil {
		t.Fatalf("SetSocket(199): %v", err)
	}
	if err := p.SetSocket(200, x.fd); err == nil {
		t.Fatal("SetSocket(200) accepted beyond the map")
	}
}
