package daemon

import (
	"fmt"
	"net/netip"
	"slices"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

// socket is one client socket: its queues in the session memory and,
// once bound, its ring endpoint. Only its session's goroutine touches it.
type socket struct {
	// unhomed: close has taken the socket off its home ring's count.
	unhomed    bool
	id         uint32
	family     uint16 // unix.AF_INET or unix.AF_INET6
	queueBytes int
	// q is where its queues are in the session memory; tx and rx are
	// their memory.
	q      queuePair
	tx, rx []byte
	// lent: a stream socket's pump uses the queues and gives them back to
	// the session memory when it ends (possibly after CLOSE).
	lent bool
	// memfd is the daemon's descriptor of the memory, kept to hand it to
	// a new daemon (live upgrade).
	memfd int
	// rxMax and txMax are the highest occupancy the stats publisher saw
	// since the last reset (guarded by the session's pub).
	rxMax, txMax uint64
	// home is the socket's lane's ring (the lane number the client got at
	// OPEN); the socket can bind on it only.
	home *ringInfo
	ep   *ring.Endpoint

	// rate is the socket's reference on its interface's rate table
	// (nil: unpaced) and rateReq the rate it asked for (rate.Rate may be
	// a nearest substitute).
	rate    *pacing.Entry
	rateReq pacing.Rate

	// Options set before the bind, applied to the endpoint at bind.
	reuseAddr bool
	hdr       ring.HeaderOptions
	pending   []pendingGroup

	// timestamping is the SO_TIMESTAMPING flags (see timestamping.go).
	timestamping uint32

	// stream is set for SOCK_STREAM (TCP) sockets (stream.go).
	stream *streamState
}

// pendingGroup is a multicast membership requested before the bind.
type pendingGroup struct{ group, source netip.Addr }

// newSocket carves a socket's queues out of the session memory.
func newSocket(id uint32, family uint16, queueBytes int, home *ringInfo, m *sessionMemory) (*socket, error) {
	p, err := m.alloc(queueBytes)
	if err != nil {
		return nil, err
	}
	k := &socket{id: id, family: family, queueBytes: queueBytes, home: home, hdr: ring.DefaultHeaderOptions, q: p,
		tx: m.queue(p.txOff, queueBytes), rx: m.queue(p.rxOff, queueBytes)}
	home.homed.Add(1)
	return k, nil
}

// close releases what the socket holds except its session memory (see
// session.closeSocket). The endpoint goes first: once its Close returns the
// engine no longer touches the memory.
func (k *socket) close() {
	if k.stream != nil {
		k.streamClose()
	}
	if !k.unhomed {
		k.unhomed = true
		k.home.homed.Add(-1)
	}
	if k.ep != nil {
		_ = k.ep.Close()
		k.ep = nil
	}
	if k.rate != nil {
		k.home.rates.Release(k.rate)
		k.rate = nil
	}
}

// onOpen creates a socket and sends its memfd and eventfds.
func (s *session) onOpen(h ctlproto.Header, m *ctlproto.Open) bool {
	if m.Family != unix.AF_INET && m.Family != unix.AF_INET6 {
		return s.fail(h, fmt.Errorf("family %d: %w", m.Family, unix.EAFNOSUPPORT))
	}
	if m.Type != unix.SOCK_DGRAM && m.Type != unix.SOCK_STREAM {
		return s.fail(h, fmt.Errorf("socket type %d: only SOCK_DGRAM (UDP) and SOCK_STREAM (TCP) are offloaded: %w", m.Type, unix.EPROTONOSUPPORT))
	}
	k, err := s.newSocketFor(h, m.Family, m.Type, m.QueueBytes)
	if err != nil {
		return s.fail(h, err)
	}
	rh := ctlproto.ReplyHeader(h)
	rh.Socket = k.id
	return s.sendNew(rh, s.openReply(k), k)
}

// newSocketFor checks the session's limits and creates a socket (OPEN,
// ACCEPT).
func (s *session) newSocketFor(h ctlproto.Header, family, typ uint16, queueBytes uint32) (*socket, error) {
	cfg := &s.d.cfg
	if len(s.sockets) >= cfg.MaxSockets {
		s.limitLog("socket limit reached: further OPENs fail with EMFILE (raise --max-sockets)", zap.Int("max_sockets", cfg.MaxSockets))
		return nil, fmt.Errorf("client has %d sockets, the per-client limit: %w", len(s.sockets), unix.EMFILE)
	}
	qb := int(queueBytes)
	if qb == 0 {
		qb = cfg.QueueBytes
	}
	if err := config.CheckQueueBytes(qb); err != nil {
		return nil, fmt.Errorf("%w: %w", err, unix.EINVAL)
	}
	if s.mem == nil {
		return nil, fmt.Errorf("OPEN in a session that said HELLO with NO_SOCKETS: %w", unix.EINVAL)
	}
	size := shmsess.SocketSpan(qb)
	if s.queueMem+size > cfg.MaxQueueMemory {
		s.limitLog("queue memory limit reached: further OPENs fail with ENOMEM (raise --max-queue-memory or open smaller queues)",
			zap.Int64("max_queue_memory", cfg.MaxQueueMemory), zap.Int64("in_use", s.queueMem))
		return nil, fmt.Errorf("client uses %d bytes of queue memory; %d more exceed the per-client limit of %d: %w",
			s.queueMem, size, cfg.MaxQueueMemory, unix.ENOMEM)
	}
	home := s.d.homeRing(family)
	if err := home.downErr(); err != nil {
		return nil, err
	}
	k, err := newSocket(s.newSocketID(), family, qb, home, s.mem)
	if err != nil {
		s.limitLog("session memory full: further OPENs fail with ENOMEM (raise --max-queue-memory or open smaller queues)", zap.Error(err))
		return nil, err
	}
	if typ == unix.SOCK_STREAM {
		if err := s.streamOpen(k); err != nil {
			s.mem.free(k.q)
			k.close()
			return nil, err
		}
		k.stream.quickAckThreshold = cfg.TCPQuickAckThreshold
	}
	return k, nil
}

// openReply describes k's place in the session memory as OPEN and ACCEPT
// replies do.
func (s *session) openReply(k *socket) ctlproto.OpenReply {
	return ctlproto.OpenReply{QueueBytes: uint32(k.queueBytes), Slot: uint32(k.q.slot),
		TXOffset: uint64(k.q.txOff), RXOffset: uint64(k.q.rxOff), Lane: uint16(s.d.ringIndex(k.home))}
}

// sendNew sends a new socket's reply (no descriptors: its queues are in
// the session memory) and adds it to the session.
func (s *session) sendNew(rh ctlproto.Header, body ctlproto.Message, k *socket) bool {
	if !s.reply(rh, body) {
		k.close()
		s.mem.free(k.q)
		return false
	}
	s.pub.Lock()
	s.sockets[k.id] = k
	s.queueMem += shmsess.SocketSpan(k.queueBytes)
	s.opened++
	s.pub.Unlock()
	s.d.ctl.socketsTotal.Add(1)
	s.log.Debug("socket opened", zap.Uint32("socket", k.id), zap.Uint16("family", k.family), zap.Int("queue_bytes", k.queueBytes),
		zap.String("ring", k.home.it.String()), zap.Bool("stream", k.stream != nil))
	return true
}

// limitLog logs a limit hit at Warn once per session (then at Debug), so
// a client hammering its limit cannot flood the log.
func (s *session) limitLog(msg string, fields ...zap.Field) {
	if s.limitWarned {
		s.log.Debug(msg, fields...)
		return
	}
	s.limitWarned = true
	s.log.Warn(msg, fields...)
}

// newSocketID returns a daemon-wide unique, non-zero socket id (unique
// within the session even after the counter wraps).
func (s *session) newSocketID() uint32 {
	for {
		id := s.d.nextSocket.Add(1)
		if id != 0 && s.sockets[id] == nil {
			return id
		}
	}
}

// closeSocket releases k and forgets it, keeping its final counters in
// the session's totals. The caller holds s.pub.
func (s *session) closeSocket(k *socket) {
	ep := k.ep
	k.close()
	if ep != nil {
		s.retire(ep)
	}
	if !k.lent {
		s.mem.free(k.q)
	}
	delete(s.sockets, k.id)
	s.changes.Add(1)
	s.queueMem -= shmsess.SocketSpan(k.queueBytes)
	s.log.Debug("socket closed", zap.Uint32("socket", k.id))
}

// sockAddr checks addr against the socket's family. An AF_INET socket
// accepts the all-zero address as its wildcard (a zero-filled request), an
// AF_INET6 socket accepts IPv4 (sent v4-mapped), as Linux's dual-stack
// sockets do.
func (k *socket) sockAddr(addr netip.AddrPort) (netip.AddrPort, error) {
	a := addr.Addr()
	if !a.IsValid() {
		return addr, fmt.Errorf("no address: %w", unix.EINVAL)
	}
	if k.family == unix.AF_INET && a.Is6() {
		if a == netip.IPv6Unspecified() {
			return netip.AddrPortFrom(netip.IPv4Unspecified(), addr.Port()), nil
		}
		return addr, fmt.Errorf("%v: an IPv6 address for an AF_INET socket: %w", a, unix.EAFNOSUPPORT)
	}
	return addr, nil
}

// bind binds the socket's endpoint (see chooseRing) and returns the bound
// address.
func (s *session) bind(k *socket, addr netip.AddrPort, reuse bool) (netip.AddrPort, error) {
	if k.ep != nil {
		return netip.AddrPort{}, fmt.Errorf("socket is already bound to %v: %w", k.ep.LocalAddr(), unix.EINVAL)
	}
	addr, err := k.sockAddr(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind: %w", err)
	}
	if p := addr.Port(); p != 0 && p < privilegedPortLimit && !peerCanBindPrivileged(s.cred.Uid, s.cred.Pid) {
		return netip.AddrPort{}, fmt.Errorf("bind %v: ports below %d need uid 0 or CAP_NET_BIND_SERVICE "+
			"(e.g. `setcap cap_net_bind_service=ep PROGRAM`): %w", addr, privilegedPortLimit, unix.EACCES)
	}
	ri, err := s.d.chooseRing(k.home, addr.Addr())
	if err != nil {
		return netip.AddrPort{}, err
	}
	if err := ri.downErr(); err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind %v: %w", addr, err)
	}
	r := ri.ring()
	lane, err := s.mem.lane(r, s.d.ringIndex(ri))
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind %v: %w", addr, err)
	}
	ep, err := r.Bind(addr, ring.BindOptions{ReuseAddr: reuse || k.reuseAddr,
		Queues: &ring.Queues{TX: k.tx, RX: k.rx, QueueBytes: k.queueBytes,
			Wake: ring.SessionWaker(s.mem.sess, k.q.slot, s.mem.wake),
			Lane: lane, Slot: k.q.slot, Activity: &s.changes}})
	if err != nil {
		return netip.AddrPort{}, err
	}
	ep.SetHeaderOptions(k.hdr)
	if k.rate != nil {
		ep.SetPacing(&k.rate.Rate)
	}
	for _, g := range k.pending {
		if err := ep.JoinGroup(g.group, g.source); err != nil {
			_ = ep.Close()
			return netip.AddrPort{}, fmt.Errorf("bind %v: apply membership of %v requested before the bind: %w", addr, g.group, err)
		}
	}
	k.pending = nil
	k.ep = ep
	s.log.Debug("socket bound", zap.Uint32("socket", k.id), zap.Stringer("addr", ep.LocalAddr()), zap.String("ring", ri.it.String()))
	return ep.LocalAddr(), nil
}

// connect sets (or, with the zero address, clears) the socket's peer,
// binding an unbound socket to the wildcard address first as Linux does.
func (s *session) connect(k *socket, peer netip.AddrPort) error {
	if !peer.Addr().IsValid() {
		if k.ep != nil {
			return k.ep.Connect(netip.AddrPort{})
		}
		return nil
	}
	if k.family == unix.AF_INET && peer.Addr().Is6() {
		return fmt.Errorf("connect %v: an IPv6 address for an AF_INET socket: %w", peer, unix.EAFNOSUPPORT)
	}
	if peer.Port() == 0 || peer.Addr().IsUnspecified() {
		return fmt.Errorf("connect %v: need an address and a port: %w", peer, unix.EINVAL)
	}
	if k.ep == nil {
		wild := netip.IPv6Unspecified()
		if peer.Addr().Is4() {
			wild = netip.IPv4Unspecified()
		}
		if _, err := s.bind(k, netip.AddrPortFrom(wild, 0), false); err != nil {
			return fmt.Errorf("connect %v: implicit bind: %w", peer, err)
		}
	}
	return k.ep.Connect(peer)
}

// groupRing checks a membership request's interface index against the ring
// the socket is (or will be) bound on.
func (k *socket) groupRing(group, source netip.Addr, ifindex uint32) error {
	if !group.IsMulticast() {
		return fmt.Errorf("%v is not a multicast group: %w", group, unix.EINVAL)
	}
	if k.family == unix.AF_INET && group.Is6() {
		return fmt.Errorf("%v: an IPv6 group for an AF_INET socket: %w", group, unix.EINVAL)
	}
	if source.IsValid() && source.Is4() != group.Is4() {
		return fmt.Errorf("source %v and group %v are of different families: %w", source, group, unix.EINVAL)
	}
	if ifindex != 0 && int(ifindex) != k.home.ring().Ifindex() {
		return fmt.Errorf("interface index %d: the socket's ring is %s (index %d); bypassd joins groups on that interface only: %w",
			ifindex, k.home.it, k.home.ring().Ifindex(), unix.ENODEV)
	}
	return nil
}

func (k *socket) join(group, source netip.Addr, ifindex uint32) error {
	if err := k.groupRing(group, source, ifindex); err != nil {
		return fmt.Errorf("join: %w", err)
	}
	if k.ep != nil {
		return k.ep.JoinGroup(group, source)
	}
	g := pendingGroup{group, source}
	for _, p := range k.pending {
		if p.group != group {
			continue
		}
		if p.source.IsValid() != source.IsValid() {
			return fmt.Errorf("join %v: cannot mix any-source and source-specific membership: %w", group, unix.EINVAL)
		}
		if p == g {
			return fmt.Errorf("join %v source %v: already a member: %w", group, source, unix.EADDRINUSE)
		}
	}
	k.pending = append(k.pending, g)
	return nil
}

func (k *socket) leave(group, source netip.Addr, ifindex uint32) error {
	if err := k.groupRing(group, source, ifindex); err != nil {
		return fmt.Errorf("leave: %w", err)
	}
	if k.ep != nil {
		return k.ep.LeaveGroup(group, source)
	}
	n := len(k.pending)
	k.pending = slices.DeleteFunc(k.pending, func(p pendingGroup) bool {
		return p.group == group && (!source.IsValid() || p.source == source)
	})
	if len(k.pending) == n {
		return fmt.Errorf("leave %v source %v: not a member: %w", group, source, unix.EADDRNOTAVAIL)
	}
	return nil
}
