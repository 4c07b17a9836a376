package ring

import "net/netip"

// tableShards splits the receive table so that a bind or close copies one
// shard, not the whole table: with 100,000 sockets a whole copy per bind
// made binding quadratic.
const tableShards = 256

type shard map[netip.AddrPort][]*Endpoint

// table is the engine's view of the bound endpoints' receive keys. It is
// immutable once published: writers (holding Ring.mu) copy the shards they
// change and swap the pointer, so the engine reads it without locks.
type table struct {
	// shards map a local address — the bound one (possibly the
	// unspecified address of its family) or a joined multicast group, with
	// the endpoint's port — to the endpoints receiving there, most recently
	// added last; shardOf picks the shard of a key. A nil shard is empty.
	shards [tableShards]shard
}

func shardOf(k netip.AddrPort) int {
	a := k.Addr().As16()
	return int(k.Port()^uint16(a[15])<<8^uint16(a[14])) % tableShards
}

func (t *table) get(k netip.AddrPort) ([]*Endpoint, bool) {
	eps, ok := t.shards[shardOf(k)][k]
	return eps, ok
}

// edit returns a copy of t whose shards in keys are private copies, for
// the caller to change.
func (t *table) edit(keys ...netip.AddrPort) *table {
	n := &table{shards: t.shards}
	copied := map[int]bool{}
	for _, k := range keys {
		i := shardOf(k)
		if copied[i] {
			continue
		}
		copied[i] = true
		s := make(shard, len(t.shards[i])+1)
		for k, v := range t.shards[i] {
			s[k] = v
		}
		n.shards[i] = s
	}
	return n
}

// withKey returns a copy of t in which ep also receives at key.
func (t *table) withKey(key netip.AddrPort, ep *Endpoint) *table {
	n := t.edit(key)
	s := n.shards[shardOf(key)]
	v := s[key]
	s[key] = append(v[:len(v):len(v)], ep)
	return n
}

// withoutKey returns a copy of t in which ep no longer receives at key.
func (t *table) withoutKey(key netip.AddrPort, ep *Endpoint) *table {
	return t.withoutEndpoints(map[*Endpoint]bool{ep: true}, key)
}

// withoutEndpoints returns a copy of t in which the endpoints in gone no
// longer receive at any of keys.
func (t *table) withoutEndpoints(gone map[*Endpoint]bool, keys ...netip.AddrPort) *table {
	n := t.edit(keys...)
	for _, key := range keys {
		s := n.shards[shardOf(key)]
		var kept []*Endpoint
		for _, e := range s[key] {
			if !gone[e] {
				kept = append(kept, e)
			}
		}
		if len(kept) > 0 {
			s[key] = kept
		} else {
			delete(s, key)
		}
	}
	return n
}

// lookup finds the endpoints for a datagram to dst: those bound to (or
// joined to) dst exactly, else those bound to the unspecified address of
// dst's family.
func (t *table) lookup(dst netip.AddrPort) []*Endpoint {
	if eps, ok := t.get(dst); ok {
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
	eps, _ := t.get(netip.AddrPortFrom(any, dst.Port()))
	return eps
}
