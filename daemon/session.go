package daemon

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/stats"
)

// maxMalformed is how many refused messages in a row end a session.
const maxMalformed = 3

// session is one client connection. Its goroutine (run) is the only one
// changing the socket table and the sockets; it does so holding pub, under
// which the stats publisher and the metrics collector read them. Others may
// only call stop.
type session struct {
	d    *Daemon
	conn *ctlproto.Conn
	cred unix.Ucred
	log  *zap.Logger

	hello     bool
	malformed int
	// program is the name HELLO gave (guarded by pub: QUERY reads it).
	program string
	// limitWarned: a limit hit was logged at Warn already.
	limitWarned bool
	// client is the stats of the session's process (nil: a tool session,
	// or stats files are off).
	client *clientStats
	// mem is the session memory (nil: a tool session, HELLO with
	// NO_SOCKETS).
	mem *sessionMemory

	// pub guards what readers of the counters look at: the socket table,
	// each socket's endpoint and options, and the counters of sockets that
	// are closing or closed.
	pub      sync.Mutex
	sockets  map[uint32]*socket
	queueMem int64
	// closing holds the endpoints of sockets being released at session
	// end (no longer in sockets, still counting); retired sums the final
	// counters of the session's closed sockets, so totals never go back.
	closing map[*ring.Endpoint]struct{}
	retired stats.SocketCounters
	opened  uint64
	// changes moves when anything the stats show of the session may have
	// changed: the engines bump it (ring.Queues.Activity) when they count
	// a datagram on one of its sockets, run after every request, close
	// and retire when counters move to the totals. The stats publisher
	// skips a client whose sessions' changes did not move.
	changes atomic.Uint64

	stopOnce sync.Once
	// parked is closed when the session pauses for a takeover (set by
	// Daemon.pause under Daemon.mu); done when run returned; abandoned
	// when it was handed over (nothing released).
	parked    chan struct{}
	done      chan struct{}
	abandoned bool
}

func newSession(d *Daemon, c *ctlproto.Conn, cred unix.Ucred) *session {
	return &session{d: d, conn: c, cred: cred, sockets: map[uint32]*socket{}, closing: map[*ring.Endpoint]struct{}{}, done: make(chan struct{}),
		log: d.log.With(zap.Int32("pid", cred.Pid), zap.Uint32("uid", cred.Uid), zap.Uint32("gid", cred.Gid))}
}

// stop tells the client the daemon is stopping and closes the connection,
// which ends run (and with it the release of the client's sockets).
func (s *session) stop() {
	s.stopOnce.Do(func() {
		s.sendShutdown()
		_ = s.conn.Close()
	})
}

func (s *session) sendShutdown() {
	_ = s.conn.SetWriteDeadline(time.Now().Add(writeTimeout))
	err := s.conn.Send(ctlproto.Header{Code: ctlproto.CodeShutdown}, ctlproto.Shutdown{Reason: ctlproto.ShutdownDaemonStopping})
	if err != nil {
		s.log.Debug("cannot send SHUTDOWN", zap.Error(err))
	}
}

// run serves requests in order until the connection ends, then releases
// everything the client held.
func (s *session) run() {
	defer close(s.done)
	defer s.d.forget(s)
	defer func() {
		if s.abandoned {
			s.abandon()
			return
		}
		s.release()
		s.d.leaveClient(s)
	}()
	for {
		h, msg, fds, err := s.conn.Recv()
		for _, fd := range fds {
			// Requests carry no descriptors (Recv refuses those that do);
			// never keep one.
			unix.Close(fd)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Paused for a takeover (nothing else sets a read deadline).
			if s.d.park(s) {
				continue
			}
			s.abandoned = s.d.isHandedOver()
			return
		}
		if err != nil {
			if !isRefused(err) {
				s.log.Debug("client disconnected", zap.NamedError("reason", err))
				return
			}
			if !s.refused(h, err) {
				return
			}
			continue
		}
		ok := s.handle(h, msg)
		s.changes.Add(1)
		if !ok {
			return
		}
	}
}

// isRefused reports whether err is a packet ctlproto refused (the session
// goes on) rather than a broken connection.
func isRefused(err error) bool {
	return errors.Is(err, ctlproto.ErrShort) || errors.Is(err, ctlproto.ErrMalformed) ||
		errors.Is(err, ctlproto.ErrUnknownCode) || errors.Is(err, ctlproto.ErrVersion)
}

// refused answers a refused packet with its errno (a packet too short to
// have a request id gets no answer) and reports whether the session goes
// on.
func (s *session) refused(h ctlproto.Header, err error) bool {
	errno := ctlproto.Errno(err)
	s.malformed++
	s.d.ctl.malformed.Add(1)
	s.log.Debug("refused message", zap.Stringer("code", h.Code), zap.Uint32("req", h.ReqID),
		zap.Uint32("socket", h.Socket), zap.String("errno", unix.ErrnoName(errno)), zap.Error(err), zap.Int("in_a_row", s.malformed))
	if !errors.Is(err, ctlproto.ErrShort) {
		if !s.reply(ctlproto.ErrorReply(h, errno), nil) {
			return false
		}
	}
	if s.malformed >= maxMalformed {
		s.d.ctl.malformedCloses.Add(1)
		s.log.Warn("closing session: too many malformed messages in a row", zap.Int("count", s.malformed), zap.Error(err))
		return false
	}
	return true
}

// reply sends one reply; false means the connection is unusable.
func (s *session) reply(h ctlproto.Header, body ctlproto.Message, fds ...int) bool {
	if err := s.conn.SetWriteDeadline(time.Now().Add(writeTimeout)); err != nil {
		return false
	}
	if err := s.conn.Send(h, body, fds...); err != nil {
		s.log.Debug("cannot reply; ending session", zap.Stringer("code", h.Code), zap.Error(err))
		return false
	}
	return true
}

// fail answers h with the errno err carries (EIO when none) and logs why.
func (s *session) fail(h ctlproto.Header, err error) bool {
	errno := errnoOf(err)
	s.d.ctl.count(h.Code, true)
	s.log.Debug("request failed", zap.Stringer("code", h.Code), zap.Uint32("req", h.ReqID),
		zap.Uint32("socket", h.Socket), zap.String("errno", unix.ErrnoName(errno)), zap.Error(err))
	return s.reply(ctlproto.ErrorReply(h, errno), nil)
}

// errnoOf extracts the errno to reply with: the first unix.Errno in err's
// chain, EIO when there is none.
func errnoOf(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return unix.ETIMEDOUT
	}
	return unix.EIO
}

// handle serves one well-formed message and reports whether the session
// goes on.
func (s *session) handle(h ctlproto.Header, msg ctlproto.Message) bool {
	if h.Code.IsReply() || h.Code == ctlproto.CodeShutdown || h.Code == ctlproto.CodeSocketError {
		// Well-formed, but a client only sends requests.
		return s.refused(h, fmt.Errorf("%w: a client sends requests only, not %v", ctlproto.ErrMalformed, h.Code))
	}
	s.malformed = 0
	s.d.ctl.count(h.Code, false)
	if !s.hello {
		if h.Code == ctlproto.CodeTakeover {
			return s.onTakeover(h, msg)
		}
		if h.Code != ctlproto.CodeHello {
			s.fail(h, fmt.Errorf("%v before HELLO: HELLO must be the first message: %w", h.Code, unix.EPROTO))
			s.log.Info("closing session: first message was not HELLO", zap.Stringer("code", h.Code))
			return false
		}
		return s.onHello(h, msg)
	}
	if h.Code == ctlproto.CodeHello {
		return s.fail(h, fmt.Errorf("second HELLO: %w", unix.EPROTO))
	}
	switch h.Code {
	case ctlproto.CodeOpen:
		m, ok := msg.(*ctlproto.Open)
		if !ok {
			return s.fail(h, fmt.Errorf("OPEN body %T: %w", msg, unix.EINVAL))
		}
		return s.onOpen(h, m)
	case ctlproto.CodeSetLogLevel:
		m, ok := msg.(*ctlproto.LogLevel)
		if !ok {
			return s.fail(h, fmt.Errorf("SET_LOG_LEVEL body %T: %w", msg, unix.EINVAL))
		}
		return s.onSetLogLevel(h, m)
	case ctlproto.CodeZeroStats:
		m, ok := msg.(*ctlproto.ZeroStats)
		if !ok {
			return s.fail(h, fmt.Errorf("ZERO_STATS body %T: %w", msg, unix.EINVAL))
		}
		return s.onZeroStats(h, m)
	case ctlproto.CodeSetQoS:
		m, ok := msg.(*ctlproto.SetQoS)
		if !ok {
			return s.fail(h, fmt.Errorf("SET_QOS body %T: %w", msg, unix.EINVAL))
		}
		return s.onSetQoS(h, m)
	case ctlproto.CodeQuery:
		m, ok := msg.(*ctlproto.Query)
		if !ok {
			return s.fail(h, fmt.Errorf("QUERY body %T: %w", msg, unix.EINVAL))
		}
		return s.onQuery(h, m)
	}
	k := s.sockets[h.Socket]
	if k == nil {
		return s.fail(h, fmt.Errorf("socket %d is not one of this client's sockets: %w", h.Socket, unix.EBADF))
	}
	if m, ok := msg.(*ctlproto.AcceptReq); ok {
		// Replies with descriptors itself, like OPEN.
		return s.onAccept(h, k, m)
	}
	var body ctlproto.Message = ctlproto.Empty{}
	var err error
	// Requests change what the stats publisher reads: hold pub while
	// serving one (not while replying).
	s.pub.Lock()
	switch m := msg.(type) {
	case *ctlproto.Bind:
		var ap ctlproto.BindReply
		if k.stream != nil {
			ap.Addr, err = s.streamBind(k, m.Addr)
		} else {
			ap.Addr, err = s.bind(k, m.Addr, m.ReuseAddr)
		}
		if err == nil {
			body = ap
		}
	case *ctlproto.Connect:
		if k.stream != nil {
			err = s.streamConnect(k, m.Addr)
		} else {
			err = s.connect(k, m.Addr)
		}
	case *ctlproto.ListenReq:
		var ap ctlproto.BindReply
		if k.stream == nil {
			err = fmt.Errorf("listen: socket %d is not a stream socket: %w", k.id, unix.EOPNOTSUPP)
		} else if ap.Addr, err = s.streamListen(k, m.Backlog); err == nil {
			body = ap
		}
	case *ctlproto.SetSockOpt:
		if err = priorityAllowed(m, s.cred.Uid, s.cred.Pid); err == nil {
			err = k.setOption(m.Level, m.Name, m.Value)
		}
	case *ctlproto.GetSockOpt:
		var v []byte
		if v, err = k.option(m.Level, m.Name); err == nil {
			body = ctlproto.SockOptValue{Value: v}
		}
	case *ctlproto.Group:
		if h.Code == ctlproto.CodeJoin {
			err = k.join(m.Group, m.Source, m.Ifindex)
		} else {
			err = k.leave(m.Group, m.Source, m.Ifindex)
		}
	case *ctlproto.Empty: // CLOSE, the only request without a body
		s.closeSocket(k)
	default:
		err = fmt.Errorf("%v body %T: %w", h.Code, msg, unix.EINVAL)
	}
	s.pub.Unlock()
	if err != nil {
		return s.fail(h, err)
	}
	return s.reply(ctlproto.ReplyHeader(h), body)
}

func (s *session) onHello(h ctlproto.Header, msg ctlproto.Message) bool {
	m, ok := msg.(*ctlproto.Hello)
	if !ok {
		s.fail(h, fmt.Errorf("HELLO body %T: %w", msg, unix.EINVAL))
		return false
	}
	s.log = s.log.With(zap.String("program", m.Name))
	s.pub.Lock()
	s.program = m.Name
	s.pub.Unlock()
	if m.MinVersion > ctlproto.Version || m.MaxVersion < ctlproto.Version {
		s.fail(h, fmt.Errorf("client speaks protocol versions %d..%d, this daemon %d: %w", m.MinVersion, m.MaxVersion, ctlproto.Version, unix.EPROTONOSUPPORT))
		s.log.Info("closing session: no common protocol version", zap.Uint16("min", m.MinVersion), zap.Uint16("max", m.MaxVersion))
		return false
	}
	cfg := &s.d.cfg
	reply := ctlproto.HelloReply{
		Version:           ctlproto.Version,
		DaemonPID:         uint32(os.Getpid()),
		MaxSockets:        uint32(cfg.MaxSockets),
		DefaultQueueBytes: uint32(cfg.QueueBytes),
		RXPollMicros:      pollMicros(cfg.RXPoll),
	}
	var fds []int
	if m.Flags&ctlproto.HelloFlagNoSockets == 0 {
		mem, err := newSessionMemory(s.cred.Pid, cfg.MaxSockets, len(s.d.rings), cfg.MaxQueueMemory, !s.d.ringDoorbells.Load())
		if err != nil {
			s.fail(h, fmt.Errorf("session memory: %w", err))
			s.log.Warn("closing session: cannot create its shared memory", zap.Error(err))
			return false
		}
		s.mem = mem
		l := mem.sess.Layout()
		reply.Lanes, reply.SessionSize = uint16(l.Lanes), uint64(l.Size)
		fds = append(fds, mem.memfd, mem.wake.FD())
		for i, ri := range s.d.rings {
			if mem.bells == nil {
				fds = append(fds, ri.doorbell.FD())
			} else {
				fds = append(fds, mem.bells[i].FD())
			}
		}
	}
	s.hello = true
	s.d.ctl.sessionsTotal.Add(1)
	if m.Flags&ctlproto.HelloFlagNoStats == 0 {
		s.d.joinClient(s, m.Name)
	}
	s.log.Debug("client said hello")
	return s.reply(ctlproto.ReplyHeader(h), reply, fds...)
}

// releaseWorkers bounds the goroutines closing a finished session's
// sockets.
const releaseWorkers = 256

// release closes every socket of the session and the connection. Sockets
// close in parallel: each endpoint Close waits for an engine iteration, and
// concurrent closes share those waits, so a client with a thousand sockets
// is released well within the promised second.
func (s *session) release() {
	_ = s.conn.Close()
	defer func() {
		if s.mem != nil {
			s.mem.close()
		}
	}()
	n := len(s.sockets)
	if n == 0 {
		return
	}
	start := time.Now()
	// The sockets leave the table at once; their endpoints keep counting
	// (as closing) until they are closed, then their final counters go to
	// retired. Readers wait for neither.
	s.pub.Lock()
	all := s.sockets
	s.sockets = map[uint32]*socket{}
	s.queueMem = 0
	s.changes.Add(1)
	eps := make([]*ring.Endpoint, 0, n)
	for _, k := range all {
		if k.ep != nil {
			s.closing[k.ep] = struct{}{}
			eps = append(eps, k.ep)
		}
	}
	s.pub.Unlock()
	work := make(chan *socket)
	var wg sync.WaitGroup
	for i := 0; i < min(n, releaseWorkers); i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range work {
				if k.stream != nil {
					k.stream.abort = true // a client gone without CLOSE resets its peers
				}
				k.close()
			}
		}()
	}
	for _, k := range all {
		work <- k
	}
	close(work)
	wg.Wait()
	s.pub.Lock()
	for _, ep := range eps {
		s.retire(ep)
	}
	s.pub.Unlock()
	s.log.Debug("session ended; sockets released", zap.Int("sockets", n), zap.Duration("took", time.Since(start)))
}

// pollMicros converts a poll duration to the protocol's microseconds:
// -1 spins forever.
func pollMicros(d time.Duration) int32 {
	if d < 0 {
		return -1
	}
	return int32(d / time.Microsecond)
}
