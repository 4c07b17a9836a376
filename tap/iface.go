package tap

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// acquireIface returns this process's tc state of the NIC, set up by the
// first caller: stale objects of a dead daemon removed, an ingress qdisc in
// place.
func acquireIface(ns netns.NsHandle, ifindex int) (_ *iface, err error) {
	dev, ino, err := nsIdentity(ns)
	if err != nil {
		return nil, err
	}
	key := ifaceKey{nsDev: dev, nsIno: ino, ifindex: ifindex}
	ifaces.Lock()
	defer ifaces.Unlock()
	if ifc := ifaces.m[key]; ifc != nil {
		ifc.refs++
		return ifc, nil
	}
	h, err := netlinkHandle(ns)
	if err != nil {
		return nil, fmt.Errorf("tap: netlink: %w", err)
	}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		return nil, fmt.Errorf("tap: interface %d: %w", ifindex, err)
	}
	ifc := &iface{key: key, nl: h, ifindex: ifindex, name: link.Attrs().Name, refs: 1}
	if _, err := sweep(h, link); err != nil {
		return nil, err
	}
	if err := ifc.ensureQdisc(link); err != nil {
		return nil, err
	}
	ifaces.m[key] = ifc
	return ifc, nil
}

func netlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	if ns.IsOpen() {
		return netlink.NewHandleAt(ns)
	}
	return netlink.NewHandle()
}

// ingressParent finds the qdisc our filters hang from: an ingress qdisc, or
// the ingress side of a clsact qdisc. kind is "" when there is neither.
func ingressParent(h *netlink.Handle, link netlink.Link) (parent uint32, kind string, err error) {
	qds, err := h.QdiscList(link)
	if err != nil {
		return 0, "", fmt.Errorf("tap: %s: list qdiscs: %w", link.Attrs().Name, err)
	}
	for _, q := range qds {
		switch q.Type() {
		case "ingress":
			return netlink.MakeHandle(0xffff, 0), "ingress", nil
		case "clsact":
			return netlink.HANDLE_MIN_INGRESS, "clsact", nil
		}
	}
	return 0, "", nil
}

func (ifc *iface) ensureQdisc(link netlink.Link) error {
	parent, kind, err := ingressParent(ifc.nl, link)
	if err != nil {
		return err
	}
	if kind != "" {
		ifc.parent = parent
		return nil
	}
	qd := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifc.ifindex,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := ifc.nl.QdiscAdd(qd); err != nil {
		return fmt.Errorf("tap: %s: add the ingress qdisc: %w", ifc.name, err)
	}
	ifc.parent, ifc.ownQdisc = netlink.MakeHandle(0xffff, 0), true
	return nil
}

// releaseLocked drops one reference; the last removes what is left of our
// classifiers and the qdisc we created (if nobody else put filters on it).
// Holds ifaces.
func (ifc *iface) releaseLocked() error {
	if ifc.refs--; ifc.refs > 0 {
		return nil
	}
	delete(ifaces.m, ifc.key)
	defer ifc.nl.Close()
	var errs []error
	for _, fam := range ifc.fams {
		if fam != nil {
			errs = append(errs, ifc.dropFamily(fam))
		}
	}
	if ifc.ownQdisc {
		errs = append(errs, dropEmptyIngress(ifc.nl, ifc.ifindex))
	}
	return errors.Join(errs...)
}

// dropEmptyIngress deletes the NIC's ingress qdisc if no filter is left on
// it (someone may have added theirs meanwhile: then it stays).
func dropEmptyIngress(h *netlink.Handle, ifindex int) error {
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		return nil // the interface is gone, and its qdisc with it
	}
	filters, err := h.FilterList(link, netlink.MakeHandle(0xffff, 0))
	if err != nil {
		return fmt.Errorf("tap: %s: list filters: %w", link.Attrs().Name, err)
	}
	if len(filters) > 0 {
		return nil
	}
	qd := &netlink.Ingress{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_INGRESS}}
	if err := h.QdiscDel(qd); err != nil && !gone(err) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("tap: %s: delete the ingress qdisc: %w", link.Attrs().Name, err)
	}
	return nil
}

// Sweep removes, from the NIC ifindex in ns, the tc objects a bypassd that
// died left behind: our classifiers (priorities PrioIPv4 and PrioIPv6)
// when every filter in them carries ClassMark and none redirects to a
// device that still exists (a living daemon's TAP), and then the ingress
// qdisc if that left it empty. It returns how many classifiers it removed.
// It refuses, with an error and without touching anything, when a filter at
// our priorities is not ours or belongs to a running daemon. A process
// that uses the interface already (NewSteering) is not swept again.
func Sweep(ns netns.NsHandle, ifindex int) (int, error) {
	dev, ino, err := nsIdentity(ns)
	if err != nil {
		return 0, err
	}
	ifaces.Lock()
	defer ifaces.Unlock()
	if ifaces.m[ifaceKey{nsDev: dev, nsIno: ino, ifindex: ifindex}] != nil {
		return 0, nil
	}
	h, err := netlinkHandle(ns)
	if err != nil {
		return 0, fmt.Errorf("tap: netlink: %w", err)
	}
	defer h.Close()
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		return 0, fmt.Errorf("tap: interface %d: %w", ifindex, err)
	}
	return sweep(h, link)
}

func sweep(h *netlink.Handle, link netlink.Link) (int, error) {
	name := link.Attrs().Name
	parent, kind, err := ingressParent(h, link)
	if err != nil || kind == "" {
		return 0, err
	}
	filters, err := h.FilterList(link, parent)
	if err != nil {
		return 0, fmt.Errorf("tap: %s: list filters: %w", name, err)
	}
	stale := map[uint16]uint16{} // priority → protocol
	for _, f := range filters {
		a := f.Attrs()
		if a.Priority != PrioIPv4 && a.Priority != PrioIPv6 {
			continue
		}
		u, ok := f.(*netlink.U32)
		if !ok || u.ClassId != ClassMark {
			return 0, fmt.Errorf("tap: %s: a %s filter at priority %#x is not bypassd's; remove it (`tc filter show dev %s ingress`) or free that priority",
				name, f.Type(), a.Priority, name)
		}
		if u.RedirIndex != 0 {
			if l, err := h.LinkByIndex(u.RedirIndex); err == nil {
				return 0, fmt.Errorf("tap: %s: the fallback filters redirect to %s, which exists: another bypassd serves this interface; stop it first",
					name, l.Attrs().Name)
			}
		}
		stale[a.Priority] = a.Protocol
	}
	if len(stale) == 0 {
		return 0, nil
	}
	for prio, proto := range stale {
		err := retryBusy(func() error {
			return h.FilterDel(&netlink.U32{FilterAttrs: netlink.FilterAttrs{LinkIndex: link.Attrs().Index,
				Parent: parent, Priority: prio, Protocol: proto}})
		})
		if err != nil && !gone(err) {
			return 0, fmt.Errorf("tap: %s: remove stale fallback filters at priority %#x: %w", name, prio, err)
		}
	}
	if kind == "ingress" {
		if err := dropEmptyIngress(h, link.Attrs().Index); err != nil {
			return len(stale), err
		}
	}
	return len(stale), nil
}
