package ring

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/tap"
)

// Live upgrade (docs/architecture.md, "Live upgrade"). Two ways, by the
// state document's version:
//
//   - The socket moves (version 2). The new daemon opens its ring with
//     Config.Adopt carrying the AF_XDP socket, its UMEM and the standby TAP
//     (PathHandover) while the old ring still serves; the engine does not
//     start. The old ring is then Quiesced (engine stopped at an iteration
//     boundary, what it held delivered or posted), its PathState goes to
//     the new ring's Activate, which starts the engine where the old one
//     stopped. The socket never leaves its queue or XSKMAP slot: frames
//     arriving meanwhile wait in its RX ring. The old ring is Abandoned.
//   - The ring is re-created (version 1): the old ring is Released (its
//     socket leaves the XSKMAP, the port reservations hold what the kernel
//     gets meanwhile), the new one opens its own socket and UMEM,
//     AdoptEndpoint rebinds, Activate delivers the kernel's backlog.

// backlogHold is the receive buffer a port reservation gets while its ring
// is handed over the version 1 way: the kernel queues the port's datagrams
// there (the XSKMAP slot is empty) until the new ring reads them.
const backlogHold = 4 << 20

// releaseDrain bounds the old ring's last receive and transmit pass.
const releaseDrain = 200 * time.Millisecond

// drainStopped runs a stopped engine's last pass, for releaseDrain at
// most: what recv takes in, the posts still backlogged and the
// completions, until nothing moves.
func (r *Ring) drainStopped(recv func() int) error {
	e := &r.eng
	var errs []error
	for end := time.Now().Add(releaseDrain); time.Now().Before(end); {
		n := recv()
		if len(e.backlog) > 0 {
			errs = append(errs, e.post())
		}
		if r.prov.TXPending() > 0 {
			n += r.prov.Complete()
		}
		if n == 0 && len(e.backlog) == 0 && r.prov.TXPending() == 0 {
			break
		}
	}
	return errors.Join(errs...)
}

// Adoption is what a ring opened for a takeover reuses.
type Adoption struct {
	// Program is the interface's steering program, adopted with
	// bpf.Adopt (shared by the interface's rings like an attached one).
	Program *bpf.Program
	// Path is the fast path's socket and the standby TAP (version 2);
	// nil: the ring opens its own (version 1).
	Path *qp.PathHandover
}

// PathState is a quiesced ring's engine-side state of its fast path.
type PathState struct {
	XSK afxdp.State `json:"xsk"`
}

// CanHandOver reports why the ring cannot be handed over (nil: it can):
// only a ring serving on its XDP fast path can.
func (r *Ring) CanHandOver() error {
	if r.fb.fp != nil && r.fb.fp.onTAP.Load() {
		return errors.New("the ring serves through its TAP fallback path")
	}
	if _, ok := r.mainSteering().(*afxdp.Steering); !ok {
		return fmt.Errorf("provider %s keeps no state another process can adopt", r.cfg.Provider)
	}
	if err := r.Err(); err != nil {
		return fmt.Errorf("the ring stopped: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ov := range r.overlays {
		return fmt.Errorf("sockets are bound on the VXLAN overlay %s, which a new daemon cannot adopt yet", ov.name)
	}
	return nil
}

// Handles returns duplicates of the steering program's descriptors (the
// caller's to close).
func (r *Ring) Handles() (bpf.Handles, error) {
	st, ok := r.mainSteering().(*afxdp.Steering)
	if !ok {
		return bpf.Handles{}, fmt.Errorf("ring %s/%d: no XDP program to hand over", r.cfg.Interface, r.cfg.Queue)
	}
	return st.Program().Handover()
}

// PathHandover returns duplicates of the ring's AF_XDP socket, UMEM and
// standby TAP descriptors (the caller's to close) and the socket's layout.
// The ring keeps serving.
func (r *Ring) PathHandover() (*qp.PathHandover, error) {
	p := r.fb.prim.Load()
	if p == nil {
		return nil, fmt.Errorf("ring %s/%d: no fast path to hand over", r.cfg.Interface, r.cfg.Queue)
	}
	sock, ok := p.prov.(*afxdp.Socket)
	if !ok {
		return nil, fmt.Errorf("ring %s/%d: provider %s keeps no state another process can adopt", r.cfg.Interface, r.cfg.Queue, r.cfg.Provider)
	}
	h := &qp.PathHandover{XSK: -1, UMEM: -1, TAP: -1}
	xsk, umem, layout, err := sock.Handover()
	if err != nil {
		return nil, err
	}
	h.XSK, h.UMEM = xsk, umem
	if h.Layout, err = json.Marshal(layout); err != nil {
		h.Close()
		return nil, fmt.Errorf("ring %s/%d: socket layout: %w", r.cfg.Interface, r.cfg.Queue, err)
	}
	if r.fb.tapDev != nil {
		if h.TAP, err = r.fb.tapDev.Dup(); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// endpointsLocked lists the bound endpoints (the caller holds mu).
func (r *Ring) endpointsLocked() []*Endpoint {
	eps := make([]*Endpoint, 0, len(r.eps))
	for ep := range r.eps {
		eps = append(eps, ep)
	}
	return eps
}

// beginHandover closes the ring to new endpoints and returns its steering
// and endpoints.
func (r *Ring) beginHandover() (*afxdp.Steering, []*Endpoint, error) {
	if err := r.CanHandOver(); err != nil {
		return nil, nil, fmt.Errorf("ring %s/%d: cannot hand over: %w", r.cfg.Interface, r.cfg.Queue, err)
	}
	st := r.mainSteering().(*afxdp.Steering)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, errRingClosed
	}
	r.closed = true
	return st, r.endpointsLocked(), nil
}

// stopEngine stops the engine thread; its state is the caller's after.
func (r *Ring) stopEngine() {
	// In-ring TCP connections are not handed over (yet): they end here.
	r.closeTCP()
	r.stop.Store(true)
	r.cancel()
	_ = r.doorbell.Wake()
	<-r.done
}

// Release hands the ring over the version 1 way. The port reservations
// start holding what the kernel receives, the ring's socket leaves the
// XSKMAP (steered frames now reach the kernel, hence the reservations),
// the engine stops and a last pass moves what the socket had received into
// the endpoints' queues and sends what it had built. Then the ring lets go
// of everything (abandon). The endpoints are unusable afterwards; the ring
// is closed.
func (r *Ring) Release() error {
	st, eps, err := r.beginHandover()
	if err != nil {
		return err
	}
	var errs []error
	for _, ep := range eps {
		if err := ep.resv.Hold(backlogHold); err != nil {
			errs = append(errs, err)
		}
	}
	if r.fb.standby != nil {
		// The standby TAP path's flow filters would take what XDP now
		// passes to the kernel, and nobody reads its TAP any more.
		errs = append(errs, r.fb.standby.steer.Close())
	}
	errs = append(errs, st.ClearSlot())
	r.stopEngine()
	errs = append(errs, r.drainStopped(r.eng.receive))
	errs = append(errs, r.abandon(st, eps)...)
	return errors.Join(errs...)
}

// Quiesce hands rings over the version 2 way: it stops their engines and
// returns each ring's PathState for the new daemon's Activate. All the
// rings of the daemon go together: one stopped ring no longer hands frames
// to another's inbox, whose last pass then delivers what it holds. The
// sockets' RX rings are left as they are (the new engine reads them);
// built frames are posted and their completions awaited for a moment.
// stopping (may be nil) is called just before the engines stop. Each ring
// must then be Abandoned.
func Quiesce(rings []*Ring, stopping func()) ([]PathState, error) {
	type stopped struct {
		st  *afxdp.Steering
		eps []*Endpoint
	}
	var errs []error
	var ss []stopped
	for _, r := range rings {
		st, eps, err := r.beginHandover()
		if err != nil {
			errs = append(errs, err)
		}
		ss = append(ss, stopped{st, eps})
	}
	if err := errors.Join(errs...); err != nil {
		for i, r := range rings {
			if ss[i].st != nil {
				r.mu.Lock()
				r.closed = false
				r.mu.Unlock()
			}
		}
		return nil, err
	}
	for _, r := range rings {
		// XDP keeps steering every flow to the socket: the standby TAP
		// path's filters carry nothing, and the new daemon's ring makes
		// its own at Activate.
		if r.fb.standby != nil {
			errs = append(errs, r.fb.standby.steer.Close())
		}
	}
	if stopping != nil {
		stopping()
	}
	for _, r := range rings {
		r.stopEngine()
	}
	out := make([]PathState, len(rings))
	for i, r := range rings {
		errs = append(errs, r.drainStopped(r.eng.receiveHandoffs))
		out[i].XSK = r.fb.prim.Load().prov.(*afxdp.Socket).State()
		r.quiesced = ss[i].st
		r.quiescedEPs = ss[i].eps
	}
	return out, errors.Join(errs...)
}

// Abandon lets go of a Quiesced ring: it closes this process's
// descriptors and mappings, leaving the kernel objects to the new daemon.
func (r *Ring) Abandon() error {
	st, eps := r.quiesced, r.quiescedEPs
	if st == nil {
		return fmt.Errorf("ring %s/%d: abandon: not quiesced", r.cfg.Interface, r.cfg.Queue)
	}
	r.quiesced, r.quiescedEPs = nil, nil
	return errors.Join(r.abandon(st, eps)...)
}

// Started reports whether the ring's engine was started (false for a
// ring opened on a handed-over socket until Activate).
func (r *Ring) Started() bool { return !r.deferStart }

// StartedAt is when the ring's engine started (zero before).
func (r *Ring) StartedAt() time.Time {
	if r.deferStart {
		return time.Time{}
	}
	return r.startedAt
}

// Discard lets go of a ring opened on a handed-over socket whose Activate
// never ran (the takeover was refused or failed before the old daemon let
// go): like Abandon, it touches nothing the old daemon still serves with.
func (r *Ring) Discard() error {
	if !r.deferStart {
		return fmt.Errorf("ring %s/%d: discard: not an adopted ring waiting for Activate", r.cfg.Interface, r.cfg.Queue)
	}
	st, ok := r.mainSteering().(*afxdp.Steering)
	if !ok {
		return fmt.Errorf("ring %s/%d: discard: no XDP path", r.cfg.Interface, r.cfg.Queue)
	}
	r.mu.Lock()
	r.closed = true
	eps := r.endpointsLocked()
	r.mu.Unlock()
	r.cancel()
	return errors.Join(r.abandon(st, eps)...)
}

// abandon closes the ring's own descriptors and mappings after its engine
// stopped, touching none of the kernel objects a new daemon holds, and
// forgets the ring's share of the interface's flows.
func (r *Ring) abandon(st *afxdp.Steering, eps []*Endpoint) []error {
	var errs []error
	ps := r.prov.Stats()
	if r.hw != nil {
		if !r.deferStart {
			<-r.hw.done
		}
		errs = append(errs, r.hw.close())
	}
	r.stopWatch()
	r.leaveGroup()
	for _, ep := range eps {
		ep.closed.Store(true)
		ep.release()
	}
	r.mu.Lock()
	flows := make([]qp.Flow, 0, len(r.flowRefs))
	for f := range r.flowRefs {
		flows = append(flows, f)
	}
	r.mu.Unlock()
	st.Forget(flows)
	r.fb.closed.Store(true)
	if p := r.fb.prim.Swap(nil); p != nil {
		errs = append(errs, p.prov.Close(), st.Abandon())
	}
	if r.fb.standby != nil {
		errs = append(errs, r.fb.standby.close())
	}
	if r.fb.wake != nil {
		errs = append(errs, r.fb.wake.Close())
	}
	errs = append(errs, r.res.Close(), r.closeDoorbells())
	r.nl.Close()
	r.ns.Close()
	r.log.Info("ring handed over", zap.Int("endpoints", len(eps)), zap.Uint64("xsk_rx_dropped", ps.RXDropped),
		zap.Uint64("rx_packets", r.stats.RXPackets.Load()), zap.Uint64("tx_packets", r.stats.TXPackets.Load()))
	return errs
}

// Activate starts a ring opened with Config.Adopt (ArmStandby follows).
// With a handed-over socket (version 2, st the old ring's PathState) the
// engine starts where the old one stopped. Without (version 1, st nil) it delivers what the kernel held on the
// adopted endpoints' reservations, puts the ring's socket in the XSKMAP,
// and delivers what reached the kernel meanwhile.
func (r *Ring) Activate(st *PathState) error {
	xs, ok := r.mainSteering().(*afxdp.Steering)
	if !ok {
		return fmt.Errorf("ring %s/%d: activate: no XDP path", r.cfg.Interface, r.cfg.Queue)
	}
	if r.deferStart {
		if st == nil {
			return fmt.Errorf("ring %s/%d: activate: the old ring's state is missing", r.cfg.Interface, r.cfg.Queue)
		}
		if err := r.fb.prim.Load().prov.(*afxdp.Socket).SetState(st.XSK); err != nil {
			return fmt.Errorf("ring %s/%d: %w", r.cfg.Interface, r.cfg.Queue, err)
		}
		// The endpoints' queues were attached while the old engine still
		// moved their indexes.
		r.mu.Lock()
		eps := r.endpointsLocked()
		r.mu.Unlock()
		for _, ep := range eps {
			if err := errors.Join(ep.etx.Resync(), ep.erx.Resync()); err != nil {
				return fmt.Errorf("ring %s/%d: endpoint %v: %w", r.cfg.Interface, r.cfg.Queue, ep.local, err)
			}
		}
		r.deferStart = false
		r.start()
	} else {
		r.backlogPass()
		if err := xs.Activate(); err != nil {
			return fmt.Errorf("ring %s/%d: %w", r.cfg.Interface, r.cfg.Queue, err)
		}
		// Frames already past the program when the slot filled still land
		// on the reservations.
		time.Sleep(10 * time.Millisecond)
		r.backlogPass()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ep := range *r.adoptedEps.Load() {
		ep.adopted.Store(false)
	}
	r.adoptedEps.Store(&[]*Endpoint{})
	return nil
}

// ArmStandby gives an activated ring's standby TAP path (if any) its flow
// filters and starts the path watcher. The daemon calls it once every
// ring is Activated: on a ring with many flows it takes a while, and no
// other ring's engine should wait for it.
func (r *Ring) ArmStandby() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Now the standby TAP path may have the flows: until the old daemon
	// removed its filters (or, version 1, until the socket was in the
	// XSKMAP) they would have clashed with them (or taken the flows from
	// the reservations).
	r.standbyDeferred = false
	if sb := r.fb.standby; sb != nil {
		if sb.steer == nil {
			steer, err := tap.NewSteering(r.ns, r.ifindex, r.fb.tapDev)
			if err == nil {
				err = setStandby(steer)
			}
			if err != nil {
				return fmt.Errorf("ring %s/%d: TAP path: %w", r.cfg.Interface, r.cfg.Queue, err)
			}
			sb.steer = steer
		}
		for f := range r.flowRefs {
			if err := sb.steer.AddFlow(f); err != nil {
				return fmt.Errorf("ring %s/%d: TAP path: steer %v: %w", r.cfg.Interface, r.cfg.Queue, f, err)
			}
		}
	}
	if r.fb.done == nil {
		r.startWatch()
	}
	return nil
}

// backlogPass makes the engine read the adopted endpoints' reservations
// once and waits for it.
func (r *Ring) backlogPass() {
	r.backlogWanted.Store(true)
	r.sync()
	for r.backlogWanted.Load() {
		select {
		case <-r.done:
			return
		default:
		}
		r.sync()
	}
}

// drainBacklog moves the datagrams the kernel held on adopted endpoints'
// reservations into their RX queues (engine thread).
func (e *engine) drainBacklog() {
	r := e.r
	if !r.backlogWanted.Load() {
		return
	}
	if e.backlogBuf == nil {
		e.backlogBuf = make([]byte, 64<<10)
	}
	st := e.stamps(time.Now().UnixNano(), 0)
	var pkts, bytes uint64
	for _, ep := range *r.adoptedEps.Load() {
		if !ep.adopted.Load() || ep.retired.Load() {
			continue
		}
		for {
			n, src, ok, err := ep.resv.ReadBacklog(e.backlogBuf)
			if err != nil {
				r.log.Warn("cannot read a port reservation's backlog", zap.Stringer("local", ep.local), zap.Error(err))
			}
			if !ok {
				break
			}
			h := dgram.Header{Addr: src, Flags: st.flags, TSSW: st.sw}
			if e.enqueue(ep, &h, e.backlogBuf[:n]) {
				pkts++
				bytes += uint64(n)
			}
		}
	}
	r.stats.RXPackets.Add(pkts)
	r.stats.RXBytes.Add(bytes)
	r.stats.RXKernelBacklog.Add(pkts)
	e.publishTouched()
	r.backlogWanted.Store(false)
}

// EndpointHandover is an endpoint's state and a duplicate of its port
// reservation's descriptor (the caller's to close), for a new daemon. Its
// queues and wake-ups live in the client's session memory, which the
// daemon hands over as a whole.
type EndpointHandover struct {
	Local, Peer netip.AddrPort
	Steered     []netip.Addr
	Groups      []Membership
	Reservation int
}

// Handover describes the endpoint for a new daemon.
func (ep *Endpoint) Handover() (EndpointHandover, error) {
	h := EndpointHandover{Local: ep.local, Peer: ep.Peer(), Steered: ep.steered, Groups: ep.Memberships(), Reservation: -1}
	var err error
	h.Reservation, err = ep.resv.Dup()
	return h, err
}

// AdoptEndpoint binds an endpoint a previous daemon handed over: the same
// address, peer, steering and memberships, its reservation (h.Reservation,
// owned from now on, also on error) and the queues in q.
// The kernel's multicast memberships are on the reservation already. Until
// Activate, what the kernel held on the reservation is delivered first.
func (r *Ring) AdoptEndpoint(h EndpointHandover, q *Queues) (_ *Endpoint, err error) {
	fail := func(err error) error {
		return fmt.Errorf("ring %s/%d: adopt endpoint %v: %w", r.cfg.Interface, r.cfg.Queue, h.Local, err)
	}
	resv, err := route.AdoptReservation(h.Reservation)
	if err != nil {
		return nil, fail(err)
	}
	ep := &Endpoint{r: r, local: unmap(h.Local), resv: resv, steered: h.Steered}
	ep.opts.Store(&DefaultHeaderOptions)
	ep.members.Store(&memberships{})
	ep.adopted.Store(true)
	defer func() {
		if err != nil {
			ep.release()
		}
	}()
	if err := ep.initQueues(q, r.cfg.QueueBytes, false); err != nil {
		return nil, fail(err)
	}
	if h.Peer.IsValid() {
		if err := ep.Connect(h.Peer); err != nil {
			return nil, fail(err)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errRingClosed
	}
	var added []netip.AddrPort
	undo := func() {
		for _, a := range added {
			r.delFlowLocked(r.udpFlow(a))
		}
	}
	// The flows are in the adopted map already; adding them again counts
	// this ring's references (the map update itself is idempotent).
	ms := &memberships{}
	for _, g := range h.Groups {
		ms.groups = append(ms.groups, membership{group: g.Group, sources: g.Sources})
	}
	keys := make([]netip.AddrPort, 0, len(h.Steered)+len(ms.groups))
	for _, d := range h.Steered {
		keys = append(keys, netip.AddrPortFrom(d, ep.local.Port()))
	}
	for _, m := range ms.groups {
		keys = append(keys, netip.AddrPortFrom(m.group, ep.local.Port()))
	}
	for _, k := range keys {
		if err := r.addFlowLocked(r.udpFlow(k)); err != nil {
			undo()
			return nil, fail(fmt.Errorf("steer flow: %w", err))
		}
		added = append(added, k)
	}
	ep.members.Store(ms)
	t := r.table.Load()
	if !ep.local.Addr().IsMulticast() {
		t = t.withKey(ep.local, ep)
	}
	for _, m := range ms.groups {
		t = t.withKey(netip.AddrPortFrom(m.group, ep.local.Port()), ep)
	}
	r.table.Store(t)
	r.eps[ep] = struct{}{}
	r.nEps.Store(int64(len(r.eps)))
	adopted := append(slices.Clone(*r.adoptedEps.Load()), ep)
	r.adoptedEps.Store(&adopted)
	if ep.lane != nil {
		ep.lane.setEndpoint(ep.slot, ep)
	}
	// One visit: the client may have queued records for the old daemon.
	r.announce(ep)
	return ep, nil
}
