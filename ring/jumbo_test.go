package ring_test

import (
	"bytes"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// jumboSizes are the datagram sizes every jumbo lab carries both ways: the
// smallest, a full 1500-MTU datagram, one that needs a chain at 2048-byte
// frames, a full 9000-MTU datagram and two that leave as fragments.
var jumboSizes = []int{1, 1472, 4000, 8972, 65000, 65507}

// TestJumbo: rings on interfaces with large MTUs carry datagrams of every
// size byte-exact in both directions through the fast path, with
// fragments cut at the interface MTU.
func TestJumbo(t *testing.T) {
	for _, tc := range []struct {
		name      string
		mtu       int
		frameSize int
		multi     bool
	}{
		{"mtu9000", 9000, 0, true}, // default frame size 4096: chains of 3
		// 4096-byte frames hold MTU 3822 in one buffer (the kernel keeps
		// 256 bytes of XDP headroom), so RoCE's 4200 needs chains of 2.
		{"mtu3800-frame4096", 3800, 0, false},
		{"mtu4200-frame4096", 4200, 4096, true},
		{"mtu4200-frame2048", 4200, 2048, true}, // chains of 3
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			l := newLabWith(t, netlab.Options{MTU: tc.mtu}, ring.Config{FrameSize: tc.frameSize})
			caps := l.r.Caps()
			if caps.MultiBuffer != tc.multi {
				t.Fatalf("MTU %d, frame size %d: multi-buffer %v, want %v (caps %+v)", tc.mtu, caps.FrameSize, caps.MultiBuffer, tc.multi, caps)
			}
			// On 6.18, veth takes the frags-aware program natively at
			// any MTU (a plain one is refused above about 3,500: ERANGE).
			if prog := l.r.Program(); prog == nil || !prog.Frags() || prog.Mode() != bpf.ModeNative {
				t.Errorf("XDP program %+v: want frags-aware in native mode", prog)
			}
			if l.r.MTU() != tc.mtu {
				t.Fatalf("ring MTU %d, want %d", l.r.MTU(), tc.mtu)
			}
			ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
			peer := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
			peerAddr := peer.LocalAddr().(*net.UDPAddr).AddrPort()
			kernelInA := udpStat(t, l.p.A.NS, false, "InDatagrams")
			kernelOutA := udpStat(t, l.p.A.NS, false, "OutDatagrams")
			buf := make([]byte, 70000)
			for _, size := range jumboSizes {
				want := payload(size, size)
				// Ring to kernel, fragments counted at the peer.
				reasm := ipStat(t, l.p.B.NS, "ReasmReqds")
				if err := ep.Send(want, peerAddr, time.Time{}); err != nil {
					t.Fatalf("ring send %d bytes: %v", size, err)
				}
				_ = peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				n, from, err := peer.ReadFromUDPAddrPort(buf)
				if err != nil {
					t.Fatalf("%d bytes ring to kernel: %v (provider %+v)", size, err, l.r.ProviderStats())
				}
				if !bytes.Equal(buf[:n], want) || from.Port() != ep.LocalAddr().Port() {
					t.Fatalf("%d bytes ring to kernel: got %d bytes from %v", size, n, from)
				}
				frags := ipStat(t, l.p.B.NS, "ReasmReqds") - reasm
				wantFrags := 0
				if size+28 > tc.mtu {
					wantFrags = (size + 8 + (tc.mtu-20)&^7 - 1) / ((tc.mtu - 20) &^ 7)
				}
				if int(frags) != wantFrags {
					t.Errorf("%d-byte datagram left as %d fragments at MTU %d, want %d", size, frags, tc.mtu, wantFrags)
				}
				// Kernel to ring.
				if _, err := peer.WriteToUDPAddrPort(want, ep.LocalAddr()); err != nil {
					t.Fatalf("kernel send %d bytes: %v", size, err)
				}
				n, from, err = ep.Recv(buf, time.Now().Add(5*time.Second))
				if err != nil {
					t.Fatalf("%d bytes kernel to ring: %v (provider %+v, reassembly %+v)", size, err, l.r.ProviderStats(), l.r.ReassemblyStats())
				}
				if !bytes.Equal(buf[:n], want) || from != peerAddr {
					t.Fatalf("%d bytes kernel to ring: got %d bytes from %v", size, n, from)
				}
			}
			st := l.r.Stats()
			t.Logf("caps %+v; ring %d rx %d tx %d tx fragments; provider %+v; reassembly %+v", caps, st.RXPackets.Load(), st.TXPackets.Load(), st.TXFragments.Load(), l.r.ProviderStats(), l.r.ReassemblyStats())
			if got := st.RXPackets.Load(); got != uint64(len(jumboSizes)) {
				t.Errorf("ring RXPackets %d, want %d", got, len(jumboSizes))
			}
			if got := st.TXPackets.Load(); got != uint64(len(jumboSizes)) {
				t.Errorf("ring TXPackets %d, want %d", got, len(jumboSizes))
			}
			if d := udpStat(t, l.p.A.NS, false, "InDatagrams") - kernelInA; d != 0 {
				t.Errorf("the kernel of the ring's side received %d UDP datagrams: fell back to the kernel", d)
			}
			if d := udpStat(t, l.p.A.NS, false, "OutDatagrams") - kernelOutA; d != 0 {
				t.Errorf("the kernel of the ring's side sent %d UDP datagrams", d)
			}
			ps := l.r.ProviderStats()
			if ps.RXBadChains != 0 || ps.InvalidDescs != 0 {
				t.Errorf("provider counted bad chains or invalid descriptors: %+v", ps)
			}
			if chained := ps.RXChains > 0 && ps.TXChains > 0; chained != tc.multi {
				t.Errorf("frames chained both ways: %v, want %v (provider %+v)", chained, tc.multi, ps)
			}
		})
	}
}
