package daemon

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/takeover"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring"
)

// The old daemon's side of a live upgrade (docs/architecture.md, "Live
// upgrade"): a TAKEOVER request pauses the daemon, its state goes to the
// new daemon, and on the new one's TAKE the rings are released and the
// daemon stops without releasing anything it handed over. Anything else
// resumes it.

// takeoverTimeout bounds each wait of the handover: sessions parking, the
// new daemon's verdict.
const takeoverTimeout = 10 * time.Second

// verdictTimeout bounds the wait for the new daemon's verdict: it builds
// every socket it received (nfds descriptors) first, which takes a few
// milliseconds each on a loaded machine.
func verdictTimeout(nfds int) time.Duration {
	return takeoverTimeout + time.Duration(nfds)*5*time.Millisecond
}

// pauseState is the daemon's pause for a handover. Guarded by Daemon.mu.
type pauseState struct {
	active bool
	// resume is closed to end the pause; handedOver says how it ended.
	resume     chan struct{}
	handedOver bool
	// acceptParked is closed by the accept loop once it stopped.
	acceptParked chan struct{}
}

// pause stops the accept loop and parks every session but except between
// two requests. It returns the parked sessions.
func (d *Daemon) pause(except *session) ([]*session, error) {
	d.mu.Lock()
	if d.pz.active || d.stopping || !d.serving {
		d.mu.Unlock()
		return nil, fmt.Errorf("another takeover is under way, or the daemon is stopping: %w", unix.EBUSY)
	}
	parked := make(chan struct{})
	d.pz = pauseState{active: true, resume: make(chan struct{}), acceptParked: parked}
	d.mu.Unlock()
	if err := d.ln.SetDeadline(time.Unix(1, 0)); err != nil {
		d.resume(nil)
		return nil, err
	}
	select {
	case <-parked:
	case <-time.After(takeoverTimeout):
		d.resume(nil)
		return nil, fmt.Errorf("the accept loop did not pause: %w", unix.EBUSY)
	}
	// No session can start now.
	d.mu.Lock()
	var out []*session
	waits := map[*session]chan struct{}{}
	for s := range d.sessions {
		if s != except {
			s.parked = make(chan struct{})
			waits[s] = s.parked
			out = append(out, s)
		}
	}
	d.mu.Unlock()
	for _, s := range out {
		_ = s.conn.SetReadDeadline(time.Unix(1, 0))
	}
	deadline := time.After(takeoverTimeout)
	live := out[:0:0]
	for _, s := range out {
		select {
		case <-waits[s]:
			live = append(live, s)
		case <-s.done:
			// The client went away meanwhile; its session released it.
		case <-deadline:
			d.resume(out)
			return nil, fmt.Errorf("a client's session (pid %d) did not pause: %w", s.cred.Pid, unix.EBUSY)
		}
	}
	return live, nil
}

// resume ends a pause: sessions read requests again and the accept loop
// goes on (or, handed over, both end).
func (d *Daemon) resume(sessions []*session) {
	if !d.pz.handedOver {
		_ = d.ln.SetDeadline(time.Time{})
		for _, s := range sessions {
			_ = s.conn.SetReadDeadline(time.Time{})
		}
	}
	d.mu.Lock()
	close(d.pz.resume)
	d.pz.active = false
	d.mu.Unlock()
}

// park is called by a session (nil: the accept loop) whose read hit the
// pause deadline. It waits for the pause to end and reports whether the
// caller goes on (false: the daemon was handed over, or this was no pause).
func (d *Daemon) park(s *session) bool {
	d.mu.Lock()
	active, resume, signal := d.pz.active, d.pz.resume, d.pz.acceptParked
	if s != nil {
		signal, s.parked = s.parked, nil
	}
	d.mu.Unlock()
	if !active || signal == nil {
		return false
	}
	close(signal)
	<-resume
	d.mu.Lock()
	defer d.mu.Unlock()
	return !d.pz.handedOver
}

// onTakeover serves TAKEOVER: the whole handover runs here, in the
// requesting connection's session, which ends with it.
func (s *session) onTakeover(h ctlproto.Header, msg ctlproto.Message) bool {
	d := s.d
	m, ok := msg.(*ctlproto.Takeover)
	if !ok {
		s.fail(h, fmt.Errorf("TAKEOVER body %T: %w", msg, unix.EINVAL))
		return false
	}
	log := s.log.With(zap.String("takeover", "offer"))
	if s.cred.Uid != 0 && s.cred.Uid != uint32(os.Geteuid()) {
		log.Warn("takeover refused: the new daemon runs as another user")
		s.fail(h, fmt.Errorf("uid %d may not take over: %w", s.cred.Uid, unix.EPERM))
		return false
	}
	version, err := takeover.Choose(int(m.MinState), int(m.MaxState))
	if err != nil {
		log.Warn("takeover refused", zap.Error(err))
		s.fail(h, fmt.Errorf("%w: %w", err, unix.EPROTONOSUPPORT))
		return false
	}
	for _, ri := range d.rings {
		if err := ri.downErr(); err != nil {
			log.Warn("takeover refused: a ring cannot be handed over", zap.Stringer("ring", ri.it), zap.Error(err))
			s.fail(h, fmt.Errorf("ring %s: %w", ri.it, unix.EBUSY))
			return false
		}
		if err := ri.ring().CanHandOver(); err != nil {
			log.Warn("takeover refused: a ring cannot be handed over", zap.Stringer("ring", ri.it), zap.Error(err))
			s.fail(h, fmt.Errorf("ring %s: %w", ri.it, unix.EBUSY))
			return false
		}
	}
	start := time.Now()
	parked, err := d.pause(s)
	if err != nil {
		log.Warn("takeover refused", zap.Error(err))
		s.fail(h, err)
		return false
	}
	handedOver := false
	defer func() {
		if !handedOver {
			d.resume(parked)
			log.Info("takeover abandoned: serving on", zap.Duration("paused", time.Since(start)))
		}
	}()
	if !s.reply(ctlproto.ReplyHeader(h), ctlproto.TakeoverReply{State: uint16(version), DaemonPID: uint32(os.Getpid())}) {
		return false
	}
	fd, err := s.conn.Dup()
	if err != nil {
		log.Warn("takeover failed", zap.Error(err))
		return false
	}
	tc, err := takeover.NewConn(fd)
	if err != nil {
		log.Warn("takeover failed", zap.Error(err))
		return false
	}
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(takeoverTimeout))
	var tab takeover.Table
	defer func() {
		for _, fd := range tab.FDs() {
			unix.Close(fd)
		}
	}()
	st, err := d.describe(version, parked, &tab)
	if err != nil {
		log.Warn("takeover failed: cannot describe the daemon's state", zap.Error(err))
		_ = tc.Refuse(err.Error())
		return false
	}
	doc, err := st.Encode()
	if err == nil {
		err = tc.Offer(version, doc, tab.FDs())
	}
	if err == nil {
		// The new daemon builds every socket before it answers.
		_ = tc.SetDeadline(time.Now().Add(verdictTimeout(len(tab.FDs()))))
		err = tc.Verdict()
	}
	if err != nil {
		log.Warn("takeover failed: the new daemon did not take over", zap.Error(err))
		return false
	}
	// Point of no return: the new daemon owns everything now.
	handedOver = true
	d.handOver(version, parked, tc, log)
	log.Info("handed over to the new daemon", zap.Int32("new_pid", s.cred.Pid), zap.Int("sessions", len(parked)),
		zap.Int("descriptors", len(tab.FDs())), zap.Int("state_bytes", len(doc)), zap.Duration("took", time.Since(start)))
	return false
}

// handOver stops what the new daemon replaces (stats, metrics), stops the
// rings (version 2: quiesced with their sockets left to the new daemon;
// version 1: released), sends RELEASED and ends the pause as handed over:
// sessions and the accept loop exit without releasing anything, Serve
// returns.
func (d *Daemon) handOver(version int, parked []*session, tc *takeover.Conn, log *zap.Logger) {
	if err := d.stopMetrics(); err != nil {
		log.Warn("stop metrics", zap.Error(err))
	}
	if err := d.stopStats(); err != nil {
		log.Warn("stop stats", zap.Error(err))
	}
	final := &takeover.Final{Endpoints: map[uint32]map[string]uint64{}}
	rings := make([]*ring.Ring, len(d.rings))
	for i, ri := range d.rings {
		rings[i] = ri.ring()
	}
	if version >= 2 {
		// From here until the new daemon's engines start, frames wait in
		// the sockets' RX rings: this is the blackout.
		states, err := ring.Quiesce(rings, func() { d.quiesceAt = time.Now() })
		if err != nil {
			log.Warn("quiesce rings", zap.Error(err))
		}
		for _, st := range states {
			b, err := json.Marshal(st)
			if err != nil {
				log.Warn("encode ring state", zap.Error(err))
			}
			final.Paths = append(final.Paths, b)
		}
	} else {
		for i, r := range rings {
			if err := r.Release(); err != nil {
				log.Warn("release ring", zap.Stringer("ring", d.rings[i].it), zap.Error(err))
			}
		}
	}
	for _, r := range rings {
		final.Rings = append(final.Rings, ringCounters(r))
	}
	if version >= 2 {
		// The engines' state first: the new daemon starts them on it,
		// and the endpoint counters follow while they run.
		if err := tc.ReleasedHead(final, true); err != nil {
			log.Warn("cannot tell the new daemon the rings are free", zap.Error(err))
		}
	}
	for _, s := range parked {
		for id, k := range s.sockets {
			if k.ep != nil {
				final.Endpoints[id] = endpointCounterMap(k.ep)
			}
		}
	}
	var err error
	if version >= 2 {
		err = tc.ReleasedCounters(final.Endpoints)
	} else {
		err = tc.Released(final, version)
	}
	if err != nil {
		log.Warn("cannot tell the new daemon the rings are free", zap.Error(err))
	}
	if version >= 2 {
		for i, r := range rings {
			if err := r.Abandon(); err != nil {
				log.Warn("let go of a ring", zap.Stringer("ring", d.rings[i].it), zap.Error(err))
			}
		}
	}
	d.mu.Lock()
	d.pz.handedOver = true
	d.handedOver = true
	d.mu.Unlock()
	d.resume(parked)
	close(d.gone)
}

// describe writes the state document and fills tab with duplicates of the
// descriptors it names.
func (d *Daemon) describe(version int, sessions []*session, tab *takeover.Table) (*takeover.State, error) {
	st := &takeover.State{Version: version, PID: os.Getpid(), Build: d.cfg.Version, Path: d.cfg.SocketPath, Metrics: takeover.NoFD,
		NextSocket: d.nextSocket.Load(), Control: map[string]uint64{
			"sessions_total": d.ctl.sessionsTotal.Load(), "sockets_total": d.ctl.socketsTotal.Load()}}
	fd, err := d.ln.Dup()
	if err != nil {
		return nil, err
	}
	st.Listener = tab.Add(fd)
	for _, l := range d.locks {
		fd, err := unix.FcntlInt(l.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("duplicate lock %s: %w", l.path, err)
		}
		st.Locks = append(st.Locks, takeover.Lock{Path: l.path, FD: tab.Add(fd)})
	}
	progs := map[string]bool{}
	ringIndex := map[*ringInfo]int{}
	for i, ri := range d.rings {
		r := ri.ring()
		ringIndex[ri] = i
		if !progs[ri.it.Name] {
			progs[ri.it.Name] = true
			h, err := r.Handles()
			if err != nil {
				return nil, fmt.Errorf("ring %s: %w", ri.it, err)
			}
			p := takeover.Program{Interface: ri.it.Name, Ifindex: r.Ifindex(), Mode: h.Mode.String(),
				Link: tab.Add(h.Link), Prog: tab.Add(h.Prog), Maps: map[string]int{}}
			for name, fd := range h.Maps {
				p.Maps[name] = tab.Add(fd)
			}
			st.Programs = append(st.Programs, p)
		}
		fd, err := unix.FcntlInt(uintptr(r.Doorbell().FD()), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("ring %s: duplicate doorbell: %w", ri.it, err)
		}
		tr := takeover.Ring{Interface: ri.it.Name, Queue: ri.it.Queue, Doorbell: tab.Add(fd), Counters: ringCounters(r)}
		if version >= 2 {
			h, err := r.PathHandover()
			if err != nil {
				return nil, fmt.Errorf("ring %s: %w", ri.it, err)
			}
			tr.Path = &takeover.Path{XSK: tab.Add(h.XSK), UMEM: tab.Add(h.UMEM), TAP: takeover.NoFD, Layout: h.Layout}
			if h.TAP >= 0 {
				tr.Path.TAP = tab.Add(h.TAP)
			}
		}
		st.Rings = append(st.Rings, tr)
	}
	for _, s := range sessions {
		ss, err := s.describeState(tab, ringIndex)
		if err != nil {
			return nil, fmt.Errorf("client pid %d: %w", s.cred.Pid, err)
		}
		st.Sessions = append(st.Sessions, ss)
	}
	return st, nil
}

// describeState writes a parked session's part of the state document.
func (s *session) describeState(tab *takeover.Table, ringIndex map[*ringInfo]int) (takeover.Session, error) {
	fd, err := s.conn.Dup()
	if err != nil {
		return takeover.Session{}, err
	}
	s.pub.Lock()
	defer s.pub.Unlock()
	ss := takeover.Session{Conn: tab.Add(fd), PID: s.cred.Pid, UID: s.cred.Uid, GID: s.cred.Gid, Program: s.program,
		Hello: s.hello, Stats: s.client != nil, Opened: s.opened, Retired: map[string]uint64{},
		Memory: takeover.NoFD, ClientWake: takeover.NoFD}
	for i, v := range s.retired {
		if v != 0 {
			ss.Retired[fmt.Sprint(i)] = v
		}
	}
	dup := func(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }
	if m := s.mem; m != nil {
		// The session memory goes over whole: the queues, bitmaps and
		// sleep flags in it are the client's and the engines' state.
		mfd, err := dup(m.memfd)
		if err != nil {
			return ss, fmt.Errorf("duplicate the session memory: %w", err)
		}
		ss.Memory = tab.Add(mfd)
		wfd, err := dup(m.wake.FD())
		if err != nil {
			return ss, fmt.Errorf("duplicate the client eventfd: %w", err)
		}
		ss.ClientWake = tab.Add(wfd)
		for _, b := range m.bells {
			bfd, err := dup(b.FD())
			if err != nil {
				return ss, fmt.Errorf("duplicate a lane doorbell: %w (check the process's open-file limit)", err)
			}
			ss.Doorbells = append(ss.Doorbells, tab.Add(bfd))
		}
		l := m.sess.Layout()
		ss.MemSize, ss.MaxSlots, ss.Lanes = l.Size, l.MaxSlots, l.Lanes
	}
	for _, k := range s.sockets {
		if k.stream != nil {
			// The seam for TCP is the stack's state; until it is carried,
			// a daemon with TCP sockets refuses the takeover and keeps
			// serving.
			return ss, fmt.Errorf("socket %d is a TCP socket: TCP connections cannot be handed over yet (close them, or restart the daemon, which resets them): %w", k.id, unix.EOPNOTSUPP)
		}
		ks := takeover.Socket{ID: k.id, Family: k.family, QueueBytes: k.queueBytes, Slot: k.q.slot,
			TXOffset: k.q.txOff, RXOffset: k.q.rxOff, Ring: ringIndex[k.home], ReuseAddr: k.reuseAddr,
			Options:      takeover.Options{TTL: k.hdr.TTL, MulticastTTL: k.hdr.MulticastTTL, TOS: k.hdr.TOS, MulticastLoop: k.hdr.MulticastLoop},
			Timestamping: k.timestamping}
		if k.rate != nil {
			ks.RateRequest = &takeover.Rate{Kbps: k.rateReq.Kbps, MaxBurst: k.rateReq.MaxBurst, TypicalBytes: k.rateReq.TypicalBytes}
		}
		for _, g := range k.pending {
			ks.Pending = append(ks.Pending, takeover.Group{Group: g.group.String(), Sources: addrStrings(g.source)})
		}
		if k.ep != nil {
			h, err := k.ep.Handover()
			if err != nil {
				return ss, fmt.Errorf("socket %d: %w", k.id, err)
			}
			e := &takeover.Endpoint{Local: h.Local.String(), Reservation: tab.Add(h.Reservation),
				Counters: endpointCounterMap(k.ep)}
			if h.Peer.IsValid() {
				e.Peer = h.Peer.String()
			}
			for _, a := range h.Steered {
				e.Steered = append(e.Steered, a.String())
			}
			for _, g := range h.Groups {
				e.Groups = append(e.Groups, takeover.Group{Group: g.Group.String(), Sources: addrStrings(g.Sources...)})
			}
			ks.Endpoint = e
		}
		ss.Sockets = append(ss.Sockets, ks)
	}
	return ss, nil
}

// abandon frees a handed-over session's descriptors and mappings in this
// process, touching none of the kernel objects the new daemon holds.
func (s *session) abandon() {
	_ = s.conn.Close()
	s.pub.Lock()
	defer s.pub.Unlock()
	for _, k := range s.sockets {
		k.ep = nil // released with its ring
	}
	s.sockets = map[uint32]*socket{}
	if s.mem != nil {
		// Its lanes left with the rings; the new daemon has the memory.
		s.mem.lanes = nil
		s.mem.close()
		s.mem = nil
	}
}

// Ring and endpoint counters cross by name, so either side may add some.
func ringCounters(r *ring.Ring) map[string]uint64 {
	st := r.Stats()
	return map[string]uint64{
		"rx_packets": st.RXPackets.Load(), "rx_bytes": st.RXBytes.Load(),
		"tx_packets": st.TXPackets.Load(), "tx_bytes": st.TXBytes.Load(),
		"rx_queue_full": st.RXQueueFull.Load(), "rx_no_endpoint": st.RXNoEndpoint.Load(),
		"tx_unreachable": st.TXUnreachable.Load(), "tx_errors": st.TXErrors.Load(),
		"rx_kernel_backlog": st.RXKernelBacklog.Load(),
	}
}

func endpointCounterMap(ep *ring.Endpoint) map[string]uint64 {
	es := ep.Stats()
	return map[string]uint64{
		"rx_packets": es.RXPackets.Load(), "rx_bytes": es.RXBytes.Load(), "rx_dropped": es.RXDropped.Load(),
		"tx_packets": es.TXPackets.Load(), "tx_bytes": es.TXBytes.Load(),
		"tx_unreachable": es.TXUnreachable.Load(), "tx_errors": es.TXErrors.Load(),
	}
}

func addrStrings[T interface {
	String() string
	IsValid() bool
}](as ...T) []string {
	var out []string
	for _, a := range as {
		if a.IsValid() {
			out = append(out, a.String())
		}
	}
	return out
}
