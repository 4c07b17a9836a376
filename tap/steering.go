package tap

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
)

// Steering directs flows arriving on a NIC to one TAP device, and the
// TAP's output to the NIC. It implements qp.Steering for the TAP path.
type Steering struct {
	ifc   *iface
	tap   *Device
	flows map[qp.Flow]bool
	// active: the TAP path carries the flows now. A standby steering has
	// its flow filters installed (harmless while XDP takes the flows
	// first) but no fragment filters, which would take fragments the XDP
	// program passes to the kernel.
	active bool
	closed bool
}

// NewSteering prepares tc on the NIC nicIfindex (in ns; netns.None(): the
// calling thread's namespace) for flows to dev: the NIC's ingress qdisc
// (created unless one exists), after removing what a dead bypassd left
// there (see Sweep); and on dev, an ingress qdisc whose one filter
// redirects everything written to the device out of the NIC.
func NewSteering(ns netns.NsHandle, nicIfindex int, dev *Device) (_ *Steering, err error) {
	ifc, err := acquireIface(ns, nicIfindex)
	if err != nil {
		return nil, err
	}
	s := &Steering{ifc: ifc, tap: dev, flows: map[qp.Flow]bool{}, active: true}
	defer func() {
		if err != nil {
			ifaces.Lock()
			ifc.releaseLocked()
			ifaces.Unlock()
		}
	}()
	qd := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: dev.Ifindex(),
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := ifc.nl.QdiscAdd(qd); err != nil {
		return nil, fmt.Errorf("tap %s: add the ingress qdisc: %w", dev.Name(), err)
	}
	out := &netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: dev.Ifindex(), Parent: netlink.MakeHandle(0xffff, 0),
		Priority: 1, Protocol: unix.ETH_P_ALL}, ClassId: ClassMark,
		Actions: []netlink.Action{netlink.NewMirredAction(nicIfindex)}}
	if err := ifc.nl.FilterAdd(out); err != nil {
		_ = ifc.nl.QdiscDel(qd)
		return nil, fmt.Errorf("tap %s: redirect its frames to %s: %w", dev.Name(), ifc.name, err)
	}
	return s, nil
}

func (s *Steering) redirect() *netlink.MirredAction { return netlink.NewMirredAction(s.tap.Ifindex()) }

// AddFlow installs a filter redirecting f to the TAP (and, with the first
// flow of its destination address, the address's tables and filters).
func (s *Steering) AddFlow(f qp.Flow) (err error) {
	if (f.Proto != unix.IPPROTO_UDP && f.Proto != unix.IPPROTO_TCP) || !f.Dst.IsValid() || f.Dst.Port() == 0 || f.Dst.Addr().IsUnspecified() {
		return fmt.Errorf("tap: flow %v: need UDP or TCP to a concrete address and port", f)
	}
	if f.Src.IsValid() && (f.Src.Addr().Is4() != f.Dst.Addr().Is4() || f.Src.Addr().IsUnspecified()) {
		return fmt.Errorf("tap: flow %v: the source must be a concrete address of the destination's family", f)
	}
	f.Dst = netip.AddrPortFrom(f.Dst.Addr().Unmap(), f.Dst.Port())
	f.Src = netip.AddrPortFrom(f.Src.Addr().Unmap(), f.Src.Port())
	if !f.Src.Addr().IsValid() {
		f.Src = netip.AddrPort{}
	}
	ifaces.Lock()
	defer ifaces.Unlock()
	if s.closed {
		return fmt.Errorf("tap: add flow %v: steering closed", f)
	}
	ifc := s.ifc
	fam, err := ifc.familyFor(f.Dst.Addr())
	if err != nil {
		return fmt.Errorf("tap: %s: %w", ifc.name, err)
	}
	at, err := ifc.addrFor(fam, f.Dst.Addr())
	if err != nil {
		ifc.dropEmpty(fam, nil)
		return fmt.Errorf("tap: %s: %w", ifc.name, err)
	}
	if ff := at.flows[f]; ff != nil {
		return fmt.Errorf("tap: %s: flow %v is already steered to TAP ifindex %d: %w", ifc.name, f, ff.owner.tap.Ifindex(), unix.EEXIST)
	}
	h, err := at.nodeHandle(f)
	if err == nil {
		dport := f.Dst.Port()
		err = ifc.add(&netlink.U32{FilterAttrs: ifc.filterAttrs(fam, h),
			Sel:     sel(u32Terminal, flowKeys(fam.v6, f.Proto, dport, f.Src)...),
			Actions: []netlink.Action{s.redirect()}})
	}
	if err != nil {
		ifc.dropEmpty(fam, at)
		return fmt.Errorf("tap: %s: filter for %v: %w", ifc.name, f, err)
	}
	at.flows[f] = &flowFilter{handle: h, owner: s}
	at.owners[s]++
	at.used[h] = true
	s.flows[f] = true
	if err := ifc.syncFrag(fam, at); err != nil {
		return fmt.Errorf("tap: %s: %w", ifc.name, err)
	}
	return nil
}

// SetActive tells whether the TAP path carries the flows now (see
// Steering.active); a new steering is active. Activating installs the
// fragment filters of its addresses.
func (s *Steering) SetActive(on bool) error {
	ifaces.Lock()
	defer ifaces.Unlock()
	if s.closed || s.active == on {
		return nil
	}
	s.active = on
	var errs []error
	for _, fam := range s.ifc.fams {
		if fam == nil {
			continue
		}
		for _, at := range fam.addrs {
			errs = append(errs, s.ifc.syncFrag(fam, at))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tap: %s: %w", s.ifc.name, err)
	}
	return nil
}

// dropEmpty removes an address table without flows and a classifier
// without addresses (after a failed add).
func (ifc *iface) dropEmpty(fam *family, at *addrTable) {
	if at != nil && len(at.flows) == 0 {
		_ = ifc.dropAddr(fam, at)
	}
	if len(fam.addrs) == 0 {
		_ = ifc.dropFamily(fam)
	}
}

// DeleteFlow removes f's filter (and the address's tables with its last
// flow).
func (s *Steering) DeleteFlow(f qp.Flow) error {
	ifaces.Lock()
	defer ifaces.Unlock()
	return s.deleteLocked(f)
}

// DeleteFlows removes many flows: an address all of whose flows go loses
// its hash table in one deletion (the kernel frees the filters in it),
// instead of one deletion per filter.
func (s *Steering) DeleteFlows(flows []qp.Flow) error {
	ifaces.Lock()
	defer ifaces.Unlock()
	byAddr := map[*addrTable][]qp.Flow{}
	var errs []error
	for _, f := range flows {
		if !s.flows[f] {
			continue
		}
		if _, at := s.ifc.lookup(f.Dst.Addr()); at != nil {
			byAddr[at] = append(byAddr[at], f)
		}
	}
	for at, fs := range byAddr {
		fam, _ := s.ifc.lookup(at.addr)
		if len(fs) < len(at.flows) {
			for _, f := range fs {
				errs = append(errs, s.deleteLocked(f))
			}
			continue
		}
		for _, f := range fs {
			delete(s.flows, f)
		}
		errs = append(errs, s.ifc.dropAddr(fam, at))
		if len(fam.addrs) == 0 {
			errs = append(errs, s.ifc.dropFamily(fam))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tap: %s: delete %d flows: %w", s.ifc.name, len(flows), err)
	}
	return nil
}

// lookup finds the classifier and hash table of a destination address.
func (ifc *iface) lookup(a netip.Addr) (*family, *addrTable) {
	fam := ifc.fams[0]
	if a.Is6() {
		fam = ifc.fams[1]
	}
	if fam == nil {
		return nil, nil
	}
	return fam, fam.addrs[a]
}

func (s *Steering) deleteLocked(f qp.Flow) error {
	if !s.flows[f] {
		return nil
	}
	delete(s.flows, f)
	ifc := s.ifc
	fam, at := ifc.lookup(f.Dst.Addr())
	if at == nil {
		return nil
	}
	ff := at.flows[f]
	delete(at.flows, f)
	if at.owners[ff.owner]--; at.owners[ff.owner] == 0 {
		delete(at.owners, ff.owner)
	}
	delete(at.used, ff.handle)
	var errs []error
	errs = append(errs, ifc.del(fam, ff.handle))
	if len(at.flows) == 0 {
		errs = append(errs, ifc.dropAddr(fam, at))
		if len(fam.addrs) == 0 {
			errs = append(errs, ifc.dropFamily(fam))
		}
	} else {
		errs = append(errs, ifc.syncFrag(fam, at))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tap: %s: delete flow %v: %w", ifc.name, f, err)
	}
	return nil
}

// Flows lists the flows whose filters redirect to this TAP, decoded from
// the filters the kernel reports.
func (s *Steering) Flows() ([]qp.Flow, error) {
	ifaces.Lock()
	defer ifaces.Unlock()
	ifc := s.ifc
	link, err := ifc.nl.LinkByIndex(ifc.ifindex)
	if err != nil {
		return nil, fmt.Errorf("tap: %s: %w", ifc.name, err)
	}
	filters, err := ifc.nl.FilterList(link, ifc.parent)
	if err != nil {
		return nil, fmt.Errorf("tap: %s: list filters: %w", ifc.name, err)
	}
	var out []qp.Flow
	for _, flt := range filters {
		u, ok := flt.(*netlink.U32)
		if !ok || u.Sel == nil || u.RedirIndex != s.tap.Ifindex() {
			continue
		}
		var fam *family
		switch u.Priority {
		case PrioIPv4:
			fam = ifc.fams[0]
		case PrioIPv6:
			fam = ifc.fams[1]
		}
		if fam == nil {
			continue
		}
		for _, at := range fam.addrs {
			if u.Handle&0xfff00000 == at.ht {
				out = append(out, decodeFlow(at.addr, u.Sel.Keys))
			}
		}
	}
	return out, nil
}

// decodeFlow reads a flow filter's keys back (see flowKeys).
func decodeFlow(dst netip.Addr, keys []nl.TcU32Key) qp.Flow {
	f := qp.Flow{Proto: unix.IPPROTO_UDP}
	var dport, sport uint16
	hasSrc := false
	var src [16]byte
	for _, k := range keys {
		if p, ok := keyProto(dst.Is6(), k); ok {
			f.Proto = p
			continue
		}
		switch {
		case k.Mask == 0x0000ffff:
			dport = uint16(k.Val)
		case k.Mask == 0xffff0000:
			sport, hasSrc = uint16(k.Val>>16), true
		case k.Mask == 0xffffffff && dst.Is4() && k.Off == 12:
			src[0], src[1], src[2], src[3] = byte(k.Val>>24), byte(k.Val>>16), byte(k.Val>>8), byte(k.Val)
		case k.Mask == 0xffffffff && dst.Is6() && k.Off >= 8 && k.Off < 24:
			i := k.Off - 8
			src[i], src[i+1], src[i+2], src[i+3] = byte(k.Val>>24), byte(k.Val>>16), byte(k.Val>>8), byte(k.Val)
		}
	}
	f.Dst = netip.AddrPortFrom(dst, dport)
	if hasSrc {
		a := netip.AddrFrom16(src)
		if dst.Is4() {
			a = netip.AddrFrom4([4]byte(src[:4]))
		}
		f.Src = netip.AddrPortFrom(a, sport)
	}
	return f
}

// Healthy reports whether the NIC and the TAP still exist.
func (s *Steering) Healthy() error {
	if _, err := s.ifc.nl.LinkByIndex(s.ifc.ifindex); err != nil {
		return fmt.Errorf("tap: interface %s is gone: %w", s.ifc.name, err)
	}
	if _, err := s.ifc.nl.LinkByIndex(s.tap.Ifindex()); err != nil {
		return fmt.Errorf("tap: device %s is gone: %w", s.tap.Name(), err)
	}
	return nil
}

// Close removes the flows still installed and the TAP's redirect to the
// NIC, and releases the NIC's tc objects with the last steering of the
// interface. It does not close the device.
func (s *Steering) Close() error {
	ifaces.Lock()
	defer ifaces.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	var errs []error
	flows := make([]qp.Flow, 0, len(s.flows))
	for f := range s.flows {
		flows = append(flows, f)
	}
	slices.SortFunc(flows, func(a, b qp.Flow) int { return a.Dst.Compare(b.Dst) })
	for _, f := range flows {
		errs = append(errs, s.deleteLocked(f))
	}
	qd := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: s.tap.Ifindex(),
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := s.ifc.nl.QdiscDel(qd); err != nil && !gone(err) && !errors.Is(err, unix.EINVAL) {
		errs = append(errs, fmt.Errorf("tap %s: delete the ingress qdisc: %w", s.tap.Name(), err))
	}
	errs = append(errs, s.ifc.releaseLocked())
	return errors.Join(errs...)
}
