package socket

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
)

// fakeDaemon speaks the control protocol over a real Unix socket like
// bypassd does, with a session memory per session, and serves its sockets'
// queues with a loopback "engine" per session that turns every sent
// datagram into a received one from its destination.
// It tests the client's protocol handling and data path without root or a
// ring; the end-to-end tests use the real daemon.
type fakeDaemon struct {
	t    testing.TB
	path string
	ln   *ctlproto.Listener

	// hook, if set, sees every request first; handled=true means it
	// replied (or deliberately did not).
	hook func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) (handled bool)
	// helloVersion is the header version of the HELLO reply (0: Version).
	helloVersion uint16
	helloReply   ctlproto.HelloReply
	queueBytes   uint32 // default queue size

	mu       sync.Mutex
	sessions []*fakeSession
	closes   atomic.Int32 // CLOSE requests seen
	wg       sync.WaitGroup
}

type fakeSession struct {
	d    *fakeDaemon
	conn *ctlproto.Conn

	// The session memory (after HELLO): the memfd's mapping, the client
	// eventfd and the lane's doorbell; done stops the engine.
	memfd    int
	mem      []byte
	sess     *shmsess.Session
	arena    *shmsess.Arena
	wake     *shmq.Waiter
	doorbell *shmq.Waiter
	done     chan struct{}
	stopOnce sync.Once

	mu       sync.Mutex
	socks    map[uint32]*fakeSock
	bySlot   map[int]*fakeSock
	nextSock uint32
	nextPort uint16
}

type fakeSock struct {
	id       uint32
	slot     int
	off      int64
	s        *fakeSession
	v6       bool
	tx, rx   *shmq.Queue
	bound    netip.AddrPort
	peer     atomic.Pointer[netip.AddrPort]
	opts     map[[2]int32][]byte
	groups   []ctlproto.Group
	paused   atomic.Bool
	received atomic.Int64 // datagrams taken from TX
}

// newFakeDaemon starts a fake daemon; configure runs before it accepts
// anything (the fields it sets are not synchronized afterwards, except the
// hook: use setHook).
func newFakeDaemon(t testing.TB, configure ...func(d *fakeDaemon)) *fakeDaemon {
	t.Helper()
	dir, err := os.MkdirTemp("", "bdsock")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "ctl.sock")
	ln, err := ctlproto.Listen(path, 0o600, -1)
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	d := &fakeDaemon{
		t: t, path: path, ln: ln,
		helloReply: ctlproto.HelloReply{Version: ctlproto.Version, DaemonPID: 4242, MaxSockets: 1024, DefaultQueueBytes: 64 << 10, RXPollMicros: 0},
		queueBytes: 64 << 10,
	}
	for _, f := range configure {
		f(d)
	}
	d.wg.Add(1)
	go d.acceptLoop()
	t.Cleanup(d.stop)
	return d
}

func (d *fakeDaemon) setHook(f func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hook = f
}

func (d *fakeDaemon) getHook() func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.hook
}

func (d *fakeDaemon) acceptLoop() {
	defer d.wg.Done()
	for {
		conn, err := d.ln.Accept()
		if err != nil {
			return
		}
		s := &fakeSession{d: d, conn: conn, socks: map[uint32]*fakeSock{}, bySlot: map[int]*fakeSock{}, nextPort: 40000,
			memfd: -1, done: make(chan struct{})}
		d.mu.Lock()
		d.sessions = append(d.sessions, s)
		d.mu.Unlock()
		d.wg.Add(1)
		go s.serve()
	}
}

// stop closes the listener and every session and waits for all goroutines.
func (d *fakeDaemon) stop() {
	_ = d.ln.Close()
	d.mu.Lock()
	ss := d.sessions
	d.mu.Unlock()
	for _, s := range ss {
		s.close()
	}
	d.wg.Wait()
}

// session returns the i-th accepted session, waiting for it.
func (d *fakeDaemon) session(i int) *fakeSession {
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(time.Millisecond) {
		d.mu.Lock()
		if len(d.sessions) > i {
			s := d.sessions[i]
			d.mu.Unlock()
			return s
		}
		d.mu.Unlock()
	}
	d.t.Fatalf("fake daemon: no session %d", i)
	return nil
}

func (d *fakeDaemon) dial(t *testing.T) *Client {
	t.Helper()
	c, err := dial(d.path, 2*time.Second)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func (s *fakeSession) close() {
	_ = s.conn.Close()
	s.stopOnce.Do(func() { close(s.done) })
}

func (s *fakeSession) sock(id uint32) *fakeSock {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.socks[id]
}

func (s *fakeSession) send(h ctlproto.Header, m ctlproto.Message, fds ...int) {
	if err := s.conn.Send(h, m, fds...); err != nil && !errors.Is(err, unix.EPIPE) && !strings.Contains(err.Error(), "closed") {
		s.d.t.Errorf("fake daemon: send %v: %v", h.Code, err)
	}
}

func (s *fakeSession) fail(h ctlproto.Header, errno unix.Errno) {
	s.send(ctlproto.ErrorReply(h, errno), ctlproto.Empty{})
}

func (s *fakeSession) serve() {
	defer s.d.wg.Done()
	defer s.close()
	for {
		h, m, fds, err := s.conn.Recv()
		for _, fd := range fds {
			unix.Close(fd)
		}
		if err != nil {
			if isDecodeError(err) {
				s.fail(h, ctlproto.Errno(err))
				continue
			}
			return
		}
		if hook := s.d.getHook(); hook != nil && hook(s, h, m) {
			continue
		}
		s.handle(h, m)
	}
}

func (s *fakeSession) handle(h ctlproto.Header, m ctlproto.Message) {
	r := ctlproto.ReplyHeader(h)
	switch h.Code {
	case ctlproto.CodeHello:
		if v := s.d.helloVersion; v != 0 {
			r.Version = v
		}
		hr := s.d.helloReply
		if hr.Version != ctlproto.Version || r.Version != ctlproto.Version {
			s.send(r, hr)
			return
		}
		fds, err := s.startSession(&hr)
		if err != nil {
			s.d.t.Errorf("fake daemon: session memory: %v", err)
			s.fail(h, unix.ENOMEM)
			return
		}
		s.send(r, hr, fds...)
	case ctlproto.CodeOpen:
		o := m.(*ctlproto.Open)
		qb := o.QueueBytes
		if qb == 0 {
			qb = s.d.queueBytes
		}
		fs, err := s.newFakeSock(qb, o.Family == ctlproto.FamilyInet6)
		if err != nil {
			s.d.t.Errorf("fake daemon: open: %v", err)
			s.fail(h, unix.ENOMEM)
			return
		}
		r.Socket = fs.id
		s.send(r, ctlproto.OpenReply{QueueBytes: qb, Slot: uint32(fs.slot), TXOffset: uint64(fs.off),
			RXOffset: uint64(fs.off + shmsess.QueueSpan(int(qb)))})
	case ctlproto.CodeBind:
		fs := s.sock(h.Socket)
		if fs == nil {
			s.fail(h, unix.EBADF)
			return
		}
		b := m.(*ctlproto.Bind)
		port := b.Addr.Port()
		if port == 0 {
			s.mu.Lock()
			s.nextPort++
			port = s.nextPort
			s.mu.Unlock()
		}
		fs.bound = netip.AddrPortFrom(b.Addr.Addr(), port)
		s.send(r, ctlproto.BindReply{Addr: fs.bound})
	case ctlproto.CodeConnect:
		fs := s.sock(h.Socket)
		if fs == nil {
			s.fail(h, unix.EBADF)
			return
		}
		p := m.(*ctlproto.Connect).Addr
		fs.peer.Store(&p)
		s.send(r, ctlproto.Empty{})
	case ctlproto.CodeSetSockOpt:
		fs := s.sock(h.Socket)
		if fs == nil {
			s.fail(h, unix.EBADF)
			return
		}
		o := m.(*ctlproto.SetSockOpt)
		if o.Level == unix.SOL_SOCKET && o.Name == unix.SO_MAX_PACING_RATE {
			s.fail(h, unix.EOPNOTSUPP)
			return
		}
		s.mu.Lock()
		fs.opts[[2]int32{o.Level, o.Name}] = append([]byte(nil), o.Value...)
		s.mu.Unlock()
		s.send(r, ctlproto.Empty{})
	case ctlproto.CodeGetSockOpt:
		fs := s.sock(h.Socket)
		if fs == nil {
			s.fail(h, unix.EBADF)
			return
		}
		o := m.(*ctlproto.GetSockOpt)
		s.mu.Lock()
		v, ok := fs.opts[[2]int32{o.Level, o.Name}]
		s.mu.Unlock()
		if !ok {
			v = binary.LittleEndian.AppendUint32(nil, 0)
		}
		s.send(r, ctlproto.SockOptValue{Value: v})
	case ctlproto.CodeJoin, ctlproto.CodeLeave:
		fs := s.sock(h.Socket)
		if fs == nil {
			s.fail(h, unix.EBADF)
			return
		}
		s.mu.Lock()
		fs.groups = append(fs.groups, *m.(*ctlproto.Group))
		s.mu.Unlock()
		s.send(r, ctlproto.Empty{})
	case ctlproto.CodeClose:
		s.d.closes.Add(1)
		s.mu.Lock()
		fs := s.socks[h.Socket]
		delete(s.socks, h.Socket)
		if fs != nil {
			delete(s.bySlot, fs.slot)
			s.arena.Free(fs.slot, fs.off, shmsess.SocketSpan(fs.tx.Capacity()))
		}
		s.mu.Unlock()
		if fs == nil {
			s.fail(h, unix.EBADF)
			return
		}
		s.send(r, ctlproto.Empty{})
	default:
		s.fail(h, unix.ENOSYS)
	}
}

// startSession creates the session memory and starts the session's
// engine; it fills in hr and returns the descriptors to send.
func (s *fakeSession) startSession(hr *ctlproto.HelloReply) ([]int, error) {
	l, err := shmsess.NewLayout(int(hr.MaxSockets), 1, 256<<20)
	if err != nil {
		return nil, err
	}
	if s.memfd, s.mem, err = shmq.CreateMemfd("fake-session", int(l.Size)); err != nil {
		return nil, err
	}
	if s.sess, err = shmsess.Init(s.mem, l); err != nil {
		return nil, err
	}
	s.arena = shmsess.NewArena(l)
	if s.wake, err = shmq.NewWaiter(); err != nil {
		return nil, err
	}
	if s.doorbell, err = shmq.NewWaiter(); err != nil {
		return nil, err
	}
	hr.Lanes, hr.SessionSize = 1, uint64(l.Size)
	s.d.wg.Add(1)
	go s.engine()
	return []int{s.memfd, s.wake.FD(), s.doorbell.FD()}, nil
}

// newFakeSock carves a socket's queues out of the session memory.
func (s *fakeSession) newFakeSock(qb uint32, v6 bool) (*fakeSock, error) {
	if s.sess == nil {
		return nil, errors.New("OPEN before a session memory")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	slot, off, ok := s.arena.Alloc(shmsess.SocketSpan(int(qb)))
	if !ok {
		return nil, errors.New("session memory full")
	}
	txm, _ := s.sess.Queue(uint64(off), int(qb))
	rxm, _ := s.sess.Queue(uint64(off+shmsess.QueueSpan(int(qb))), int(qb))
	tx, err := shmq.Init(txm, int(qb))
	if err != nil {
		return nil, err
	}
	tx.ArmReadWait() // the engine's side starts armed, as the daemon's does
	rx, err := shmq.Init(rxm, int(qb))
	if err != nil {
		return nil, err
	}
	s.nextSock++
	fs := &fakeSock{id: s.nextSock, slot: slot, off: off, s: s, v6: v6, tx: tx, rx: rx, opts: map[[2]int32][]byte{}}
	s.socks[fs.id] = fs
	s.bySlot[slot] = fs
	return fs, nil
}

// engine serves the session's sockets: the ones announced on lane 0 and
// the ones it could not finish (paused, or still holding records).
func (s *fakeSession) engine() {
	defer s.d.wg.Done()
	defer func() {
		_ = s.doorbell.Close()
		_ = s.wake.Close()
		_ = shmq.Unmap(s.mem)
		unix.Close(s.memfd)
	}()
	ln := s.sess.Lane(0)
	active := map[*fakeSock]bool{}
	var scratch []byte // reused: the benchmarks count the shim's allocations only
	for {
		select {
		case <-s.done:
			return
		default:
		}
		ln.Drain(func(slot int) {
			s.mu.Lock()
			fs := s.bySlot[slot]
			s.mu.Unlock()
			if fs != nil {
				active[fs] = true
			}
		})
		paused := false
		for fs := range active {
			s.mu.Lock()
			live := s.socks[fs.id] == fs
			s.mu.Unlock()
			if !live {
				delete(active, fs)
				continue
			}
			if fs.paused.Load() {
				paused = true
				continue
			}
			if !fs.loopback(&scratch) {
				return
			}
			if !fs.tx.ArmReadWait() {
				delete(active, fs)
			}
		}
		switch {
		case paused:
			select {
			case <-time.After(time.Millisecond):
			case <-s.done:
				return
			}
		case len(active) > 0:
		case ln.ArmSleep():
			ln.DisarmSleep()
		default:
			// A bounded sleep, so that the end of the session (done) is
			// seen without a doorbell.
			err := s.doorbell.Wait(time.Now().Add(10 * time.Millisecond))
			ln.DisarmSleep()
			if err != nil && !errors.Is(err, shmq.ErrTimeout) {
				return
			}
		}
	}
}

// event wakes the client's waiters of fs.
func (fs *fakeSock) event() {
	if fs.s.sess.Event(fs.slot) {
		_ = fs.s.wake.Wake()
	}
}

// loopback turns each TX record into an RX datagram from its destination
// (the connected peer for a zero destination). It returns false when the
// session ends.
func (fs *fakeSock) loopback(scratch *[]byte) bool {
	var h dgram.Header
	for !fs.paused.Load() {
		rec, _, err := fs.tx.Peek()
		if err != nil {
			break
		}
		payload, perr := dgram.Parse(rec, &h)
		if perr == nil {
			fs.received.Add(1)
			if p := fs.peer.Load(); !h.Addr.IsValid() && p != nil {
				h.Addr = *p
			}
			if cap(*scratch) < dgram.HeaderLen+len(payload) {
				*scratch = make([]byte, dgram.HeaderLen+len(payload))
			}
			out := (*scratch)[:dgram.HeaderLen+len(payload)]
			dgram.Put(out, &h)
			copy(out[dgram.HeaderLen:], payload)
			// Unlike a ring (which drops), wait for room so that tests
			// can count on every datagram.
			for fs.rx.Push(dgram.TypeDatagram, out) != nil {
				if fs.rx.Publish() {
					fs.event()
				}
				select {
				case <-time.After(100 * time.Microsecond):
				case <-fs.s.done:
					return false
				}
			}
		}
		fs.tx.Advance()
	}
	if fs.tx.Release() {
		fs.event()
	}
	if fs.rx.Publish() {
		fs.event()
	}
	return true
}

func (fs *fakeSock) pause() { fs.paused.Store(true) }

func (fs *fakeSock) unpause() {
	fs.paused.Store(false)
}

// inject queues a datagram from src on the socket's RX queue, as a ring
// engine would.
func (fs *fakeSock) inject(t *testing.T, src netip.AddrPort, payload []byte) {
	t.Helper()
	out := make([]byte, dgram.HeaderLen+len(payload))
	dgram.Put(out, &dgram.Header{Addr: src})
	copy(out[dgram.HeaderLen:], payload)
	if err := fs.rx.Push(dgram.TypeDatagram, out); err != nil {
		t.Fatalf("inject: %v", err)
	}
	if fs.rx.Publish() {
		fs.event()
	}
}

// resources counts goroutines and open fds, to check for leaks.
func resources(t *testing.T) (goroutines, fds int) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return runtime.NumGoroutine(), len(ents)
}

// settle waits until goroutines and fds return to at most the baseline
// (they wind down asynchronously), failing if they do not.
func settle(t *testing.T, g0, f0 int) {
	t.Helper()
	var g, f int
	for start := time.Now(); time.Since(start) < 5*time.Second; time.Sleep(5 * time.Millisecond) {
		g, f = resources(t)
		if g <= g0 && f <= f0 {
			return
		}
	}
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	t.Fatalf("leak: goroutines %d (was %d), fds %d (was %d)\n%s\n%s", g, g0, f, f0, fdList(), buf[:n])
}

func fdList() string {
	ents, _ := os.ReadDir("/proc/self/fd")
	var b strings.Builder
	for _, e := range ents {
		l, _ := os.Readlink("/proc/self/fd/" + e.Name())
		b.WriteString(e.Name() + " -> " + l + "\n")
	}
	return b.String()
}
