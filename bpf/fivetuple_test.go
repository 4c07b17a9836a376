package bpf

import (
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
)

// TestFiveTupleCount: the count that lets the program skip the 5-tuple
// lookup follows 5-tuple flows exactly (replacing one does not count twice,
// 3-tuple flows do not count) and returns to 0.
func TestFiveTupleCount(t *testing.T) {
	lab := netlab.NewPair(t, netlab.Options{})
	p := attachIn(t, lab.A, Options{})
	count := func() uint32 {
		t.Helper()
		var n uint32
		if err := p.objs.FiveTuples.Lookup(uint32(0), &n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	dst := netip.AddrPortFrom(lab.A.Addr4(), 5000)
	three := Flow{Proto: unix.IPPROTO_UDP, Dst: dst}
	five := Flow{Proto: unix.IPPROTO_UDP, Dst: dst, Src: netip.AddrPortFrom(lab.B.Addr4(), 6000)}
	five2 := Flow{Proto: unix.IPPROTO_UDP, Dst: dst, Src: netip.AddrPortFrom(lab.B.Addr4(), 6001)}
	for _, step := range []struct {
		do   func() error
		want uint32
	}{
		{func() error { return p.AddFlow(three, 0) }, 0},
		{func() error { return p.AddFlow(five, 0) }, 1},
		{func() error { return p.AddFlow(five, 1) }, 1}, // replace
		{func() error { return p.AddFlow(five2, 0) }, 2},
		{func() error { return p.DeleteFlow(five) }, 1},
		{func() error { return p.DeleteFlow(three) }, 1},
		{func() error { return p.DeleteFlow(five2) }, 0},
	} {
		if err := step.do(); err != nil {
			t.Fatal(err)
		}
		if got := count(); got != step.want {
			t.Fatalf("5-tuple count %d, want %d", got, step.want)
		}
	}
	if err := p.DeleteFlow(five); err == nil || count() != 0 {
		t.Fatalf("deleting an absent 5-tuple flow: %v, count %d", err, count())
	}
}
