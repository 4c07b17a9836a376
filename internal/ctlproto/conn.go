package ctlproto

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// maxRecvFDs sizes the control buffer: room for more descriptors than any
// valid message carries, so that a peer sending a few extra ones has them
// received and closed here, and any more are discarded by the kernel
// (MSG_CTRUNC) rather than left in flight.
const maxRecvFDs = 2 * (FDDoorbell + MaxLanes)

// dialTimeout bounds a connect to a daemon whose backlog is full.
const dialTimeout = 5 * time.Second

// Conn is one end of a control connection (a SOCK_SEQPACKET Unix socket).
// It is safe for one goroutine calling Recv and any number calling Send
// concurrently; each Send is one packet, never interleaved with another.
// The socket is non-blocking and driven by Go's runtime poller, so deadlines
// apply and Close unblocks a pending Recv or Send (which then return errors
// matching net.ErrClosed).
type Conn struct {
	f    *os.File
	rc   syscall.RawConn
	rbuf []byte // receive buffer, owned by the single reader
	oob  []byte

	closed atomic.Bool // set before closing, so that errors caused by Close read as net.ErrClosed
}

// SocketPath returns the control socket path clients use: $BYPASSD_SOCKET if
// set, else DefaultPath.
func SocketPath() string {
	if p := os.Getenv(EnvSocket); p != "" {
		return p
	}
	return DefaultPath
}

// NewConn wraps fd, a connected AF_UNIX SOCK_SEQPACKET socket, and takes
// ownership of it: it is closed by Conn.Close, or right away if NewConn
// fails.
func NewConn(fd int) (*Conn, error) {
	if err := checkSocket(fd); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: wrap fd %d: %w", fd, err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: wrap fd %d: set non-blocking: %w", fd, err)
	}
	// A non-blocking fd makes os.NewFile register it with the runtime poller.
	f := os.NewFile(uintptr(fd), "bypassd-control")
	if f == nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ctlproto: wrap fd %d: invalid descriptor", fd)
	}
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("ctlproto: wrap fd %d: %w", fd, err)
	}
	return &Conn{
		f:    f,
		rc:   rc,
		rbuf: make([]byte, MaxMessage),
		oob:  make([]byte, unix.CmsgSpace(maxRecvFDs*4)),
	}, nil
}

func checkSocket(fd int) error {
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return fmt.Errorf("not a socket: %w", err)
	}
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return fmt.Errorf("read socket type: %w", err)
	}
	if dom != unix.AF_UNIX || typ != unix.SOCK_SEQPACKET {
		return fmt.Errorf("socket is domain %d type %d, want AF_UNIX SOCK_SEQPACKET", dom, typ)
	}
	return nil
}

// Pair returns two connected Conns (socketpair), for tests and in-process
// use.
func Pair() (*Conn, *Conn, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("ctlproto: socketpair: %w", err)
	}
	a, err := NewConn(fds[0])
	if err != nil {
		unix.Close(fds[1])
		return nil, nil, err
	}
	b, err := NewConn(fds[1])
	if err != nil {
		a.Close()
		return nil, nil, err
	}
	return a, b, nil
}

// Dial connects to the daemon's control socket at path ("" = SocketPath()).
// Its errors say what to do: start the daemon, fix permissions, or point
// BYPASSD_SOCKET elsewhere; they match the underlying errno (errors.Is).
func Dial(path string) (*Conn, error) {
	if path == "" {
		path = SocketPath()
	}
	sa, err := sockaddr(path)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ctlproto: dial %s: create socket: %w", path, err)
	}
	if err := connectTimeout(fd, sa, dialTimeout); err != nil {
		unix.Close(fd)
		return nil, dialError(path, err)
	}
	c, err := NewConn(fd)
	if err != nil {
		return nil, fmt.Errorf("ctlproto: dial %s: %w", path, err)
	}
	return c, nil
}

// connectTimeout connects a blocking socket; SO_SNDTIMEO bounds the wait
// for a full listen backlog (the kernel then returns EAGAIN).
func connectTimeout(fd int, sa unix.Sockaddr, d time.Duration) error {
	tv := unix.NsecToTimeval(d.Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &tv); err != nil {
		return err
	}
	for {
		err := unix.Connect(fd, sa)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	var zero unix.Timeval
	return unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_SNDTIMEO, &zero)
}

func dialError(path string, err error) error {
	errno := Errno(err)
	var msg string
	switch errno {
	case unix.ENOENT, unix.ECONNREFUSED:
		msg = fmt.Sprintf("bypassd is not running at %s: start it with `bypassd --interface IFACE` (or set %s)", path, EnvSocket)
	case unix.EACCES, unix.EPERM:
		msg = fmt.Sprintf("no permission to connect to %s: ask for membership in the socket's group", path)
	case unix.EAGAIN:
		msg = fmt.Sprintf("bypassd at %s is not accepting connections (its backlog stayed full for %v): check the daemon's logs", path, dialTimeout)
	case unix.EPROTOTYPE:
		msg = fmt.Sprintf("%s is not a bypassd control socket (wrong socket type): set %s to the daemon's socket", path, EnvSocket)
	case unix.ENOTDIR:
		msg = fmt.Sprintf("bypassd is not running at %s (a path component is not a directory): set %s to the daemon's socket", path, EnvSocket)
	default:
		msg = fmt.Sprintf("cannot connect to bypassd at %s", path)
	}
	return fmt.Errorf("ctlproto: %s: %w", msg, os.NewSyscallError("connect", err))
}

func sockaddr(path string) (*unix.SockaddrUnix, error) {
	// sun_path holds 108 bytes including the terminating NUL.
	if len(path) == 0 || len(path) > 107 {
		return nil, fmt.Errorf("ctlproto: socket path %q must be 1..107 bytes long: choose a shorter path", path)
	}
	return &unix.SockaddrUnix{Name: path}, nil
}

// Send sends one message, with fds attached (SCM_RIGHTS). fds must be
// exactly what the message carries (ExpectFDs: four for a successful OPEN
// reply, none otherwise); they stay owned by the caller, who may close them
// once Send returns. A zero h.Version is sent as Version.
func (c *Conn) Send(h Header, body Message, fds ...int) error {
	b, err := Marshal(make([]byte, 0, MaxMessage), h, body)
	if err != nil {
		return err
	}
	if want := ExpectFDs(h, body); len(fds) != want {
		return fmt.Errorf("ctlproto: send %v: %d file descriptors attached, the message carries %d", h.Code, len(fds), want)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	var serr error
	err = c.rc.Write(func(fd uintptr) bool {
		for {
			serr = unix.Sendmsg(int(fd), b, oob, nil, unix.MSG_NOSIGNAL)
			if serr != unix.EINTR {
				return serr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("ctlproto: send %v: %w", h.Code, connError(&c.closed, err))
	}
	return nil
}

// Recv reads one packet, blocking until one arrives, the read deadline
// passes (os.ErrDeadlineExceeded) or the Conn is closed (net.ErrClosed). The
// peer closing its end yields io.EOF. The returned fds (those of a
// successful HELLO or QUERY reply, none otherwise) are owned by the caller
// and are close-on-exec.
//
// A packet that is refused (see Unmarshal; also a packet larger than
// MaxMessage, truncated ancillary data, or a wrong number of descriptors)
// returns an error wrapping ErrShort, ErrVersion, ErrUnknownCode or
// ErrMalformed, the Header whenever it could be read, and no fds: any it
// carried are closed here. The connection stays usable after such an error.
func (c *Conn) Recv() (Header, Message, []int, error) {
	var n, oobn, flags int
	var rerr error
	err := c.rc.Read(func(fd uintptr) bool {
		for {
			n, oobn, flags, _, rerr = unix.Recvmsg(int(fd), c.rbuf, c.oob, unix.MSG_CMSG_CLOEXEC)
			if rerr != unix.EINTR {
				return rerr != unix.EAGAIN
			}
		}
	})
	if err == nil {
		err = rerr
	}
	if err != nil {
		return Header{}, nil, nil, fmt.Errorf("ctlproto: receive: %w", connError(&c.closed, err))
	}
	fds, ferr := parseRights(c.oob[:oobn])
	fail := func(h Header, e error) (Header, Message, []int, error) {
		closeFDs(fds)
		return h, nil, nil, e
	}
	if ferr != nil {
		return fail(rawHeader(c.rbuf[:n]), fmt.Errorf("%w: ancillary data: %v", ErrMalformed, ferr))
	}
	if n == 0 && len(fds) == 0 && flags&unix.MSG_TRUNC == 0 {
		// SOCK_SEQPACKET reads 0 bytes only at end of stream (an empty
		// packet is never a valid message, so nothing is lost).
		return Header{}, nil, nil, io.EOF
	}
	if flags&unix.MSG_TRUNC != 0 {
		return fail(rawHeader(c.rbuf[:n]), fmt.Errorf("%w: packet larger than %d bytes", ErrMalformed, MaxMessage))
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return fail(rawHeader(c.rbuf[:n]), fmt.Errorf("%w: more than %d file descriptors attached", ErrMalformed, maxRecvFDs))
	}
	h, m, err := Unmarshal(c.rbuf[:n])
	if err != nil {
		return fail(h, err)
	}
	if want := ExpectFDs(h, m); len(fds) != want {
		return fail(h, fmt.Errorf("%w: %v with %d file descriptors, want %d", ErrMalformed, h.Code, len(fds), want))
	}
	return h, m, fds, nil
}

// rawHeader reads the header fields of a packet refused before decoding,
// so that its request id can still be echoed.
func rawHeader(b []byte) Header {
	if len(b) < HeaderLen {
		return Header{}
	}
	h, _, _ := Unmarshal(b[:HeaderLen])
	return h
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, err
	}
	var fds []int
	var firstErr error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			if firstErr == nil {
				firstErr = fmt.Errorf("unexpected control message level %d type %d", msgs[i].Header.Level, msgs[i].Header.Type)
			}
			continue
		}
		got, err := unix.ParseUnixRights(&msgs[i])
		fds = append(fds, got...)
		if err != nil && firstErr == nil {
			firstErr = err
		}
	}
	return fds, firstErr
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// connError maps errors caused by Close (the poller reports "use of closed
// file", not os.ErrClosed, through a RawConn) to net.ErrClosed, which is
// what socket users test for.
func connError(closed *atomic.Bool, err error) error {
	if closed.Load() || errors.Is(err, os.ErrClosed) {
		return net.ErrClosed
	}
	return err
}

// SetReadDeadline bounds pending and future Recv calls (zero: no deadline).
func (c *Conn) SetReadDeadline(t time.Time) error {
	if err := c.f.SetReadDeadline(t); err != nil {
		return fmt.Errorf("ctlproto: set read deadline: %w", connError(&c.closed, err))
	}
	return nil
}

// SetWriteDeadline bounds pending and future Send calls (zero: no
// deadline); a daemon uses it so that a client that stops reading cannot
// block it.
func (c *Conn) SetWriteDeadline(t time.Time) error {
	if err := c.f.SetWriteDeadline(t); err != nil {
		return fmt.Errorf("ctlproto: set write deadline: %w", connError(&c.closed, err))
	}
	return nil
}

// PeerCred returns the peer's identity as the kernel recorded it at
// connect time (SO_PEERCRED): the only identity the daemon trusts.
func (c *Conn) PeerCred() (*unix.Ucred, error) {
	var cred *unix.Ucred
	var gerr error
	err := c.rc.Control(func(fd uintptr) {
		cred, gerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if err == nil {
		err = gerr
	}
	if err != nil {
		return nil, fmt.Errorf("ctlproto: read peer credentials: %w", connError(&c.closed, err))
	}
	return cred, nil
}

// Dup returns a new descriptor of the connection's socket (close-on-exec,
// owned by the caller). A live upgrade hands connections to the new daemon
// this way; the peer notices nothing, and closing c afterwards does not end
// the connection while the duplicate is open.
func (c *Conn) Dup() (int, error) {
	var nfd int
	var derr error
	err := c.rc.Control(func(fd uintptr) {
		nfd, derr = unix.FcntlInt(fd, unix.F_DUPFD_CLOEXEC, 0)
	})
	if err == nil {
		err = derr
	}
	if err != nil {
		return -1, fmt.Errorf("ctlproto: duplicate: %w", connError(&c.closed, err))
	}
	return nfd, nil
}

// Close closes the connection, unblocking a pending Recv or Send. The peer
// sees end of stream.
func (c *Conn) Close() error {
	c.closed.Store(true)
	if err := c.f.Close(); err != nil {
		return fmt.Errorf("ctlproto: close: %w", connError(&c.closed, err))
	}
	return nil
}
