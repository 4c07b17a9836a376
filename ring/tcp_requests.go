package ring

import (
	"sync"
	"sync/atomic"
)

// connRequests are per-connection settings that the daemon's goroutines
// request and the engine applies on its next pass (the TCP_QUICKACK
// thresholds of tcp_delack.go, the pacing rates of tcp_pacing.go). gen
// counts changes, so the engine looks only after one.
type connRequests[V any] struct {
	mu  sync.Mutex
	req map[tcpFlowKey]V
	gen atomic.Uint64
}

// set requests v for k, or withdraws k's request (drop). It reports
// whether anything changed: the caller then wakes the engine.
func (q *connRequests[V]) set(k tcpFlowKey, v V, drop bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if drop {
		if _, ok := q.req[k]; !ok {
			return false
		}
		delete(q.req, k)
	} else {
		if q.req == nil {
			q.req = map[tcpFlowKey]V{}
		}
		q.req[k] = v
	}
	q.gen.Add(1)
	return true
}

// apply brings the engine's per-connection state conns (created on first
// use) up to date with the requests if they changed since generation
// *seen: set for each connection with a request, unset for each without
// one (the state stays; its owner forgets it when done).
func applyRequests[V, C any](q *connRequests[V], seen *uint64, conns *map[tcpFlowKey]*C, set func(c *C, v V), unset func(c *C)) {
	g := q.gen.Load()
	if g == *seen {
		return
	}
	*seen = g
	if *conns == nil {
		*conns = map[tcpFlowKey]*C{}
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	for k, v := range q.req {
		c := (*conns)[k]
		if c == nil {
			c = new(C)
			(*conns)[k] = c
		}
		set(c, v)
	}
	for k, c := range *conns {
		if _, ok := q.req[k]; !ok {
			unset(c)
		}
	}
}
