package main

import (
	"fmt"
	"net/netip"
)

// The VXLAN cases: the kernel and ring cases between VXLAN devices (VNI
// 4242, dstport 4789) over the lab pair. tx-kernel-vxlan and
// rx-kernel-vxlan are the kernel's VXLAN driver (encapsulation in the
// kernel of A, decapsulation likewise); tx-ring-vxlan and rx-ring-vxlan a
// ring endpoint on A's overlay address (the ring encapsulates, XDP steers
// by VNI and the engine decapsulates). The sink and the ring load generator
// in B see the outer frames.

// addrA and addrB are the addresses the cases bind in A and B: the pair's,
// or the overlay's while a VXLAN case runs.
func (b *bench) addrA() netip.Addr {
	if b.overlay {
		return b.oa.Addr4()
	}
	return b.p.A.Addr4()
}

func (b *bench) addrB() netip.Addr {
	if b.overlay {
		return b.ob.Addr4()
	}
	return b.p.B.Addr4()
}

func (b *bench) vxlanCases() ([]struct {
	name string
	fn   func() (sample, error)
}, error) {
	var err error
	if b.oa, b.ob, err = b.p.CreateVXLAN(4242, 4789, 42); err != nil {
		return nil, err
	}
	on := func(fn func() (sample, error)) func() (sample, error) {
		return func() (sample, error) {
			b.overlay = true
			defer func() { b.overlay = false }()
			return fn()
		}
	}
	return []struct {
		name string
		fn   func() (sample, error)
	}{
		{"tx-kernel-vxlan", on(b.txKernel)}, {"tx-ring-vxlan", on(b.txRing)},
		{"rx-kernel-vxlan", on(b.rxKernel)}, {"rx-ring-vxlan", on(b.rxRing)},
	}, nil
}

// reportVXLAN prints the overlay cases next to plain UDP on the same ring
// and the kernel's VXLAN path.
func reportVXLAN(o options, res map[string][]sample) {
	if len(res["tx-ring-vxlan"]) == 0 && len(res["rx-ring-vxlan"]) == 0 {
		return
	}
	m := func(c string) float64 { return deliveredMpps(res, c) }
	for _, dir := range []string{"tx", "rx"} {
		vx, plain, kvx := m(dir+"-ring-vxlan"), m(dir+"-ring"), m(dir+"-kernel-vxlan")
		if vx == 0 {
			continue
		}
		fmt.Printf("%s %d-byte UDP over VXLAN: ring %.3f Mpps, plain UDP on the ring %.3f, kernel VXLAN %.3f (medians of %d, delivered); ring VXLAN/plain %.2fx, ring VXLAN/kernel VXLAN %.2fx\n",
			dir, o.size, vx, plain, kvx, len(res[dir+"-ring-vxlan"]), ratioOrZero(vx, plain), ratioOrZero(vx, kvx))
	}
}
