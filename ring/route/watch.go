package route

import (
	"net/netip"
	"syscall"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// watch is the resolver's one notification goroutine: it reads rtnetlink
// notifications of the namespace until Close and invalidates what they touch.
func (r *Resolver) watch() {
	defer r.wg.Done()
	var backoff time.Duration
	for {
		msgs, from, err := r.sub.Receive()
		if err != nil {
			select {
			case <-r.done:
				return
			default:
			}
			switch {
			case errIs(err, unix.EINTR, unix.EAGAIN):
				continue
			case errIs(err, unix.ENOBUFS):
				// The kernel dropped notifications: we no longer know what
				// changed, so forget everything.
				r.mu.Lock()
				r.invalidateLocked("notification overrun")
				r.wakeAllLocked()
				r.mu.Unlock()
				r.log.Warn("rtnetlink notifications lost (receive buffer overrun); dropped the route cache")
				continue
			}
			r.mu.Lock()
			r.invalidateLocked("notification read error")
			r.wakeAllLocked()
			r.mu.Unlock()
			r.log.Warn("rtnetlink notification read failed; dropped the route cache", zap.Error(err))
			// Do not spin on a persistent error.
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			t := time.NewTimer(backoff)
			select {
			case <-r.done:
				t.Stop()
				return
			case <-t.C:
			}
			continue
		}
		backoff = 0
		if from.Pid != nl.PidKernel {
			continue // only the kernel speaks on a multicast group we trust
		}
		for i := range msgs {
			r.handle(&msgs[i])
		}
	}
}

// handle applies one notification.
func (r *Resolver) handle(m *syscall.NetlinkMessage) {
	switch m.Header.Type {
	case unix.RTM_NEWNEIGH, unix.RTM_DELNEIGH:
		nb, err := netlink.NeighDeserialize(m.Data)
		if err != nil {
			r.invalidate("unparsable neighbour notification")
			return
		}
		if nb.LinkIndex == r.ifindex && nb.Family == unix.AF_BRIDGE {
			// A VXLAN device's forwarding database: the remote VTEP of
			// its destinations may have changed.
			r.invalidate("forwarding database changed")
			return
		}
		if nb.LinkIndex != r.ifindex || (nb.Family != unix.AF_INET && nb.Family != unix.AF_INET6) {
			return
		}
		ip, ok := netip.AddrFromSlice(nb.IP)
		if !ok {
			return
		}
		r.neighEvent(ip.Unmap(), m.Header.Type == unix.RTM_DELNEIGH, nb)

	case unix.RTM_NEWLINK, unix.RTM_DELLINK:
		r.linkEvent(m)

	case unix.RTM_NEWROUTE, unix.RTM_DELROUTE:
		r.routeEvent(m)

	case unix.RTM_NEWADDR, unix.RTM_DELADDR:
		// Addresses decide source selection, directed broadcasts and local
		// routes: anything may have changed.
		r.invalidate("address changed")

	case unix.RTM_NEWRULE, unix.RTM_DELRULE, unix.RTM_NEWNEXTHOP, unix.RTM_DELNEXTHOP:
		r.invalidate("routing rule or nexthop changed")
	}
}

func (r *Resolver) invalidate(reason string) {
	r.mu.Lock()
	r.invalidateLocked(reason)
	r.mu.Unlock()
}

// linkEvent bumps the generation when our interface's MTU, MAC or state
// changed, or when another interface appeared down/up or went away (IPv4
// flushes such an interface's routes without notifying).
func (r *Resolver) linkEvent(m *syscall.NetlinkMessage) {
	if len(m.Data) < unix.SizeofIfInfomsg {
		r.invalidate("short link notification")
		return
	}
	ifi := nl.DeserializeIfInfomsg(m.Data)
	index := int(ifi.Index)
	flags := ifi.Flags & routingFlags
	deleted := m.Header.Type == unix.RTM_DELLINK

	if index != r.ifindex {
		r.mu.Lock()
		defer r.mu.Unlock()
		old, known := r.others[index]
		switch {
		case deleted:
			delete(r.others, index)
			if known {
				r.invalidateLocked("interface removed", zap.Int("other_ifindex", index))
			}
		case !known:
			// A new interface routes nothing until addresses or routes
			// are added, which are notified themselves.
			r.others[index] = flags
		case old != flags:
			r.others[index] = flags
			r.invalidateLocked("interface state changed", zap.Int("other_ifindex", index))
		}
		return
	}

	if deleted {
		r.log.Warn("the ring's interface was removed")
		r.invalidate("interface removed")
		return
	}
	hdr := unix.NlMsghdr(m.Header)
	link, err := netlink.LinkDeserialize(&hdr, m.Data)
	if err != nil {
		r.invalidate("unparsable link notification")
		return
	}
	attrs := link.Attrs()
	r.setName(attrs.Name)
	now := stateOf(attrs)
	r.mu.Lock()
	defer r.mu.Unlock()
	if now != r.self {
		r.self = now
		r.invalidateLocked("interface MTU, address or state changed", zap.Int("mtu", now.mtu), zap.Stringer("mac", attrs.HardwareAddr))
	}
}

// routeEvent invalidates when the changed route could be chosen for a cached
// or pending destination: its prefix contains it. Route lookups only ever
// consider routes whose prefix contains the destination, so other changes
// (e.g. the per-pod routes of a container host) leave the cache alone.
func (r *Resolver) routeEvent(m *syscall.NetlinkMessage) {
	prefix, ok := routePrefix(m.Data)
	r.mu.Lock()
	defer r.mu.Unlock()
	if !ok {
		r.invalidateLocked("unparsable route notification")
		return
	}
	touched := false
	for dst := range r.cache {
		if touched = prefix.Contains(dst); touched {
			break
		}
	}
	for dst := range r.pending {
		if touched = touched || prefix.Contains(dst); touched {
			break
		}
	}
	if touched {
		r.invalidateLocked("route changed", zap.Stringer("prefix", prefix))
	}
}

// routePrefix extracts the destination prefix of an RTM_*ROUTE message.
func routePrefix(b []byte) (netip.Prefix, bool) {
	if len(b) < unix.SizeofRtMsg {
		return netip.Prefix{}, false
	}
	family, dstLen := b[0], int(b[1])
	attrs, err := nl.ParseRouteAttr(b[unix.SizeofRtMsg:])
	if err != nil {
		return netip.Prefix{}, false
	}
	var addr netip.Addr
	for _, a := range attrs {
		if a.Attr.Type == unix.RTA_DST {
			addr, _ = netip.AddrFromSlice(a.Value)
		}
	}
	if !addr.IsValid() {
		// No RTA_DST: a default route (dst_len 0) of the message's family.
		switch {
		case dstLen != 0:
			return netip.Prefix{}, false
		case family == unix.AF_INET:
			addr = netip.IPv4Unspecified()
		case family == unix.AF_INET6:
			addr = netip.IPv6Unspecified()
		default:
			return netip.Prefix{}, false
		}
	}
	p, err := addr.Prefix(dstLen)
	if err != nil {
		return netip.Prefix{}, false
	}
	return p, true
}
