package ring

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

// Endpoint is a UDP socket bound on a ring: the engine side of its two
// queues, its steering entries, its kernel port reservation and its
// multicast memberships. Its user side is either in this process (Send and
// Recv, see inproc.go) or in a client process that maps the same queues.
type Endpoint struct {
	r     *Ring
	local netip.AddrPort
	peer  atomic.Pointer[netip.AddrPort]
	opts  atomic.Pointer[HeaderOptions]
	resv  *route.Reservation
	// ov is the VXLAN overlay the endpoint is bound on (nil: the
	// interface itself).
	ov *overlay
	// steered lists the destination addresses Bind steered to the ring.
	steered []netip.Addr
	// members is the endpoint's multicast memberships, replaced as a whole
	// (copy-on-write) so the engine reads it without locks.
	members atomic.Pointer[memberships]

	// Engine side of the queues: consumer of TX, producer of RX.
	etx, erx *shmq.Queue
	// wake wakes the user: RX data for a waiting reader, TX room for a
	// waiting writer.
	wake Waker
	// activity is Queues.Activity (nil: none); see noteActivity.
	activity *atomic.Uint64
	// lane and slot are where a client user announces TX work (nil lane:
	// the user is in this process and announces through announce).
	lane *Lane
	slot int
	// announced: queued in the ring's in-process announcements, linked
	// through nextAnnounced.
	announced     atomic.Bool
	nextAnnounced atomic.Pointer[Endpoint]
	// retired is set when the endpoint leaves the ring; the engine drops
	// its references to it.
	retired atomic.Bool
	// user is the in-process user side; nil when the user is a client.
	user *sockq.Conn

	// mu serializes membership changes and Close (never held by the engine).
	mu     sync.Mutex
	closed atomic.Bool
	// broken is set by the engine when a queue turned out corrupt.
	broken atomic.Bool
	// adopted: handed over by a previous daemon, and the kernel may hold
	// datagrams for it on its reservation (until Ring.Activate).
	adopted atomic.Bool

	// rate is the pacing rate SetPacing asked for (nil: unpaced).
	rate atomic.Pointer[pacing.Rate]

	// engine-owned
	touched bool
	stalled bool
	// active: in the engine's list of endpoints to visit.
	active bool
	pace   paceState
	cls    epClass

	stats EndpointStats
}

// EndpointStats are an endpoint's counters.
type EndpointStats struct {
	RXPackets, RXBytes atomic.Uint64
	// RXDropped counts datagrams dropped because the RX queue was full.
	RXDropped atomic.Uint64
	// RXBatches counts times the engine published datagrams to the RX
	// queue, RXWakeups those of them that found the user asleep and woke
	// it (a poll miss, in VMA's terms).
	RXBatches, RXWakeups atomic.Uint64
	TXPackets, TXBytes   atomic.Uint64
	// TXUnreachable counts datagrams dropped because the next hop could not
	// be resolved; TXErrors those that could not be encoded or sent.
	TXUnreachable, TXErrors atomic.Uint64
	// TXWakeups counts times the engine freed TX room for a user that was
	// waiting for it (the user's send would have blocked).
	TXWakeups atomic.Uint64
}

// HeaderOptions are the per-socket header fields of transmitted datagrams.
type HeaderOptions struct {
	// TTL is the IPv4 TTL / IPv6 hop limit of unicast datagrams (IP_TTL,
	// IPV6_UNICAST_HOPS); default 64.
	TTL uint8
	// MulticastTTL is the same for multicast destinations
	// (IP_MULTICAST_TTL, IPV6_MULTICAST_HOPS); default 1, as in Linux.
	MulticastTTL uint8
	// TOS is the IPv4 TOS byte / IPv6 traffic class (IP_TOS, IPV6_TCLASS).
	TOS uint8
	// Priority is the socket priority (sk_prio) that picks the traffic
	// class (SO_PRIORITY; IP_TOS sets it too, through the kernel's fixed
	// ToS map, as Linux does).
	Priority uint32
	// MulticastLoop delivers multicast datagrams sent by this socket to
	// local members too (IP_MULTICAST_LOOP); default true, as in Linux.
	MulticastLoop bool
}

// DefaultHeaderOptions are the options of a new endpoint.
var DefaultHeaderOptions = HeaderOptions{TTL: 64, MulticastTTL: 1, MulticastLoop: true}

// membership is one joined group; sources, when not empty, is the
// source-specific filter (only datagrams from these sources are accepted).
type membership struct {
	group   netip.Addr
	sources []netip.Addr
}

type memberships struct{ groups []membership }

// accepts reports whether a datagram from src to group passes the filter.
func (m *memberships) accepts(group, src netip.Addr) bool {
	for i := range m.groups {
		if m.groups[i].group == group {
			return len(m.groups[i].sources) == 0 || slices.Contains(m.groups[i].sources, src)
		}
	}
	return false
}

// BindOptions modify Bind.
type BindOptions struct {
	// ReuseAddr lets several endpoints bind one port (SO_REUSEADDR), as
	// multicast receivers do. Unicast datagrams go to the most recently
	// bound of them; multicast datagrams to every member.
	ReuseAddr bool
	// Queues supplies the queues' memory and the user side's waiters (the
	// daemon: a client's memfd). Nil: the ring allocates them in this
	// process and the endpoint's Send and Recv methods are its user side.
	Queues *Queues
}

// Queues is the memory of a client socket's queues in its session memory
// and how its user and the engine wake each other. The memory stays the
// caller's.
type Queues struct {
	// TX and RX are freshly formatted shmq queues of Size(QueueBytes)
	// bytes (the TX queue with its consumer-waiting flag armed): the user
	// produces into TX and consumes from RX. The engine does not read them
	// until the user announces work, so an idle socket's pages stay out of
	// the daemon's memory.
	TX, RX     []byte
	QueueBytes int
	// Wake wakes the user (SessionWaker).
	Wake Waker
	// Lane and Slot are where the user announces TX work (AddLane).
	Lane *Lane
	Slot int
	// Activity, if set, is bumped by the engine once per burst in which it
	// counts anything in the endpoint's stats (datagrams received, dropped,
	// sent or refused) or breaks it: a publisher of the counters of many
	// endpoints sharing one Activity reads them again only when it moved.
	Activity *atomic.Uint64
}

// BindUDP binds an in-process UDP endpoint to addr (see Bind).
func (r *Ring) BindUDP(addr netip.AddrPort) (*Endpoint, error) {
	return r.Bind(addr, BindOptions{})
}

// Bind binds a UDP endpoint to addr on the ring. addr's IP must be one of
// the interface's addresses, the unspecified address of its family (all of
// them) or a multicast group (received once joined); port 0 picks a free
// port. The port is also reserved in the
// kernel with an ordinary socket so no other program can take it.
func (r *Ring) Bind(addr netip.AddrPort, opts BindOptions) (_ *Endpoint, err error) {
	addr = unmap(addr)
	fail := func(err error) error {
		return fmt.Errorf("ring %s/%d: bind %v: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
	}
	if !addr.Addr().IsValid() {
		return nil, fail(unix.EINVAL)
	}
	ip := addr.Addr()
	var (
		dsts []netip.Addr
		vx   *netlink.Vxlan
	)
	if ip.IsUnspecified() {
		if dsts, err = r.interfaceAddrs(ip.Is4()); err != nil {
			return nil, fail(err)
		}
		if len(dsts) == 0 {
			return nil, fail(fmt.Errorf("%s has no %s address to receive on: %w", r.cfg.Interface, familyName(ip), unix.EADDRNOTAVAIL))
		}
	} else if ip.IsMulticast() {
		// Bound to a group: it receives nothing until it joins it
		// (JoinGroup steers the group then).
	} else {
		local, err := r.ownsLocal(ip)
		if err != nil {
			return nil, fail(err)
		}
		if !local {
			if vx, err = r.overlayOf(ip); err != nil {
				return nil, fail(err)
			}
			if vx == nil {
				return nil, fail(fmt.Errorf("%v is not an address of %s or of a VXLAN device over it: %w", ip, r.cfg.Interface, unix.EADDRNOTAVAIL))
			}
		}
		dsts = []netip.Addr{ip}
	}
	network := "udp6"
	if ip.Is4() {
		network = "udp4"
	}
	ep := &Endpoint{r: r}
	ep.opts.Store(&DefaultHeaderOptions)
	ep.members.Store(&memberships{})
	defer func() {
		if err != nil {
			ep.release()
		}
	}()
	if err := ep.initQueues(opts.Queues, r.cfg.QueueBytes, true); err != nil {
		return nil, fail(err)
	}
	if ep.lane != nil && !ep.lane.valid(ep.slot) {
		return nil, fail(fmt.Errorf("slot %d is outside its lane: %w", ep.slot, unix.EINVAL))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errRingClosed
	}
	if vx != nil {
		if ep.ov, err = r.acquireOverlayLocked(vx); err != nil {
			return nil, fail(err)
		}
		defer func() {
			if err != nil {
				r.closeOverlay(r.releaseOverlayLocked(ep.ov))
			}
		}()
	}
	if ep.resv, err = route.ReservePort(r.ns, network, addr, route.ReserveOptions{ReuseAddr: opts.ReuseAddr}); err != nil {
		return nil, fail(err)
	}
	ep.local = unmap(ep.resv.Addr())
	ep.steered = dsts
	var added []qp.Flow
	for _, d := range dsts {
		f := ep.flow(netip.AddrPortFrom(d, ep.local.Port()))
		if err := r.addFlowLocked(f); err != nil {
			for _, a := range added {
				r.delFlowLocked(a)
			}
			return nil, fail(fmt.Errorf("steer flow: %w", err))
		}
		added = append(added, f)
	}
	if !ip.IsMulticast() { // a group's receive key comes with JoinGroup
		r.table.Store(r.table.Load().withKey(ep.local, ep))
	}
	r.eps[ep] = struct{}{}
	r.nEps.Store(int64(len(r.eps)))
	if ep.lane != nil {
		ep.lane.setEndpoint(ep.slot, ep)
	}
	// One visit if records were queued before the bind: the client
	// announced them while the engine did not know the slot yet. Waking
	// the engine for every bind would cost a third of the daemon's CPU
	// while a client opens thousands of sockets.
	if ep.lane == nil || ep.lane.takeEarly(ep.slot) {
		r.announce(ep)
	}
	return ep, nil
}

// noteActivity tells the endpoint's publisher (Queues.Activity) that its
// counters moved.
func (ep *Endpoint) noteActivity() {
	if ep.activity != nil {
		ep.activity.Add(1)
	}
}

func familyName(ip netip.Addr) string {
	if ip.Is4() {
		return "IPv4"
	}
	return "IPv6"
}

func unmap(ap netip.AddrPort) netip.AddrPort {
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())
}

// initQueues sets up the endpoint's queues: q's (fresh: formatted and
// never used, so their pages need not be read; else queues in use, as an
// adopted endpoint's are) or, with q nil, in-process ones.
func (ep *Endpoint) initQueues(q *Queues, capacity int, fresh bool) error {
	var err error
	if q != nil {
		ep.wake, ep.lane, ep.slot, ep.activity = q.Wake, q.Lane, q.Slot, q.Activity
		attach := func(mem []byte) (*shmq.Queue, error) {
			if fresh {
				return shmq.AttachFresh(mem, q.QueueBytes)
			}
			return shmq.Attach(mem)
		}
		if ep.etx, err = attach(q.TX); err != nil {
			return fmt.Errorf("TX queue: %w", err)
		}
		if ep.erx, err = attach(q.RX); err != nil {
			return fmt.Errorf("RX queue: %w", err)
		}
		return nil
	}
	size := shmq.Size(capacity)
	txMem, rxMem := make([]byte, size), make([]byte, size)
	var txq, rxq *shmq.Queue
	if txq, err = shmq.Init(txMem, capacity); err != nil {
		return fmt.Errorf("TX queue: %w", err)
	}
	if rxq, err = shmq.Init(rxMem, capacity); err != nil {
		return fmt.Errorf("RX queue: %w", err)
	}
	if ep.etx, err = shmq.Attach(txMem); err != nil {
		return fmt.Errorf("TX queue: %w", err)
	}
	if ep.erx, err = shmq.Attach(rxMem); err != nil {
		return fmt.Errorf("RX queue: %w", err)
	}
	// Armed from the start, as a client's TX queue is: the first datagram
	// announces the endpoint.
	ep.etx.ArmReadWait()
	rxSig, txSig := shmq.NewSignal(), shmq.NewSignal()
	ep.wake = multiWaker{rxSig, txSig}
	ep.user = sockq.New(txq, rxq, rxSig, txSig, inprocAnnouncer{ep}, ep.r.userPolicy)
	return nil
}

// release frees the reservation and the in-process user (steering and
// table entries are removed by the caller).
func (ep *Endpoint) release() {
	if ep.resv != nil {
		_ = ep.resv.Close()
	}
	if ep.user != nil {
		ep.user.Close()
	}
}

// LocalAddr returns the bound address (with the port the kernel picked for
// port 0).
func (ep *Endpoint) LocalAddr() netip.AddrPort { return ep.local }

// Connect sets the default destination and, like a connected kernel UDP
// socket, makes the endpoint accept datagrams from peer only. The zero
// AddrPort disconnects.
func (ep *Endpoint) Connect(peer netip.AddrPort) error {
	if peer.IsValid() {
		peer = unmap(peer)
		if peer.Addr().Is4() != ep.local.Addr().Is4() {
			return unixErr(unix.EAFNOSUPPORT, "connect %v: endpoint is bound to %v", peer, ep.local)
		}
		if peer.Port() == 0 || peer.Addr().IsUnspecified() {
			return unixErr(unix.EINVAL, "connect %v: need an address and a port", peer)
		}
	}
	ep.peer.Store(&peer)
	return nil
}

// Peer returns the connected peer (zero if not connected).
func (ep *Endpoint) Peer() netip.AddrPort {
	if p := ep.peer.Load(); p != nil {
		return *p
	}
	return netip.AddrPort{}
}

// SetHeaderOptions sets the header fields of datagrams sent from now on.
func (ep *Endpoint) SetHeaderOptions(o HeaderOptions) { ep.opts.Store(&o) }

// HeaderOptions returns the current header options.
func (ep *Endpoint) HeaderOptions() HeaderOptions { return *ep.opts.Load() }

// Stats returns the endpoint's counters.
func (ep *Endpoint) Stats() *EndpointStats { return &ep.stats }

// Membership is one multicast group an endpoint receives; Sources is the
// source-specific filter (empty: any source).
type Membership struct {
	Group   netip.Addr
	Sources []netip.Addr
}

// Memberships returns the endpoint's multicast memberships (a copy; safe
// from any goroutine).
func (ep *Endpoint) Memberships() []Membership {
	ms := ep.members.Load()
	out := make([]Membership, len(ms.groups))
	for i, m := range ms.groups {
		out[i] = Membership{Group: m.group, Sources: slices.Clone(m.sources)}
	}
	return out
}

// Broken reports whether the endpoint's queues failed (a corrupt queue, or
// the ring's engine stopped): the ring no longer serves it.
func (ep *Endpoint) Broken() bool { return ep.broken.Load() }

// JoinGroup makes the endpoint receive datagrams sent to group on its port.
// A valid source makes the membership source-specific (that source only;
// several calls add sources). The kernel joins the group on the ring's
// interface, so IGMP/MLD reports go out and the NIC accepts the group's MAC.
func (ep *Endpoint) JoinGroup(group, source netip.Addr) error {
	group, source = group.Unmap(), source.Unmap()
	if ep.ov != nil {
		return unixErr(unix.EOPNOTSUPP, "join %v: multicast on the VXLAN overlay %s is not carried by bypassd; bind an address of %s", group, ep.ov.name, ep.r.cfg.Interface)
	}
	if !group.IsMulticast() || group.Is4() != ep.local.Addr().Is4() {
		return unixErr(unix.EINVAL, "join %v on %v: not a multicast group of the socket's family", group, ep.local)
	}
	if !ep.local.Addr().IsUnspecified() && ep.local.Addr() != group {
		return unixErr(unix.EINVAL, "join %v: bound to %v; bind the unspecified address or the group to receive it", group, ep.local.Addr())
	}
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed.Load() {
		return errEndpointClosed
	}
	old := ep.members.Load()
	i := slices.IndexFunc(old.groups, func(m membership) bool { return m.group == group })
	if i >= 0 && (!source.IsValid() || len(old.groups[i].sources) == 0 || slices.Contains(old.groups[i].sources, source)) {
		if source.IsValid() != (len(old.groups[i].sources) > 0) {
			return unixErr(unix.EINVAL, "join %v: cannot mix any-source and source-specific membership", group)
		}
		return unixErr(unix.EADDRINUSE, "join %v source %v: already a member", group, source)
	}
	if err := ep.resv.JoinGroup(group, source, ep.r.ifindex); err != nil {
		return fmt.Errorf("join %v on %s: %w", group, ep.r.cfg.Interface, err)
	}
	n := &memberships{groups: slices.Clone(old.groups)}
	if i >= 0 {
		n.groups[i].sources = append(slices.Clone(n.groups[i].sources), source)
		ep.members.Store(n)
		return nil
	}
	m := membership{group: group}
	if source.IsValid() {
		m.sources = []netip.Addr{source}
	}
	n.groups = append(n.groups, m)
	r := ep.r
	r.mu.Lock()
	defer r.mu.Unlock()
	key := netip.AddrPortFrom(group, ep.local.Port())
	if err := r.addFlowLocked(r.udpFlow(key)); err != nil {
		_ = ep.resv.LeaveGroup(group, source, ep.r.ifindex)
		return fmt.Errorf("join %v: steer group: %w", group, err)
	}
	ep.members.Store(n)
	r.table.Store(r.table.Load().withKey(key, ep))
	return nil
}

// LeaveGroup ends a membership (source-specific when source is valid).
func (ep *Endpoint) LeaveGroup(group, source netip.Addr) error {
	group, source = group.Unmap(), source.Unmap()
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed.Load() {
		return errEndpointClosed
	}
	old := ep.members.Load()
	i := slices.IndexFunc(old.groups, func(m membership) bool { return m.group == group })
	if i < 0 || (source.IsValid() && !slices.Contains(old.groups[i].sources, source)) {
		return unixErr(unix.EADDRNOTAVAIL, "leave %v source %v: not a member", group, source)
	}
	n := &memberships{groups: slices.Clone(old.groups)}
	if source.IsValid() && len(old.groups[i].sources) > 1 {
		n.groups[i].sources = slices.DeleteFunc(slices.Clone(old.groups[i].sources), func(a netip.Addr) bool { return a == source })
		ep.members.Store(n)
		return ep.resv.LeaveGroup(group, source, ep.r.ifindex)
	}
	n.groups = slices.Delete(n.groups, i, i+1)
	ep.dropGroup(old.groups[i], n)
	return nil
}

// dropGroup removes one whole membership: table, steering, kernel.
func (ep *Endpoint) dropGroup(m membership, next *memberships) {
	r := ep.r
	key := netip.AddrPortFrom(m.group, ep.local.Port())
	r.mu.Lock()
	r.table.Store(r.table.Load().withoutKey(key, ep))
	r.delFlowLocked(r.udpFlow(key))
	r.mu.Unlock()
	ep.members.Store(next)
	sources := m.sources
	if len(sources) == 0 {
		sources = []netip.Addr{{}}
	}
	for _, s := range sources {
		if err := ep.resv.LeaveGroup(m.group, s, r.ifindex); err != nil {
			r.log.Warn("kernel leave failed", zap.Stringer("group", m.group), zap.Error(err))
		}
	}
}

var errEndpointClosed = fmt.Errorf("endpoint closed: %w", os.ErrClosed)

// Close unbinds the endpoint: steering entries, memberships and the port
// reservation are released, and a blocked in-process Send or Recv returns
// net.ErrClosed. The queues' memory is not touched after Close returns.
func (ep *Endpoint) Close() error {
	ep.mu.Lock()
	defer ep.mu.Unlock()
	if ep.closed.Swap(true) {
		return nil
	}
	if ep.user != nil {
		ep.user.Close()
	}
	r := ep.r
	ms := ep.members.Load()
	for _, m := range ms.groups {
		ep.dropGroup(m, &memberships{})
	}
	r.retire(ep)
	ep.release()
	return nil
}

// retireBatch is a set of endpoints leaving the table together.
type retireBatch struct {
	eps  map[*Endpoint]bool
	done chan struct{}
}

// retire removes ep from the table and from steering, and returns once the
// engine holds no reference to it. Endpoints closed at the same time (a
// client with a thousand sockets dies) share one table copy and one wait for
// the engine: closing them one by one costs a copy of the table each.
func (r *Ring) retire(ep *Endpoint) {
	ep.retired.Store(true)
	if ep.lane != nil {
		ep.lane.setEndpoint(ep.slot, nil)
	}
	r.retireMu.Lock()
	if r.retiring == nil {
		r.retiring = &retireBatch{eps: map[*Endpoint]bool{}, done: make(chan struct{})}
	}
	mine := r.retiring
	mine.eps[ep] = true
	if r.retireBusy {
		// Another closer is working; it takes this batch next.
		r.retireMu.Unlock()
		<-mine.done
		return
	}
	r.retireBusy = true
	for r.retiring != nil {
		b := r.retiring
		r.retiring = nil
		r.retireMu.Unlock()
		r.mu.Lock()
		var keys []netip.AddrPort
		for e := range b.eps {
			if !e.local.Addr().IsMulticast() {
				keys = append(keys, e.local)
			}
			delete(r.eps, e)
		}
		r.nEps.Store(int64(len(r.eps)))
		r.table.Store(r.table.Load().withoutEndpoints(b.eps, keys...))
		r.retireGen.Add(1)
		// Steering goes first so no new frame is redirected for the port.
		var (
			flows []qp.Flow
			gone  []*overlay
		)
		for e := range b.eps {
			for _, d := range e.steered {
				flows = append(flows, e.flow(netip.AddrPortFrom(d, e.local.Port())))
			}
			if e.ov != nil {
				if ov := r.releaseOverlayLocked(e.ov); ov != nil {
					gone = append(gone, ov)
				}
			}
		}
		r.delFlowsLocked(flows)
		r.mu.Unlock()
		r.sync()
		for _, ov := range gone {
			r.closeOverlay(ov)
		}
		close(b.done)
		r.retireMu.Lock()
	}
	r.retireBusy = false
	r.retireMu.Unlock()
}

func (r *Ring) udpFlow(dst netip.AddrPort) qp.Flow {
	return qp.Flow{Proto: unix.IPPROTO_UDP, Dst: dst}
}

// addFlowLocked steers f to this ring, sharing the entry with endpoints that
// already use it (reuse-address binds, common groups). Holds r.mu.
func (r *Ring) addFlowLocked(f qp.Flow) error {
	if r.flowRefs[f] == 0 {
		var steers []qp.Steering
		for _, s := range r.steeringsLocked() {
			if carries(s, f) {
				steers = append(steers, s)
			}
		}
		for i, s := range steers {
			if err := s.AddFlow(f); err != nil {
				for _, added := range steers[:i] {
					_ = added.DeleteFlow(f)
				}
				if errors.Is(err, unix.ENOSPC) {
					r.stats.FlowsFull.Add(1)
				}
				return err
			}
		}
	}
	r.flowRefs[f]++
	return nil
}

// delFlowLocked drops one reference to f, removing the entry with the last.
func (r *Ring) delFlowLocked(f qp.Flow) { r.delFlowsLocked([]qp.Flow{f}) }

// flowsDeleter is implemented by steerings that remove many flows faster
// together than one by one (tc: a whole address's hash table at once).
type flowsDeleter interface {
	DeleteFlows(flows []qp.Flow) error
}

// delFlowsLocked drops one reference to each flow and removes those that
// lost their last, from one steering after the other (the fast path's
// first, so its entries go as fast as without a fallback).
func (r *Ring) delFlowsLocked(flows []qp.Flow) {
	var gone []qp.Flow
	for _, f := range flows {
		n := r.flowRefs[f]
		switch {
		case n == 0:
		case n > 1:
			r.flowRefs[f] = n - 1
		default:
			delete(r.flowRefs, f)
			gone = append(gone, f)
		}
	}
	if len(gone) == 0 {
		return
	}
	for _, s := range r.steeringsLocked() {
		var mine []qp.Flow
		for _, f := range gone {
			if carries(s, f) {
				mine = append(mine, f)
			}
		}
		if bd, ok := s.(flowsDeleter); ok && len(mine) > 1 {
			if err := bd.DeleteFlows(mine); err != nil {
				r.log.Warn("delete steering entries failed", zap.Int("flows", len(mine)), zap.Error(err))
			}
			continue
		}
		for _, f := range mine {
			if err := s.DeleteFlow(f); err != nil {
				r.log.Warn("delete steering entry failed", zap.Stringer("flow", f), zap.Error(err))
			}
		}
	}
}
