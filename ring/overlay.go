package ring

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/ring/wire/packet"
	"github.com/bypassd/bypassd/ring/wire/vxlan"
)

// Overlay sockets: an endpoint bound to an address of a VXLAN device whose
// underlay is the ring's interface (`ip link add vx0 type vxlan id N dev
// IF dstport 4789 ...`) is served by the ring like one bound to an address
// of the interface. The XDP program steers its datagrams by VNI and inner
// tuple; the engine decapsulates them on receive and encapsulates what it
// sends with the outer headers the device would write: its VNI, port, local
// address, TTL and ToS, the remote VTEP from its forwarding database (the
// entry for the inner next hop's MAC, else the default entry, else its
// `remote`), and the outer next hop as for any UDP destination. The inner
// next hop is the device's neighbour, resolved by a second route.Resolver
// on the device.

// overlay is one VXLAN device that bound endpoints use (Ring.mu guards
// refs).
type overlay struct {
	ifindex int
	name    string
	vni     uint32
	port    uint16
	// local is the device's local address (zero: the outer route's
	// source); remote its default remote VTEP (zero: none).
	local, remote netip.Addr
	ttl           uint8
	// tos is the outer ToS byte; tosInherit copies the inner one (the
	// device's `tos inherit`).
	tos        uint8
	tosInherit bool
	checksum   bool
	portRange  [2]uint16
	// res resolves inner next hops: the device's neighbours.
	res  *route.Resolver
	refs int
}

// overlayOf returns the VXLAN device over the ring's interface that has
// addr, or nil.
func (r *Ring) overlayOf(addr netip.Addr) (*netlink.Vxlan, error) {
	links, err := r.nl.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list interfaces: %w", err)
	}
	fam := netlink.FAMILY_V6
	if addr.Is4() {
		fam = netlink.FAMILY_V4
	}
	for _, l := range links {
		vx, ok := l.(*netlink.Vxlan)
		if !ok || vx.VtepDevIndex != r.ifindex {
			continue
		}
		addrs, err := r.nl.AddrList(l, fam)
		if err != nil {
			return nil, fmt.Errorf("interface %s: list addresses: %w", vx.Name, err)
		}
		for _, a := range addrs {
			if ip, ok := netip.AddrFromSlice(a.IP); ok && ip.Unmap() == addr {
				return vx, nil
			}
		}
	}
	return nil, nil
}

// acquireOverlayLocked returns the ring's overlay for vx, creating it
// (with its resolver) on first use. Holds r.mu.
func (r *Ring) acquireOverlayLocked(vx *netlink.Vxlan) (*overlay, error) {
	if ov := r.overlays[vx.Index]; ov != nil {
		ov.refs++
		return ov, nil
	}
	if vx.FlowBased {
		return nil, fmt.Errorf("VXLAN device %s is in external (collect-metadata) mode: its VNI and remote come from each packet's metadata, not from the device; give it an `id` and a `remote` or FDB entries: %w", vx.Name, unix.EOPNOTSUPP)
	}
	if vx.VxlanId <= 0 || vx.VxlanId > vxlan.MaxVNI {
		return nil, fmt.Errorf("VXLAN device %s has VNI %d; overlay sockets need VNI 1..%d: %w", vx.Name, vx.VxlanId, vxlan.MaxVNI, unix.EOPNOTSUPP)
	}
	ov := &overlay{ifindex: vx.Index, name: vx.Name, vni: uint32(vx.VxlanId), port: uint16(vx.Port),
		ttl: uint8(vx.TTL), checksum: vx.UDPCSum, portRange: [2]uint16{uint16(vx.PortLow), uint16(vx.PortHigh)}, refs: 1}
	if ov.port == 0 {
		ov.port = 8472 // the kernel's default dstport
	}
	if vx.TOS == 1 {
		ov.tosInherit = true
	} else {
		ov.tos = uint8(vx.TOS)
	}
	for _, a := range []struct {
		ip  net.IP
		dst *netip.Addr
	}{{vx.SrcAddr, &ov.local}, {vx.Group, &ov.remote}} {
		if ip, ok := netip.AddrFromSlice(a.ip); ok && !ip.IsUnspecified() {
			*a.dst = ip.Unmap()
			if !a.dst.Is4() {
				return nil, fmt.Errorf("VXLAN device %s has an IPv6 underlay (%v); bypassd encapsulates over IPv4 only: %w", vx.Name, ip, unix.EOPNOTSUPP)
			}
		}
	}
	if ov.remote.IsMulticast() {
		return nil, fmt.Errorf("VXLAN device %s floods to multicast group %v; bypassd carries unicast overlays (a `remote` or FDB entries): %w", vx.Name, ov.remote, unix.EOPNOTSUPP)
	}
	res, err := route.NewResolver(r.ns, vx.Index, r.log.With(zap.String("overlay", vx.Name)))
	if err != nil {
		return nil, fmt.Errorf("VXLAN device %s: %w", vx.Name, err)
	}
	ov.res = res
	r.overlays[vx.Index] = ov
	r.publishOverlaysLocked()
	r.log.Info("overlay in use", zap.String("device", vx.Name), zap.Uint32("vni", ov.vni), zap.Uint16("port", ov.port),
		zap.Stringer("local", ov.local), zap.Stringer("remote", ov.remote))
	return ov, nil
}

// releaseOverlayLocked drops one reference to ov and returns it when that
// was the last (the caller closes its resolver outside r.mu, after the
// engine let go of it). Holds r.mu.
func (r *Ring) releaseOverlayLocked(ov *overlay) *overlay {
	if ov.refs--; ov.refs > 0 {
		return nil
	}
	delete(r.overlays, ov.ifindex)
	r.publishOverlaysLocked()
	return ov
}

// publishOverlaysLocked gives the engine the overlays in use.
func (r *Ring) publishOverlaysLocked() {
	list := make([]*overlay, 0, len(r.overlays))
	for _, ov := range r.overlays {
		list = append(list, ov)
	}
	r.ovList.Store(&list)
}

// overlayPort reports whether a datagram to port carries an overlay's
// frames (engine).
func (r *Ring) overlayPort(port uint16) bool {
	for _, ov := range *r.ovList.Load() {
		if ov.port == port {
			return true
		}
	}
	return false
}

// generation changes whenever a next hop or template may have changed: the
// interface's routes and neighbours, or an overlay's.
func (r *Ring) generation() uint64 {
	g := r.res.Generation()
	for _, ov := range *r.ovList.Load() {
		g += ov.res.Generation()
	}
	return g
}

// flow is the steering entry for datagrams to dst on ep's network.
func (ep *Endpoint) flow(dst netip.AddrPort) qp.Flow {
	f := ep.r.udpFlow(dst)
	if ep.ov != nil {
		f.VNI, f.VXLANPort = ep.ov.vni, ep.ov.port
	}
	return f
}

// vni is the VXLAN network the endpoint receives from (0: the interface).
func (ep *Endpoint) vni() uint32 {
	if ep.ov == nil {
		return 0
	}
	return ep.ov.vni
}

// resolveOverlay finds everything an overlay destination needs: the inner
// next hop on the device, the remote VTEP from its forwarding database and
// the outer next hop toward it.
func (r *Ring) resolveOverlay(ctx context.Context, ov *overlay, dst netip.Addr) (inner, outer route.Next, remote netip.Addr, err error) {
	if inner, err = ov.res.Resolve(ctx, dst); err != nil {
		return
	}
	if remote, err = r.remoteVTEP(ov, inner.DstMAC); err != nil {
		return
	}
	if outer, err = r.res.Resolve(ctx, remote); err != nil {
		err = fmt.Errorf("remote VTEP %v of %s: %w", remote, ov.name, err)
	}
	return
}

// remoteVTEP looks mac up in the device's forwarding database: its own
// entry, else the default (all-zero) entry, else the device's remote. With
// several default entries the kernel sends unknown unicast to each; bypassd
// sends to the first.
func (r *Ring) remoteVTEP(ov *overlay, mac net.HardwareAddr) (netip.Addr, error) {
	fdb, err := r.nl.NeighList(ov.ifindex, unix.AF_BRIDGE)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("read the forwarding database of %s: %w", ov.name, err)
	}
	var dflt netip.Addr
	for _, n := range fdb {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || ip.IsUnspecified() {
			continue
		}
		switch {
		case bytes.Equal(n.HardwareAddr, mac):
			return ip.Unmap(), nil
		case bytes.Equal(n.HardwareAddr, make(net.HardwareAddr, 6)) && !dflt.IsValid():
			dflt = ip.Unmap()
		}
	}
	if dflt.IsValid() {
		return dflt, nil
	}
	if ov.remote.IsValid() {
		return ov.remote, nil
	}
	return netip.Addr{}, fmt.Errorf("%s has no forwarding entry for %v and no remote: add one with `bridge fdb append 00:00:00:00:00:00 dev %s dst REMOTE`: %w",
		ov.name, mac, ov.name, unix.EHOSTUNREACH)
}

// overlayTemplate builds the encapsulating template for ep → dst from a
// resolved overlay destination.
func (e *engine) overlayTemplate(ep *Endpoint, dst netip.AddrPort, d *dest, to packet.TemplateOptions) (frameTemplate, error) {
	ov := ep.ov
	mtu := min(d.next.MTU, d.outer.MTU-vxlan.Overhead4, e.r.maxMTU()-vxlan.Overhead4)
	inner, err := packet.NewTemplate(d.next.SrcMAC, d.next.DstMAC, ep.local, dst, mtu, to)
	if err != nil {
		return nil, err
	}
	local := ov.local
	if !local.IsValid() {
		local = d.outer.Src
	}
	tos := ov.tos
	if ov.tosInherit {
		tos = to.TOS
	}
	x, err := vxlan.NewEncap(vxlan.Outer{SrcMAC: d.outer.SrcMAC, DstMAC: d.outer.DstMAC, Src: local, Dst: d.remote,
		SrcPort: vxlan.SourcePort(ep.local, dst, ov.portRange[0], ov.portRange[1]), DstPort: ov.port, VNI: ov.vni,
		TTL: ov.ttl, TOS: tos, Checksum: ov.checksum})
	if err != nil {
		return nil, err
	}
	return &vxlan.Template{Inner: inner, Encap: x}, nil
}

// frameTemplate builds the frames of one (endpoint, destination): a
// packet.Template, or a vxlan.Template for overlay endpoints.
type frameTemplate interface {
	HeaderLen() int
	Frames(payloadLen int) (int, error)
	BuildFrame(buf, payload []byte, i int, ipID uint32) (int, error)
	Src() netip.AddrPort
}

// closeOverlay closes the resolver of an overlay no endpoint uses any more
// (nil: nothing to do).
func (r *Ring) closeOverlay(ov *overlay) {
	if ov == nil {
		return
	}
	if err := ov.res.Close(); err != nil {
		r.log.Warn("close overlay resolver", zap.String("device", ov.name), zap.Error(err))
	}
}
