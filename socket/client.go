package socket

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/internal/sockq"
)

// EnvRXPoll overrides the daemon's polling policy for this process: µs a
// blocked read or write spins before sleeping, -1 spins forever, 0 never.
const EnvRXPoll = "BYPASSD_RX_POLL"

// RequestTimeout bounds every control request (bind, options, ...): a
// daemon that does not answer within it is reported as hung.
const RequestTimeout = 5 * time.Second

// Client is one connection (session) to bypassd. Sockets opened through it
// live as long as it does: when it is closed, or the daemon goes away, all
// of them stop working. Safe for concurrent use.
type Client struct {
	path    string
	conn    *ctlproto.Conn
	hello   ctlproto.HelloReply
	policy  shmq.Policy
	timeout time.Duration // RequestTimeout; shorter in tests
	// cs is the session memory every socket's queues live in. It is
	// unmapped when the Client is closed or dead and its last socket is
	// torn down (csRefs counts the sockets, plus one for the live Client).
	cs     *shmsess.ClientSession
	csRefs int

	mu      sync.Mutex
	err     error // non-nil once closed (net.ErrClosed) or broken (*goneError)
	closed  bool  // Close was called
	nextID  uint32
	pending map[uint32]chan reply
	socks   map[clientSock]struct{}

	readerDone chan struct{}
}

// reply is what the reader goroutine hands to a waiting request.
type reply struct {
	h    ctlproto.Header
	body ctlproto.Message
	fds  []int
	err  error
}

// Dial connects to bypassd's control socket at path ("": $BYPASSD_SOCKET,
// else /run/bypassd/bypassd.sock) and negotiates the protocol version. The
// errors say what to do: start the daemon, fix permissions, or upgrade the
// side that is too old.
func Dial(path string) (*Client, error) {
	return dial(path, RequestTimeout)
}

func dial(path string, timeout time.Duration) (*Client, error) {
	if path == "" {
		path = ctlproto.SocketPath()
	}
	override, err := rxPollOverride()
	if err != nil {
		return nil, err
	}
	conn, err := ctlproto.Dial(path)
	if err != nil {
		return nil, fmt.Errorf("socket: %w", err)
	}
	c, err := handshake(conn, path, timeout)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	if override != nil {
		c.policy = *override
	}
	go c.readLoop()
	return c, nil
}

// rxPollOverride parses $BYPASSD_RX_POLL, if set.
func rxPollOverride() (*shmq.Policy, error) {
	s, ok := os.LookupEnv(EnvRXPoll)
	if !ok || strings.TrimSpace(s) == "" {
		return nil, nil
	}
	us, err := strconv.Atoi(strings.TrimSpace(s))
	if err != nil {
		return nil, fmt.Errorf("socket: %s=%q is not a number of microseconds: use -1 (spin forever), 0 (never spin) or a positive count, or unset it", EnvRXPoll, s)
	}
	p, err := shmq.PolicyFromMicros(us)
	if err != nil {
		return nil, fmt.Errorf("socket: %s: %w", EnvRXPoll, err)
	}
	return &p, nil
}

// handshake runs HELLO on a fresh connection and returns the Client
// (reader not yet started).
func handshake(conn *ctlproto.Conn, path string, timeout time.Duration) (*Client, error) {
	const helloID = 1
	fail := func(err error) (*Client, error) { return nil, fmt.Errorf("socket: %w", err) }
	if err := conn.SetWriteDeadline(time.Now().Add(timeout)); err != nil {
		return fail(err)
	}
	if err := conn.Send(ctlproto.Header{Code: ctlproto.CodeHello, ReqID: helloID}, ctlproto.NewHello(filepath.Base(os.Args[0]))); err != nil {
		return fail(fmt.Errorf("send HELLO to bypassd at %s: %w", path, err))
	}
	if err := conn.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return fail(err)
	}
	h, body, fds, err := conn.Recv()
	if err != nil || h.Status != 0 {
		closeFDs(fds)
	}
	switch {
	case errors.Is(err, ctlproto.ErrVersion):
		return fail(versionError(path, h.Version))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return fail(fmt.Errorf("bypassd at %s did not answer HELLO within %v; it may be hung: check its logs and restart it: %w", path, timeout, unix.ETIMEDOUT))
	case errors.Is(err, io.EOF):
		return fail(fmt.Errorf("bypassd at %s closed the connection during HELLO (is it a bypassd? check its logs): %w", path, unix.ECONNRESET))
	case err != nil:
		return fail(fmt.Errorf("HELLO with bypassd at %s: %w", path, err))
	case h.Code != ctlproto.CodeHello|ctlproto.ReplyBit || h.ReqID != helloID:
		return fail(fmt.Errorf("bypassd at %s answered HELLO with %v (request id %d): %w", path, h.Code, h.ReqID, unix.EPROTO))
	case h.Status == unix.EPROTONOSUPPORT:
		return fail(versionError(path, 0))
	case h.Status != 0:
		return fail(fmt.Errorf("bypassd at %s refused HELLO: %w", path, h.Status))
	}
	hr, ok := body.(*ctlproto.HelloReply)
	if ok && hr.Version != ctlproto.Version {
		closeFDs(fds)
		return fail(versionError(path, hr.Version))
	}
	if !ok || hr.SessionSize == 0 {
		closeFDs(fds)
		return fail(fmt.Errorf("bypassd at %s answered HELLO with %T and no session memory: %w", path, body, unix.EPROTO))
	}
	cs, err := shmsess.OpenClientSession(int(hr.MaxSockets), int(hr.Lanes), hr.SessionSize, fds)
	if err != nil {
		return fail(fmt.Errorf("bypassd at %s: %w", path, err))
	}
	fail = func(err error) (*Client, error) {
		_ = cs.Close()
		return nil, fmt.Errorf("socket: %w", err)
	}
	if err := conn.SetReadDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	if err := conn.SetWriteDeadline(time.Time{}); err != nil {
		return fail(err)
	}
	policy, err := shmq.PolicyFromMicros(int(hr.RXPollMicros))
	if err != nil {
		return fail(fmt.Errorf("bypassd at %s announced an invalid poll policy: %w", path, err))
	}
	return &Client{
		path:       path,
		conn:       conn,
		hello:      *hr,
		policy:     policy,
		timeout:    timeout,
		cs:         cs,
		csRefs:     1,
		pending:    make(map[uint32]chan reply),
		socks:      make(map[clientSock]struct{}),
		nextID:     helloID,
		readerDone: make(chan struct{}),
	}, nil
}

// versionError explains a protocol version mismatch; daemonVersion 0 means
// the daemon only said it cannot speak ours.
func versionError(path string, daemonVersion uint16) error {
	switch {
	case daemonVersion == 0:
		return fmt.Errorf("bypassd at %s does not speak control protocol version %d, the version of this program's socket package: upgrade bypassd, or rebuild this program against the socket package of the daemon's release: %w",
			path, ctlproto.Version, unix.EPROTONOSUPPORT)
	case daemonVersion > ctlproto.Version:
		return fmt.Errorf("bypassd at %s speaks control protocol version %d, this program speaks version %d: upgrade this program (rebuild it against a newer github.com/bypassd/bypassd/socket) or run a bypassd that speaks version %d: %w",
			path, daemonVersion, ctlproto.Version, ctlproto.Version, unix.EPROTONOSUPPORT)
	default:
		return fmt.Errorf("bypassd at %s speaks control protocol version %d, this program speaks version %d: upgrade bypassd: %w",
			path, daemonVersion, ctlproto.Version, unix.EPROTONOSUPPORT)
	}
}

// DaemonPID returns the daemon's process id as it announced it.
func (c *Client) DaemonPID() int { return int(c.hello.DaemonPID) }

// Path returns the control socket path the Client is connected to.
func (c *Client) Path() string { return c.path }

var (
	defaultMu     sync.Mutex
	defaultClient *Client
)

// Default returns the process-wide Client, dialing it ("" path: the
// environment or the default) on first use, and again after the daemon went
// away, so that a restarted daemon is picked up by new sockets.
func Default() (*Client, error) {
	defaultMu.Lock()
	defer defaultMu.Unlock()
	if defaultClient != nil && defaultClient.alive() {
		return defaultClient, nil
	}
	c, err := Dial("")
	if err != nil {
		return nil, err
	}
	defaultClient = c
	return c, nil
}

// ok reports whether c came from Dial (not nil, not a zero Client).
func (c *Client) ok() bool { return c != nil && c.conn != nil }

var errNoClient = fmt.Errorf("socket: not a Client returned by Dial or Default: %w", unix.EINVAL)

func (c *Client) alive() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err == nil
}

// ListenUDP opens a socket through Default and binds it (see
// Client.ListenUDP).
func ListenUDP(network string, laddr netip.AddrPort) (*UDPConn, error) {
	c, err := Default()
	if err != nil {
		return nil, opError("listen", network, nil, udpAddr(laddr), err)
	}
	return c.ListenUDP(network, laddr)
}

// DialUDP opens a socket through Default and connects it (see
// Client.DialUDP).
func DialUDP(network string, laddr, raddr netip.AddrPort) (*UDPConn, error) {
	c, err := Default()
	if err != nil {
		return nil, opError("dial", network, udpAddr(laddr), udpAddr(raddr), err)
	}
	return c.DialUDP(network, laddr, raddr)
}

// ListenConfig holds what must be decided before a socket is bound.
type ListenConfig struct {
	// ReuseAddr lets several sockets bind the same address and port
	// (SO_REUSEADDR), e.g. receivers of one multicast group; each must set it.
	ReuseAddr bool
	// QueueBytes is the data capacity of each of the socket's two queues:
	// 0 for the daemon's default, else a power of two from 4 KiB to 16 MiB.
	// A queue holds datagrams up to about half its size.
	QueueBytes int
	// Pacing, when its Kbps is not 0, paces the socket from its first
	// datagram (SO_MAX_PACING_RATE set before the bind; SetPacing
	// changes it later).
	Pacing Pacing
}

// ListenUDP opens a UDP socket and binds it to laddr. network is "udp4",
// "udp6" or "udp" (the family of laddr; IPv4 if laddr has no address).
// An laddr without an address binds the wildcard address (allowed when
// bypassd has exactly one interface of the family); port 0 picks a port.
func (c *Client) ListenUDP(network string, laddr netip.AddrPort) (*UDPConn, error) {
	return c.ListenUDPConfig(network, laddr, ListenConfig{})
}

// ListenUDPConfig is ListenUDP with options that must be set before the
// socket is bound.
func (c *Client) ListenUDPConfig(network string, laddr netip.AddrPort, cfg ListenConfig) (*UDPConn, error) {
	if !c.ok() {
		return nil, opError("listen", network, nil, udpAddr(laddr), errNoClient)
	}
	u, err := c.open(network, laddr, netip.AddrPort{}, cfg)
	if err != nil {
		return nil, opError("listen", network, nil, udpAddr(laddr), err)
	}
	return u, nil
}

// DialUDP opens a UDP socket, binds it to laddr (no address: the wildcard
// address and a chosen port) and connects it to raddr, after which it
// receives only raddr's datagrams and Write sends to raddr.
func (c *Client) DialUDP(network string, laddr, raddr netip.AddrPort) (*UDPConn, error) {
	return c.DialUDPConfig(network, laddr, raddr, ListenConfig{})
}

// DialUDPConfig is DialUDP with options that must be set before the
// socket is bound.
func (c *Client) DialUDPConfig(network string, laddr, raddr netip.AddrPort, cfg ListenConfig) (*UDPConn, error) {
	if !c.ok() {
		return nil, opError("dial", network, udpAddr(laddr), udpAddr(raddr), errNoClient)
	}
	if !raddr.Addr().IsValid() || raddr.Port() == 0 {
		return nil, opError("dial", network, udpAddr(laddr), udpAddr(raddr),
			fmt.Errorf("remote address %v needs an IP address and a port: %w", raddr, unix.EDESTADDRREQ))
	}
	u, err := c.open(network, laddr, raddr, cfg)
	if err != nil {
		return nil, opError("dial", network, udpAddr(laddr), udpAddr(raddr), err)
	}
	return u, nil
}

// family resolves network and the addresses to the socket's family and
// normalized (unmapped, wildcard-filled) local and remote addresses.
func family(proto, network string, laddr, raddr netip.AddrPort) (v6 bool, l, r netip.AddrPort, err error) {
	la, ra := laddr.Addr().Unmap(), raddr.Addr().Unmap()
	switch network {
	case proto + "4":
	case proto + "6":
		v6 = true
	case proto:
		switch {
		case la.IsValid():
			v6 = la.Is6()
		case ra.IsValid():
			v6 = ra.Is6()
		}
	default:
		return false, l, r, fmt.Errorf("network %q: use %q, %q or %q: %w", network, proto, proto+"4", proto+"6", net.UnknownNetworkError(network))
	}
	fam := "IPv4"
	if v6 {
		fam = "IPv6"
	}
	for _, a := range []netip.Addr{la, ra} {
		if a.IsValid() && a.Is6() != v6 {
			return false, l, r, fmt.Errorf("address %v is not an %s address (network %s): %w", a, fam, network, unix.EAFNOSUPPORT)
		}
		if a.Zone() != "" {
			return false, l, r, fmt.Errorf("address %v has a zone, which bypassd does not support: %w", a, unix.EINVAL)
		}
	}
	if !la.IsValid() {
		la = netip.IPv4Unspecified()
		if v6 {
			la = netip.IPv6Unspecified()
		}
	}
	l = netip.AddrPortFrom(la, laddr.Port())
	if ra.IsValid() {
		r = netip.AddrPortFrom(ra, raddr.Port())
	}
	return v6, l, r, nil
}

// open runs OPEN, maps the queues, then (SO_REUSEADDR,) BIND and, if raddr
// is set, CONNECT.
func (c *Client) open(network string, laddr, raddr netip.AddrPort, cfg ListenConfig) (*UDPConn, error) {
	v6, laddr, raddr, err := family("udp", network, laddr, raddr)
	if err != nil {
		return nil, err
	}
	qb := cfg.QueueBytes
	if qb != 0 && (qb < ctlproto.MinQueueBytes || qb > ctlproto.MaxQueueBytes || qb&(qb-1) != 0) {
		return nil, fmt.Errorf("ListenConfig.QueueBytes %d: use 0 (the daemon's default) or a power of two from %d to %d: %w",
			qb, ctlproto.MinQueueBytes, ctlproto.MaxQueueBytes, unix.EINVAL)
	}
	fam := uint16(ctlproto.FamilyInet)
	if v6 {
		fam = ctlproto.FamilyInet6
	}
	h, body, fds, err := c.call(ctlproto.CodeOpen, 0, ctlproto.Open{Family: fam, Type: ctlproto.TypeDgram, QueueBytes: uint32(qb)})
	if err != nil {
		return nil, err
	}
	u, err := c.attach(network, v6, h.Socket, body, fds)
	if err != nil {
		c.discard(h.Socket)
		return nil, err
	}
	if err := c.register(u); err != nil {
		return nil, err
	}
	if err := u.bindConnect(laddr, raddr, cfg); err != nil {
		_ = u.Close()
		return nil, err
	}
	return u, nil
}

// attach attaches the queues of an OPEN reply in the session memory.
func (c *Client) attach(network string, v6 bool, id uint32, body ctlproto.Message, fds []int) (*UDPConn, error) {
	closeFDs(fds) // an OPEN reply carries none (ctlproto refuses any)
	or, ok := body.(*ctlproto.OpenReply)
	if !ok {
		return nil, fmt.Errorf("bypassd answered OPEN with %T (want an OpenReply): %w", body, unix.EPROTO)
	}
	u := &UDPConn{c: c, id: id, network: network, v6: v6}
	if err := c.attachQueues(or, &u.qwait); err != nil {
		return nil, err
	}
	u.maxQueued = u.tx.MaxPayload() - dgram.HeaderLen
	u.q = sockq.New(u.tx, u.rx, u.rxWait, u.txWait, u.doorbell, c.policy)
	return u, nil
}

// attachQueues attaches the queues an OPEN (or ACCEPT) reply placed in the
// session memory into q, taking a reference on the session memory that
// q.release gives back.
func (c *Client) attachQueues(or *ctlproto.OpenReply, q *qwait) error {
	c.mu.Lock()
	cs := c.cs
	if c.csRefs == 0 {
		cs = nil
	} else {
		c.csRefs++
	}
	c.mu.Unlock()
	if cs == nil {
		return c.deadOr(net.ErrClosed)
	}
	sq, err := cs.Socket(shmsess.QueueOffsets{Slot: int(or.Slot), Lane: int(or.Lane), TXOffset: or.TXOffset, RXOffset: or.RXOffset,
		QueueBytes: int(or.QueueBytes)})
	if err != nil {
		c.releaseSession()
		return fmt.Errorf("bypassd described the socket's queues badly: %w", err)
	}
	q.client, q.slot = c, int(or.Slot)
	q.tx, q.rx = sq.TX, sq.RX
	q.rxWait, q.txWait, q.doorbell = sq.RXWait, sq.TXWait, sq.Announce
	q.policy = c.policy
	return nil
}

// clientSock is a socket of the Client (UDPConn, TCPConn, TCPListener):
// what the Client does to all of them when the session ends.
type clientSock interface {
	sockID() uint32
	// breakWith makes its pending and future calls fail with reason.
	breakWith(reason error)
	// closeLocal marks it closed and releases its process-local side
	// (false: it was closed already).
	closeLocal() bool
	// goneErr is why the daemon dropped it, if it did.
	goneErr() error
}

// releaseSession drops one reference to the session memory: a socket torn
// down, or the Client itself closed or dead. The last one unmaps it.
func (c *Client) releaseSession() {
	c.mu.Lock()
	c.csRefs--
	last := c.csRefs == 0
	c.mu.Unlock()
	if last {
		_ = c.cs.Close()
	}
}

// deadOr returns the error the Client died with, or err.
func (c *Client) deadOr(err error) error {
	if d := c.deadErr(); d != nil {
		return d
	}
	return err
}

// register adds u to the sockets the Client breaks or closes; a Client
// that died meanwhile gets u torn down instead.
func (c *Client) register(u clientSock) error {
	c.mu.Lock()
	err := c.err
	if err == nil {
		c.socks[u] = struct{}{}
	}
	c.mu.Unlock()
	if err != nil {
		u.closeLocal()
		return err
	}
	return nil
}

func (u *UDPConn) bindConnect(laddr, raddr netip.AddrPort, cfg ListenConfig) error {
	if cfg.ReuseAddr {
		if err := u.SetOption("SO_REUSEADDR", 1); err != nil {
			return err
		}
	}
	if cfg.Pacing.Kbps != 0 {
		if err := u.SetPacing(cfg.Pacing); err != nil {
			return err
		}
	}
	m, err := u.request(ctlproto.CodeBind, ctlproto.Bind{Addr: laddr, ReuseAddr: cfg.ReuseAddr})
	if err != nil {
		return fmt.Errorf("bind %v: %w", laddr, err)
	}
	br, ok := m.(*ctlproto.BindReply)
	if !ok {
		return fmt.Errorf("bind %v: bypassd answered with %T: %w", laddr, m, unix.EPROTO)
	}
	u.laddr = br.Addr
	if !raddr.IsValid() {
		return nil
	}
	if _, err := u.request(ctlproto.CodeConnect, ctlproto.Connect{Addr: raddr}); err != nil {
		return fmt.Errorf("connect to %v: %w", raddr, err)
	}
	u.raddr = raddr
	return nil
}

// closeSocket forgets u and tells the daemon, unless the session is over
// anyway (then the daemon has released everything already).
func (c *Client) closeSocket(u clientSock) error {
	c.mu.Lock()
	delete(c.socks, u)
	dead := c.err != nil
	c.mu.Unlock()
	if dead {
		return nil // the session ended, which releases the socket too
	}
	_, _, fds, err := c.call(ctlproto.CodeClose, u.sockID(), ctlproto.Empty{})
	closeFDs(fds)
	var sd *socketDeadError
	if g := u.goneErr(); g != nil && errors.As(g, &sd) {
		// Dropped by the daemon (SOCKET_ERROR): the CLOSE frees what it
		// still held; how it answers does not matter.
		return nil
	}
	if err != nil && c.isDead() {
		return nil // the session ended meanwhile, which releases the socket too
	}
	return err
}

func (c *Client) isDead() bool { return !c.alive() }

// discard closes a socket the daemon opened for a request that failed
// afterwards, without waiting for the answer.
func (c *Client) discard(id uint32) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	reqID := c.newIDLocked()
	c.mu.Unlock()
	_ = c.send(ctlproto.Header{Code: ctlproto.CodeClose, ReqID: reqID, Socket: id}, ctlproto.Empty{}, time.Now().Add(c.timeout))
}

// send sends one request. The write deadline keeps a daemon that stopped
// reading from blocking the caller forever; concurrent senders each push it
// to their own deadline, which only ever moves it later by a little.
func (c *Client) send(h ctlproto.Header, body ctlproto.Message, deadline time.Time) error {
	_ = c.conn.SetWriteDeadline(deadline)
	return c.conn.Send(h, body)
}

func (c *Client) newIDLocked() uint32 {
	c.nextID++
	if c.nextID == 0 { // 0 is what unsolicited messages carry
		c.nextID = 1
	}
	return c.nextID
}

// call sends one request and waits for its reply (at most c.timeout). A
// reply with a non-zero status becomes a *DaemonError. The caller owns the
// returned fds.
func (c *Client) call(code ctlproto.Code, sock uint32, body ctlproto.Message) (ctlproto.Header, ctlproto.Message, []int, error) {
	ch := make(chan reply, 1)
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return ctlproto.Header{}, nil, nil, err
	}
	id := c.newIDLocked()
	c.pending[id] = ch
	c.mu.Unlock()

	deadline := time.Now().Add(c.timeout)
	if err := c.send(ctlproto.Header{Code: code, ReqID: id, Socket: sock}, body, deadline); err != nil {
		if !c.forget(id) {
			r := <-ch // the reader failed the request meanwhile
			closeFDs(r.fds)
			if r.err != nil {
				return ctlproto.Header{}, nil, nil, r.err
			}
		}
		if derr := c.deadErr(); derr != nil {
			return ctlproto.Header{}, nil, nil, derr
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return ctlproto.Header{}, nil, nil, c.timeoutError(code)
		}
		return ctlproto.Header{}, nil, nil, fmt.Errorf("send %v to bypassd: %w", code, err)
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	var r reply
	select {
	case r = <-ch:
	case <-t.C:
		if c.forget(id) {
			return ctlproto.Header{}, nil, nil, c.timeoutError(code)
		}
		r = <-ch // answered just now
	}
	switch {
	case r.err != nil:
		closeFDs(r.fds)
		return ctlproto.Header{}, nil, nil, r.err
	case r.h.Code != code|ctlproto.ReplyBit:
		closeFDs(r.fds)
		return ctlproto.Header{}, nil, nil, fmt.Errorf("bypassd answered %v with %v: %w", code, r.h.Code, unix.EPROTO)
	case r.h.Status != 0:
		closeFDs(r.fds)
		return ctlproto.Header{}, nil, nil, c.daemonError(code, r.h.Status)
	}
	return r.h, r.body, r.fds, nil
}

func (c *Client) timeoutError(code ctlproto.Code) error {
	return fmt.Errorf("bypassd at %s did not answer %v within %v; it may be hung or overloaded: check its logs and restart it if it stays unresponsive: %w",
		c.path, code, c.timeout, unix.ETIMEDOUT)
}

// forget removes a pending request; false means the reader already took it
// and a reply is (about to be) in its channel.
func (c *Client) forget(id uint32) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.pending[id]; !ok {
		return false
	}
	delete(c.pending, id)
	return true
}

func (c *Client) deadErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// readLoop is the Client's reader goroutine: it hands replies to waiting
// requests and turns SHUTDOWN and end of stream into broken sockets.
func (c *Client) readLoop() {
	defer close(c.readerDone)
	for {
		h, body, fds, err := c.conn.Recv()
		if err != nil {
			if isDecodeError(err) {
				// A reply we cannot decode: fail its request (if it is one of
				// ours) rather than the whole session.
				c.deliver(h, reply{err: fmt.Errorf("bypassd sent an invalid %v: %w", h.Code, err)})
				continue
			}
			detail := "connection closed"
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				detail = "control connection failed: " + err.Error()
			}
			c.fail(&goneError{detail: detail})
			_ = c.conn.Close()
			return
		}
		switch {
		case h.Code == ctlproto.CodeShutdown:
			closeFDs(fds)
			detail := "it is shutting down"
			if s, ok := body.(*ctlproto.Shutdown); ok && s.Reason != ctlproto.ShutdownDaemonStopping {
				detail = fmt.Sprintf("it ended the session, reason %d", s.Reason)
			}
			c.fail(&goneError{detail: detail})
			// Keep reading: the daemon closes the connection next, and
			// replies already sent are still delivered as failures.
		case h.Code == ctlproto.CodeSocketError:
			closeFDs(fds)
			if m, ok := body.(*ctlproto.SocketError); ok {
				c.socketDead(h.Socket, unix.Errno(m.Errno))
			}
		case !h.Code.IsReply():
			closeFDs(fds) // the daemon sends no other requests
		default:
			c.deliver(h, reply{h: h, body: body, fds: fds})
		}
	}
}

func isDecodeError(err error) bool {
	return errors.Is(err, ctlproto.ErrMalformed) || errors.Is(err, ctlproto.ErrUnknownCode) ||
		errors.Is(err, ctlproto.ErrVersion) || errors.Is(err, ctlproto.ErrShort)
}

// deliver hands r to the request h answers. An answer nobody waits for
// (its request timed out) is dropped; if it opened a socket, that socket is
// closed again so the daemon does not keep it for the rest of the session.
func (c *Client) deliver(h ctlproto.Header, r reply) {
	c.mu.Lock()
	ch, ok := c.pending[h.ReqID]
	if ok {
		delete(c.pending, h.ReqID)
	}
	c.mu.Unlock()
	if ok {
		ch <- r
		return
	}
	closeFDs(r.fds)
	if r.err == nil && h.Code == ctlproto.CodeOpen|ctlproto.ReplyBit && h.Status == 0 && h.Socket != 0 {
		c.discard(h.Socket)
	}
}

// socketDead breaks the socket the daemon declared dead (SOCKET_ERROR): it
// released the socket already, the session goes on.
func (c *Client) socketDead(id uint32, errno unix.Errno) {
	c.mu.Lock()
	var dead clientSock
	for u := range c.socks {
		if u.sockID() == id {
			dead = u
			break
		}
	}
	c.mu.Unlock()
	if dead != nil {
		dead.breakWith(&socketDeadError{errno: errno})
	}
}

// fail ends the session: pending and future requests fail with reason and
// every socket is broken (its pending and future calls fail too).
func (c *Client) fail(reason error) {
	c.mu.Lock()
	first := c.err == nil
	if first {
		c.err = reason
	}
	reason = c.err
	pending := c.pending
	c.pending = make(map[uint32]chan reply)
	socks := make([]clientSock, 0, len(c.socks))
	for u := range c.socks {
		socks = append(socks, u)
	}
	c.mu.Unlock()
	for _, ch := range pending {
		ch <- reply{err: reason}
	}
	if first {
		// A dead Client opens no more sockets: the session memory stays
		// mapped only as long as its sockets do.
		c.releaseSession()
	}
	if errors.Is(reason, ErrDaemonGone) {
		for _, u := range socks {
			u.breakWith(reason)
		}
	}
}

// Close ends the session: every socket opened through the Client is closed
// (pending calls return net.ErrClosed) and the daemon releases all of them.
func (c *Client) Close() error {
	if !c.ok() {
		return errNoClient
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return fmt.Errorf("socket: close client: %w", net.ErrClosed)
	}
	c.closed = true
	c.mu.Unlock()
	c.fail(net.ErrClosed)
	c.mu.Lock()
	socks := make([]clientSock, 0, len(c.socks))
	for u := range c.socks {
		socks = append(socks, u)
	}
	clear(c.socks)
	c.mu.Unlock()
	for _, u := range socks {
		u.closeLocal()
	}
	_ = c.conn.Close()
	<-c.readerDone
	return nil
}
