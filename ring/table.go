package ring

import "net/netip"

// table is the engine's view of the bound endpoints. It is immutable once
// published: writers (holding Ring.mu) copy it, change the copy and swap the
// pointer, so the engine reads it without locks.
type table struct {
	// byAddr maps a local address — the bound one (possibly the
	// unspecified address of its family) or a joined multicast group, with
	// the endpoint's port — to the endpoints receiving there, most recently
	// added last.
	byAddr map[netip.AddrPort][]*Endpoint
	// all lists every endpoint once, for the engine's TX scan.
	all []*Endpoint
}

func (t *table) clone() *table {
	n := &table{byAddr: make(map[netip.AddrPort][]*Endpoint, len(t.byAddr)+1), all: t.all[:len(t.all):len(t.all)]}
	for k, v := range t.byAddr {
		n.byAddr[k] = v
	}
	return n
}

// withKey returns a copy of t in which ep also receives at key.
func (t *table) withKey(key netip.AddrPort, ep *Endpoint) *table {
	n := t.clone()
	v := n.byAddr[key]
	n.byAddr[key] = append(v[:len(v):len(v)], ep)
	return n
}

// withEndpoint returns a copy of t listing ep and receiving at key.
func (t *table) withEndpoint(key netip.AddrPort, ep *Endpoint) *table {
	return t.withKey(key, ep).withListed(ep)
}

// withListed returns a copy of t that lists ep (for its TX queue) without a
// receive key.
func (t *table) withListed(ep *Endpoint) *table {
	n := t.clone()
	n.all = append(n.all, ep)
	return n
}

// withoutKey returns a copy of t in which ep no longer receives at key.
func (t *table) withoutKey(key netip.AddrPort, ep *Endpoint) *table {
	n := t.clone()
	var kept []*Endpoint
	for _, e := range n.byAddr[key] {
		if e != ep {
			kept = append(kept, e)
		}
	}
	if len(kept) > 0 {
		n.byAddr[key] = kept
	} else {
		delete(n.byAddr, key)
	}
	return n
}

// withoutEndpoints returns a copy of t without the endpoints in gone.
func (t *table) withoutEndpoints(gone map[*Endpoint]bool) *table {
	n := &table{byAddr: make(map[netip.AddrPort][]*Endpoint, len(t.byAddr))}
	for k, v := range t.byAddr {
		var kept []*Endpoint
		for _, e := range v {
			if !gone[e] {
				kept = append(kept, e)
			}
		}
		if len(kept) > 0 {
			n.byAddr[k] = kept
		}
	}
	for _, e := range t.all {
		if !gone[e] {
			n.all = append(n.all, e)
		}
	}
	return n
}

// lookup finds the endpoints for a datagram to dst: those bound to (or
// joined to) dst exactly, else those bound to the unspecified address of
// dst's family.
func (t *table) lookup(dst netip.AddrPort) []*Endpoint {
	if eps, ok := t.byAddr[dst]; ok {
		return eps
	}
	if dst.Addr().IsMulticast() {
		// Group traffic goes to members only (as with IP_MULTICAST_ALL=0).
		return nil
	}
	any := netip.IPv4Unspecified()
	if dst.Addr().Is6() {
		any = netip.IPv6Unspecified()
	}
	return t.byAddr[netip.AddrPortFrom(any, dst.Port())]
}
