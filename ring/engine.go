package ring

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/ring/sched/qos"
	"github.com/bypassd/bypassd/ring/wire/packet"
	"github.com/bypassd/bypassd/ring/wire/reassembly"
	"github.com/bypassd/bypassd/ring/wire/vxlan"
)

// Stats are a ring's counters. The engine updates them once per burst.
type Stats struct {
	RXPackets, RXBytes, TXPackets, TXBytes atomic.Uint64
	// RXNoEndpoint counts datagrams steered to the ring with no endpoint
	// (a race with Close, or a fragment of a closed flow).
	RXNoEndpoint atomic.Uint64
	// RXMalformed counts frames that failed to parse; RXChecksum datagrams
	// whose UDP checksum was wrong; RXQueueFull datagrams dropped because
	// the endpoint's RX queue was full.
	RXMalformed, RXChecksum, RXQueueFull atomic.Uint64
	// TXFragments counts IP fragments sent for datagrams over the MTU.
	TXFragments atomic.Uint64
	// TXNoBuffer counts times the engine waited for free send buffers.
	TXNoBuffer atomic.Uint64
	// TXUnreachable counts datagrams dropped because the next hop could
	// not be resolved; TXErrors datagrams that could not be encoded.
	TXUnreachable, TXErrors atomic.Uint64
	// TXLinkDown counts frames dropped because the link was down.
	TXLinkDown atomic.Uint64
	// Wakeups counts times the engine slept and woke up.
	Wakeups atomic.Uint64
	// FlowsFull counts binds and joins refused because the steering map
	// was full (--max-flows).
	FlowsFull atomic.Uint64
	// RXHandedOff counts frames this ring received for a flow homed on
	// another ring of the interface and passed to that ring (handoff.go);
	// RXHandoffDropped those it could not (the home ring's inbox full, or
	// no ring on the home queue); RXHandoffIn frames other rings passed to
	// this one (counted before parsing, like RXBurst's frames).
	RXHandedOff, RXHandoffDropped, RXHandoffIn atomic.Uint64
	// RXDecapsulated counts VXLAN datagrams of overlay endpoints the ring
	// decapsulated (their inner datagrams count in RXPackets);
	// TXEncapsulated datagrams it sent encapsulated (in TXPackets).
	RXDecapsulated, TXEncapsulated atomic.Uint64
	// RXKernelBacklog counts datagrams the kernel held on port
	// reservations during a live upgrade and the new ring delivered (in
	// RXPackets too).
	RXKernelBacklog atomic.Uint64
	// Iterations counts engine iterations; TXVisits the endpoints the
	// transmit passes visited (announced, due or still busy ones only:
	// idle endpoints cost nothing, and tests check that with these).
	Iterations, TXVisits atomic.Uint64
	// TXPaced counts datagrams sent from paced endpoints; TXPaceWaits
	// times a paced endpoint's next datagram waited for its departure
	// time; TXPaceLate those waits that ended later than the burst
	// allowance makes up for (rate lost); PacedQueues is the number of
	// paced endpoints now (a gauge).
	TXPaced, TXPaceWaits, TXPaceLate, PacedQueues atomic.Uint64
	// TCPRXPackets and TCPRXBytes count TCP frames handed to the ring's
	// TCP stack (IP bytes); TCPTXPackets and TCPTXBytes the stack's
	// packets sent.
	TCPRXPackets, TCPRXBytes, TCPTXPackets, TCPTXBytes atomic.Uint64
	// TCPDelayedAcks counts ACKs the engine held back under the
	// TCP_QUICKACK threshold (tcp_delack.go).
	TCPDelayedAcks atomic.Uint64
	// TC are the counters of each traffic class (engine_qos.go).
	TC [qos.NumTC]TCStats
}

// Stats returns the ring's counters.
func (r *Ring) Stats() *Stats { return &r.stats }

// ProviderStats returns the provider's counters.
func (r *Ring) ProviderStats() qp.Stats { return r.prov.Stats() }

// ReassemblyStats returns fragment reassembly counters (engine-owned; a
// snapshot taken at the engine's last iteration).
func (r *Ring) ReassemblyStats() reassembly.Stats {
	if p := r.eng.reasmStats.Load(); p != nil {
		return *p
	}
	return reassembly.Stats{}
}

// dest is the engine's state for one destination address: the resolved next
// hop and the IP identification counter.
type dest struct {
	state destState
	// next is the next hop (an overlay destination's inner one, on the
	// VXLAN device); outer and remote are an overlay destination's next
	// hop on the interface and remote VTEP.
	next    route.Next
	outer   route.Next
	remote  netip.Addr
	err     error
	retryAt time.Time
	ipID    uint32
}

type destState uint8

const (
	destResolving destState = iota
	destReady
	destFailed
)

// maxDests bounds the destination cache.
const maxDests = 8192

// tmplKey selects a header template: one per (endpoint, destination).
type tmplKey struct {
	ep  *Endpoint
	dst netip.AddrPort
}

// destKey names a destination: an address on the interface's network or
// (ov not nil) on an overlay.
type destKey struct {
	ov   *overlay
	addr netip.Addr
}

// tmplEntry is a template and the endpoint options it was built with.
type tmplEntry struct {
	tmpl frameTemplate
	opts *HeaderOptions
}

type resolution struct {
	// gen is the resolver generation the answer belongs to.
	gen    uint64
	key    destKey
	next   route.Next
	outer  route.Next
	remote netip.Addr
	err    error
}

// engine is the state only the ring's thread touches.
type engine struct {
	r  *Ring
	rx []qp.Frame
	tx []qp.Frame
	// yieldDue: since it last yielded its P, the engine woke goroutines
	// of this process (TCP segments to the stack, a stream socket's
	// bell; see yield).
	yieldDue bool
	// backlog holds built frames the TX ring had no room for.
	backlog []qp.Frame
	touched []*Endpoint
	// woken lists the rings this burst handed frames to (handoff.go).
	woken []*Ring
	dests map[destKey]*dest
	tmpls map[tmplKey]tmplEntry
	gen   uint64
	// delack is the delayed ACKs of TCP connections (tcp_delack.go),
	// tcpPace their pacing (tcp_pacing.go).
	delack  delackState
	tcpPace tcpPaceState
	reasm   *reassembly.Reassembler
	// reasmStats is published for readers on other goroutines.
	reasmStats atomic.Pointer[reassembly.Stats]
	lastExpire time.Time
	// lastRetire is the retire generation the engine last pruned its
	// references to retired endpoints for.
	lastRetire uint64
	// active lists the endpoints the next transmit pass visits (announced,
	// due from the pacing wheel, or not drained empty), next is the spare
	// buffer; stalled those waiting for a next hop, reactivated by any
	// resolution. Endpoint.active marks membership of either.
	active, next, stalled []*Endpoint
	// curLane and visitSlot drain a lane's bitmap without allocating.
	curLane   *Lane
	visitSlot func(int)
	// hot lists the lanes the engine serves (disarmed: their clients
	// announce without ringing); every other lane is armed. laneOf maps
	// a lane doorbell to its lane, rebuilt when the ring's lanes change
	// (lanesOf is the list it was built from); events receives the rung
	// doorbells.
	hot     []*Lane
	laneOf  map[int32]*Lane
	lanesOf *[]*Lane
	events  []unix.EpollEvent
	// rungDue: the last sleep ended with a doorbell event pending;
	// lastRung is when takeRung last looked (e.now's clock; a busy engine
	// looks every rungEvery).
	rungDue  bool
	lastRung int64
	// visits counts endpoint visits, published per iteration.
	visits uint64
	// stg stages built frames in device memory (staging.go).
	stg staging
	// backlogBuf receives datagrams from port reservations (handover.go).
	backlogBuf []byte

	// Pacing (engine_pacing.go): the clock of this transmit pass, the
	// wheel of endpoints waiting for a departure time, the endpoints with
	// pacing state, and the provider's hardware rate limiter if any.
	clockBase time.Time
	now       int64
	wheel     *pacing.Wheel[*Endpoint]
	paced     map[*Endpoint]struct{}
	hwRate    qp.RateLimiter
	hwNext    int
	hwFree    []int
	hwRefused bool
	// paceSpin is the adaptive spin margin; paceWake when a sleep
	// shortened for a departure is meant to end (0: it was not).
	paceSpin time.Duration
	paceWake int64

	// switches is the fallback's path switch count the templates were
	// built under (mtu.go).
	switches uint64
	// qos is the traffic-class scheduler's state (engine_qos.go).
	qos qosState
}

// pruneRetired drops the engine's references to endpoints that left the
// ring since the last call: templates, pacing state, the visit lists.
func (e *engine) pruneRetired() {
	g := e.r.retireGen.Load()
	if g == e.lastRetire {
		return
	}
	e.lastRetire = g
	for k := range e.tmpls {
		if k.ep.retired.Load() {
			delete(e.tmpls, k)
		}
	}
	for ep := range e.paced {
		if ep.retired.Load() {
			e.paceForget(ep)
		}
	}
	gone := func(ep *Endpoint) bool { return ep.retired.Load() }
	e.active = slices.DeleteFunc(e.active, gone)
	e.stalled = slices.DeleteFunc(e.stalled, gone)
}

// activate puts ep on the next transmit pass's list.
func (e *engine) activate(ep *Endpoint) {
	if !ep.active {
		ep.active = true
		e.active = append(e.active, ep)
	}
}

// quietPasses is how many passes in a row a hot lane may announce nothing
// before the engine arms it again: a busy client announcing now and then
// should not pay a doorbell write each time, an idle one should not cost
// the engine a look per pass.
const quietPasses = 64

// rungEvery is how often a busy engine, which does not sleep, looks for
// rung doorbells (a sleeping one is woken by them): the most an idle
// session's first datagram waits behind other sessions' traffic.
const rungEvery = 20 * time.Microsecond

// collect activates the endpoints announced since the last pass: by
// clients in the bitmaps of the lanes the engine serves or whose doorbells
// rang, and by in-process users.
func (e *engine) collect() {
	r := e.r
	// e.now: the pass's clock, read by paceAdvance.
	if e.rungDue || e.now-e.lastRung >= int64(rungEvery) {
		e.rungDue, e.lastRung = false, e.now
		e.takeRung()
	}
	for i := 0; i < len(e.hot); {
		l := e.hot[i]
		switch {
		case l.closed.Load():
		case l.ln.Pending():
			e.curLane = l
			l.ln.Drain(e.visitSlot)
			l.quiet = 0
			i++
			continue
		case l.quiet < quietPasses:
			l.quiet++
			i++
			continue
		case l.ln.ArmSleep():
			// Announced meanwhile: keep serving it.
			l.ln.DisarmSleep()
			i++
			continue
		}
		l.hot = false
		e.hot[i] = e.hot[len(e.hot)-1]
		e.hot = e.hot[:len(e.hot)-1]
	}
	e.curLane = nil
	if r.inproc.Load() == nil {
		return
	}
	for ep := r.inproc.Swap(nil); ep != nil; {
		next := ep.nextAnnounced.Load()
		ep.nextAnnounced.Store(nil)
		ep.announced.Store(false)
		if !ep.retired.Load() {
			e.activate(ep)
		}
		ep = next
	}
}

// takeRung reads the doorbells that rang (without waiting) and serves
// their lanes: a lane doorbell names its lane; the ring's own doorbell
// (in-process wake-ups, and the clients of lanes without a doorbell of
// their own) has the engine look at those lanes.
func (e *engine) takeRung() {
	r := e.r
	n, err := unix.EpollWait(r.epfd, e.events, 0)
	if err != nil || n == 0 {
		return
	}
	// A full batch may have left events behind: look again next pass.
	e.rungDue = n == len(e.events)
	if lanes := r.lanes.Load(); lanes != e.lanesOf {
		e.lanesOf = lanes
		clear(e.laneOf)
		if e.laneOf == nil {
			e.laneOf = map[int32]*Lane{}
		}
		for _, l := range *lanes {
			if l.bell != nil {
				e.laneOf[int32(l.bell.FD())] = l
			}
		}
	}
	for _, ev := range e.events[:n] {
		if int(ev.Fd) == r.doorbell.FD() {
			for _, l := range *e.lanesOf {
				if l.bell == nil && !l.hot && !l.closed.Load() && l.ln.Pending() {
					e.serve(l)
				}
			}
			continue
		}
		if l := e.laneOf[ev.Fd]; l != nil && !l.hot && !l.closed.Load() {
			e.serve(l)
		}
	}
}

// serve puts a rung lane on the hot list, disarmed: its client announces
// without ringing while the engine looks at it on every pass.
func (e *engine) serve(l *Lane) {
	l.ln.DisarmSleep()
	l.hot, l.quiet = true, 0
	e.hot = append(e.hot, l)
}

// onSlot activates the endpoint of an announced slot of e.curLane. A slot
// that names none wakes its waker (a stream socket's pump) or is marked
// early: records queued before the bind, which the bind has visited (or a
// broken or hostile client, a socket being closed).
func (e *engine) onSlot(slot int) {
	ep := e.curLane.endpoint(slot)
	if ep == nil {
		if e.curLane.wake(slot) {
			// A stream socket: its pump does the work
			// (tcpstack.Pump.Wake), its goroutine perhaps woken.
			e.yieldDue = true
			return
		}
		if ep = e.curLane.markEarly(slot); ep == nil {
			return
		}
	}
	if !ep.retired.Load() {
		e.activate(ep)
	}
}

func (e *engine) init(r *Ring) {
	e.r = r
	e.rx = make([]qp.Frame, r.cfg.Batch)
	e.tx = make([]qp.Frame, 0, r.cfg.Batch+64)
	e.dests = map[destKey]*dest{}
	e.tmpls = map[tmplKey]tmplEntry{}
	e.reasm = reassembly.New(r.cfg.Reassembly)
	e.visitSlot = e.onSlot
	e.events = make([]unix.EpollEvent, 64)
	e.initPacing()
	e.qosSync()
}

func (e *engine) loop() error {
	r := e.r
	e.pacingThread()
	var idleSince time.Time
	for !r.stop.Load() {
		r.epoch.Add(1)
		r.stats.Iterations.Add(1)
		t := r.table.Load()
		work, err := e.iterate(t)
		if err != nil {
			return err
		}
		if work > 0 {
			idleSince = time.Time{}
			continue
		}
		now := time.Now()
		if idleSince.IsZero() {
			idleSince = now
		}
		if r.cfg.Poll < 0 || now.Sub(idleSince) < r.cfg.Poll || e.paceImminent() {
			continue
		}
		if e.yieldDue {
			// What the woken goroutines do may be work (segments to
			// send): look again before sleeping.
			e.yield()
			continue
		}
		if err := e.sleep(); err != nil {
			return err
		}
		idleSince = time.Time{}
	}
	return nil
}

// iterate does one round of work and reports how much it did.
func (e *engine) iterate(t *table) (int, error) {
	r := e.r
	if g := r.generation(); g != e.gen {
		// Routes or neighbours changed: rebuild next hops and templates
		// lazily.
		e.gen = g
		clear(e.dests)
		clear(e.tmpls)
		e.checkMTU()
	} else if e.pathSwitched() {
		clear(e.tmpls) // built for the other path's largest frame
	}
	e.pruneRetired()
	e.drainBacklog()
	e.qosSync()
	work := e.receive()
	for {
		select {
		case res := <-r.resolved:
			e.applyResolution(res)
			work++
			continue
		default:
		}
		break
	}
	if work > 0 && len(e.stalled) > 0 && len(r.resolved) == 0 {
		// A next hop was answered: the stalled endpoints try again (those
		// whose destination is still unresolved stall again).
		e.active = append(e.active, e.stalled...)
		e.stalled = e.stalled[:0]
	}
	n, err := e.transmit(t)
	if err != nil {
		return 0, err
	}
	work += n
	if r.prov.TXPending() > 0 {
		work += r.prov.Complete()
	}
	if now := time.Now(); now.Sub(e.lastExpire) > 100*time.Millisecond {
		e.lastExpire = now
		if e.reasm.Expire(now) > 0 {
			e.publishReassemblyStats()
		}
	}
	return work, nil
}

// sleep blocks until the provider has frames or a doorbell rings. Before
// sleeping it arms the lanes it serves (the others are armed already) and
// re-checks them and the in-process announcements, so work announced in
// between is not missed: the cost of going to sleep follows the sessions
// that were busy, not the sessions open. Endpoints are not touched: an
// empty TX queue stays armed from the pass that drained it.
func (e *engine) sleep() error {
	r := e.r
	// Swap, not Store: a full barrier before the loads below (Dekker
	// against announce's increment and load).
	r.sleeping.Swap(true)
	defer r.sleeping.Store(false)
	pending := r.inproc.Load() != nil
	for _, ep := range e.active {
		// An endpoint whose traffic class a limit holds back does not
		// keep the engine awake: the class's ready time bounds the sleep.
		if !ep.cls.held {
			pending = true
			break
		}
	}
	for _, l := range e.hot {
		if !l.closed.Load() && l.ln.ArmSleep() {
			pending = true
		}
	}
	timeout := e.qosTimeout(e.paceTimeout(time.Second))
	if pending || len(e.backlog) > 0 || r.prov.TXPending() > 0 || e.tcpPending() || (r.inbox != nil && r.inbox.pending()) {
		timeout = 0
	}
	if timeout > 0 {
		r.stats.Wakeups.Add(1)
	}
	woke, err := r.prov.Wait(timeout, r.epfd)
	e.rungDue = woke
	e.paceWoke()
	if pending {
		// Not slept: keep serving the hot lanes, disarmed.
		for _, l := range e.hot {
			if !l.closed.Load() {
				l.ln.DisarmSleep()
			}
		}
	} else {
		// They stay armed; a doorbell brings each back.
		for _, l := range e.hot {
			l.hot = false
		}
		e.hot = e.hot[:0]
	}
	if err != nil {
		return fmt.Errorf("ring %s/%d: %w", r.cfg.Interface, r.cfg.Queue, err)
	}
	return nil
}

// receive moves one burst of frames from the provider to endpoints, and
// one burst of frames other rings handed over.
func (e *engine) receive() int {
	r := e.r
	n := r.prov.RXBurst(e.rx)
	handed := e.receiveHandoffs()
	if n == 0 {
		return handed
	}
	var rs rxBurst
	rs.start(r)
	own := uint32(r.cfg.Queue)
	for i := 0; i < n; i++ {
		if fr := &e.rx[i]; fr.Tagged && fr.Home != own && r.group != nil {
			e.handOff(fr)
			continue
		}
		e.rxFrame(&rs, e.rx[i].Buf, e.rx[i].HWTimestamp)
	}
	r.prov.ReleaseRX(e.rx[:n])
	e.wakeHomes()
	e.finishBurst(&rs)
	if e.yieldDue {
		e.yield()
	}
	return n + handed
}

// yield lets the goroutines the engine made runnable run now: gVisor's
// TCP processor goroutine that a delivered segment woke, a pump or
// listener whose bell the engine rang. The runtime queues a goroutine
// woken by the engine on the engine's P (its "run next" slot), where it
// waits while the engine spins, and — the engine's sleep being a system
// call that keeps the P until the runtime's monitor takes it back, up to
// 10 ms later — while the engine sleeps too, unless an idle P steals it.
// Measured before this (docs/benchmarks.md, TCP latency): the processor
// goroutine started 1 ms after the segment on average. Yielding hands the
// P over once per burst; UDP-only rings never do.
func (e *engine) yield() {
	e.yieldDue = false
	runtime.Gosched()
}

// receiveHandoffs takes up to a batch of frames from the ring's inbox.
func (e *engine) receiveHandoffs() int {
	r := e.r
	if r.inbox == nil || !r.inbox.pending() {
		return 0
	}
	var rs rxBurst
	rs.start(r)
	n := 0
	for ; n < r.cfg.Batch; n++ {
		buf, hwts, ok := r.inbox.peek()
		if !ok {
			break
		}
		e.rxFrame(&rs, buf, hwts)
		r.inbox.pop()
	}
	r.stats.RXHandoffIn.Add(uint64(n))
	e.finishBurst(&rs)
	return n
}

// rxBurst is the state of one receive burst.
type rxBurst struct {
	t         *table
	now       time.Time
	ts        int64
	pkts      uint64
	bytes     uint64
	fragments bool
	// f is the parsed frame; inner the inner frame of a VXLAN datagram.
	f, inner packet.Frame
}

func (rs *rxBurst) start(r *Ring) {
	rs.now = time.Now()
	rs.ts = rs.now.UnixNano()
	rs.t = r.table.Load()
}

// rxFrame parses one received frame and delivers its datagram; a VXLAN
// datagram of an overlay in use is decapsulated first.
func (e *engine) rxFrame(rs *rxBurst, buf []byte, hwts uint64) {
	r := e.r
	f := &rs.f
	if err := packet.Parse(buf, f); err != nil {
		r.stats.RXMalformed.Add(1)
		return
	}
	if f.Kind != packet.KindUDP || !r.overlayPort(f.Dst.Port()) {
		e.rxPacket(rs, f, 0, buf, hwts)
		return
	}
	if !e.udpChecksumOK(f) {
		r.stats.RXChecksum.Add(1)
		return
	}
	vni, inner, err := vxlan.Decap(f.Payload)
	if err != nil || packet.Parse(inner, &rs.inner) != nil {
		r.stats.RXMalformed.Add(1)
		return
	}
	r.stats.RXDecapsulated.Add(1)
	e.rxPacket(rs, &rs.inner, vni, inner, hwts)
}

// udpChecksumOK verifies a UDP datagram's checksum unless the NIC did or
// an IPv4 sender left it out.
func (e *engine) udpChecksumOK(f *packet.Frame) bool {
	return e.r.cfg.SkipRXChecksum || (f.UDPChecksum == 0 && f.Dst.Addr().Is4()) || f.VerifyUDP()
}

// rxPacket delivers the datagram (or fragment) of a parsed frame, received
// on the interface (vni 0) or inside an overlay.
func (e *engine) rxPacket(rs *rxBurst, f *packet.Frame, vni uint32, buf []byte, hwts uint64) {
	r := e.r
	switch f.Kind {
	case packet.KindUDP:
		if !e.udpChecksumOK(f) {
			r.stats.RXChecksum.Add(1)
			return
		}
		if e.deliver(rs.t, f.Src, f.Dst, vni, f.Payload, e.stamps(rs.ts, hwts)) {
			rs.pkts++
			rs.bytes += uint64(len(f.Payload))
			e.rxClass(f.TOS, f.PCP, f.Tagged, len(f.Payload))
		}
	case packet.KindFragment:
		k := reassembly.Key{Src: f.Src.Addr(), Dst: f.Dst.Addr(), ID: f.FragID, Proto: f.Proto}
		seg, done, err := e.reasm.Add(k, f.FragOff, f.More, f.Payload, rs.now)
		rs.fragments = true
		if err != nil || !done {
			return
		}
		sport, dport, payload, err := packet.ParseUDPSegment(seg)
		if err != nil || f.Proto != packet.ProtoUDP {
			r.stats.RXMalformed.Add(1)
			return
		}
		if !r.cfg.SkipRXChecksum && !packet.VerifyUDP(k.Src, k.Dst, seg) {
			r.stats.RXChecksum.Add(1)
			return
		}
		src, dst := netip.AddrPortFrom(k.Src, sport), netip.AddrPortFrom(k.Dst, dport)
		// The frame that completed the datagram gives its hardware
		// stamp.
		if e.deliver(rs.t, src, dst, vni, payload, e.stamps(rs.ts, hwts)) {
			rs.pkts++
			rs.bytes += uint64(len(payload))
			e.rxClass(f.TOS, f.PCP, f.Tagged, len(payload))
		}
	case packet.KindOther:
		if vni == 0 && f.Proto == packet.ProtoTCP && e.tcpReceive(buf) {
			r.stats.TCPRXPackets.Add(1)
			r.stats.TCPRXBytes.Add(uint64(len(buf)))
			return
		}
		r.stats.RXMalformed.Add(1)
	default:
		r.stats.RXMalformed.Add(1)
	}
}

// finishBurst publishes a burst's counters and datagrams.
func (e *engine) finishBurst(rs *rxBurst) {
	r := e.r
	if rs.fragments {
		e.publishReassemblyStats()
	}
	// Counters first, so that a reader woken by the datagrams sees them.
	r.stats.RXPackets.Add(rs.pkts)
	r.stats.RXBytes.Add(rs.bytes)
	e.publishTouched()
}

// deliver copies one datagram into the RX queue of every endpoint bound to
// dst (several for multicast) on the network vni names (0: the
// interface's, else a VXLAN overlay's).
func (e *engine) deliver(t *table, src, dst netip.AddrPort, vni uint32, payload []byte, st rxStamps) bool {
	eps := t.lookup(dst)
	if len(eps) == 0 {
		e.r.stats.RXNoEndpoint.Add(1)
		return false
	}
	h := dgram.Header{Addr: src, Flags: st.flags, TSSW: st.sw, TSHWRaw: st.hwRaw, TSHWSys: st.hwSys}
	if dst.Addr().IsMulticast() {
		// Every member whose filter accepts the source gets a copy.
		ok := false
		for _, ep := range eps {
			if ep.vni() == vni && ep.members.Load().accepts(dst.Addr(), src.Addr()) && e.enqueue(ep, &h, payload) {
				ok = true
			}
		}
		return ok
	}
	// Unicast goes to one endpoint: the most recently bound that accepts
	// the sender (several only with SO_REUSEADDR).
	for i := len(eps) - 1; i >= 0; i-- {
		ep := eps[i]
		if ep.vni() != vni {
			continue
		}
		if p := ep.peer.Load(); p != nil && p.IsValid() && *p != src {
			continue
		}
		return e.enqueue(ep, &h, payload)
	}
	e.r.stats.RXNoEndpoint.Add(1)
	return false
}

// publishTouched makes the datagrams enqueued since the last call visible
// and wakes their readers.
func (e *engine) publishTouched() {
	for _, ep := range e.touched {
		ep.touched = false
		ep.noteActivity()
		ep.stats.RXBatches.Add(1)
		if ep.erx.Publish() {
			ep.stats.RXWakeups.Add(1)
			_ = ep.wake.Wake()
		}
	}
	e.touched = e.touched[:0]
}

// enqueue copies one datagram into ep's RX queue (published after the burst).
func (e *engine) enqueue(ep *Endpoint, h *dgram.Header, payload []byte) bool {
	rec, err := ep.erx.Reserve(dgram.HeaderLen + len(payload))
	if err != nil {
		ep.noteActivity()
		ep.stats.RXDropped.Add(1)
		e.r.stats.RXQueueFull.Add(1)
		return false
	}
	dgram.Put(rec, h)
	copy(rec[dgram.HeaderLen:], payload)
	_ = ep.erx.Commit(dgram.HeaderLen+len(payload), dgram.TypeDatagram)
	ep.stats.RXPackets.Add(1)
	ep.stats.RXBytes.Add(uint64(len(payload)))
	if !ep.touched {
		ep.touched = true
		e.touched = append(e.touched, ep)
	}
	return true
}

// transmit takes datagrams from endpoint TX queues, builds frames and posts
// them. It returns how many datagrams it consumed.
func (e *engine) transmit(t *table) (int, error) {
	e.paceAdvance()
	if len(e.backlog) > 0 {
		if err := e.post(); err != nil {
			return 0, err
		}
		if len(e.backlog) > 0 {
			return 0, nil
		}
	}
	e.collect()
	list := e.active
	e.active = e.next[:0]
	cand := list[:0]
	for _, ep := range list {
		ep.active = false
		if ep.retired.Load() || ep.broken.Load() || ep.paceWaiting() {
			// The pacing wheel reactivates a waiting endpoint when due.
			continue
		}
		cand = append(cand, ep)
	}
	e.visits += uint64(len(cand))
	work, err := e.sendClasses(t, cand)
	for _, ep := range cand {
		switch {
		case ep.retired.Load() || ep.broken.Load():
		case ep.stalled:
			if !ep.active {
				ep.active = true
				e.stalled = append(e.stalled, ep)
			}
		case ep.paceWaiting():
		case ep.etx.Readable():
			// Left for the batch, the class's budget or its limit.
			e.activate(ep)
		case ep.etx.ArmReadWait():
			// Records arrived between the drain and arming: the producer
			// may not have announced them.
			e.activate(ep)
		}
	}
	e.next = list[:0]
	r := e.r
	r.stats.TXVisits.Store(e.visits)
	if err != nil {
		return work, err
	}
	e.publishTouched() // multicast loopback copies
	n, err := e.tcpTransmit()
	work += n
	if err != nil {
		return work, err
	}
	if len(e.tx) > 0 {
		e.backlog = append(e.backlog, e.tx...)
		e.tx = e.tx[:0]
		if err := e.post(); err != nil {
			return work, err
		}
	}
	return work, nil
}

// drain moves up to one batch of an endpoint's queued datagrams into frames,
// stopping once it has sent budget wire bytes (the traffic class's grant).
// more reports that it stopped for the batch or the budget, not because
// the endpoint cannot send now.
func (e *engine) drain(t *table, ep *Endpoint, budget int64) (n int, wire int64, more bool, err error) {
	r := e.r
	var h dgram.Header
	ep.stalled = false
	e.paceSync(ep)
	for {
		if n >= r.cfg.Batch || wire >= budget {
			more = true
			break
		}
		rec, _, err := ep.etx.Peek()
		if err != nil {
			if errors.Is(err, shmq.ErrEmpty) {
				break
			}
			// A corrupt queue: stop serving this endpoint, the others
			// go on.
			if !ep.broken.Swap(true) {
				ep.noteActivity()
				r.log.Warn("endpoint TX queue corrupt; endpoint disabled", zap.Stringer("local", ep.local), zap.Error(err))
				if ep.user != nil {
					ep.user.Break(fmt.Errorf("TX queue: %w", err))
				}
			}
			break
		}
		payload, err := dgram.Parse(rec, &h)
		if err != nil {
			ep.stats.TXErrors.Add(1)
			r.stats.TXErrors.Add(1)
			ep.etx.Advance()
			n++
			continue
		}
		dst := h.Addr
		if !dst.IsValid() {
			if p := ep.peer.Load(); p != nil {
				dst = *p
			}
		}
		tmpl, d, ok := e.template(ep, dst)
		if !ok {
			// Next hop still resolving: keep the datagram queued; the
			// resolution wakes the engine.
			ep.stalled = true
			break
		}
		if tmpl == nil {
			// Unreachable: dropped, as the kernel drops after failed ARP.
			ep.stats.TXUnreachable.Add(1)
			r.stats.TXUnreachable.Add(1)
			ep.etx.Advance()
			n++
			continue
		}
		frames, err := tmpl.Frames(len(payload))
		if err != nil {
			ep.stats.TXErrors.Add(1)
			r.stats.TXErrors.Add(1)
			ep.etx.Advance()
			n++
			continue
		}
		size := len(payload) + frames*tmpl.HeaderLen()
		if ep.pace.applied != nil && !e.paceAllow(ep, size) {
			break
		}
		if len(e.tx)+frames > cap(e.tx) {
			e.backlog = append(e.backlog, e.tx...)
			e.tx = e.tx[:0]
			if err := e.post(); err != nil {
				return n, wire, false, err
			}
			if len(e.backlog) > 0 {
				break
			}
		}
		got := e.allocTX(e.tx[len(e.tx):len(e.tx)+frames], tmpl.HeaderLen()+len(payload))
		if got < frames {
			r.prov.FreeTX(e.tx[len(e.tx) : len(e.tx)+got])
			r.stats.TXNoBuffer.Add(1)
			break
		}
		base := len(e.tx)
		e.tx = e.tx[:base+frames]
		bad := false
		for i := 0; i < frames; i++ {
			fr := &e.tx[base+i]
			l, err := tmpl.BuildFrame(fr.Buf, payload, i, d.ipID)
			if err != nil {
				bad = true
				break
			}
			fr.Buf = fr.Buf[:l]
			fr.SendQueue = ep.pace.hwQueue
		}
		if bad {
			e.dropFrames(e.tx[base:])
			e.tx = e.tx[:base]
			ep.stats.TXErrors.Add(1)
			r.stats.TXErrors.Add(1)
		} else {
			e.stage(e.tx[base:])
			d.ipID++
			if frames > 1 {
				r.stats.TXFragments.Add(uint64(frames))
			}
			if dst.Addr().IsMulticast() && ep.opts.Load().MulticastLoop {
				// Local members get a copy, as with IP_MULTICAST_LOOP.
				e.deliver(t, tmpl.Src(), dst, 0, payload, rxStamps{flags: dgram.FlagSWTimestamp, sw: time.Now().UnixNano()})
			}
			if ep.pace.applied != nil {
				e.paceCharge(ep, size)
			}
			wire += int64(size)
			ep.stats.TXPackets.Add(1)
			ep.stats.TXBytes.Add(uint64(len(payload)))
			r.stats.TXPackets.Add(1)
			r.stats.TXBytes.Add(uint64(len(payload)))
			r.stats.TC[ep.cls.tc].TXPackets.Add(1)
			if ep.ov != nil {
				r.stats.TXEncapsulated.Add(1)
			}
		}
		ep.etx.Advance()
		n++
	}
	if n > 0 {
		ep.noteActivity()
		if ep.etx.Release() {
			ep.stats.TXWakeups.Add(1)
			_ = ep.wake.Wake()
		}
	}
	return n, wire, more, nil
}

// post hands the backlog to the provider.
func (e *engine) post() error {
	n, err := e.r.prov.TXBurst(e.backlog)
	e.backlog = e.backlog[:copy(e.backlog, e.backlog[n:])]
	if errors.Is(err, unix.ENETDOWN) {
		// The link is down: drop what could not be posted, as a NIC
		// would; the ring goes on and sends again when the link is up.
		e.r.stats.TXLinkDown.Add(uint64(len(e.backlog)))
		e.dropFrames(e.backlog)
		e.backlog = e.backlog[:0]
		return nil
	}
	return err
}

// template returns the header template for ep → dst. ok=false means the
// next hop is being resolved (try later); a nil template with ok=true means
// dst is unreachable.
func (e *engine) template(ep *Endpoint, dst netip.AddrPort) (frameTemplate, *dest, bool) {
	key := tmplKey{ep: ep, dst: dst}
	opts := ep.opts.Load()
	dk := destKey{ov: ep.ov, addr: dst.Addr()}
	if te, ok := e.tmpls[key]; ok && te.opts == opts {
		if d := e.dests[dk]; d != nil {
			return te.tmpl, d, true
		}
	}
	d, ok := e.nextHop(dk)
	if !ok {
		return nil, nil, false
	}
	if d.state == destFailed {
		return nil, d, true
	}
	src := ep.local
	if src.Addr().IsUnspecified() {
		src = netip.AddrPortFrom(d.next.Src, src.Port())
	}
	to := packet.TemplateOptions{TTL: opts.TTL, TOS: opts.TOS}
	if dst.Addr().IsMulticast() {
		to.TTL = opts.MulticastTTL
	}
	e.forceHeader(&to, dst.Addr().IsMulticast())
	var tmpl frameTemplate
	var err error
	if ep.ov != nil {
		tmpl, err = e.overlayTemplate(ep, dst, d, to)
	} else {
		// Datagrams are cut at the route's MTU, and never larger than
		// the ring's frames carry (an interface MTU raised beyond them,
		// mtu.go).
		tmpl, err = packet.NewTemplate(d.next.SrcMAC, d.next.DstMAC, src, dst, min(d.next.MTU, e.r.maxMTU()), to)
	}
	if err != nil {
		e.r.log.Warn("cannot build header template", zap.Stringer("dst", dst), zap.Error(err))
		return nil, d, true
	}
	if len(e.tmpls) >= 4*maxDests {
		clear(e.tmpls)
	}
	e.tmpls[key] = tmplEntry{tmpl: tmpl, opts: opts}
	return tmpl, d, true
}

// nextHop returns the destination state of addr, starting a resolution
// when it is unknown or its failure is old. ok=false: being resolved (try
// later; the resolution wakes the engine); otherwise d is ready or failed
// (unreachable).
func (e *engine) nextHop(key destKey) (d *dest, ok bool) {
	d = e.dests[key]
	if d == nil {
		if len(e.dests) >= maxDests {
			// Bounded memory for a server answering many peers: start
			// over; entries are rebuilt on demand.
			clear(e.dests)
			clear(e.tmpls)
		}
		d = &dest{state: destResolving, ipID: rand.Uint32()}
		e.dests[key] = d
		e.startResolve(key)
		return nil, false
	}
	switch d.state {
	case destResolving:
		return nil, false
	case destFailed:
		if time.Now().After(d.retryAt) {
			d.state = destResolving
			e.startResolve(key)
			return nil, false
		}
	}
	return d, true
}

func (e *engine) startResolve(key destKey) {
	r := e.r
	go func() {
		ctx, cancel := context.WithTimeout(r.ctx, r.cfg.ResolveTimeout)
		defer cancel()
		res := resolution{gen: r.generation(), key: key}
		if key.ov == nil {
			res.next, res.err = r.res.Resolve(ctx, key.addr)
		} else {
			res.next, res.outer, res.remote, res.err = r.resolveOverlay(ctx, key.ov, key.addr)
		}
		select {
		case r.resolved <- res:
			r.doorbell.Wake()
		case <-r.done:
		}
	}()
}

func (e *engine) applyResolution(res resolution) {
	d := e.dests[res.key]
	if d == nil || d.state != destResolving {
		return // forgotten after a route change; the next datagram asks again
	}
	if res.gen != e.gen {
		// Answered from tables that changed meanwhile: ask again.
		e.startResolve(res.key)
		return
	}
	if res.err != nil {
		d.state, d.err, d.retryAt = destFailed, res.err, time.Now().Add(time.Second)
		e.r.log.Warn("destination unreachable", zap.Stringer("dst", res.key.addr), zap.Error(res.err))
		return
	}
	d.state, d.next, d.outer, d.remote, d.err = destReady, res.next, res.outer, res.remote, nil
}

// drainEventfd consumes an eventfd's counter (non-blocking) after poll
// reported it readable.
func drainEventfd(fd int) {
	var buf [8]byte
	_, _ = unix.Read(fd, buf[:])
}

func (e *engine) publishReassemblyStats() {
	st := e.reasm.Stats()
	e.reasmStats.Store(&st)
}
