package route

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"
)

// nudValid are the neighbour states whose link-layer address can be used
// (the kernel's NUD_VALID).
const nudValid = netlink.NUD_PERMANENT | netlink.NUD_NOARP | netlink.NUD_REACHABLE |
	netlink.NUD_PROBE | netlink.NUD_STALE | netlink.NUD_DELAY

// neighAbsent marks "no entry in the neighbour table".
const neighAbsent = -1

func neighStateName(st int) string {
	switch st {
	case neighAbsent:
		return "absent"
	case netlink.NUD_NONE:
		return "NONE"
	case netlink.NUD_INCOMPLETE:
		return "INCOMPLETE"
	case netlink.NUD_REACHABLE:
		return "REACHABLE"
	case netlink.NUD_STALE:
		return "STALE"
	case netlink.NUD_DELAY:
		return "DELAY"
	case netlink.NUD_PROBE:
		return "PROBE"
	case netlink.NUD_FAILED:
		return "FAILED"
	case netlink.NUD_NOARP:
		return "NOARP"
	case netlink.NUD_PERMANENT:
		return "PERMANENT"
	default:
		return fmt.Sprintf("0x%x", st)
	}
}

// acquireNH registers interest in hop so that notifications about it are
// counted from now on.
func (r *Resolver) acquireNH(hop netip.Addr) *nhEntry {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nh[hop]
	if e == nil {
		e = &nhEntry{wake: make(chan struct{})}
		r.nh[hop] = e
	}
	e.refs++
	return e
}

func (r *Resolver) releaseNH(hop netip.Addr, e *nhEntry) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e.refs--
	if e.refs == 0 && e.mac == nil && r.nh[hop] == e {
		delete(r.nh, hop)
	}
}

// resolveNeighbour completes n with the MAC of hop, asking the kernel to
// resolve it if needed, and caches the answer for dst.
//
// Correctness argument: a notification about hop bumps e.seq. An answer is
// published (e.mac set, cached) only if e.seq did not move between just
// before the table read and the publication; from then on every notification
// is compared with e.mac. So a change the read missed is either seen as a
// moved seq (read again) or compared against the published MAC (bump).
func (r *Resolver) resolveNeighbour(ctx context.Context, dst, hop netip.Addr, n Next, g0 uint64) (Next, error) {
	e := r.acquireNH(hop)
	defer r.releaseNH(hop, e)

	var (
		poked    time.Time
		ticker   *time.Ticker
		unstable int
		state    = neighAbsent
	)
	defer func() {
		if ticker != nil {
			ticker.Stop()
		}
	}()
	for {
		r.mu.Lock()
		seq, wake := e.seq, e.wake
		r.mu.Unlock()

		st, mac, err := r.lookupNeigh(hop)
		if err != nil {
			return Next{}, err
		}
		state = st
		if usable(st, mac, n.SrcMAC) {
			if st&netlink.NUD_STALE != 0 && poked.IsZero() {
				// Kernel traffic would make the kernel re-confirm a STALE
				// entry; bypass traffic does not, so ask for it explicitly.
				// The MAC is usable meanwhile.
				poked = time.Now()
				if err := r.poke(hop); err != nil {
					r.log.Debug("neighbour re-confirmation request failed", zap.Stringer("neighbour", hop), zap.Error(err))
				}
			}
			n.DstMAC = mac
			r.mu.Lock()
			if e.seq == seq {
				if r.storeLocked(dst, n, g0) {
					e.mac = mac
				}
				r.mu.Unlock()
				return n, nil
			}
			unstable++
			if unstable >= maxUnstable {
				// The entry keeps changing; hand out the latest answer and
				// make sure the caller looks again.
				r.invalidateLocked("neighbour flapping", zap.Stringer("neighbour", hop))
				r.mu.Unlock()
				return n, nil
			}
			r.mu.Unlock()
			continue
		}

		// Not resolved: ask the kernel to resolve it. Pokes are not repeated
		// while the kernel is probing (INCOMPLETE), only after it gave up.
		probing := st != neighAbsent && st&netlink.NUD_INCOMPLETE != 0
		if poked.IsZero() || (!probing && time.Since(poked) >= repokeInterval) {
			poked = time.Now()
			if err := r.poke(hop); err != nil {
				return Next{}, fmt.Errorf("route: ask the kernel to resolve %s on %s: %w", hop, r.name(), err)
			}
		}
		if ticker == nil {
			ticker = time.NewTicker(recheckInterval)
		}
		select {
		case <-wake:
		case <-ticker.C:
		case <-r.done:
			return Next{}, errClosed
		case <-ctx.Done():
			// One last look: the answer may have arrived with the deadline.
			r.mu.Lock()
			seq = e.seq
			r.mu.Unlock()
			st, mac, err := r.lookupNeigh(hop)
			if err != nil || !usable(st, mac, n.SrcMAC) {
				if err == nil {
					state = st
				}
				return Next{}, r.unreachable(ctx, dst, hop, state)
			}
			n.DstMAC = mac
			r.mu.Lock()
			if e.seq == seq {
				if r.storeLocked(dst, n, g0) {
					e.mac = mac
				}
			} else {
				// No time to read again: the caller must look again.
				r.invalidateLocked("neighbour changed during resolution", zap.Stringer("neighbour", hop))
			}
			r.mu.Unlock()
			return n, nil
		}
	}
}

// usable reports a neighbour state and address the ring can send to.
func usable(state int, mac, srcMAC net.HardwareAddr) bool {
	return state != neighAbsent && state&nudValid != 0 && len(mac) == len(srcMAC)
}

// unreachable builds the error for a neighbour that did not answer in time.
func (r *Resolver) unreachable(ctx context.Context, dst, hop netip.Addr, state int) error {
	proto := "ARP"
	if hop.Is6() {
		proto = "neighbour discovery (ND)"
	}
	who := hop.String()
	if hop != dst {
		who = "gateway " + who + " (next hop to " + dst.String() + ")"
	}
	if errors.Is(ctx.Err(), context.Canceled) {
		return fmt.Errorf("route: resolving %s on %s: gave up waiting for the %s reply (neighbour %s): %w",
			who, r.name(), proto, neighStateName(state), ctx.Err())
	}
	return fmt.Errorf("route: no %s reply from %s on %s (neighbour %s): is the peer up? %w (%w)",
		proto, who, r.name(), neighStateName(state), unix.EHOSTUNREACH, ctx.Err())
}

// lookupNeigh reads hop's entry on our interface from the kernel.
func (r *Resolver) lookupNeigh(hop netip.Addr) (state int, mac net.HardwareAddr, err error) {
	family := netlink.FAMILY_V4
	if hop.Is6() {
		family = netlink.FAMILY_V6
	}
	var list []netlink.Neigh
	err = r.withHandle(func(h *netlink.Handle) error {
		// A dump interrupted by a concurrent change is retried; the kernel
		// table is small and changes rarely.
		for try := 0; ; try++ {
			var err error
			list, err = h.NeighList(r.ifindex, family)
			if err == nil || !errors.Is(err, netlink.ErrDumpInterrupted) || try == 3 {
				return err
			}
		}
	})
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return neighAbsent, nil, fmt.Errorf("route: read the neighbour table of %s: %w", r.name(), err)
	}
	for i := range list {
		nb := &list[i]
		if nb.LinkIndex != r.ifindex {
			continue
		}
		if ip, ok := netip.AddrFromSlice(nb.IP); ok && ip.Unmap() == hop {
			return nb.State, nb.HardwareAddr, nil
		}
	}
	return neighAbsent, nil, nil
}

// poke makes the kernel resolve hop: RTM_NEWNEIGH with NTF_USE creates the
// entry if needed and runs neigh_event_send on it, which starts ARP/ND
// (or re-confirmation of a STALE entry) exactly as an outgoing packet would,
// without touching a valid entry's state or address.
func (r *Resolver) poke(hop netip.Addr) error {
	family := netlink.FAMILY_V4
	if hop.Is6() {
		family = netlink.FAMILY_V6
	}
	return r.withHandle(func(h *netlink.Handle) error {
		return h.NeighSet(&netlink.Neigh{
			LinkIndex: r.ifindex,
			Family:    family,
			IP:        hop.AsSlice(),
			State:     netlink.NUD_NONE,
			Flags:     netlink.NTF_USE,
		})
	})
}

// neighEvent handles a neighbour notification for hop on our interface.
func (r *Resolver) neighEvent(hop netip.Addr, deleted bool, nb *netlink.Neigh) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.nh[hop]
	if e == nil {
		return
	}
	e.seq++
	close(e.wake)
	e.wake = make(chan struct{})
	if e.mac == nil {
		return
	}
	usable := !deleted && nb.State&nudValid != 0 && len(nb.HardwareAddr) > 0
	if usable && bytes.Equal(nb.HardwareAddr, e.mac) {
		return // e.g. REACHABLE -> STALE: same MAC, nothing to rebuild
	}
	reason := "neighbour changed"
	if !usable {
		reason = "neighbour gone or failed"
	}
	r.invalidateLocked(reason, zap.Stringer("neighbour", hop),
		zap.String("state", neighStateName(nb.State)), zap.Stringer("mac", nb.HardwareAddr))
}

// wakeAllLocked tells every waiting resolution to look again, after
// notifications may have been lost.
func (r *Resolver) wakeAllLocked() {
	for _, e := range r.nh {
		e.seq++
		close(e.wake)
		e.wake = make(chan struct{})
	}
}
