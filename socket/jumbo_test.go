package socket

import (
	"bytes"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/netlab"
)

// TestJumboEndToEnd is the jumbo-frame acceptance test: bypassd started on
// a 9000-MTU interface with no frame-size option serves a socket client
// whose datagrams of 1 to 65000 bytes travel byte-exact both ways to and
// from a kernel peer through the ring (its counters rise, the kernel's of
// the client's side do not), a 65000-byte datagram leaving as 8 fragments.
func TestJumboEndToEnd(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{MTU: 9000, StaticNeigh: true})
	// No frame-size option; queues large enough for 65000-byte datagrams.
	srv := daemontest.Start(t, p, config.Config{QueueBytes: 256 << 10}, nil)
	r := srv.Rings()[0]
	if caps := r.Caps(); r.MTU() != 9000 || !caps.MultiBuffer {
		t.Fatalf("ring on a 9000-MTU interface: MTU %d, caps %+v; want multi-buffer", r.MTU(), caps)
	}
	c, err := Dial(srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := c.ListenUDP("udp4", netip.AddrPortFrom(p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	peer := p.B.NS.ListenUDP(t, netip.AddrPortFrom(p.B.Addr4(), 0))
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	counter := func(ns *netlab.NS, table, field string) uint64 {
		t.Helper()
		v, err := ns.SNMPCounter(table, field)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	kernelIn, kernelOut := counter(p.A.NS, "Udp", "InDatagrams"), counter(p.A.NS, "Udp", "OutDatagrams")
	rx0, tx0 := r.Stats().RXPackets.Load(), r.Stats().TXPackets.Load()
	sizes := []int{1, 1472, 4000, 8972, 65000}
	buf := make([]byte, 70000)
	for _, size := range sizes {
		want := make([]byte, size)
		rng := rand.New(rand.NewPCG(uint64(size), 21))
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		reasm := counter(p.B.NS, "Ip", "ReasmReqds")
		if _, err := conn.WriteToUDPAddrPort(want, peerAddr); err != nil {
			t.Fatalf("send %d bytes: %v", size, err)
		}
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:n], want) || from.Port() != local.Port() {
			t.Fatalf("%d bytes client to kernel: got %d bytes from %v, %v", size, n, from, err)
		}
		frags := counter(p.B.NS, "Ip", "ReasmReqds") - reasm
		if wantFrags := map[int]uint64{65000: 8}[size]; frags != wantFrags {
			t.Errorf("a %d-byte datagram reached the peer as %d fragments, want %d", size, frags, wantFrags)
		}
		if _, err := peer.WriteToUDPAddrPort(want, local); err != nil {
			t.Fatalf("kernel send %d bytes: %v", size, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err = conn.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:n], want) || from != peerAddr {
			t.Fatalf("%d bytes kernel to client: got %d bytes from %v, %v (provider %+v)", size, n, from, err, r.ProviderStats())
		}
	}
	if rx, tx := r.Stats().RXPackets.Load()-rx0, r.Stats().TXPackets.Load()-tx0; rx != uint64(len(sizes)) || tx != uint64(len(sizes)) {
		t.Errorf("the ring carried %d datagrams in and %d out, want %d each", rx, tx, len(sizes))
	}
	if in, out := counter(p.A.NS, "Udp", "InDatagrams")-kernelIn, counter(p.A.NS, "Udp", "OutDatagrams")-kernelOut; in != 0 || out != 0 {
		t.Errorf("the kernel of the client's side carried %d datagrams in and %d out: not the fast path", in, out)
	}
	if ps := r.ProviderStats(); ps.RXChains == 0 || ps.TXChains == 0 || ps.RXBadChains != 0 {
		t.Errorf("provider %+v: want chains both ways and no bad chain", ps)
	}
}
