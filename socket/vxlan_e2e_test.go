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

// TestVXLANEndToEnd: a client socket bound to an address of a VXLAN device
// over the interface bypassd serves talks to a kernel VXLAN device in the
// peer namespace, byte-exact both ways, through the ring (its counters and
// its encapsulation counters rise; the kernel of the client's namespace,
// which would otherwise decapsulate, counts no UDP datagram).
func TestVXLANEndToEnd(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{}, nil)
	r := srv.Rings()[0]
	oa, ob := p.AddVXLAN(t, 4317, 4789, 43)
	c, err := Dial(srv.SocketPath())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	conn, err := c.ListenUDP("udp4", netip.AddrPortFrom(oa.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	local := conn.LocalAddr().(*net.UDPAddr).AddrPort()
	peer := p.B.NS.ListenUDP(t, netip.AddrPortFrom(ob.Addr4(), 0))
	peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
	counter := func(field string) uint64 {
		t.Helper()
		v, err := p.A.NS.SNMPCounter("Udp", field)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	kernelIn, kernelOut := counter("InDatagrams"), counter("OutDatagrams")
	st := r.Stats()
	rx0, tx0, enc0, dec0 := st.RXPackets.Load(), st.TXPackets.Load(), st.TXEncapsulated.Load(), st.RXDecapsulated.Load()
	sizes := []int{1, 1422, 1423, 9000}
	buf := make([]byte, 70000)
	for _, size := range sizes {
		want := make([]byte, size)
		rng := rand.New(rand.NewPCG(uint64(size), 43))
		for i := range want {
			want[i] = byte(rng.Uint32())
		}
		if _, err := conn.WriteToUDPAddrPort(want, peerAddr); err != nil {
			t.Fatalf("send %d bytes: %v", size, err)
		}
		_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := peer.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:n], want) || from != local {
			t.Fatalf("%d bytes client to the kernel's overlay: got %d bytes from %v, %v", size, n, from, err)
		}
		if _, err := peer.WriteToUDPAddrPort(want, local); err != nil {
			t.Fatalf("kernel send %d bytes: %v", size, err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err = conn.ReadFromUDPAddrPort(buf)
		if err != nil || !bytes.Equal(buf[:n], want) || from != peerAddr {
			t.Fatalf("%d bytes kernel to client: got %d bytes from %v, %v (ring %+v)", size, n, from, err, st)
		}
	}
	k := uint64(len(sizes))
	if rx, tx := st.RXPackets.Load()-rx0, st.TXPackets.Load()-tx0; rx != k || tx != k {
		t.Errorf("the ring carried %d datagrams in and %d out, want %d each", rx, tx, k)
	}
	if enc, dec := st.TXEncapsulated.Load()-enc0, st.RXDecapsulated.Load()-dec0; enc != k || dec < k {
		t.Errorf("the ring encapsulated %d datagrams and decapsulated %d frames, want %d and at least %d", enc, dec, k, k)
	}
	if in, out := counter("InDatagrams")-kernelIn, counter("OutDatagrams")-kernelOut; in != 0 || out != 0 {
		t.Errorf("the kernel of the client's side carried %d UDP datagrams in and %d out: not the fast path", in, out)
	}
}
