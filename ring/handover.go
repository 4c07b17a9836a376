package ring

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/route"
)

// Live upgrade (docs/architecture.md, "Live upgrade"): an old daemon's ring
// is Released, leaving its steering program, flows, port reservations and
// queues to a new daemon, whose ring is opened with Config.Adopt, gets the
// endpoints back with AdoptEndpoint and starts receiving at Activate. The
// AF_XDP socket and UMEM are not handed over: the new ring opens its own.

// backlogHold is the receive buffer a port reservation gets while its ring
// is handed over: the kernel queues the port's datagrams there (the XSKMAP
// slot is empty) until the new ring reads them.
const backlogHold = 4 << 20

// releaseDrain bounds the old ring's last receive and transmit pass.
const releaseDrain = 200 * time.Millisecond

// Adoption is what a ring opened for a takeover reuses.
type Adoption struct {
	// Doorbell is the engine's eventfd the clients hold.
	Doorbell *shmq.Waiter
	// Program is the interface's steering program, adopted with
	// bpf.Adopt (shared by the interface's rings like an attached one).
	Program *bpf.Program
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

// Release hands the ring over. The port reservations start holding what
// the kernel receives, the ring's socket leaves the XSKMAP (steered frames
// now reach the kernel, hence the reservations), the engine stops and a
// last pass moves what the socket had received into the endpoints' queues
// and sends what it had built. Then the ring closes its socket, UMEM and
// standby TAP path and its descriptors of the program, the reservations
// and the eventfds, leaving every one of those kernel objects to the new
// daemon, which holds its own descriptors of them. The endpoints are
// unusable afterwards; the ring is closed.
func (r *Ring) Release() error {
	if err := r.CanHandOver(); err != nil {
		return fmt.Errorf("ring %s/%d: cannot hand over: %w", r.cfg.Interface, r.cfg.Queue, err)
	}
	st := r.mainSteering().(*afxdp.Steering)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return errRingClosed
	}
	r.closed = true
	eps := r.table.Load().all
	r.mu.Unlock()
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
	// In-ring TCP connections are not handed over (yet): they end here.
	r.closeTCP()
	r.stop.Store(true)
	r.cancel()
	_ = r.doorbell.Wake()
	<-r.done
	// The engine thread is gone: its state is this goroutine's now.
	e := &r.eng
	for end := time.Now().Add(releaseDrain); time.Now().Before(end); {
		n := e.receive()
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
	ps := r.prov.Stats()
	if r.hw != nil {
		<-r.hw.done
		errs = append(errs, r.hw.close())
	}
	r.stopWatch()
	for _, ep := range eps {
		ep.closed.Store(true)
		ep.release()
	}
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
	errs = append(errs, r.res.Close(), r.doorbell.Close())
	r.nl.Close()
	r.ns.Close()
	r.log.Info("ring handed over", zap.Int("endpoints", len(eps)), zap.Uint64("xsk_rx_dropped", ps.RXDropped),
		zap.Uint64("rx_packets", r.stats.RXPackets.Load()), zap.Uint64("tx_packets", r.stats.TXPackets.Load()))
	return errors.Join(errs...)
}

// Activate starts a ring opened with Config.Adopt receiving: it delivers
// what the kernel held on the adopted endpoints' reservations, puts the
// ring's socket in the XSKMAP, and delivers what reached the kernel
// meanwhile.
func (r *Ring) Activate() error {
	st, ok := r.mainSteering().(*afxdp.Steering)
	if !ok {
		return fmt.Errorf("ring %s/%d: activate: no XDP path", r.cfg.Interface, r.cfg.Queue)
	}
	r.backlogPass()
	if err := st.Activate(); err != nil {
		return fmt.Errorf("ring %s/%d: %w", r.cfg.Interface, r.cfg.Queue, err)
	}
	// Frames already past the program when the slot filled still land
	// on the reservations.
	time.Sleep(10 * time.Millisecond)
	r.backlogPass()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ep := range r.table.Load().all {
		ep.adopted.Store(false)
	}
	// Now the standby TAP path may have the flows: until the socket was
	// in the XSKMAP its filters would have taken them from the
	// reservations.
	r.standbyDeferred = false
	if sb := r.fb.standby; sb != nil {
		for f := range r.flowRefs {
			if err := sb.steer.AddFlow(f); err != nil {
				return fmt.Errorf("ring %s/%d: TAP path: steer %v: %w", r.cfg.Interface, r.cfg.Queue, f, err)
			}
		}
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
func (e *engine) drainBacklog(t *table) {
	r := e.r
	if !r.backlogWanted.Load() {
		return
	}
	if e.backlogBuf == nil {
		e.backlogBuf = make([]byte, 64<<10)
	}
	st := e.stamps(time.Now().UnixNano(), 0)
	var pkts, bytes uint64
	for _, ep := range t.all {
		if !ep.adopted.Load() {
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

// EndpointHandover is an endpoint's state and duplicates of its
// descriptors (the caller's to close), for a new daemon.
type EndpointHandover struct {
	Local, Peer    netip.AddrPort
	Steered        []netip.Addr
	Groups         []Membership
	Reservation    int
	RXWait, TXWait int
}

// Handover describes the endpoint for a new daemon.
func (ep *Endpoint) Handover() (h EndpointHandover, err error) {
	h = EndpointHandover{Local: ep.local, Peer: ep.Peer(), Steered: ep.steered, Groups: ep.Memberships(),
		Reservation: -1, RXWait: -1, TXWait: -1}
	dup := func(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }
	defer func() {
		if err != nil {
			for _, fd := range []int{h.Reservation, h.RXWait, h.TXWait} {
				if fd >= 0 {
					unix.Close(fd)
				}
			}
		}
	}()
	if h.Reservation, err = ep.resv.Dup(); err != nil {
		return h, err
	}
	if h.RXWait, err = dup(ep.rxWait.FD()); err != nil {
		return h, fmt.Errorf("duplicate RX eventfd: %w", err)
	}
	if h.TXWait, err = dup(ep.txWait.FD()); err != nil {
		return h, fmt.Errorf("duplicate TX eventfd: %w", err)
	}
	return h, nil
}

// AdoptEndpoint binds an endpoint a previous daemon handed over: the same
// address, peer, steering and memberships, its reservation (h.Reservation,
// owned from now on like q's waiters, also on error) and the queues in q.
// The kernel's multicast memberships are on the reservation already. Until
// Activate, what the kernel held on the reservation is delivered first.
func (r *Ring) AdoptEndpoint(h EndpointHandover, q *Queues) (_ *Endpoint, err error) {
	fail := func(err error) error {
		return fmt.Errorf("ring %s/%d: adopt endpoint %v: %w", r.cfg.Interface, r.cfg.Queue, h.Local, err)
	}
	resv, err := route.AdoptReservation(h.Reservation)
	if err != nil {
		_ = q.RXWait.Close()
		_ = q.TXWait.Close()
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
	if err := ep.initQueues(q, r.cfg.QueueBytes); err != nil {
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
	if ep.local.Addr().IsMulticast() {
		t = t.withListed(ep)
	} else {
		t = t.withEndpoint(ep.local, ep)
	}
	for _, m := range ms.groups {
		t = t.withKey(netip.AddrPortFrom(m.group, ep.local.Port()), ep)
	}
	r.table.Store(t)
	_ = r.doorbell.Wake()
	return ep, nil
}
