package ring

import (
	"sync/atomic"
	"time"

	"github.com/bypassd/bypassd/ring/sched/qos"
	"github.com/bypassd/bypassd/ring/wire/packet"
)

// Traffic classes in the engine. Every transmit pass files the endpoints
// that have datagrams by their class (sk_prio → UP → TC, package qos),
// and the ring's qos.Scheduler says which class sends next and how many
// wire bytes it may send before the next decision; within a class the
// endpoints take turns. Per-socket pacing stays below: a paced endpoint
// waiting for its departure time is not a candidate, whatever its class's
// turn. A class held back by its rate limit (or a ring held by the port
// limit) keeps its datagrams queued, as pacing does: backpressure reaches
// the senders through their full queues, nothing is dropped.

// TCStats are a traffic class's counters on one ring.
type TCStats struct {
	// TXPackets and TXBytes count datagrams sent in the class and their
	// wire bytes (headers included, what the scheduler shares).
	TXPackets, TXBytes atomic.Uint64
	// TXBacklog is the bytes queued in the class's sockets at the last
	// transmit pass (a gauge); TXHeld counts passes in which the class had
	// datagrams but its rate limit (or the port's) held them back.
	TXBacklog, TXHeld atomic.Uint64
	// RXPackets and RXBytes count received datagrams by the class the
	// trust state gives them (payload bytes).
	RXPackets, RXBytes atomic.Uint64
}

// SetQoS gives the ring its interface's QoS state (validated by the
// caller); the engine applies it from its next pass. Nil restores
// qos.Default.
func (r *Ring) SetQoS(c *qos.Config) {
	if c != nil {
		cp := *c
		c = &cp
	}
	r.qosCfg.Store(c)
	_ = r.doorbell.Wake()
}

// QoS returns the ring's QoS state.
func (r *Ring) QoS() qos.Config {
	if c := r.qosCfg.Load(); c != nil {
		return *c
	}
	return qos.Default()
}

// TCStats returns the counters of traffic class tc (0..7).
func (r *Ring) TCStats(tc int) *TCStats { return &r.stats.TC[tc] }

var defaultQoS = qos.Default()

// qosState is the engine's side: the configuration it runs, its
// scheduler, and the per-pass candidate lists.
type qosState struct {
	cfg   *qos.Config // as loaded from Ring.qosCfg (nil: default)
	run   *qos.Config // what the scheduler was built from
	sched *qos.Scheduler
	// class holds this pass's candidates of each class; next is the turn
	// within each.
	class [qos.NumTC][]*Endpoint
	next  [qos.NumTC]int
	// readyAt is when a held class may send again (engine clock; 0:
	// none is held).
	readyAt int64
	// gauged says the backlog gauges show a non-empty pass (an empty one
	// zeroes them once).
	gauged bool
}

// epClass caches an endpoint's class for the options and configuration
// it was computed from.
type epClass struct {
	opts *HeaderOptions
	cfg  *qos.Config
	tc   uint8
	// held marks an endpoint whose class a limit holds back: it does not
	// keep the engine from sleeping (the ready time bounds the sleep).
	held bool
}

// qosSync applies a configuration change (each iteration, before it
// receives): a new scheduler, and templates rebuilt for the forced
// traffic class and TTL.
func (e *engine) qosSync() {
	p := e.r.qosCfg.Load()
	if p == e.qos.cfg && e.qos.sched != nil {
		return
	}
	e.qos.cfg = p
	e.qos.run = p
	if p == nil {
		e.qos.run = &defaultQoS
	}
	e.qos.sched = qos.NewScheduler(e.qos.run, e.monotonic())
	clear(e.tmpls)
}

// classOf returns ep's traffic class.
func (e *engine) classOf(ep *Endpoint) uint8 {
	o := ep.opts.Load()
	if ep.cls.opts != o || ep.cls.cfg != e.qos.run {
		ep.cls.opts, ep.cls.cfg = o, e.qos.run
		ep.cls.tc = e.qos.run.Egress(o.Priority).TC
	}
	return ep.cls.tc
}

// forceHeader applies the interface's forced traffic class and TTL (the
// RoCE document's knobs) to a unicast template's options.
func (e *engine) forceHeader(to *packet.TemplateOptions, multicast bool) {
	c := e.qos.run
	if c.TrafficClass >= 0 {
		to.TOS = uint8(c.TrafficClass)
	}
	if c.TTL != 0 && !multicast {
		// Multicast keeps its own TTL: forcing a unicast TTL on it
		// would carry it beyond the scope IP_MULTICAST_TTL gives it.
		to.TTL = c.TTL
	}
}

// sendClasses drains the endpoints of eps that have datagrams in the
// order the scheduler grants. It returns the datagrams consumed.
func (e *engine) sendClasses(t *table, eps []*Endpoint) (int, error) {
	q := &e.qos
	r := e.r
	var backlog uint8
	var queued [qos.NumTC]uint64
	for _, ep := range eps {
		ep.cls.held = false
		// A rate change applies even to an idle endpoint (a removed rate
		// frees its hardware send queue now, not at its next datagram).
		e.paceSync(ep)
		if ep.paceWaiting() || !ep.etx.Readable() {
			continue
		}
		tc := e.classOf(ep)
		q.class[tc] = append(q.class[tc], ep)
		queued[tc] += uint64(ep.etx.Len())
		backlog |= 1 << tc
	}
	if backlog != 0 || q.gauged {
		for tc := range qos.NumTC {
			r.stats.TC[tc].TXBacklog.Store(queued[tc])
		}
		q.gauged = backlog != 0
	}
	if backlog == 0 {
		q.readyAt = 0
		return 0, nil
	}
	// Bounded so that producers that keep their queues full cannot keep
	// the engine from receiving.
	work, limit := 0, r.cfg.Batch*len(eps)
	q.readyAt = 0
	for backlog != 0 && work < limit {
		tc, budget, ok := q.sched.Pick(backlog, e.now)
		if !ok {
			e.qosHold(backlog)
			break
		}
		list := q.class[tc]
		i := q.next[tc] % len(list)
		ep := list[i]
		n, wire, more, err := e.drain(t, ep, budget)
		work += n
		if wire > 0 {
			q.sched.Charge(tc, int(wire))
			r.stats.TC[tc].TXBytes.Add(uint64(wire))
		}
		if err != nil {
			e.qosReset()
			return work, err
		}
		if len(e.backlog) > 0 {
			// The provider's ring is full: the next pass decides again.
			break
		}
		if more {
			q.next[tc] = i + 1
			continue
		}
		q.class[tc] = append(list[:i], list[i+1:]...)
		if len(q.class[tc]) == 0 {
			backlog &^= 1 << tc
		}
		// Refresh the clock for the limits: the drain took time.
		e.now = e.monotonic()
	}
	e.qosReset()
	return work, nil
}

// qosHold notes that the classes of backlog are held back by limits.
func (e *engine) qosHold(backlog uint8) {
	q := &e.qos
	at, ok := q.sched.NextReady(backlog, e.now)
	if !ok {
		return
	}
	q.readyAt = at
	for tc := range qos.NumTC {
		if backlog&(1<<tc) == 0 {
			continue
		}
		e.r.stats.TC[tc].TXHeld.Add(1)
		for _, ep := range q.class[tc] {
			ep.cls.held = true
		}
	}
}

// qosReset empties the pass's candidate lists.
func (e *engine) qosReset() {
	for tc := range e.qos.class {
		clear(e.qos.class[tc])
		e.qos.class[tc] = e.qos.class[tc][:0]
	}
}

// qosTimeout shortens a sleep of at most d to end when a held class may
// send again.
func (e *engine) qosTimeout(d time.Duration) time.Duration {
	if e.qos.readyAt == 0 {
		return d
	}
	return min(d, max(time.Duration(e.qos.readyAt-e.monotonic()), 0))
}

// rxClass counts a received datagram in the class the trust state gives
// it.
func (e *engine) rxClass(tos, pcp uint8, tagged bool, bytes int) {
	_, tc := e.qos.run.Ingress(tos, pcp, tagged)
	s := &e.r.stats.TC[tc]
	s.RXPackets.Add(1)
	s.RXBytes.Add(uint64(bytes))
}
