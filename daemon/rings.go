package daemon

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
)

// hasFamily reports whether ri's interface has an address of the family
// (v4 or v6); the ring caches its addresses until they change.
func (d *Daemon) hasFamily(ri *ringInfo, v4 bool) (bool, error) {
	ok, err := ri.ring().HasFamily(v4)
	if err != nil {
		return false, fmt.Errorf("interface %s: %w", ri.it.Name, err)
	}
	return ok, nil
}

// homeRing is the ring whose doorbell a new socket of the family gets:
// of the rings of the first interface with an address of the family (in
// configuration order), the one with the fewest sockets homed on it, then
// the least traffic; else the first ring (the bind then fails with the
// ring's explanation). The home is fixed at OPEN because the client gets
// the home ring's doorbell there.
func (d *Daemon) homeRing(family uint16) *ringInfo {
	v4 := family == unix.AF_INET
	var best *ringInfo
	for _, ri := range d.rings {
		if best != nil && ri.it.Name != best.it.Name {
			break
		}
		if best == nil {
			if ok, err := d.hasFamily(ri, v4); err != nil || !ok {
				continue
			}
			best = ri
			continue
		}
		if ri.downErr() == nil && ri.lighter(best) {
			best = ri
		}
	}
	if best == nil {
		return d.rings[0]
	}
	return best
}

// lighter reports whether ri carries less than o: fewer sockets homed on
// it, or as many and fewer bytes moved.
func (ri *ringInfo) lighter(o *ringInfo) bool {
	a, b := ri.homed.Load(), o.homed.Load()
	if a != b {
		return a < b
	}
	sa, sb := ri.ring().Stats(), o.ring().Stats()
	return sa.RXBytes.Load()+sa.TXBytes.Load() < sb.RXBytes.Load()+sb.TXBytes.Load()
}

// chooseRing picks the ring a socket with home ring home binds addr on.
// A specific address goes to a ring of the interface owning it; the
// wildcard (and a multicast group, which no interface owns) to a ring of
// the only interface with an address of that family. That ring is home
// when home is one of the interface's rings (see the package documentation
// on doorbells).
func (d *Daemon) chooseRing(home *ringInfo, addr netip.Addr) (*ringInfo, error) {
	if addr.IsUnspecified() || addr.IsMulticast() {
		var found []*ringInfo
		for _, ri := range d.rings {
			ok, err := d.hasFamily(ri, addr.Is4())
			if err != nil {
				return nil, err
			}
			if ok {
				found = append(found, ri)
			}
		}
		switch {
		case len(found) == 0 && len(d.rings) == 1:
			// Let the ring explain which address is missing.
			return d.rings[0], nil
		case len(found) == 0:
			return nil, fmt.Errorf("bind %v: no interface bypassd serves has an %s address: %w", addr, familyName(addr), unix.EADDRNOTAVAIL)
		}
		for _, ri := range found {
			if ri.it.Name != found[0].it.Name {
				return nil, fmt.Errorf("bind %v: several interfaces bypassd serves have %s addresses (%s and %s): bind a specific address: %w",
					addr, familyName(addr), found[0].it.Name, ri.it.Name, unix.EADDRNOTAVAIL)
			}
		}
		return sameRing(home, found[0], addr)
	}
	if ok, err := home.ring().Owns(addr); err != nil {
		return nil, fmt.Errorf("bind %v: %w", addr, err)
	} else if ok {
		return home, nil
	}
	for _, ri := range d.rings {
		if ri.it.Name == home.it.Name {
			continue
		}
		ok, err := ri.ring().Owns(addr)
		if err != nil {
			return nil, fmt.Errorf("bind %v: %w", addr, err)
		}
		if ok {
			return sameRing(home, ri, addr)
		}
	}
	return nil, fmt.Errorf("bind %v: not an address of an interface bypassd serves: %w", addr, unix.EADDRNOTAVAIL)
}

// sameRing returns home if ri is a ring of home's interface (any of them
// serves its addresses), else explains why the bind fails.
func sameRing(home, ri *ringInfo, addr netip.Addr) (*ringInfo, error) {
	if ri.it.Name == home.it.Name {
		return home, nil
	}
	if ri != home {
		return nil, fmt.Errorf("bind %v: served by ring %s, but the socket was opened for ring %s (its doorbell): "+
			"bypassd serves several interfaces of this family; run one daemon per interface, or bind addresses of %s only: %w",
			addr, ri.it, home.it, home.it, unix.EADDRNOTAVAIL)
	}
	return ri, nil
}

func familyName(a netip.Addr) string {
	if a.Is4() {
		return "IPv4"
	}
	return "IPv6"
}
