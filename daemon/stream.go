package daemon

// Stream (SOCK_STREAM, TCP) sockets: OPEN gives the socket a doorbell of
// its own inside the daemon (it wakes the socket's pump, not the ring's
// engine; the engine rings it when the client announces the socket's
// slot on its lane, see ring.Lane.SetWaker);
// BIND reserves the port on the ring's TCP stack; LISTEN starts a listener
// goroutine that takes established connections (up to the backlog) and
// announces each with an Acceptable event in the listening socket's RX
// queue; ACCEPT turns one into a new socket; CONNECT starts the handshake,
// whose outcome the pump reports as an event. A connection's bytes move
// between its stack endpoint and its queues in a tcpstack.Pump.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
	streamrec "github.com/bypassd/bypassd/internal/stream"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/tcpstack"
)

// defaultBacklog is LISTEN's backlog for 0 and its cap (somaxconn).
const defaultBacklog = 4096

// connectTimeout bounds the next-hop lookup a CONNECT does to pick the
// source address (the handshake itself is not waited for).
const connectTimeout = 3 * time.Second

// streamState is what a stream socket has beyond a datagram socket's.
type streamState struct {
	// bell is the socket's doorbell: the engine rings it when the client
	// announces the socket (after queueing TX records or freeing RX
	// room), the stack's events ring it too. lane and slot are where the
	// engine finds it; wake wakes the client (the session's events).
	bell *tcpstack.Bell
	lane *ring.Lane
	slot int
	wake ring.Waker
	ri   *ringInfo
	// One of binding (bound), lis (listening) or conn (connecting or
	// connected) is set once the socket is bound.
	binding *ring.TCPBinding
	conn    *ring.TCPConn
	pump    *tcpstack.Pump
	lis     *listener
	// abort: the session ended without CLOSE, reset the connection.
	abort bool
	// opts are the socket's options (streamopt.go).
	opts streamOpts
	// quickAckThreshold is --tcp-quickack-threshold (0: off), applied
	// while TCP_QUICKACK is on.
	quickAckThreshold int
}

// listener serves a listening socket: its goroutine moves established
// connections from the stack to ready and announces them in the RX queue.
type listener struct {
	l       *ring.TCPListener
	rx      *shmq.Queue
	rxWait  ring.Waker
	bell    *tcpstack.Bell
	backlog int
	stop    func()
	done    chan struct{}

	mu        sync.Mutex
	closed    bool
	ready     []*ring.TCPConn
	announced int
}

// streamOpen prepares a new stream socket's doorbell and files it under
// the socket's slot on its lane.
func (s *session) streamOpen(k *socket) error {
	bell := tcpstack.NewBell()
	m := s.mem
	lane, err := m.lane(k.home.ring(), s.d.ringIndex(k.home))
	if err != nil {
		return err
	}
	lane.SetWaker(k.q.slot, bell)
	k.stream = &streamState{bell: bell, lane: lane, slot: k.q.slot, wake: ring.SessionWaker(m.sess, k.q.slot, m.wake)}
	return nil
}

// streamBind reserves addr's port on the ring serving addr.
func (s *session) streamBind(k *socket, addr netip.AddrPort) (netip.AddrPort, error) {
	st := k.stream
	if st.binding != nil || st.lis != nil || st.conn != nil {
		return netip.AddrPort{}, fmt.Errorf("socket is already bound: %w", unix.EINVAL)
	}
	addr, err := k.sockAddr(addr)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind: %w", err)
	}
	if p := addr.Port(); p != 0 && p < privilegedPortLimit && !peerCanBindPrivileged(s.cred.Uid, s.cred.Pid) {
		return netip.AddrPort{}, fmt.Errorf("bind %v: ports below %d need uid 0 or CAP_NET_BIND_SERVICE: %w", addr, privilegedPortLimit, unix.EACCES)
	}
	ri, err := s.d.chooseRing(k.home, addr.Addr())
	if err != nil {
		return netip.AddrPort{}, err
	}
	if err := ri.downErr(); err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind %v: %w", addr, err)
	}
	b, err := ri.ring().BindTCP(addr, k.reuseAddr)
	if err != nil {
		return netip.AddrPort{}, err
	}
	st.binding, st.ri = b, ri
	s.log.Debug("stream socket bound", zap.Uint32("socket", k.id), zap.Stringer("addr", b.LocalAddr()))
	return b.LocalAddr(), nil
}

// autobind binds an unbound stream socket to the wildcard address and a
// free port, as Linux does for listen and connect.
func (s *session) autobind(k *socket) error {
	if k.stream.binding != nil {
		return nil
	}
	wild := netip.IPv6Unspecified()
	if k.family == unix.AF_INET {
		wild = netip.IPv4Unspecified()
	}
	_, err := s.streamBind(k, netip.AddrPortFrom(wild, 0))
	return err
}

func (k *socket) streamBusy() error {
	if k.stream.lis != nil {
		return fmt.Errorf("socket is listening: %w", unix.EINVAL)
	}
	if k.stream.conn != nil {
		return fmt.Errorf("socket is connected: %w", unix.EISCONN)
	}
	return nil
}

// streamListen makes the socket listen and returns its address.
func (s *session) streamListen(k *socket, backlog uint32) (netip.AddrPort, error) {
	if err := k.streamBusy(); err != nil {
		return netip.AddrPort{}, fmt.Errorf("listen: %w", err)
	}
	if err := s.autobind(k); err != nil {
		return netip.AddrPort{}, fmt.Errorf("listen: %w", err)
	}
	st := k.stream
	n := int(backlog)
	if n == 0 || n > defaultBacklog {
		n = defaultBacklog
	}
	rx, err := shmq.Attach(k.rx)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("listen: RX queue: %w", err)
	}
	local := st.binding.LocalAddr()
	st.binding.SetReuseAddr(k.reuseAddr)
	l, err := st.binding.Listen(n)
	if err != nil {
		return netip.AddrPort{}, err
	}
	st.binding = nil
	ls := &listener{l: l, rx: rx, rxWait: st.wake, bell: st.bell, backlog: n, done: make(chan struct{})}
	ls.stop = l.Notify(func() { _ = st.bell.Wake() })
	st.lis = ls
	go ls.run()
	s.log.Debug("stream socket listening", zap.Uint32("socket", k.id), zap.Stringer("addr", local), zap.Int("backlog", n))
	return local, nil
}

// run takes connections and announces them until close.
func (ls *listener) run() {
	defer close(ls.done)
	for {
		ls.mu.Lock()
		if ls.closed {
			ls.mu.Unlock()
			return
		}
		for len(ls.ready) < ls.backlog {
			c, err := ls.l.AcceptTCP()
			if err != nil {
				break
			}
			ls.ready = append(ls.ready, c)
		}
		waitRoom := false
		for ls.announced < len(ls.ready) {
			buf, err := ls.rx.Reserve(streamrec.EventLen)
			if err != nil {
				waitRoom = errors.Is(err, shmq.ErrFull)
				break
			}
			streamrec.Put(buf, streamrec.Event{Kind: streamrec.Acceptable, Addr: ls.ready[ls.announced].RemoteAddr()})
			_ = ls.rx.Commit(streamrec.EventLen, streamrec.TypeEvent)
			ls.announced++
		}
		ls.mu.Unlock()
		if ls.rx.Publish() {
			_ = ls.rxWait.Wake()
		}
		if waitRoom && ls.rx.ArmWriteWait(streamrec.EventLen) {
			ls.rx.DisarmWriteWait()
			continue
		}
		_ = ls.bell.Wait(time.Time{})
		ls.rx.DisarmWriteWait()
	}
}

// take removes the oldest announced connection.
func (ls *listener) take() *ring.TCPConn {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.announced == 0 {
		return nil
	}
	c := ls.ready[0]
	ls.ready = ls.ready[1:]
	ls.announced--
	return c
}

// giveBack returns a connection take removed, as the oldest, to be
// announced again.
func (ls *listener) giveBack(c *ring.TCPConn) {
	ls.mu.Lock()
	if ls.closed {
		ls.mu.Unlock()
		c.Abort()
		return
	}
	// The announced prefix keeps its length: the connection announced
	// last moves out of it and the run loop announces it again, so the
	// events in the queue match the connections waiting.
	ls.ready = append([]*ring.TCPConn{c}, ls.ready...)
	ls.mu.Unlock()
	_ = ls.bell.Wake()
}

// close stops the goroutine, resets the connections nobody accepted and
// stops listening.
func (ls *listener) close() {
	ls.mu.Lock()
	ls.closed = true
	ready := ls.ready
	ls.ready = nil
	ls.mu.Unlock()
	ls.stop()
	_ = ls.bell.Wake()
	<-ls.done
	for _, c := range ready {
		c.Abort()
	}
	_ = ls.l.Close()
}

// onAccept takes one announced connection of a listening socket as a new
// socket and sends it like an OPEN reply.
func (s *session) onAccept(h ctlproto.Header, k *socket, m *ctlproto.AcceptReq) bool {
	if k.stream == nil || k.stream.lis == nil {
		return s.fail(h, fmt.Errorf("accept: socket %d is not listening: %w", k.id, unix.EINVAL))
	}
	c := k.stream.lis.take()
	if c == nil {
		return s.fail(h, fmt.Errorf("accept: no connection announced: %w", unix.EAGAIN))
	}
	n, err := s.newSocketFor(h, k.family, unix.SOCK_STREAM, m.QueueBytes)
	if err != nil {
		// Over its budget the client fails as accept(2) does at the
		// descriptor limit (EMFILE, ENOMEM), and the connection waits
		// for a later ACCEPT, announced again.
		k.stream.lis.giveBack(c)
		return s.fail(h, err)
	}
	n.stream.ri = k.stream.ri
	n.stream.opts = k.stream.opts
	n.stream.opts.apply(c.Endpoint().EP)
	if k.rate != nil {
		// SO_MAX_PACING_RATE is inherited, as Linux copies it to the
		// accepted socket; the entry exists, so only a full paced-queue
		// limit refuses it (then the connection is not paced).
		if e, err := n.home.rates.Acquire(k.rateReq); err == nil {
			n.rate, n.rateReq = e, k.rateReq
		} else {
			s.log.Warn("accepted connection not paced at its listener's rate", zap.Uint32("socket", n.id), zap.Error(err))
		}
	}
	rh := ctlproto.ReplyHeader(h)
	rh.Socket = n.id
	body := ctlproto.AcceptReply{OpenReply: s.openReply(n), Peer: c.RemoteAddr(), Local: c.LocalAddr()}
	if !s.sendNew(rh, body, n) {
		c.Abort()
		return false
	}
	// What the client queues before the pump starts waits in its queue.
	s.pub.Lock()
	err = s.startPump(n, c, false)
	s.pub.Unlock()
	if err != nil {
		c.Abort()
		s.log.Warn("accepted connection cannot be served; reset", zap.Uint32("socket", n.id), zap.Error(err))
	}
	return true
}

// streamConnect binds an unbound socket and starts the handshake; the
// pump reports how it ends (Connected or Error event).
func (s *session) streamConnect(k *socket, peer netip.AddrPort) error {
	if !peer.Addr().IsValid() {
		return fmt.Errorf("connect: no peer (a stream socket cannot disconnect): %w", unix.EINVAL)
	}
	if err := k.streamBusy(); err != nil {
		return fmt.Errorf("connect %v: %w", peer, err)
	}
	if k.family == unix.AF_INET && peer.Addr().Is6() {
		return fmt.Errorf("connect %v: an IPv6 address for an AF_INET socket: %w", peer, unix.EAFNOSUPPORT)
	}
	if err := s.autobind(k); err != nil {
		return fmt.Errorf("connect %v: %w", peer, err)
	}
	st := k.stream
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	st.binding.SetReuseAddr(k.reuseAddr)
	c, err := st.binding.Connect(ctx, peer, st.opts.apply)
	if err != nil {
		return err
	}
	st.binding = nil
	if err := s.startPump(k, c, true); err != nil {
		c.Abort()
		return err
	}
	s.log.Debug("stream socket connecting", zap.Uint32("socket", k.id), zap.Stringer("local", c.LocalAddr()), zap.Stringer("peer", peer))
	return nil
}

// startPump connects c to the socket's queues. The pump owns the queues
// (k.lent) and the doorbell from now on: its end gives the queues back to
// the session memory (see sessionMemory.lendToPump) and closes the bell.
func (s *session) startPump(k *socket, c *ring.TCPConn, connecting bool) error {
	tx, err := shmq.Attach(k.tx)
	if err != nil {
		return fmt.Errorf("TX queue: %w", err)
	}
	rx, err := shmq.Attach(k.rx)
	if err != nil {
		return fmt.Errorf("RX queue: %w", err)
	}
	st := k.stream
	bell, lane, slot, q := st.bell, st.lane, st.slot, k.q
	ref, giveBack := s.mem.lendToPump()
	st.conn = c
	k.applyQuickAck()
	k.applyPacing()
	st.pump = tcpstack.StartPump(c.Endpoint(), tcpstack.PumpConfig{TX: tx, RX: rx, RXWait: st.wake, TXWait: st.wake, Bell: bell,
		Connecting: connecting, Done: func(abort bool) {
			if abort {
				c.Abort()
			} else {
				_ = c.Close()
			}
			lane.SetWaker(slot, nil)
			_ = bell.Close()
			giveBack(q)
		}})
	ref.p = st.pump
	// The engine hands the client's announcements to the pump itself
	// (Pump.Wake), not to its goroutine.
	lane.SetWaker(slot, st.pump)
	// The pump's end releases these now.
	st.bell, k.lent = nil, true
	return nil
}

// streamClose releases what a stream socket holds beyond the common
// parts: a pump finishes (CLOSE: what the client queued is sent, then
// FIN; session end: reset) and releases the queues itself.
func (k *socket) streamClose() {
	st := k.stream
	switch {
	case st.pump != nil:
		if st.abort || st.opts.resetOnClose() {
			st.pump.Abort()
		} else {
			st.pump.Finish()
		}
		st.pump = nil
		// The pump gives the queues back when it ends.
		k.tx, k.rx = nil, nil
	case st.lis != nil:
		st.lis.close()
		st.lis = nil
	case st.binding != nil:
		st.binding.Close()
		st.binding = nil
	}
	if st.bell != nil {
		st.lane.SetWaker(st.slot, nil)
		_ = st.bell.Close()
		st.bell = nil
	}
}
