package socket

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/internal/stream"
)

// TCPConn is a TCP connection carried by bypassd: the daemon's TCP stack
// holds the connection, its bytes move through the socket's shared-memory
// queues as stream records. It implements net.Conn; all methods are safe
// for concurrent use (reads are serialized among themselves, and so are
// writes).
type TCPConn struct {
	tcpSock
	// rxOff is how much of the current data record was read (rxMu);
	// rdErr is the sticky end of reading: io.EOF or the connection's
	// error.
	rxOff int
	rdErr error
	// wrClosed: CloseWrite was called.
	wrClosed atomic.Bool
}

// TCPListener is a listening TCP socket carried by bypassd. It implements
// net.Listener.
type TCPListener struct {
	tcpSock
}

var (
	_ net.Conn     = (*TCPConn)(nil)
	_ net.Listener = (*TCPListener)(nil)
)

// tcpSock is what TCP connections and listeners share: the socket, its
// queues and its life.
type tcpSock struct {
	c            *Client
	id           uint32
	network      string
	v6           bool
	laddr, raddr netip.AddrPort
	qwait
	nonblock   atomic.Bool
	closed     atomic.Bool
	gone       atomic.Pointer[error]
	life       sync.RWMutex // data calls hold it shared; teardown exclusively before unmapping
	rxMu, txMu sync.Mutex
}

func (t *tcpSock) sockID() uint32 { return t.id }

func (t *tcpSock) goneErr() error {
	if p := t.gone.Load(); p != nil {
		return *p
	}
	return nil
}

func (t *tcpSock) breakWith(reason error) {
	err := fmt.Errorf("%w: %w", net.ErrClosed, reason)
	t.gone.CompareAndSwap(nil, &err)
	_ = t.rxWait.Close()
	_ = t.txWait.Close()
}

func (t *tcpSock) closeLocal() bool {
	if !t.closed.CompareAndSwap(false, true) {
		return false
	}
	_ = t.rxWait.Close()
	_ = t.txWait.Close()
	t.life.Lock()
	defer t.life.Unlock()
	t.release()
	return true
}

func (t *tcpSock) deadErr() error {
	if t.closed.Load() {
		return net.ErrClosed
	}
	return t.goneErr()
}

func (t *tcpSock) opErr(op string, err error) error {
	var raddr net.Addr
	if t.raddr.IsValid() {
		raddr = net.TCPAddrFromAddrPort(t.raddr)
	}
	return opError(op, t.network, net.TCPAddrFromAddrPort(t.laddr), raddr, err)
}

// mapErr turns a wait's error into what a socket user expects.
func (t *tcpSock) mapErr(err error) error {
	switch {
	case errors.Is(err, shmq.ErrClosed):
		if d := t.deadErr(); d != nil {
			return d
		}
		return net.ErrClosed
	case errors.Is(err, shmq.ErrTimeout):
		return sockq.ErrTimeout
	}
	return err
}

// close closes the socket: local side first (pending calls fail with
// net.ErrClosed), then the daemon's.
func (t *tcpSock) close(self clientSock) error {
	if !t.closeLocal() {
		return t.opErr("close", net.ErrClosed)
	}
	if err := t.c.closeSocket(self); err != nil {
		return t.opErr("close", err)
	}
	return nil
}

// SetDeadline sets the read and write deadlines (see net.Conn).
func (t *tcpSock) SetDeadline(tm time.Time) error {
	if err := t.SetReadDeadline(tm); err != nil {
		return err
	}
	return t.SetWriteDeadline(tm)
}

// SetReadDeadline sets the deadline of pending and future reads (and
// accepts); past it they fail with an error matching
// os.ErrDeadlineExceeded.
func (t *tcpSock) SetReadDeadline(tm time.Time) error {
	if t.closed.Load() {
		return t.opErr("set", net.ErrClosed)
	}
	t.rdl.Store(deadlineNanos(tm))
	if t.rsleep.Load() > 0 {
		_ = t.rxWait.Wake()
	}
	return nil
}

// SetWriteDeadline sets the deadline of pending and future writes (which
// wait only while the send queue is full).
func (t *tcpSock) SetWriteDeadline(tm time.Time) error {
	if t.closed.Load() {
		return t.opErr("set", net.ErrClosed)
	}
	t.wdl.Store(deadlineNanos(tm))
	if t.wsleep.Load() > 0 {
		_ = t.txWait.Wake()
	}
	return nil
}

// SetNonblock switches between blocking (the default) and non-blocking
// mode, where a read with nothing queued, a write that finds the send
// queue full and an accept with nothing to accept fail at once with an
// error matching unix.EAGAIN.
func (t *tcpSock) SetNonblock(nonblocking bool) { t.nonblock.Store(nonblocking) }

// ID returns the daemon's id for this socket.
func (t *tcpSock) ID() uint32 { return t.id }

// LocalAddr returns the local address (*net.TCPAddr).
func (t *tcpSock) LocalAddr() net.Addr { return net.TCPAddrFromAddrPort(t.laddr) }

// RemoteAddr returns the peer's address (*net.TCPAddr).
func (t *tcpSock) RemoteAddr() net.Addr {
	if !t.raddr.IsValid() {
		return nil
	}
	return net.TCPAddrFromAddrPort(t.raddr)
}

// nextEvent waits for the next RX record, which must be an event, and
// consumes it (the handshake's end, a connection to accept).
func (t *tcpSock) nextEvent(dl func() int64) (stream.Event, error) {
	for {
		if err := t.deadErr(); err != nil {
			return stream.Event{}, err
		}
		rec, typ, err := t.rx.Peek()
		if err == nil {
			if typ != stream.TypeEvent {
				t.rx.Advance()
				t.release()
				return stream.Event{}, fmt.Errorf("bypassd sent a record of type %d where an event belongs: %w", typ, unix.EPROTO)
			}
			ev, perr := stream.Parse(rec)
			t.rx.Advance()
			t.release()
			return ev, perr
		}
		if !errors.Is(err, shmq.ErrEmpty) {
			return stream.Event{}, fmt.Errorf("receive queue: %w", err)
		}
		if t.nonblock.Load() {
			return stream.Event{}, unix.EAGAIN
		}
		d := dl()
		if expired(d) {
			return stream.Event{}, sockq.ErrTimeout
		}
		if err := t.wait(false, 0, d); err != nil && err != errDeadlineChanged {
			return stream.Event{}, t.mapErr(err)
		}
	}
}

// release frees consumed RX room and wakes the daemon's pump if it waits
// for it.
func (t *tcpSock) release() {
	if t.rx.Release() {
		_ = t.doorbell.Wake()
	}
}

// DialTCP opens a TCP connection through Default (see Client.DialTCP).
func DialTCP(network string, laddr, raddr netip.AddrPort) (*TCPConn, error) {
	c, err := Default()
	if err != nil {
		return nil, opError("dial", network, nil, net.TCPAddrFromAddrPort(raddr), err)
	}
	return c.DialTCP(network, laddr, raddr)
}

// ListenTCP listens through Default (see Client.ListenTCP).
func ListenTCP(network string, laddr netip.AddrPort) (*TCPListener, error) {
	c, err := Default()
	if err != nil {
		return nil, opError("listen", network, nil, net.TCPAddrFromAddrPort(laddr), err)
	}
	return c.ListenTCP(network, laddr)
}

// openStream opens a stream socket into t and, when laddr has an address
// or a port, binds it. opened reports whether t holds a socket to close
// on error.
func (c *Client) openStream(t *tcpSock, network string, laddr, raddr netip.AddrPort) (opened bool, err error) {
	v6, laddr, _, err := family("tcp", network, laddr, raddr)
	if err != nil {
		return false, err
	}
	fam := uint16(ctlproto.FamilyInet)
	if v6 {
		fam = ctlproto.FamilyInet6
	}
	h, body, fds, err := c.call(ctlproto.CodeOpen, 0, ctlproto.Open{Family: fam, Type: ctlproto.TypeStream})
	if err != nil {
		return false, err
	}
	or, ok := body.(*ctlproto.OpenReply)
	if !ok {
		closeFDs(fds)
		c.discard(h.Socket)
		return false, fmt.Errorf("bypassd answered OPEN with %T: %w", body, unix.EPROTO)
	}
	t.c, t.id, t.network, t.v6 = c, h.Socket, network, v6
	closeFDs(fds) // an OPEN reply carries none (ctlproto refuses any)
	if err = c.attachQueues(or, &t.qwait); err != nil {
		c.discard(h.Socket)
		return false, err
	}
	if !laddr.Addr().IsUnspecified() || laddr.Port() != 0 {
		m, err := t.request(ctlproto.CodeBind, ctlproto.Bind{Addr: laddr})
		if err != nil {
			return true, fmt.Errorf("bind %v: %w", laddr, err)
		}
		if br, ok := m.(*ctlproto.BindReply); ok {
			t.laddr = br.Addr
		}
	}
	return true, nil
}

func (t *tcpSock) request(code ctlproto.Code, body ctlproto.Message) (ctlproto.Message, error) {
	if err := t.deadErr(); err != nil {
		return nil, err
	}
	_, m, fds, err := t.c.call(code, t.id, body)
	closeFDs(fds)
	return m, err
}

// DialTCP connects to raddr from laddr (no address: the route's source
// address; port 0: a free port) and waits for the handshake. network is
// "tcp", "tcp4" or "tcp6". A refused connection fails with an error
// matching unix.ECONNREFUSED.
func (c *Client) DialTCP(network string, laddr, raddr netip.AddrPort) (*TCPConn, error) {
	fail := func(err error) error {
		return opError("dial", network, net.TCPAddrFromAddrPort(laddr), net.TCPAddrFromAddrPort(raddr), err)
	}
	if !c.ok() {
		return nil, fail(errNoClient)
	}
	if !raddr.Addr().IsValid() || raddr.Port() == 0 {
		return nil, fail(fmt.Errorf("remote address %v needs an IP address and a port: %w", raddr, unix.EDESTADDRREQ))
	}
	conn := &TCPConn{}
	opened, err := c.openStream(&conn.tcpSock, network, laddr, raddr)
	if opened {
		if rerr := c.register(conn); rerr != nil {
			return nil, fail(rerr)
		}
	}
	if err != nil {
		if opened {
			_ = conn.Close()
		}
		return nil, fail(err)
	}
	if _, err := conn.request(ctlproto.CodeConnect, ctlproto.Connect{Addr: raddr}); err != nil {
		_ = conn.Close()
		return nil, fail(fmt.Errorf("connect to %v: %w", raddr, err))
	}
	conn.raddr = netip.AddrPortFrom(raddr.Addr().Unmap(), raddr.Port())
	ev, err := conn.nextEvent(conn.rdl.Load)
	if err == nil {
		switch ev.Kind {
		case stream.Connected:
			conn.laddr = ev.Addr
			return conn, nil
		case stream.Error:
			err = fmt.Errorf("connect to %v: %w", raddr, unix.Errno(ev.Errno))
		default:
			err = fmt.Errorf("connect to %v: bypassd sent event %d before the handshake ended: %w", raddr, ev.Kind, unix.EPROTO)
		}
	}
	_ = conn.Close()
	return nil, fail(err)
}

// ListenTCP listens on laddr (no address: the wildcard address of the
// family; port 0: a free port). network is "tcp", "tcp4" or "tcp6".
func (c *Client) ListenTCP(network string, laddr netip.AddrPort) (*TCPListener, error) {
	fail := func(err error) error {
		return opError("listen", network, nil, net.TCPAddrFromAddrPort(laddr), err)
	}
	if !c.ok() {
		return nil, fail(errNoClient)
	}
	l := &TCPListener{}
	opened, err := c.openStream(&l.tcpSock, network, laddr, netip.AddrPort{})
	if opened {
		if rerr := c.register(l); rerr != nil {
			return nil, fail(rerr)
		}
	}
	if err != nil {
		if opened {
			_ = l.Close()
		}
		return nil, fail(err)
	}
	m, err := l.request(ctlproto.CodeListen, ctlproto.ListenReq{})
	if err != nil {
		_ = l.Close()
		return nil, fail(err)
	}
	if br, ok := m.(*ctlproto.BindReply); ok {
		l.laddr = br.Addr
	}
	return l, nil
}

// Addr returns the listening address (net.Listener).
func (l *TCPListener) Addr() net.Addr { return l.LocalAddr() }

// Close stops listening; connections not accepted yet are reset.
func (l *TCPListener) Close() error { return l.close(l) }

// Accept waits for a connection (net.Listener).
func (l *TCPListener) Accept() (net.Conn, error) { return l.AcceptTCP() }

// AcceptTCP waits for a connection and returns it as a *TCPConn.
func (l *TCPListener) AcceptTCP() (*TCPConn, error) {
	l.life.RLock()
	defer l.life.RUnlock()
	l.rxMu.Lock()
	defer l.rxMu.Unlock()
	for {
		ev, err := l.nextEvent(l.rdl.Load)
		if err != nil {
			return nil, l.opErr("accept", err)
		}
		if ev.Kind != stream.Acceptable {
			continue
		}
		h, body, fds, err := l.c.call(ctlproto.CodeAccept, l.id, ctlproto.AcceptReq{})
		if errors.Is(err, unix.EAGAIN) {
			continue
		}
		if err != nil {
			return nil, l.opErr("accept", err)
		}
		ar, ok := body.(*ctlproto.AcceptReply)
		if !ok {
			closeFDs(fds)
			l.c.discard(h.Socket)
			return nil, l.opErr("accept", fmt.Errorf("bypassd answered ACCEPT with %T: %w", body, unix.EPROTO))
		}
		conn := &TCPConn{tcpSock: tcpSock{c: l.c, id: h.Socket, network: l.network, v6: l.v6, laddr: ar.Local, raddr: ar.Peer}}
		closeFDs(fds)
		if err = l.c.attachQueues(&ar.OpenReply, &conn.qwait); err != nil {
			l.c.discard(h.Socket)
			return nil, l.opErr("accept", err)
		}
		if err := l.c.register(conn); err != nil {
			return nil, l.opErr("accept", err)
		}
		return conn, nil
	}
}

// Read reads what the peer sent, at most len(b) bytes; at the end of the
// stream it returns io.EOF, after a reset the connection's error (for
// example one matching unix.ECONNRESET).
func (t *TCPConn) Read(b []byte) (int, error) {
	t.life.RLock()
	defer t.life.RUnlock()
	t.rxMu.Lock()
	defer t.rxMu.Unlock()
	if len(b) == 0 {
		return 0, nil
	}
	n := 0
	for {
		if err := t.deadErr(); err != nil {
			return n, t.opErr("read", err)
		}
		if t.rdErr != nil {
			if n > 0 {
				return n, nil
			}
			if t.rdErr == io.EOF {
				return 0, io.EOF
			}
			return 0, t.opErr("read", t.rdErr)
		}
		rec, typ, err := t.rx.Peek()
		if err != nil {
			if !errors.Is(err, shmq.ErrEmpty) {
				t.breakWith(fmt.Errorf("receive queue: %w", err))
				continue
			}
			if n > 0 {
				t.release()
				return n, nil
			}
			if t.nonblock.Load() {
				return 0, t.opErr("read", unix.EAGAIN)
			}
			dl := t.rdl.Load()
			if expired(dl) {
				return 0, t.opErr("read", sockq.ErrTimeout)
			}
			if err := t.wait(false, 0, dl); err != nil && err != errDeadlineChanged {
				return 0, t.opErr("read", t.mapErr(err))
			}
			continue
		}
		switch typ {
		case stream.TypeData:
			c := copy(b[n:], rec[t.rxOff:])
			n += c
			t.rxOff += c
			if t.rxOff >= len(rec) {
				t.rx.Advance()
				t.rxOff = 0
			}
		case stream.TypeEvent:
			ev, perr := stream.Parse(rec)
			t.rx.Advance()
			switch {
			case perr != nil:
				t.rdErr = fmt.Errorf("%w: %w", perr, unix.EPROTO)
			case ev.Kind == stream.EOF:
				t.rdErr = io.EOF
			case ev.Kind == stream.Error:
				t.rdErr = unix.Errno(ev.Errno)
			}
		default:
			t.rx.Advance()
		}
		if n == len(b) {
			t.release()
			return n, nil
		}
	}
}

// Write queues b for sending. It waits while the send queue is full (until
// the write deadline; in non-blocking mode it fails with EAGAIN after
// queueing what fits). Once the connection failed (a reset, a keepalive
// or user timeout) it fails with the connection's error, for example one
// matching unix.ECONNRESET.
func (t *TCPConn) Write(b []byte) (int, error) {
	t.life.RLock()
	defer t.life.RUnlock()
	t.txMu.Lock()
	defer t.txMu.Unlock()
	sent := 0
	defer t.publish()
	for sent < len(b) {
		if err := t.deadErr(); err != nil {
			return sent, t.opErr("write", err)
		}
		if e := t.tx.ConsumerError(); e != 0 {
			// The connection failed: the daemon takes no more bytes.
			return sent, t.opErr("write", unix.Errno(e))
		}
		if t.wrClosed.Load() {
			return sent, t.opErr("write", unix.EPIPE)
		}
		chunk := min(len(b)-sent, t.tx.MaxPayload())
		buf, err := t.tx.Reserve(chunk)
		if errors.Is(err, shmq.ErrFull) && chunk > 4096 {
			chunk = 4096
			buf, err = t.tx.Reserve(chunk)
		}
		if err == nil {
			copy(buf, b[sent:sent+chunk])
			_ = t.tx.Commit(chunk, stream.TypeData)
			sent += chunk
			continue
		}
		if !errors.Is(err, shmq.ErrFull) {
			t.breakWith(fmt.Errorf("send queue: %w", err))
			continue
		}
		t.publish()
		if t.nonblock.Load() {
			return sent, t.opErr("write", unix.EAGAIN)
		}
		dl := t.wdl.Load()
		if expired(dl) {
			return sent, t.opErr("write", sockq.ErrTimeout)
		}
		if err := t.wait(true, chunk, dl); err != nil && err != errDeadlineChanged {
			return sent, t.opErr("write", t.mapErr(err))
		}
	}
	return sent, nil
}

func (t *TCPConn) publish() {
	if t.tx.Publish() {
		_ = t.doorbell.Wake()
	}
}

// CloseWrite shuts down the sending side: the peer gets FIN after what
// was written before (shutdown(SHUT_WR)). The end marker needs room in the
// send queue: with the queue full, CloseWrite waits for it up to the write
// deadline; if it fails, the sending side stays open and CloseWrite may be
// called again.
func (t *TCPConn) CloseWrite() error {
	t.life.RLock()
	defer t.life.RUnlock()
	t.txMu.Lock()
	defer t.txMu.Unlock()
	if err := t.deadErr(); err != nil {
		return t.opErr("close", err)
	}
	if t.wrClosed.Load() {
		return nil
	}
	for {
		buf, err := t.tx.Reserve(stream.EventLen)
		if err == nil {
			stream.Put(buf, stream.Event{Kind: stream.EOF})
			_ = t.tx.Commit(stream.EventLen, stream.TypeEvent)
			t.wrClosed.Store(true)
			t.publish()
			return nil
		}
		if !errors.Is(err, shmq.ErrFull) {
			return t.opErr("close", err)
		}
		t.publish()
		if err := t.wait(true, stream.EventLen, t.wdl.Load()); err != nil && err != errDeadlineChanged {
			return t.opErr("close", t.mapErr(err))
		}
	}
}

// Close closes the connection: what was written is still sent, then FIN;
// pending reads and writes fail with net.ErrClosed. A process that exits
// without closing resets its connections instead.
func (t *TCPConn) Close() error { return t.close(t) }

// SetOption sets a socket option by its Linux name (OptionNames lists
// them; TCP sockets take TCP_NODELAY, TCP_QUICKACK, TCP_MAXSEG,
// TCP_KEEPIDLE, TCP_KEEPINTVL, TCP_KEEPCNT, TCP_USER_TIMEOUT,
// SO_KEEPALIVE, SO_SNDBUF and SO_RCVBUF). An option set on a listener is
// inherited by the connections it accepts.
func (t *tcpSock) SetOption(name string, value int) error {
	o, err := lookupOption(name)
	if err != nil {
		return t.opErr("set", err)
	}
	v, err := o.encode(name, value)
	if err != nil {
		return t.opErr("set", err)
	}
	return t.setRaw(name, o, v)
}

func (t *tcpSock) setRaw(name string, o option, v []byte) error {
	if _, err := t.request(ctlproto.CodeSetSockOpt, ctlproto.SetSockOpt{Level: o.level, Name: o.name, Value: v}); err != nil {
		return t.opErr("set", fmt.Errorf("setsockopt %s: %w", name, err))
	}
	return nil
}

// Option returns a socket option's value by its Linux name.
func (t *tcpSock) Option(name string) (int, error) {
	o, err := lookupOption(name)
	if err != nil {
		return 0, t.opErr("get", err)
	}
	m, err := t.request(ctlproto.CodeGetSockOpt, ctlproto.GetSockOpt{Level: o.level, Name: o.name})
	if err != nil {
		return 0, t.opErr("get", fmt.Errorf("getsockopt %s: %w", name, err))
	}
	v, ok := m.(*ctlproto.SockOptValue)
	if !ok {
		return 0, t.opErr("get", fmt.Errorf("getsockopt %s: bypassd answered with %T: %w", name, m, unix.EPROTO))
	}
	val, err := o.decode(name, v.Value)
	if err != nil {
		return 0, t.opErr("get", err)
	}
	return val, nil
}

// SetNoDelay turns Nagle's algorithm off (true, TCP_NODELAY) or on, as
// net.TCPConn.SetNoDelay. Unlike Go's net, sockets start with Nagle on
// (Linux's default).
func (t *tcpSock) SetNoDelay(noDelay bool) error {
	return t.SetOption("TCP_NODELAY", boolToInt(noDelay))
}

// SetMaxPacingRate paces the connection at bytesPerSec of wire bytes
// (SO_MAX_PACING_RATE; 0 removes the limit): bypassd sends its frames at
// that rate, a large segment spread out frame by frame. A listener's rate
// is inherited by the connections it accepts.
func (t *tcpSock) SetMaxPacingRate(bytesPerSec uint32) error {
	return t.SetOption("SO_MAX_PACING_RATE", int(bytesPerSec))
}

// SetKeepAlive turns keepalive probes on or off (SO_KEEPALIVE).
func (t *tcpSock) SetKeepAlive(keepalive bool) error {
	return t.SetOption("SO_KEEPALIVE", boolToInt(keepalive))
}

// SetKeepAlivePeriod sets the idle time before the first probe and the
// interval between probes (TCP_KEEPIDLE, TCP_KEEPINTVL; whole seconds, at
// least 1), as net.TCPConn.SetKeepAlivePeriod.
func (t *tcpSock) SetKeepAlivePeriod(d time.Duration) error {
	secs := max(int((d+time.Second-1)/time.Second), 1)
	if err := t.SetOption("TCP_KEEPIDLE", secs); err != nil {
		return err
	}
	return t.SetOption("TCP_KEEPINTVL", secs)
}

// SetLinger sets what Close does with unsent data (SO_LINGER), as
// net.TCPConn.SetLinger: sec < 0 (the default) sends it in the
// background; sec == 0 discards it and resets the connection; sec > 0
// lingers up to sec seconds.
func (t *tcpSock) SetLinger(sec int) error {
	v := make([]byte, 8)
	if sec >= 0 {
		binary.LittleEndian.PutUint32(v, 1)
		binary.LittleEndian.PutUint32(v[4:], uint32(min(sec, math.MaxInt32)))
	}
	return t.setRaw("SO_LINGER", option{level: unix.SOL_SOCKET, name: unix.SO_LINGER}, v)
}

// SetReadBuffer sets the receive buffer of the daemon's TCP endpoint
// (SO_RCVBUF), which bounds the window offered to the peer.
func (t *tcpSock) SetReadBuffer(bytes int) error { return t.SetOption("SO_RCVBUF", bytes) }

// SetWriteBuffer sets the send buffer of the daemon's TCP endpoint
// (SO_SNDBUF).
func (t *tcpSock) SetWriteBuffer(bytes int) error { return t.SetOption("SO_SNDBUF", bytes) }

func boolToInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
