package netlab

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// Overlay is one end of a VXLAN overlay between the lab's namespaces: a
// kernel vxlan device over the end's veth.
type Overlay struct {
	NS    *NS
	Name  string
	Index int
	MAC   net.HardwareAddr
	IPv4  netip.Prefix
	VNI   uint32
}

// Addr4 returns the overlay end's IPv4 address.
func (o *Overlay) Addr4() netip.Addr { return o.IPv4.Addr() }

// AddVXLAN creates a VXLAN device with vni on each end of the pair (over its
// veth, dstport port, local its IPv4 address, remote the other end's), up,
// with 192.168.<subnet>.1/24 on A's and .2/24 on B's, IPv6 off and each
// other's MAC as a permanent neighbour: no ARP, ND or MLD crosses the
// tunnel, so the kernel's UDP counters move only with the test's traffic.
// The devices go with the namespaces.
func (p *Pair) AddVXLAN(tb testing.TB, vni uint32, port uint16, subnet byte) (a, b *Overlay) {
	tb.Helper()
	a, b, err := p.CreateVXLAN(vni, port, subnet)
	if err != nil {
		tb.Fatal(err)
	}
	return a, b
}

// CreateVXLAN is AddVXLAN for programs other than tests.
func (p *Pair) CreateVXLAN(vni uint32, port uint16, subnet byte) (a, b *Overlay, err error) {
	name := fmt.Sprintf("vx%d", vni)
	a = &Overlay{NS: p.A.NS, Name: name, VNI: vni, IPv4: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, subnet, 1}), 24)}
	b = &Overlay{NS: p.B.NS, Name: name, VNI: vni, IPv4: netip.PrefixFrom(netip.AddrFrom4([4]byte{192, 168, subnet, 2}), 24)}
	for _, e := range []struct {
		o          *Overlay
		under      *Link
		remoteVTEP netip.Addr
	}{{a, p.A, p.B.Addr4()}, {b, p.B, p.A.Addr4()}} {
		if err := e.o.create(e.under, e.remoteVTEP, port); err != nil {
			return nil, nil, err
		}
	}
	for _, e := range [][2]*Overlay{{a, b}, {b, a}} {
		n := &netlink.Neigh{LinkIndex: e[0].Index, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: e[1].Addr4().AsSlice(), HardwareAddr: e[1].MAC}
		if err := e[0].NS.Netlink().NeighAdd(n); err != nil {
			return nil, nil, fmt.Errorf("netlab: neighbour %s on %s in %s: %w", e[1].Addr4(), e[0].Name, e[0].NS.Name, err)
		}
	}
	deadline := time.Now().Add(readyTimeout)
	for _, o := range []*Overlay{a, b} {
		for {
			l, err := o.NS.Netlink().LinkByIndex(o.Index)
			if err != nil {
				return nil, nil, fmt.Errorf("netlab: %s in %s: %w", o.Name, o.NS.Name, err)
			}
			if l.Attrs().OperState == netlink.OperUp || l.Attrs().OperState == netlink.OperUnknown {
				break
			}
			if time.Now().After(deadline) {
				return nil, nil, fmt.Errorf("netlab: %s in %s not up (%s)", o.Name, o.NS.Name, l.Attrs().OperState)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	return a, b, nil
}

func (o *Overlay) create(under *Link, remote netip.Addr, port uint16) error {
	nl := o.NS.Netlink()
	vx := &netlink.Vxlan{LinkAttrs: netlink.LinkAttrs{Name: o.Name}, VxlanId: int(o.VNI), VtepDevIndex: under.Index,
		SrcAddr: under.Addr4().AsSlice(), Group: remote.AsSlice(), Port: int(port), Learning: true}
	if err := nl.LinkAdd(vx); err != nil {
		return fmt.Errorf("netlab: add VXLAN device %s (VNI %d) in %s: %w", o.Name, o.VNI, o.NS.Name, err)
	}
	err := o.NS.Do(func() error {
		// Before the link is up, so it never gets an IPv6 link-local
		// address (whose ND and MLD would cross the tunnel).
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+o.Name+"/disable_ipv6", []byte("1"), 0); err != nil {
			return err
		}
		// Locally generated datagrams leave with a complete checksum,
		// as on a real NIC.
		return setTxChecksum(o.Name, false)
	})
	if err != nil {
		return fmt.Errorf("netlab: configure %s in %s: %w", o.Name, o.NS.Name, err)
	}
	l, err := nl.LinkByName(o.Name)
	if err != nil {
		return fmt.Errorf("netlab: find %s in %s: %w", o.Name, o.NS.Name, err)
	}
	o.Index, o.MAC = l.Attrs().Index, l.Attrs().HardwareAddr
	if err := nl.AddrAdd(l, &netlink.Addr{IPNet: prefixNet(o.IPv4)}); err != nil {
		return fmt.Errorf("netlab: address %s on %s in %s: %w", o.IPv4, o.Name, o.NS.Name, err)
	}
	if err := nl.LinkSetUp(l); err != nil {
		return fmt.Errorf("netlab: set %s up in %s: %w", o.Name, o.NS.Name, err)
	}
	return nil
}
