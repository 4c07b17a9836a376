package daemon

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/takeover"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

// The new daemon's side of a live upgrade (see handover.go for the old
// one's): Takeover asks the daemon running on cfg.SocketPath for its state,
// checks it, commits, and rebuilds the daemon around what it received.

// TakeoverOptions tune Takeover.
type TakeoverOptions struct {
	// MinState and MaxState are the state document versions accepted
	// (zero: takeover.MinVersion..takeover.Version). Tests narrow them to
	// check refusals.
	MinState, MaxState int
	// abortAfterBuild makes a version 2 takeover give up after building
	// everything, as a new daemon dying there would (tests).
	abortAfterBuild bool
}

// Takeover replaces the bypassd serving cfg.SocketPath: it receives that
// daemon's control socket, sessions, sockets and steering program and
// returns a Daemon serving them (call Serve as after New). Before it
// commits, any failure leaves the old daemon serving; after, the old one
// is gone and an error means the clients lost their daemon. Like New, it
// must run on a thread in the interfaces' network namespace.
func Takeover(cfg config.Config, opts TakeoverOptions, log *zap.Logger) (_ *Daemon, err error) {
	if opts.MinState == 0 {
		opts.MinState, opts.MaxState = takeover.MinVersion, takeover.Version
	}
	d, err := newDaemon(cfg, log)
	if err != nil {
		return nil, err
	}
	committed := false
	defer func() {
		if err != nil && !committed {
			_ = d.release()
		}
	}()
	if err := d.resolveInterfaces(); err != nil {
		return nil, err
	}
	log = d.log.With(zap.String("takeover", "take"))
	start := time.Now()
	tc, oldPID, err := requestTakeover(d.cfg.SocketPath, opts)
	if err != nil {
		return nil, err
	}
	defer tc.Close()
	_ = tc.SetDeadline(time.Now().Add(takeoverTimeout))
	version, doc, files, err := tc.Receive(opts.MinState, opts.MaxState)
	if err != nil {
		return nil, fmt.Errorf("daemon: takeover from pid %d: %w", oldPID, err)
	}
	defer func() {
		if n := files.Close(); n > 0 && err == nil {
			log.Warn("descriptors the state document did not name were closed", zap.Int("count", n))
		}
	}()
	st, err := takeover.Decode(doc, files.Len())
	if err == nil {
		err = d.checkState(st)
	}
	// With the sockets handed over (version 2) everything is built while
	// the old daemon still serves; only the engines start after it let go.
	early := version >= 2
	if err == nil && early {
		err = d.build(st, files)
		// The build took its time; the old daemon allows for it
		// (verdictTimeout).
		_ = tc.SetDeadline(time.Now().Add(takeoverTimeout))
		if err == nil && opts.abortAfterBuild {
			err = errors.New("aborted after the build (test)")
		}
	}
	if err != nil {
		_ = tc.Refuse(err.Error())
		return nil, fmt.Errorf("daemon: takeover from pid %d refused: %w", oldPID, err)
	}
	if err := tc.Commit(); err != nil {
		return nil, fmt.Errorf("daemon: takeover from pid %d: %w", oldPID, err)
	}
	committed = true
	// From here on the old daemon stops; failing leaves the clients
	// without a daemon, so say so.
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w (the old daemon had handed over: its clients lost their daemon; start bypassd again)", err)
			_ = d.release()
		}
	}()
	final, err := tc.AwaitReleased()
	if err != nil {
		return nil, fmt.Errorf("daemon: takeover from pid %d: waiting for the rings: %w", oldPID, err)
	}
	released := time.Now()
	if !early {
		if err := d.build(st, files); err != nil {
			return nil, fmt.Errorf("daemon: takeover from pid %d: %w", oldPID, err)
		}
	}
	if err := d.startAdopted(st, final, tc.AwaitCounters); err != nil {
		return nil, fmt.Errorf("daemon: takeover from pid %d: %w", oldPID, err)
	}
	log.Info("took over", zap.Int("old_pid", oldPID), zap.Int("state_version", version), zap.Int("sessions", len(st.Sessions)),
		zap.Int("descriptors", files.Len()), zap.Duration("released_to_serving", time.Since(released)), zap.Duration("total", time.Since(start)))
	return d, nil
}

// requestTakeover sends TAKEOVER and returns the connection as a takeover
// stream.
func requestTakeover(path string, opts TakeoverOptions) (*takeover.Conn, int, error) {
	c, err := ctlproto.Dial(path)
	if err != nil {
		return nil, 0, fmt.Errorf("daemon: takeover: no daemon to take over: %w", err)
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(takeoverTimeout))
	h := ctlproto.Header{Code: ctlproto.CodeTakeover, ReqID: 1}
	if err := c.Send(h, ctlproto.Takeover{MinState: uint16(opts.MinState), MaxState: uint16(opts.MaxState)}); err != nil {
		return nil, 0, fmt.Errorf("daemon: takeover: %w", err)
	}
	rh, m, fds, err := c.Recv()
	closeFDs(fds)
	if err != nil {
		return nil, 0, fmt.Errorf("daemon: takeover: no answer from the running daemon: %w", err)
	}
	switch rh.Status {
	case 0:
	case unix.ENOSYS, unix.EPROTO:
		return nil, 0, fmt.Errorf("daemon: takeover: the running daemon cannot hand over (it predates live upgrade): stop it and start this one: %w", rh.Status)
	case unix.EPROTONOSUPPORT:
		return nil, 0, fmt.Errorf("daemon: takeover: no state version in common with the running daemon (this one reads %d..%d; see its log): %w",
			opts.MinState, opts.MaxState, rh.Status)
	case unix.EBUSY:
		return nil, 0, fmt.Errorf("daemon: takeover: the running daemon cannot hand over now (a ring is not on its fast path, or another takeover runs; see its log): retry later: %w", rh.Status)
	case unix.EPERM:
		return nil, 0, fmt.Errorf("daemon: takeover: run as root or as the running daemon's user: %w", rh.Status)
	default:
		return nil, 0, fmt.Errorf("daemon: takeover: refused by the running daemon: %w", rh.Status)
	}
	rep, ok := m.(*ctlproto.TakeoverReply)
	if !ok {
		return nil, 0, fmt.Errorf("daemon: takeover: reply body %T", m)
	}
	fd, err := c.Dup()
	if err != nil {
		return nil, 0, err
	}
	tc, err := takeover.NewConn(fd)
	if err != nil {
		return nil, 0, err
	}
	return tc, int(rep.DaemonPID), nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// checkState refuses a state this daemon's configuration cannot adopt.
func (d *Daemon) checkState(st *takeover.State) error {
	if st.Path != d.cfg.SocketPath {
		return fmt.Errorf("the running daemon serves %s, this one is configured for %s", st.Path, d.cfg.SocketPath)
	}
	if len(st.Rings) != len(d.cfg.Interfaces) {
		return fmt.Errorf("the running daemon has %d rings, this one is configured for %d: start it with the same --interface list", len(st.Rings), len(d.cfg.Interfaces))
	}
	for i, r := range st.Rings {
		if it := d.cfg.Interfaces[i]; r.Interface != it.Name || r.Queue != it.Queue {
			return fmt.Errorf("ring %d is %s/%d in the running daemon, %s here: start it with the same --interface list", i, r.Interface, r.Queue, it)
		}
	}
	for _, ss := range st.Sessions {
		if ss.Memory != takeover.NoFD && ss.Lanes != len(d.cfg.Interfaces) {
			return fmt.Errorf("client pid %d: session memory for %d rings, this daemon has %d", ss.PID, ss.Lanes, len(d.cfg.Interfaces))
		}
		for _, k := range ss.Sockets {
			if config.CheckQueueBytes(k.QueueBytes) != nil {
				return fmt.Errorf("socket %d: queue size %d", k.ID, k.QueueBytes)
			}
		}
	}
	return nil
}

// build makes the daemon from a received state: listener, locks, rings on
// the handed-over programs, doorbells and (version 2) sockets, and the
// sessions with their sockets. Nothing serves yet (start). With version 2
// it runs while the old daemon still serves: it must not disturb anything
// the old daemon uses, and on error discardBuilt lets it all go.
func (d *Daemon) build(st *takeover.State, files *takeover.Files) error {
	d.built = true
	fd, err := files.Take(st.Listener)
	if err != nil {
		return err
	}
	if d.ln, err = ctlproto.ListenerFromFD(fd, st.Path); err != nil {
		return err
	}
	for _, l := range st.Locks {
		fd, err := files.Take(l.FD)
		if err != nil {
			return err
		}
		d.locks = append(d.locks, &ifaceLock{path: l.Path, f: os.NewFile(uintptr(fd), l.Path)})
	}
	progs := map[string]*bpf.Program{}
	for _, p := range st.Programs {
		h := bpf.Handles{Maps: map[string]int{}, Mode: bpf.ModeNative}
		if p.Mode == bpf.ModeGeneric.String() {
			h.Mode = bpf.ModeGeneric
		}
		if h.Link, err = files.Take(p.Link); err != nil {
			return err
		}
		if h.Prog, err = files.Take(p.Prog); err != nil {
			return err
		}
		for name, i := range p.Maps {
			if h.Maps[name], err = files.Take(i); err != nil {
				return err
			}
		}
		prog, err := bpf.Adopt(p.Ifindex, h)
		if err != nil {
			return fmt.Errorf("interface %s: %w", p.Interface, err)
		}
		progs[p.Interface] = prog
	}
	err = d.openRings(func(i int, it config.Interface) (*ring.Adoption, *shmq.Bell, error) {
		prog := progs[it.Name]
		if prog == nil {
			return nil, nil, fmt.Errorf("no steering program handed over for %s", it.Name)
		}
		fd, err := files.Take(st.Rings[i].Doorbell)
		if err != nil {
			return nil, nil, err
		}
		w, err := shmq.NewBellFD(fd)
		if err != nil {
			return nil, nil, err
		}
		ad := &ring.Adoption{Program: prog}
		if p := st.Rings[i].Path; p != nil {
			if ad.Path, err = takePath(p, files); err != nil {
				_ = w.Close()
				return nil, nil, err
			}
		}
		return ad, w, nil
	})
	if err != nil {
		return err
	}
	d.nextSocket.Store(st.NextSocket)
	d.ctl.sessionsTotal.Store(st.Control["sessions_total"])
	d.ctl.socketsTotal.Store(st.Control["sockets_total"])
	for _, ss := range st.Sessions {
		s, err := d.adoptSession(ss, files)
		if s != nil {
			d.adopted = append(d.adopted, s)
		}
		if err != nil {
			return fmt.Errorf("client pid %d: %w", ss.PID, err)
		}
	}
	return nil
}

// takePath takes a ring's handed-over fast path descriptors.
func takePath(p *takeover.Path, files *takeover.Files) (_ *qp.PathHandover, err error) {
	h := &qp.PathHandover{XSK: -1, UMEM: -1, TAP: -1, Layout: p.Layout}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	if h.XSK, err = files.Take(p.XSK); err != nil {
		return nil, err
	}
	if h.UMEM, err = files.Take(p.UMEM); err != nil {
		return nil, err
	}
	if p.TAP != takeover.NoFD {
		if h.TAP, err = files.Take(p.TAP); err != nil {
			return nil, err
		}
	}
	return h, nil
}

// discardBuilt lets go of what build made when the takeover is refused
// before the old daemon let go: nothing it serves with is touched.
func (d *Daemon) discardBuilt() {
	for _, s := range d.adopted {
		s.abandon()
	}
	d.adopted = nil
	for _, ri := range d.rings {
		r := ri.ring()
		if r == nil {
			continue
		}
		// A ring whose engine started (the old daemon is gone) is closed
		// for good; one that never did is only let go of.
		var err error
		if r.Started() {
			err = r.Close()
		} else {
			err = r.Discard()
		}
		if err != nil {
			d.log.Warn("let go of an adopted ring", zap.Stringer("ring", ri.it), zap.Error(err))
		}
	}
	_ = d.abandon()
}

// startAdopted makes a built daemon serve: counters carried over, the rings'
// engines started where the old daemon's stopped (final is its last word),
// stats, metrics and the sessions.
func (d *Daemon) startAdopted(st *takeover.State, final *takeover.Final, moreCounters func() (map[uint32]map[string]uint64, error)) error {
	// Engines first: counters are added to, so seeding them after
	// loses nothing, and the blackout ends sooner.
	for i, ri := range d.rings {
		var ps *ring.PathState
		if st.Rings[i].Path != nil {
			if i >= len(final.Paths) {
				return fmt.Errorf("ring %s: the old daemon sent no engine state", ri.it)
			}
			ps = &ring.PathState{}
			if err := json.Unmarshal(final.Paths[i], ps); err != nil {
				return fmt.Errorf("ring %s: engine state: %w", ri.it, err)
			}
		}
		if err := ri.ring().Activate(ps); err != nil {
			return err
		}
	}
	for _, ri := range d.rings {
		if err := ri.ring().ArmStandby(); err != nil {
			return err
		}
	}
	for i, ri := range d.rings {
		c := st.Rings[i].Counters
		if i < len(final.Rings) && final.Rings[i] != nil {
			c = final.Rings[i]
		}
		seedRing(ri.ring(), c)
	}
	counters := map[uint32]map[string]uint64{}
	for _, ss := range st.Sessions {
		for _, ks := range ss.Sockets {
			if ks.Endpoint != nil {
				counters[ks.ID] = ks.Endpoint.Counters
			}
		}
	}
	// With version 2 the endpoint counters follow the engines' state.
	eps, err := moreCounters()
	if err != nil {
		return fmt.Errorf("endpoint counters: %w", err)
	}
	for id, c := range final.Endpoints {
		counters[id] = c
	}
	for id, c := range eps {
		counters[id] = c
	}
	for _, s := range d.adopted {
		for id, k := range s.sockets {
			if k.ep != nil {
				seedEndpoint(k.ep, counters[id])
			}
		}
	}
	d.built = false
	for _, l := range d.locks {
		if err := l.f.Truncate(0); err == nil {
			_, _ = l.f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		}
	}
	if err := d.startStats(); err != nil {
		return err
	}
	for i, ss := range st.Sessions {
		if ss.Stats && i < len(d.adopted) {
			d.joinClient(d.adopted[i], ss.Program)
		}
	}
	if err := d.startMetrics(); err != nil {
		return err
	}
	d.logReady()
	d.mu.Lock()
	for _, s := range d.adopted {
		d.sessions[s] = struct{}{}
		d.sessWG.Add(1)
		go s.run()
	}
	d.adopted = nil
	d.mu.Unlock()
	return nil
}

// adoptSession rebuilds one session and its sockets.
func (d *Daemon) adoptSession(ss takeover.Session, files *takeover.Files) (*session, error) {
	fd, err := files.Take(ss.Conn)
	if err != nil {
		return nil, err
	}
	c, err := ctlproto.NewConn(fd)
	if err != nil {
		return nil, err
	}
	s := newSession(d, c, unix.Ucred{Pid: ss.PID, Uid: ss.UID, Gid: ss.GID})
	s.hello, s.program, s.opened = ss.Hello, ss.Program, ss.Opened
	if ss.Program != "" {
		s.log = s.log.With(zap.String("program", ss.Program))
	}
	for k, v := range ss.Retired {
		if i, err := strconv.Atoi(k); err == nil && i >= 0 && i < len(s.retired) {
			s.retired[i] = v
		}
	}
	if ss.Memory != takeover.NoFD {
		memfd, err := files.Take(ss.Memory)
		if err != nil {
			return s, err
		}
		wakefd, err := files.Take(ss.ClientWake)
		if err != nil {
			unix.Close(memfd)
			return s, err
		}
		var bellfds []int
		for _, i := range ss.Doorbells {
			fd, err := files.Take(i)
			if err != nil {
				for _, fd := range append(bellfds, memfd, wakefd) {
					unix.Close(fd)
				}
				return s, err
			}
			bellfds = append(bellfds, fd)
		}
		live := make([]shmsess.Range, 0, len(ss.Sockets))
		for _, ks := range ss.Sockets {
			live = append(live, shmsess.Range{Slot: ks.Slot, Off: ks.TXOffset, Span: shmsess.SocketSpan(ks.QueueBytes)})
		}
		if s.mem, err = adoptSessionMemory(memfd, wakefd, bellfds, ss.MemSize, ss.MaxSlots, ss.Lanes, live); err != nil {
			return s, err
		}
	}
	for _, ks := range ss.Sockets {
		k, err := d.adoptSocket(s, ks, files)
		if err != nil {
			return s, fmt.Errorf("socket %d: %w", ks.ID, err)
		}
		s.sockets[k.id] = k
		s.queueMem += shmsess.SocketSpan(k.queueBytes)
	}
	return s, nil
}

// adoptSocket finds a handed-over socket's queues in its session memory
// and, if it was bound, binds its endpoint again on the adopted ring.
func (d *Daemon) adoptSocket(s *session, ks takeover.Socket, files *takeover.Files) (_ *socket, err error) {
	if ks.RXOffset != ks.TXOffset+shmsess.QueueSpan(ks.QueueBytes) {
		return nil, fmt.Errorf("queues at %d and %d, not one socket's range", ks.TXOffset, ks.RXOffset)
	}
	m := s.mem
	k := &socket{id: ks.ID, family: ks.Family, queueBytes: ks.QueueBytes, home: d.rings[ks.Ring],
		q:  queuePair{slot: ks.Slot, txOff: ks.TXOffset, rxOff: ks.RXOffset, queueBytes: ks.QueueBytes},
		tx: m.queue(ks.TXOffset, ks.QueueBytes), rx: m.queue(ks.RXOffset, ks.QueueBytes),
		reuseAddr: ks.ReuseAddr, timestamping: ks.Timestamping,
		hdr: ring.HeaderOptions{TTL: ks.Options.TTL, MulticastTTL: ks.Options.MulticastTTL, TOS: ks.Options.TOS, MulticastLoop: ks.Options.MulticastLoop}}
	k.home.homed.Add(1)
	defer func() {
		if err != nil {
			k.close()
		}
	}()
	if _, err = shmq.Attach(k.tx); err != nil {
		return nil, fmt.Errorf("TX queue: %w", err)
	}
	if _, err = shmq.Attach(k.rx); err != nil {
		return nil, fmt.Errorf("RX queue: %w", err)
	}
	for _, g := range ks.Pending {
		pg := pendingGroup{}
		if pg.group, err = netip.ParseAddr(g.Group); err != nil {
			return nil, err
		}
		if len(g.Sources) > 0 {
			if pg.source, err = netip.ParseAddr(g.Sources[0]); err != nil {
				return nil, err
			}
		}
		k.pending = append(k.pending, pg)
	}
	if r := ks.RateRequest; r != nil {
		k.rateReq = pacing.Rate{Kbps: r.Kbps, MaxBurst: r.MaxBurst, TypicalBytes: r.TypicalBytes}
		if k.rate, err = k.home.rates.Acquire(k.rateReq); err != nil {
			return nil, fmt.Errorf("pacing rate %v: %w", k.rateReq, err)
		}
	}
	if ks.Endpoint == nil {
		return k, nil
	}
	e := ks.Endpoint
	h := ring.EndpointHandover{Reservation: -1}
	if h.Local, err = netip.ParseAddrPort(e.Local); err != nil {
		return nil, err
	}
	if e.Peer != "" {
		if h.Peer, err = netip.ParseAddrPort(e.Peer); err != nil {
			return nil, err
		}
	}
	if h.Steered, err = parseAddrs(e.Steered); err != nil {
		return nil, err
	}
	for _, g := range e.Groups {
		m := ring.Membership{}
		if m.Group, err = netip.ParseAddr(g.Group); err != nil {
			return nil, err
		}
		if m.Sources, err = parseAddrs(g.Sources); err != nil {
			return nil, err
		}
		h.Groups = append(h.Groups, m)
	}
	if h.Reservation, err = files.Take(e.Reservation); err != nil {
		return nil, err
	}
	r := k.home.ring()
	lane, err := m.lane(r, ks.Ring)
	if err != nil {
		return nil, err
	}
	ep, err := r.AdoptEndpoint(h, &ring.Queues{TX: k.tx, RX: k.rx, QueueBytes: k.queueBytes,
		Wake: ring.SessionWaker(m.sess, k.q.slot, m.wake), Lane: lane, Slot: k.q.slot, Activity: &s.changes})
	if err != nil {
		return nil, err
	}
	k.ep = ep
	ep.SetHeaderOptions(k.hdr)
	if k.rate != nil {
		ep.SetPacing(&k.rate.Rate)
	}
	return k, nil
}

// seedRing and seedEndpoint carry counters over, so totals never go back.
func seedRing(r *ring.Ring, c map[string]uint64) {
	st := r.Stats()
	for name, v := range c {
		switch name {
		case "rx_packets":
			st.RXPackets.Add(v)
		case "rx_bytes":
			st.RXBytes.Add(v)
		case "tx_packets":
			st.TXPackets.Add(v)
		case "tx_bytes":
			st.TXBytes.Add(v)
		case "rx_queue_full":
			st.RXQueueFull.Add(v)
		case "rx_no_endpoint":
			st.RXNoEndpoint.Add(v)
		case "tx_unreachable":
			st.TXUnreachable.Add(v)
		case "tx_errors":
			st.TXErrors.Add(v)
		case "rx_kernel_backlog":
			st.RXKernelBacklog.Add(v)
		}
	}
}

func seedEndpoint(ep *ring.Endpoint, c map[string]uint64) {
	es := ep.Stats()
	for name, v := range c {
		switch name {
		case "rx_packets":
			es.RXPackets.Add(v)
		case "rx_bytes":
			es.RXBytes.Add(v)
		case "rx_dropped":
			es.RXDropped.Add(v)
		case "tx_packets":
			es.TXPackets.Add(v)
		case "tx_bytes":
			es.TXBytes.Add(v)
		case "tx_unreachable":
			es.TXUnreachable.Add(v)
		case "tx_errors":
			es.TXErrors.Add(v)
		}
	}
}

// parseAddrs parses a state document's address list (nil for none).
func parseAddrs(ss []string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range ss {
		ip, err := netip.ParseAddr(a)
		if err != nil {
			return nil, err
		}
		out = append(out, ip)
	}
	return out, nil
}
