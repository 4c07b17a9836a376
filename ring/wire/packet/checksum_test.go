package packet

import (
	"math/rand/v2"
	"net/netip"
	"testing"
)

// refSum is the RFC 1071 definition, word by word, kept deliberately naive as
// an independent reference for the 64-bit implementation.
func refSum(b []byte, initial uint32) uint16 {
	s := initial
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
		for s>>16 != 0 {
			s = s&0xffff + s>>16
		}
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// refPseudo is the pseudo-header laid out as bytes (RFC 768, RFC 8200 8.1).
func refPseudo(src, dst netip.Addr, proto uint8, length int) []byte {
	if src.Is4() {
		s, d := src.As4(), dst.As4()
		b := append(s[:], d[:]...)
		return append(b, 0, proto, byte(length>>8), byte(length))
	}
	s, d := src.As16(), dst.As16()
	b := append(s[:], d[:]...)
	return append(b, byte(length>>24), byte(length>>16), byte(length>>8), byte(length), 0, 0, 0, proto)
}

func TestChecksumMatchesReference(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	buf := make([]byte, 70000)
	for i := range buf {
		buf[i] = byte(rng.Uint32())
	}
	for _, fill := range []byte{0x00, 0xff} {
		b := make([]byte, 300)
		for i := range b {
			b[i] = fill
		}
		for n := 0; n <= len(b); n++ {
			for _, init := range []uint32{0, 1, 0xffff, 0x1fffe, 0xffffffff} {
				// init%0xffff is the same ones' complement value and keeps
				// the reference's 32-bit accumulator from overflowing.
				if got, want := Checksum(b[:n], init), refSum(b[:n], init%0xffff); !congruent(got, want) {
					t.Fatalf("fill %#x len %d init %#x: Checksum = %#x, reference %#x", fill, n, init, got, want)
				}
			}
		}
	}
	for i := 0; i < 2000; i++ {
		start := rng.IntN(64)
		n := rng.IntN(2000)
		if i%100 == 0 {
			n = rng.IntN(len(buf) - 64)
		}
		b := buf[start : start+n]
		init := rng.Uint32() & 0xffff
		got, want := Checksum(b, init), refSum(b, init)
		if !congruent(got, want) {
			t.Fatalf("start %d len %d init %#x: Checksum = %#x, reference %#x", start, n, init, got, want)
		}
	}
}

// congruent reports whether two folded sums are the same ones' complement
// value (0 and 0xffff are both zero).
func congruent(a, b uint16) bool {
	return a == b || (a == 0 && b == 0xffff) || (a == 0xffff && b == 0)
}

func TestCombineAndPseudoHeader(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 500; i++ {
		a := make([]byte, 2*rng.IntN(100))
		b := make([]byte, rng.IntN(100))
		for j := range a {
			a[j] = byte(rng.Uint32())
		}
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		got := Combine(Checksum(a, 0), Checksum(b, 0))
		want := refSum(append(append([]byte{}, a...), b...), 0)
		if !congruent(got, want) {
			t.Fatalf("Combine = %#x, want %#x", got, want)
		}
	}
	for _, c := range []struct{ src, dst string }{
		{"192.0.2.1", "198.51.100.7"},
		{"::ffff:192.0.2.1", "::ffff:198.51.100.7"},
		{"2001:db8::1", "fe80::1234:5678:9abc:def0"},
	} {
		src, dst := netip.MustParseAddr(c.src), netip.MustParseAddr(c.dst)
		for _, n := range []uint32{8, 1480, 65535, 70000} {
			got := PseudoHeaderChecksum(ProtoUDP, src, dst, n)
			want := refSum(refPseudo(src.Unmap(), dst.Unmap(), ProtoUDP, int(n)), 0)
			if src.Unmap().Is4() {
				want = refSum(refPseudo(src.Unmap(), dst.Unmap(), ProtoUDP, int(n&0xffff)), uint32(n>>16))
			}
			if !congruent(got, want) {
				t.Fatalf("%s -> %s len %d: PseudoHeaderChecksum = %#x, want %#x", c.src, c.dst, n, got, want)
			}
		}
	}
}

func TestPseudoHeaderMixedFamiliesSafe(t *testing.T) {
	t.Parallel()
	v4, v6 := netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1")
	for _, p := range [][2]netip.Addr{{v4, v6}, {v6, v4}, {v4, {}}, {{}, {}}} {
		PseudoHeaderChecksum(ProtoUDP, p[0], p[1], 8) // must not panic
	}
}

func BenchmarkChecksum1500(b *testing.B) {
	buf := make([]byte, 1500)
	for i := range buf {
		buf[i] = byte(i)
	}
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		Checksum(buf, 0)
	}
}
