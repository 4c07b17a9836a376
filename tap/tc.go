package tap

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/ring/qp"
)

// Marks of our tc objects on a NIC. Nothing else of the system uses them by
// convention; Sweep and the start-up check refuse to touch an interface
// where a filter at our priorities lacks ClassMark.
const (
	// PrioIPv4 and PrioIPv6 are the priorities of our u32 classifiers on
	// the NIC's ingress. They are large (late): filters of other tools at
	// smaller priorities run first.
	PrioIPv4 = 0xbd00
	PrioIPv6 = 0xbd01
	// ClassMark is the class id of every u32 filter we create.
	ClassMark = 0xbd0d0001
	// Hash table ids we allocate: htidFirst..htidLast (the kernel's own
	// automatic ids start at 0x800).
	htidFirst = 0x400
	htidLast  = 0x7ff
	// Node ids in a bucket: 5-tuple filters below fiveTupleLast, so they
	// are tried before 3-tuple filters of the same destination.
	nodeFirst     = 1
	fiveTupleLast = 0x7ff
	nodeLast      = 0xfff
	// Filters in an entry table per address: link, (IPv4) pass, fragments.
	entryNodes = 3
	maxAddrs   = nodeLast / entryNodes
)

// busyTimeout bounds the retries of a deletion the kernel answers with
// EBUSY (a hash table is released only after the RCU grace period of the
// filter that linked to it).
const busyTimeout = 2 * time.Second

func retryBusy(op func() error) error {
	deadline := time.Now().Add(busyTimeout)
	wait := 200 * time.Microsecond
	for {
		err := op()
		if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
			return err
		}
		time.Sleep(wait)
		if wait < 20*time.Millisecond {
			wait *= 2
		}
	}
}

// Interfaces are shared by the rings of this process: one state per
// (network namespace, ifindex).
var ifaces = struct {
	sync.Mutex
	m map[ifaceKey]*iface
}{m: map[ifaceKey]*iface{}}

type ifaceKey struct {
	nsDev, nsIno uint64
	ifindex      int
}

// iface is our tc state on one NIC.
type iface struct {
	key     ifaceKey
	nl      *netlink.Handle
	ifindex int
	name    string
	// parent of our filters: the ingress qdisc, or the ingress side of a
	// clsact qdisc someone else created.
	parent uint32
	// ownQdisc: we created the ingress qdisc (and remove it when done).
	ownQdisc bool
	refs     int
	fams     [2]*family // IPv4, IPv6; nil until the first flow
}

// family is one u32 classifier instance (one priority and protocol).
type family struct {
	v6    bool
	prio  uint16
	entry uint32 // handle of the entry table
	addrs map[netip.Addr]*addrTable
	// slots[i] tells whether entry-table slot i is taken by an address.
	slots [maxAddrs]bool
}

// addrTable is the hash table of one destination address and its filters.
type addrTable struct {
	addr  netip.Addr
	ht    uint32 // hash table handle
	slot  int
	flows map[qp.Flow]*flowFilter
	// owners counts the flows in flows per steering, so syncFrag finds a
	// steering with flows here without walking them (100,000 flows on
	// one address made every bind walk them all).
	owners map[*Steering]int
	// fragTo is the steering whose TAP receives the address's fragments
	// (nil: no fragment filter installed; see syncFrag).
	fragTo *Steering
	used   map[uint32]bool // node handles in use
}

type flowFilter struct {
	handle uint32
	owner  *Steering
}

func (ifc *iface) filterAttrs(fam *family, handle uint32) netlink.FilterAttrs {
	return netlink.FilterAttrs{LinkIndex: ifc.ifindex, Parent: ifc.parent, Handle: handle,
		Priority: fam.prio, Protocol: protoOf(fam.v6)}
}

func (ifc *iface) add(f *netlink.U32) error {
	ifc.mark(f)
	return ifc.nl.FilterAdd(f)
}

// mark gives a filter our class id and, when its handle names a table and
// bucket, places it there (the kernel requires the two to agree).
func (ifc *iface) mark(f *netlink.U32) {
	if f.Divisor != 0 {
		return
	}
	f.ClassId = ClassMark
	if f.Handle&0xfff00000 != 0 {
		f.Hash = f.Handle & 0xfffff000
	}
}

func (ifc *iface) del(fam *family, handle uint32) error {
	return retryBusy(func() error {
		err := ifc.nl.FilterDel(&netlink.U32{FilterAttrs: ifc.filterAttrs(fam, handle)})
		if gone(err) {
			return nil
		}
		return err
	})
}

// familyFor returns the classifier for addresses like a, creating it (an
// entry table, and in the automatic root table one filter linking to it).
func (ifc *iface) familyFor(a netip.Addr) (*family, error) {
	i := 0
	if a.Is6() {
		i = 1
	}
	if ifc.fams[i] != nil {
		return ifc.fams[i], nil
	}
	fam := &family{v6: a.Is6(), prio: PrioIPv4, addrs: map[netip.Addr]*addrTable{}}
	if fam.v6 {
		fam.prio = PrioIPv6
	}
	var err error
	if fam.entry, err = ifc.newTable(fam, 1); err != nil {
		return nil, fmt.Errorf("create the entry table: %w", err)
	}
	link := &netlink.U32{FilterAttrs: ifc.filterAttrs(fam, 0), Link: fam.entry,
		Sel: sel(0, nl.TcU32Key{})}
	if err := ifc.add(link); err != nil {
		_ = ifc.dropFamily(fam)
		return nil, fmt.Errorf("link the entry table: %w", err)
	}
	ifc.fams[i] = fam
	return fam, nil
}

// newTable creates a hash table with the first free id of our range.
func (ifc *iface) newTable(fam *family, divisor uint32) (uint32, error) {
	for id := uint32(htidFirst); id <= htidLast; id++ {
		h := id << 20
		err := ifc.add(&netlink.U32{FilterAttrs: ifc.filterAttrs(fam, h), Divisor: divisor})
		if errors.Is(err, unix.EEXIST) {
			continue // someone else's table on this qdisc
		}
		return h, err
	}
	return 0, fmt.Errorf("all u32 hash table ids %#x-%#x of %s are taken", htidFirst, htidLast, ifc.name)
}

// dropFamily deletes the whole classifier instance.
func (ifc *iface) dropFamily(fam *family) error {
	err := ifc.del(fam, 0)
	if fam.v6 {
		ifc.fams[1] = nil
	} else {
		ifc.fams[0] = nil
	}
	if err != nil {
		return fmt.Errorf("delete the u32 classifier at priority %#x: %w", fam.prio, err)
	}
	return nil
}

// addrFor returns the hash table of address a, creating it and the
// address's filters in the entry table.
func (ifc *iface) addrFor(fam *family, a netip.Addr) (*addrTable, error) {
	if at := fam.addrs[a]; at != nil {
		return at, nil
	}
	slot := -1
	for i, used := range fam.slots {
		if !used {
			slot = i
			break
		}
	}
	if slot < 0 {
		return nil, fmt.Errorf("more than %d offloaded addresses on %s", maxAddrs, ifc.name)
	}
	ht, err := ifc.newTable(fam, 256)
	if err != nil {
		return nil, fmt.Errorf("hash table for %v: %w", a, err)
	}
	at := &addrTable{addr: a, ht: ht, slot: slot, flows: map[qp.Flow]*flowFilter{}, owners: map[*Steering]int{}, used: map[uint32]bool{}}
	fail := func(err error) (*addrTable, error) {
		ifc.dropAddr(fam, at)
		return nil, fmt.Errorf("filters for %v: %w", a, err)
	}
	base := fam.entry | uint32(slot*entryNodes+1)
	if err := ifc.add(&netlink.U32{FilterAttrs: ifc.filterAttrs(fam, base), Link: ht, Sel: linkSel(a)}); err != nil {
		return fail(err)
	}
	if !a.Is6() {
		// Unfragmented UDP that no flow filter took goes to the kernel
		// here; otherwise the fragment filter below would take it. A
		// terminal filter without actions classifies as "ok" (pass),
		// which needs no action module (act_gact may be absent).
		pass := &netlink.U32{FilterAttrs: ifc.filterAttrs(fam, base+1),
			Sel: sel(u32Terminal, append(addrKeys(a, true), udpKey(false), unfragmentedKey())...)}
		if err := ifc.add(pass); err != nil {
			return fail(err)
		}
	}
	fam.slots[slot] = true
	fam.addrs[a] = at
	return at, nil
}

// syncFrag installs, moves or removes the address's fragment filter: its
// fragments go to an active steering that has flows to the address (the
// current one while it qualifies), and to the kernel when there is none,
// so a standby TAP path takes no fragments from the XDP path.
func (ifc *iface) syncFrag(fam *family, at *addrTable) error {
	qualifies := func(s *Steering) bool { return s != nil && s.active && at.owners[s] > 0 }
	want := at.fragTo
	if !qualifies(want) {
		want = nil
		for s := range at.owners {
			if qualifies(s) {
				want = s
				break
			}
		}
	}
	if want == at.fragTo {
		return nil
	}
	var err error
	switch {
	case want == nil:
		err = ifc.del(fam, fam.entry|uint32(at.slot*entryNodes+3))
	case at.fragTo == nil:
		err = ifc.add(ifc.fragFilter(fam, at, want))
	default:
		f := ifc.fragFilter(fam, at, want)
		ifc.mark(f)
		err = ifc.nl.FilterReplace(f)
	}
	if err != nil {
		return fmt.Errorf("fragment filter of %v: %w", at.addr, err)
	}
	at.fragTo = want
	return nil
}

// fragFilter redirects the address's UDP fragments to s's TAP.
func (ifc *iface) fragFilter(fam *family, at *addrTable, s *Steering) *netlink.U32 {
	keys := addrKeys(at.addr, true)
	if fam.v6 {
		keys = append(keys, ipv6FragKey())
	} else {
		keys = append(keys, udpKey(false))
	}
	return &netlink.U32{FilterAttrs: ifc.filterAttrs(fam, fam.entry|uint32(at.slot*entryNodes+3)),
		Sel: sel(u32Terminal, keys...), Actions: []netlink.Action{s.redirect()}}
}

// dropAddr deletes an address's filters and its hash table (the table is
// busy until the link filter is released: del retries).
func (ifc *iface) dropAddr(fam *family, at *addrTable) error {
	base := fam.entry | uint32(at.slot*entryNodes+1)
	var errs []error
	for h := base; h < base+entryNodes; h++ {
		errs = append(errs, ifc.del(fam, h))
	}
	errs = append(errs, ifc.del(fam, at.ht))
	fam.slots[at.slot] = false
	delete(fam.addrs, at.addr)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("remove the filters of %v: %w", at.addr, err)
	}
	return nil
}

// nodeHandle picks a free filter handle in the flow's bucket.
func (at *addrTable) nodeHandle(f qp.Flow) (uint32, error) {
	first, last := uint32(0x800), uint32(nodeLast)
	if f.Src.IsValid() {
		first, last = nodeFirst, fiveTupleLast
	}
	bucket := uint32(f.Dst.Port() & 0xff)
	for n := first; n <= last; n++ {
		h := at.ht | bucket<<12 | n
		if !at.used[h] {
			return h, nil
		}
	}
	return 0, fmt.Errorf("bucket %d of %v is full", bucket, at.addr)
}

func nsIdentity(ns netns.NsHandle) (dev, ino uint64, err error) {
	var st unix.Stat_t
	if ns.IsOpen() {
		err = unix.Fstat(int(ns), &st)
	} else {
		err = unix.Stat("/proc/thread-self/ns/net", &st)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("identify the network namespace: %w", err)
	}
	return st.Dev, st.Ino, nil
}

// gone reports errors meaning the object (or its whole device) no longer
// exists: a deletion has nothing left to do.
func gone(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENODEV)
}
