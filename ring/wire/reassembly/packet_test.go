package reassembly

import (
	"bytes"
	"math/rand/v2"
	"net"
	"net/netip"
	"testing"

	"github.com/bypassd/bypassd/ring/wire/packet"
)

// TestPacketRoundTrip sends datagrams through packet.Template fragments,
// packet.Parse, Add, packet.ParseUDPSegment and packet.VerifyUDP, for IPv4
// and IPv6, with fragments in random order and some duplicated.
func TestPacketRoundTrip(t *testing.T) {
	t.Parallel()
	src := net.HardwareAddr{2, 0, 0, 0, 0, 1}
	dst := net.HardwareAddr{2, 0, 0, 0, 0, 2}
	for _, c := range []struct {
		name     string
		from, to string
		mtu      int
		max      int
	}{
		{"v4", "192.0.2.1:5000", "192.0.2.2:11111", 1500, packet.MaxUDPPayload4},
		{"v4-mtu576", "192.0.2.1:5000", "192.0.2.2:11111", 576, packet.MaxUDPPayload4},
		{"v6", "[2001:db8::1]:5000", "[2001:db8::2]:11111", 1500, packet.MaxUDPPayload6},
		{"v6-mtu1280", "[2001:db8::1]:5000", "[2001:db8::2]:11111", 1280, packet.MaxUDPPayload6},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			from, to := netip.MustParseAddrPort(c.from), netip.MustParseAddrPort(c.to)
			tm, err := packet.NewTemplate(src, dst, from, to, c.mtu, packet.TemplateOptions{VLAN: 10})
			if err != nil {
				t.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(uint64(c.mtu), 1))
			r := New(Config{})
			for _, size := range []int{c.mtu, 3000, 8000, 40000, c.max} {
				payload := randBytes(rng, size)
				id := rng.Uint32()
				n, err := tm.Frames(size)
				if err != nil || n < 2 {
					t.Fatalf("Frames(%d) = %d, %v", size, n, err)
				}
				var frames [][]byte
				for i := range n {
					buf := make([]byte, tm.MaxFrameLen())
					l, err := tm.BuildFrame(buf, payload, i, id)
					if err != nil {
						t.Fatal(err)
					}
					frames = append(frames, buf[:l])
				}
				frames = append(frames, bytes.Clone(frames[rng.IntN(n)])) // a duplicate
				rng.Shuffle(len(frames), func(i, j int) { frames[i], frames[j] = frames[j], frames[i] })
				var got []byte
				var f packet.Frame
				for i, fr := range frames {
					if err := packet.Parse(fr, &f); err != nil || f.Kind != packet.KindFragment {
						t.Fatalf("Parse: kind %v, %v", f.Kind, err)
					}
					k := Key{Src: f.Src.Addr(), Dst: f.Dst.Addr(), ID: f.FragID, Proto: f.Proto}
					d, done, err := r.Add(k, f.FragOff, f.More, f.Payload, t0)
					if err != nil {
						t.Fatalf("Add: %v", err)
					}
					// Scribble over the frame: Add must have copied.
					for j := range fr {
						fr[j] = 0x5a
					}
					if done {
						if i < len(frames)-1 && got != nil {
							t.Fatal("completed twice")
						}
						got = append([]byte(nil), d...)
						if !packet.VerifyUDP(k.Src, k.Dst, d) {
							t.Fatalf("size %d: reassembled datagram fails the UDP checksum", size)
						}
						sp, dp, pl, err := packet.ParseUDPSegment(d)
						if err != nil || sp != from.Port() || dp != to.Port() || !bytes.Equal(pl, payload) {
							t.Fatalf("size %d: ParseUDPSegment = %d %d %d bytes %v", size, sp, dp, len(pl), err)
						}
					}
				}
				if got == nil {
					t.Fatalf("size %d: never completed", size)
				}
			}
			// A duplicate arriving after completion opens a new datagram
			// that can only time out, as in Linux.
			r.Expire(t0.Add(DefaultTimeout))
			if r.Len() != 0 || r.Buffered() != 0 {
				t.Fatalf("left %d datagrams, %d bytes", r.Len(), r.Buffered())
			}
		})
	}
}
