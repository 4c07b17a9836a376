package route

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// Next is everything the ring needs to build Ethernet/IP/UDP headers for one
// destination.
type Next struct {
	Ifindex        int
	Src            netip.Addr // preferred source the kernel picks (route get)
	Gateway        netip.Addr // zero if on-link (and for multicast/broadcast)
	SrcMAC, DstMAC net.HardwareAddr
	MTU            int // route MTU if set (capped by the link MTU), else link MTU
}

func (n Next) clone() Next {
	n.SrcMAC = append(net.HardwareAddr(nil), n.SrcMAC...)
	n.DstMAC = append(net.HardwareAddr(nil), n.DstMAC...)
	return n
}

const (
	// maxCacheEntries bounds memory when a ring talks to very many peers
	// (a server answering many clients); when full the cache starts over.
	maxCacheEntries = 1 << 16
	// netlinkTimeout bounds each request to the kernel so a wedged netlink
	// socket cannot hang the engine.
	netlinkTimeout = 5 * time.Second
	// repokeInterval spaces out repeated NTF_USE pokes for a neighbour the
	// kernel has given up on (FAILED) while the caller is still willing to wait.
	repokeInterval = time.Second
	// recheckInterval re-reads the neighbour table while waiting, a safety net
	// should a notification be lost.
	recheckInterval = time.Second
	// maxUnstable is how often a neighbour may change under a resolution
	// before we hand out the latest answer and bump the generation instead.
	maxUnstable = 4
	// subscriptionBuffer is the receive buffer asked for the notification
	// socket; an overrun is survivable (the cache is dropped) but costly.
	subscriptionBuffer = 4 << 20
)

// Resolver answers Resolve for one interface of one network namespace and
// caches the answers until rtnetlink says they may have changed.
//
// It is safe for concurrent use.
type Resolver struct {
	ifindex int
	log     *zap.Logger
	gen     atomic.Uint64

	// hmu guards h against Close while a request is running on it.
	hmu     sync.RWMutex
	h       *netlink.Handle
	hClosed bool

	sub       *nl.NetlinkSocket
	done      chan struct{}
	closeOnce sync.Once
	wg        sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	cache   map[netip.Addr]Next
	nh      map[netip.Addr]*nhEntry
	pending map[netip.Addr]int // destinations being resolved (not yet cached)
	self    linkState          // our interface as last seen
	others  map[int]uint32     // other interfaces' routing-relevant flags
	ifname  atomic.Pointer[string]
}

// nhEntry tracks one next hop (a neighbour on our interface) that is cached
// or being resolved.
type nhEntry struct {
	mac  net.HardwareAddr // the MAC handed out from the cache; nil if none
	seq  uint64           // bumped by every kernel notification about it
	wake chan struct{}    // closed (and replaced) on every notification
	refs int              // resolutions in progress
}

// linkState is what of our interface can change a Next.
type linkState struct {
	mtu   int
	mac   string
	flags uint32
}

// routingFlags are the interface flags whose change can change routing.
const routingFlags = unix.IFF_UP | unix.IFF_RUNNING | unix.IFF_LOWER_UP

// NewResolver watches one namespace (ns is not closed by the resolver;
// netns.None() means the current one) and one interface, which must exist and
// be an Ethernet interface.
func NewResolver(ns netns.NsHandle, ifindex int, log *zap.Logger) (*Resolver, error) {
	if ifindex <= 0 {
		return nil, fmt.Errorf("route: invalid interface index %d: pass the index of the ring's interface", ifindex)
	}
	if log == nil {
		log = zap.NewNop()
	}
	r := &Resolver{
		ifindex: ifindex,
		log:     log.With(zap.Int("ifindex", ifindex)),
		done:    make(chan struct{}),
		cache:   make(map[netip.Addr]Next),
		nh:      make(map[netip.Addr]*nhEntry),
		pending: make(map[netip.Addr]int),
		others:  make(map[int]uint32),
	}
	r.gen.Store(1)
	name := fmt.Sprintf("ifindex %d", ifindex)
	r.ifname.Store(&name)

	h, err := netlink.NewHandleAt(ns, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("route: open rtnetlink in namespace %s: %w (bypassd needs CAP_NET_ADMIN)", ns, err)
	}
	if err := h.SetSocketTimeout(netlinkTimeout); err != nil {
		h.Close()
		return nil, fmt.Errorf("route: set rtnetlink timeout: %w", err)
	}
	r.h = h

	// Subscribe before the first read of the tables so that no change can
	// fall between what we read and what we are told.
	err = inNS(ns, func() error {
		s, err := nl.Subscribe(unix.NETLINK_ROUTE,
			unix.RTNLGRP_LINK, unix.RTNLGRP_NEIGH,
			unix.RTNLGRP_IPV4_IFADDR, unix.RTNLGRP_IPV6_IFADDR,
			unix.RTNLGRP_IPV4_ROUTE, unix.RTNLGRP_IPV6_ROUTE,
			unix.RTNLGRP_IPV4_RULE, unix.RTNLGRP_IPV6_RULE,
			unix.RTNLGRP_NEXTHOP)
		if err != nil {
			return err
		}
		r.sub = s
		return nil
	})
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("route: subscribe to rtnetlink notifications in namespace %s: %w", ns, err)
	}
	// A big buffer makes overruns rare; SO_RCVBUFFORCE needs CAP_NET_ADMIN,
	// otherwise the kernel caps at net.core.rmem_max, which is still fine.
	if err := r.sub.SetReceiveBufferSize(subscriptionBuffer, true); err != nil {
		_ = r.sub.SetReceiveBufferSize(subscriptionBuffer, false)
	}

	fail := func(err error) (*Resolver, error) {
		r.sub.Close()
		h.Close()
		return nil, err
	}
	link, err := h.LinkByIndex(ifindex)
	if err != nil {
		return fail(fmt.Errorf("route: interface index %d not found in namespace %s: %w", ifindex, ns, err))
	}
	attrs := link.Attrs()
	if attrs.EncapType != "" && attrs.EncapType != "ether" {
		return fail(fmt.Errorf("route: interface %s is %q, not Ethernet: the ring builds Ethernet frames, use an Ethernet interface", attrs.Name, attrs.EncapType))
	}
	if attrs.RawFlags&unix.IFF_NOARP != 0 {
		return fail(fmt.Errorf("route: interface %s has ARP disabled (NOARP): next-hop MACs cannot be learned; enable it with `ip link set %s arp on`", attrs.Name, attrs.Name))
	}
	r.setName(attrs.Name)
	r.self = stateOf(attrs)
	links, err := h.LinkList()
	if err != nil {
		return fail(fmt.Errorf("route: list interfaces in namespace %s: %w", ns, err))
	}
	for _, l := range links {
		if a := l.Attrs(); a.Index != ifindex {
			r.others[a.Index] = a.RawFlags & routingFlags
		}
	}

	r.wg.Add(1)
	go r.watch()
	return r, nil
}

func stateOf(a *netlink.LinkAttrs) linkState {
	return linkState{mtu: a.MTU, mac: string(a.HardwareAddr), flags: a.RawFlags & routingFlags}
}

func (r *Resolver) setName(name string) { r.ifname.Store(&name) }
func (r *Resolver) name() string        { return *r.ifname.Load() }

// Generation increments whenever cached information may have changed
// (neighbour MAC change, route/address/rule change, link MTU/MAC/state
// change). It starts at 1. To never miss a change, read it before Resolve and
// tag what you build from the answer with that value; rebuild when it
// differs. It is one atomic load.
func (r *Resolver) Generation() uint64 { return r.gen.Load() }

// LinkMTU is the interface's MTU as last notified (a change bumps the
// generation).
func (r *Resolver) LinkMTU() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.self.mtu
}

// Close stops the notification goroutine and releases the netlink sockets.
// Resolve calls waiting for a neighbour return an error. Close is idempotent.
func (r *Resolver) Close() error {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		r.mu.Unlock()
		close(r.done)
		r.sub.Close() // wakes the watcher blocked in Receive
		r.wg.Wait()
		r.hmu.Lock()
		r.hClosed = true
		r.h.Close()
		r.hmu.Unlock()
	})
	return nil
}

var errClosed = fmt.Errorf("route: resolver is closed: %w", net.ErrClosed)

// withHandle runs fn on the netlink handle unless the resolver is closed.
func (r *Resolver) withHandle(fn func(h *netlink.Handle) error) error {
	r.hmu.RLock()
	defer r.hmu.RUnlock()
	if r.hClosed {
		return errClosed
	}
	return fn(r.h)
}

// Resolve returns the next hop for dst via the resolver's interface.
//
// Answers are cached until a netlink route/neighbour/link/address update of
// the namespace may have changed them. If the kernel routes dst via another
// interface, the error names it and wraps unix.ENETUNREACH (the ring only
// transmits on its own interface). A missing neighbour is resolved through
// the kernel (ARP/ND), waiting at most until ctx is done; no answer by then
// is an error wrapping unix.EHOSTUNREACH. Multicast destinations and
// broadcasts (limited and directed) get a computed MAC without neighbour
// lookup; they always leave through the resolver's interface. An IPv6
// link-local destination is taken to be on the resolver's interface; a zone
// naming another interface is an error.
func (r *Resolver) Resolve(ctx context.Context, dst netip.Addr) (Next, error) {
	if !dst.IsValid() {
		return Next{}, fmt.Errorf("route: resolve: no destination address given: %w", unix.EINVAL)
	}
	if err := r.checkZone(dst); err != nil {
		return Next{}, err
	}
	dst = dst.WithZone("").Unmap()
	if dst.IsUnspecified() {
		return Next{}, fmt.Errorf("route: resolve %s: the unspecified address is not a destination: %w", dst, unix.EINVAL)
	}
	if dst.Is6() && dst.IsInterfaceLocalMulticast() {
		return Next{}, fmt.Errorf("route: resolve %s: interface-local multicast never leaves the host: %w", dst, unix.ENETUNREACH)
	}

	g0 := r.gen.Load()
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return Next{}, errClosed
	}
	if n, ok := r.cache[dst]; ok {
		r.mu.Unlock()
		return n.clone(), nil
	}
	// Registered before the first query: a route change touching dst while
	// it is resolved must bump the generation although dst is not cached yet.
	r.pending[dst]++
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		if r.pending[dst]--; r.pending[dst] == 0 {
			delete(r.pending, dst)
		}
		r.mu.Unlock()
	}()

	n, err := r.resolve(ctx, dst, g0)
	if err != nil {
		return Next{}, err
	}
	return n.clone(), nil
}

// checkZone accepts a zone only if it names the resolver's interface.
func (r *Resolver) checkZone(dst netip.Addr) error {
	z := dst.Zone()
	if z == "" || z == r.name() || z == strconv.Itoa(r.ifindex) {
		return nil
	}
	return fmt.Errorf("route: resolve %s: the zone names another interface than the ring's %s: %w", dst, r.name(), unix.ENETUNREACH)
}

// needsOif reports destinations whose interface is chosen by the sender, not
// by the routing table: multicast, limited broadcast and IPv6 link-local.
func needsOif(dst netip.Addr) bool {
	return dst.IsMulticast() || dst == limitedBroadcast || (dst.Is6() && dst.IsLinkLocalUnicast())
}

func (r *Resolver) resolve(ctx context.Context, dst netip.Addr, g0 uint64) (Next, error) {
	var (
		link   netlink.Link
		routes []netlink.Route
	)
	err := r.withHandle(func(h *netlink.Handle) error {
		var err error
		link, err = h.LinkByIndex(r.ifindex)
		if err != nil {
			return fmt.Errorf("route: interface index %d is gone from the namespace (was %s): %w", r.ifindex, r.name(), err)
		}
		opts := &netlink.RouteGetOptions{}
		if needsOif(dst) {
			opts.OifIndex = r.ifindex
		}
		routes, err = h.RouteGetWithOptions(dst.AsSlice(), opts)
		if err != nil {
			msg := fmt.Sprintf("route: the kernel has no usable route to %s (none, or a blackhole/unreachable/prohibit route; check `ip route get %s`)", dst, dst)
			if errIs(err, unix.ENETUNREACH, unix.EHOSTUNREACH) {
				return fmt.Errorf("%s: %w", msg, err)
			}
			return fmt.Errorf("%s: %w (%w)", msg, unix.ENETUNREACH, err)
		}
		return nil
	})
	if err != nil {
		return Next{}, err
	}
	attrs := link.Attrs()
	r.setName(attrs.Name)
	if attrs.RawFlags&unix.IFF_UP == 0 {
		return Next{}, fmt.Errorf("route: interface %s is down; bring it up with `ip link set %s up`: %w", attrs.Name, attrs.Name, unix.ENETDOWN)
	}
	if len(routes) == 0 {
		return Next{}, fmt.Errorf("route: the kernel returned no route to %s: %w", dst, unix.ENETUNREACH)
	}
	rt := routes[0]
	if err := r.checkRoute(dst, rt); err != nil {
		return Next{}, err
	}

	n := Next{Ifindex: r.ifindex, SrcMAC: attrs.HardwareAddr, MTU: attrs.MTU}
	if rt.MTU > 0 && rt.MTU < n.MTU {
		n.MTU = rt.MTU
	}
	src, _ := netip.AddrFromSlice(rt.Src)
	n.Src = src.Unmap()
	if !n.Src.IsValid() || n.Src.IsUnspecified() {
		fam := "IPv4"
		if dst.Is6() {
			fam = "IPv6"
		}
		return Next{}, fmt.Errorf("route: no %s source address on %s to reach %s: assign one (`ip addr add ... dev %s`; IPv6 addresses must have finished DAD): %w",
			fam, attrs.Name, dst, attrs.Name, unix.EADDRNOTAVAIL)
	}
	if len(n.SrcMAC) != 6 {
		return Next{}, fmt.Errorf("route: interface %s has no Ethernet address (%q): the ring needs an Ethernet interface: %w", attrs.Name, n.SrcMAC, unix.EINVAL)
	}

	switch {
	case dst.IsMulticast():
		n.DstMAC, _ = MulticastMAC(dst)
		return r.store(dst, n, g0), nil
	case dst == limitedBroadcast || rt.Type == unix.RTN_BROADCAST:
		n.DstMAC = BroadcastMAC
		return r.store(dst, n, g0), nil
	}

	hop := dst
	if gw, ok := gatewayOf(rt); ok {
		n.Gateway = gw
		hop = gw
	}
	return r.resolveNeighbour(ctx, dst, hop, n, g0)
}

// checkRoute rejects what the ring cannot transmit: routes via another
// interface, local delivery, and blackhole/unreachable/prohibit routes.
func (r *Resolver) checkRoute(dst netip.Addr, rt netlink.Route) error {
	if rt.Type == unix.RTN_LOCAL || rt.Type == unix.RTN_ANYCAST {
		return fmt.Errorf("route: %s is an address of this namespace (the kernel delivers it locally via %s), not a peer on %s: %w",
			dst, r.linkName(rt.LinkIndex), r.name(), unix.ENETUNREACH)
	}
	switch rt.Type {
	case unix.RTN_UNICAST, unix.RTN_BROADCAST, unix.RTN_MULTICAST:
	default:
		return fmt.Errorf("route: the route to %s is of type %s, nothing can be sent there: %w", dst, routeTypeName(rt.Type), unix.ENETUNREACH)
	}
	if rt.LinkIndex != r.ifindex {
		other := r.linkName(rt.LinkIndex)
		return fmt.Errorf("route: the kernel routes %s via %s, not via the ring's interface %s: the ring only transmits on its own interface; fix the routes or use a ring on %s: %w",
			dst, other, r.name(), other, unix.ENETUNREACH)
	}
	return nil
}

// gatewayOf returns the route's gateway, including an IPv6 gateway of an
// IPv4 route (RTA_VIA, RFC 5549).
func gatewayOf(rt netlink.Route) (netip.Addr, bool) {
	if gw, ok := netip.AddrFromSlice(rt.Gw); ok && !gw.Unmap().IsUnspecified() {
		return gw.Unmap(), true
	}
	if via, ok := rt.Via.(*netlink.Via); ok && via != nil {
		if gw, ok := netip.AddrFromSlice(via.Addr); ok && !gw.Unmap().IsUnspecified() {
			return gw.Unmap(), true
		}
	}
	return netip.Addr{}, false
}

func (r *Resolver) linkName(ifindex int) string {
	if ifindex == r.ifindex {
		return r.name()
	}
	name := fmt.Sprintf("ifindex %d", ifindex)
	_ = r.withHandle(func(h *netlink.Handle) error {
		if l, err := h.LinkByIndex(ifindex); err == nil {
			name = fmt.Sprintf("%s (ifindex %d)", l.Attrs().Name, ifindex)
		}
		return nil
	})
	return name
}

func routeTypeName(t int) string {
	switch t {
	case unix.RTN_BLACKHOLE:
		return "blackhole"
	case unix.RTN_UNREACHABLE:
		return "unreachable"
	case unix.RTN_PROHIBIT:
		return "prohibit"
	case unix.RTN_THROW:
		return "throw"
	case unix.RTN_NAT:
		return "nat"
	default:
		return fmt.Sprintf("%d", t)
	}
}

// store caches n unless the generation moved since the resolution began,
// in which case the caller already knows to resolve again.
func (r *Resolver) store(dst netip.Addr, n Next, g0 uint64) Next {
	r.mu.Lock()
	r.storeLocked(dst, n, g0)
	r.mu.Unlock()
	return n
}

func (r *Resolver) storeLocked(dst netip.Addr, n Next, g0 uint64) bool {
	if r.closed || r.gen.Load() != g0 {
		return false
	}
	if len(r.cache) >= maxCacheEntries {
		// Starting over keeps memory bounded; nothing changed, so no bump.
		// The next hops stay tracked: MACs already handed out must still be
		// compared with what the kernel says next.
		clear(r.cache)
		if len(r.nh) >= maxCacheEntries {
			// Only a bump lets us forget handed-out MACs.
			r.invalidateLocked("too many next hops")
			return false
		}
	}
	r.cache[dst] = n
	return true
}

// invalidateLocked drops every cached answer and bumps the generation.
func (r *Resolver) invalidateLocked(reason string, fields ...zap.Field) {
	r.gen.Add(1)
	clear(r.cache)
	for ip, e := range r.nh {
		e.mac = nil
		if e.refs == 0 {
			delete(r.nh, ip)
		}
	}
	if ce := r.log.Check(zap.DebugLevel, "route cache invalidated"); ce != nil {
		ce.Write(append(fields, zap.String("reason", reason), zap.Uint64("generation", r.gen.Load()))...)
	}
}

// errIs reports whether err is one of the errnos.
func errIs(err error, errnos ...unix.Errno) bool {
	for _, e := range errnos {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
