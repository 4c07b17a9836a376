package socket

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/sockq"
)

// Largest UDP payloads, as the kernel enforces them: 65535 minus the IPv4
// (20) or IPv6 (no IP header counted, only the 8-byte UDP header: 65535-8)
// headers.
const (
	MaxDatagram4 = 65507
	MaxDatagram6 = 65527
)

// Message is one datagram of a batch: ReadBatch stores up to len(Buf) bytes
// of it in Buf (a longer datagram is truncated, like recvfrom(2)), its length
// in N and its sender in Addr.
type Message struct {
	Buf  []byte
	N    int
	Addr netip.AddrPort
	// TS holds the timestamps the socket asked for with SetTimestamping.
	TS Timestamps
}

// UDPConn is a UDP socket accelerated by bypassd. Datagrams move through
// shared-memory queues the daemon's ring engine serves; only control
// requests (bind, connect, options, multicast membership) go over the
// Client's Unix socket. It implements net.PacketConn and net.Conn; all
// methods are safe for concurrent use.
type UDPConn struct {
	c       *Client
	id      uint32 // the daemon's socket id
	network string // as the caller spelled it, for errors ("udp", "udp4", "udp6")
	v6      bool   // family AF_INET6

	// The queues in the Client's session memory and the user side over
	// them (qwait: the queues, wake-ups, deadlines).
	qwait
	q         *sockq.Conn
	maxQueued int // largest payload the TX queue accepts

	// Set while the socket is opened, before any caller sees it, and never
	// changed afterwards, so reads need no lock.
	laddr, raddr netip.AddrPort

	nonblock   atomic.Bool
	closed     atomic.Bool
	gone       atomic.Pointer[error] // why the daemon is no longer reachable
	life       sync.RWMutex          // data calls hold it shared; teardown exclusively before unmapping
	rxMu, txMu sync.Mutex            // one receiver / one sender at a time, as the queues are SPSC
	rxScratch  []sockq.Message       // ReadBatch's conversion buffer (rxMu)
	tsFlags    atomic.Uint32         // SO_TIMESTAMPING flags the daemon accepted
}

var (
	_ net.PacketConn = (*UDPConn)(nil)
	_ net.Conn       = (*UDPConn)(nil)
)

// errDeadlineChanged makes a wait return so its caller re-reads the
// deadline.
var errDeadlineChanged = errors.New("deadline changed")

// spinCheckEvery is how many queue checks a spinning wait makes between
// reads of the clock, the deadline and the closed state.
const spinCheckEvery = 64

// pastDeadline is handed to sockq so that its calls never wait: UDPConn does
// its own waiting, because a sockq wait cannot be interrupted by a deadline
// change.
var pastDeadline = time.Unix(1, 0)

// LocalAddr returns the bound address (*net.UDPAddr). For a socket bound to
// the wildcard address it is the wildcard address with the chosen port.
func (u *UDPConn) LocalAddr() net.Addr {
	if !u.ok() {
		return nil
	}
	return udpAddr(u.laddr)
}

// ok reports whether u is a socket a Client opened (not nil, not a zero
// UDPConn), so that misuse returns EINVAL like Go's net instead of
// panicking.
func (u *UDPConn) ok() bool { return u != nil && u.c != nil }

var errInvalid = fmt.Errorf("not a socket opened by a socket.Client: %w", unix.EINVAL)

// RemoteAddr returns the connected peer (*net.UDPAddr), or nil.
func (u *UDPConn) RemoteAddr() net.Addr {
	if !u.ok() {
		return nil
	}
	return udpAddr(u.raddr)
}

// ID returns the daemon's id for this socket (what bypass-stats shows).
func (u *UDPConn) ID() uint32 {
	if !u.ok() {
		return 0
	}
	return u.id
}

// SetNonblock switches the socket between blocking (the default) and
// non-blocking mode. In non-blocking mode a read with nothing queued and a
// write that finds the send queue full fail at once with an error matching
// unix.EAGAIN.
func (u *UDPConn) SetNonblock(nonblocking bool) {
	if u.ok() {
		u.nonblock.Store(nonblocking)
	}
}

// SetDeadline sets the read and write deadlines (see net.Conn).
func (u *UDPConn) SetDeadline(t time.Time) error {
	if err := u.SetReadDeadline(t); err != nil {
		return err
	}
	return u.SetWriteDeadline(t)
}

// SetReadDeadline sets the deadline for pending and future reads; the zero
// time removes it. A read past its deadline fails with an error matching
// os.ErrDeadlineExceeded.
func (u *UDPConn) SetReadDeadline(t time.Time) error {
	if !u.ok() || u.q == nil {
		return opError("set", "udp", nil, nil, errInvalid)
	}
	if u.closed.Load() {
		return u.opErr("set", netip.AddrPort{}, net.ErrClosed)
	}
	u.rdl.Store(deadlineNanos(t))
	if u.rsleep.Load() > 0 {
		_ = u.rxWait.Wake() // a sleeping reader re-reads the deadline
	}
	return nil
}

// SetWriteDeadline sets the deadline for pending and future writes (which
// wait only while the send queue is full).
func (u *UDPConn) SetWriteDeadline(t time.Time) error {
	if !u.ok() || u.q == nil {
		return opError("set", "udp", nil, nil, errInvalid)
	}
	if u.closed.Load() {
		return u.opErr("set", netip.AddrPort{}, net.ErrClosed)
	}
	u.wdl.Store(deadlineNanos(t))
	if u.wsleep.Load() > 0 {
		_ = u.txWait.Wake()
	}
	return nil
}

func deadlineNanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	n := t.UnixNano()
	if n == 0 {
		n = 1 // 0 means "none"
	}
	return n
}

func expired(dl int64) bool { return dl != 0 && time.Now().UnixNano() >= dl }

// opErr wraps err as a *net.OpError with this socket's addresses; addr
// overrides the remote address (a write's destination).
func (u *UDPConn) opErr(op string, addr netip.AddrPort, err error) error {
	if u == nil {
		return opError(op, "udp", nil, udpAddr(addr), err)
	}
	if !addr.IsValid() {
		addr = u.raddr
	}
	network := u.network
	if network == "" {
		network = "udp"
	}
	return opError(op, network, udpAddr(u.laddr), udpAddr(addr), err)
}

// deadErr returns why the socket cannot be used any more, or nil.
func (u *UDPConn) deadErr() error {
	if u.closed.Load() {
		return net.ErrClosed
	}
	if p := u.gone.Load(); p != nil {
		return *p
	}
	return nil
}

// Read reads one datagram from the connected peer (see ReadFrom).
func (u *UDPConn) Read(b []byte) (int, error) {
	n, _, err := u.ReadFromUDPAddrPort(b)
	return n, err
}

// ReadFrom reads one datagram into b and returns its length (at most
// len(b): the rest of a longer datagram is discarded) and sender
// (*net.UDPAddr).
func (u *UDPConn) ReadFrom(b []byte) (int, net.Addr, error) {
	n, ap, err := u.ReadFromUDPAddrPort(b)
	if err != nil {
		return 0, nil, err
	}
	return n, net.UDPAddrFromAddrPort(ap), nil
}

// ReadFromUDPAddrPort is ReadFrom without the allocation of a net.Addr.
func (u *UDPConn) ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error) {
	var m [1]sockq.Message
	m[0].Buf = b
	if _, err := u.recv(m[:], nil); err != nil {
		return 0, netip.AddrPort{}, err
	}
	return m[0].N, m[0].Addr, nil
}

// ReadBatch waits for at least one datagram, then fills msgs with the
// datagrams already queued (without waiting again) and returns how many it
// filled.
func (u *UDPConn) ReadBatch(msgs []Message) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	return u.recv(nil, msgs)
}

// recv receives into one of sm (the caller's own sockq messages) or msgs
// (converted through rxScratch under rxMu).
func (u *UDPConn) recv(sm []sockq.Message, msgs []Message) (int, error) {
	if !u.ok() || u.q == nil {
		return 0, opError("read", "udp", nil, nil, errInvalid)
	}
	u.life.RLock()
	defer u.life.RUnlock()
	if err := u.deadErr(); err != nil {
		return 0, u.opErr("read", netip.AddrPort{}, err)
	}
	u.rxMu.Lock()
	defer u.rxMu.Unlock()
	if msgs != nil {
		if cap(u.rxScratch) < len(msgs) {
			u.rxScratch = make([]sockq.Message, len(msgs))
		}
		sm = u.rxScratch[:len(msgs)]
		for i := range msgs {
			sm[i] = sockq.Message{Buf: msgs[i].Buf}
		}
		defer clear(sm) // do not keep the caller's buffers alive
	}
	for {
		if err := u.deadErr(); err != nil {
			return 0, u.opErr("read", netip.AddrPort{}, err)
		}
		dl := u.rdl.Load()
		if expired(dl) {
			return 0, u.opErr("read", netip.AddrPort{}, sockq.ErrTimeout)
		}
		// Only a queue with something in it (or a corrupt one, which sockq
		// then reports) is handed to sockq: on an empty one its own
		// never-waiting wait would cost more than the check.
		if u.rx.Readable() {
			n, err := u.q.RecvBatch(sm, pastDeadline)
			if n > 0 {
				for i := 0; i < n && msgs != nil; i++ {
					msgs[i].N, msgs[i].Addr = sm[i].N, sm[i].Addr
					u.timestamps(&msgs[i].TS, &sm[i].Header)
				}
				return n, nil
			}
			if err != nil && !errors.Is(err, sockq.ErrTimeout) {
				return 0, u.opErr("read", netip.AddrPort{}, u.mapErr(err))
			}
		}
		if u.nonblock.Load() {
			return 0, u.opErr("read", netip.AddrPort{}, unix.EAGAIN)
		}
		if err := u.wait(false, 0, dl); err != nil && err != errDeadlineChanged {
			return 0, u.opErr("read", netip.AddrPort{}, u.mapErr(err))
		}
	}
}

// Write sends b as one datagram to the connected peer.
func (u *UDPConn) Write(b []byte) (int, error) {
	return u.WriteToUDPAddrPort(b, netip.AddrPort{})
}

// WriteTo sends b as one datagram to addr, which must be a *net.UDPAddr. It
// waits while the send queue is full (blocking mode, until the write
// deadline).
func (u *UDPConn) WriteTo(b []byte, addr net.Addr) (int, error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok || ua == nil {
		return 0, u.opErr("write", netip.AddrPort{}, fmt.Errorf("destination %v (%T) is not a *net.UDPAddr: %w", addr, addr, unix.EINVAL))
	}
	ap := ua.AddrPort()
	if !ap.Addr().IsValid() {
		return 0, u.opErr("write", netip.AddrPort{}, fmt.Errorf("destination %v has no IP address: %w", ua, unix.EDESTADDRREQ))
	}
	return u.WriteToUDPAddrPort(b, ap)
}

// WriteToUDPAddrPort sends b as one datagram to addr; the zero AddrPort
// means the connected peer.
func (u *UDPConn) WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error) {
	msgs := [1][]byte{b}
	if _, err := u.send(msgs[:], addr); err != nil {
		return 0, err
	}
	return len(b), nil
}

// WriteBatch queues each message as one datagram to dst (the zero AddrPort:
// the connected peer) and returns how many it queued. It waits for room like
// WriteTo; when it returns fewer than len(msgs), err says why the next one
// was not queued (a datagram over MaxDatagram4/MaxDatagram6 fails with
// EMSGSIZE and is not queued).
func (u *UDPConn) WriteBatch(msgs [][]byte, dst netip.AddrPort) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	return u.send(msgs, dst)
}

// destination validates dst (zero: the connected peer) and returns the
// address queued in the record and the one that decides the size limit.
func (u *UDPConn) destination(dst netip.AddrPort) (queued, peer netip.AddrPort, err error) {
	raddr := u.raddr
	if dst == (netip.AddrPort{}) {
		if !raddr.IsValid() {
			return dst, dst, fmt.Errorf("no destination and the socket is not connected (use WriteTo or DialUDP): %w", unix.EDESTADDRREQ)
		}
		return netip.AddrPort{}, raddr, nil
	}
	if raddr.IsValid() {
		return dst, dst, net.ErrWriteToConnected
	}
	a := dst.Addr().Unmap()
	switch {
	case !a.IsValid():
		return dst, dst, fmt.Errorf("destination %v has no IP address: %w", dst, unix.EDESTADDRREQ)
	case dst.Port() == 0:
		return dst, dst, fmt.Errorf("destination %v has port 0: %w", dst, unix.EINVAL)
	case a.Is4() && u.v6:
		return dst, dst, fmt.Errorf("an IPv6 socket cannot send to IPv4 address %v (open a udp4 socket for it): %w", a, unix.EAFNOSUPPORT)
	case a.Is6() && !u.v6:
		return dst, dst, fmt.Errorf("an IPv4 socket cannot send to IPv6 address %v (open a udp6 socket for it): %w", a, unix.EAFNOSUPPORT)
	case a.Zone() != "":
		return dst, dst, fmt.Errorf("destination %v has a zone, which bypassd does not support: %w", dst, unix.EINVAL)
	}
	dst = netip.AddrPortFrom(a, dst.Port())
	return dst, dst, nil
}

func (u *UDPConn) send(msgs [][]byte, dst netip.AddrPort) (int, error) {
	if !u.ok() || u.q == nil {
		return 0, opError("write", "udp", nil, udpAddr(dst), errInvalid)
	}
	u.life.RLock()
	defer u.life.RUnlock()
	if err := u.deadErr(); err != nil {
		return 0, u.opErr("write", dst, err)
	}
	queued, peer, err := u.destination(dst)
	if err != nil {
		return 0, u.opErr("write", dst, err)
	}
	limit := MaxDatagram6
	if peer.Addr().Is4() {
		limit = MaxDatagram4
	}
	if limit > u.maxQueued {
		limit = u.maxQueued
	}
	// Only the messages before the first oversized one are queued, so that
	// an oversized datagram fails without anything of it reaching the wire.
	ok := len(msgs)
	for i, m := range msgs {
		if len(m) > limit {
			ok = i
			break
		}
	}
	sent, err := u.sendLocked(msgs[:ok], queued, peer)
	if err == nil && ok < len(msgs) {
		m := len(msgs[ok])
		if limit == u.maxQueued && m <= MaxDatagram6 {
			err = fmt.Errorf("datagram of %d bytes exceeds the %d bytes this socket's queue holds (open it with a larger ListenConfig.QueueBytes): %w", m, limit, unix.EMSGSIZE)
		} else {
			err = fmt.Errorf("datagram of %d bytes exceeds the UDP maximum of %d: %w", m, limit, unix.EMSGSIZE)
		}
		err = u.opErr("write", peer, err)
	}
	return sent, err
}

func (u *UDPConn) sendLocked(msgs [][]byte, queued, peer netip.AddrPort) (int, error) {
	if len(msgs) == 0 {
		return 0, nil
	}
	u.txMu.Lock()
	defer u.txMu.Unlock()
	sent := 0
	for {
		if err := u.deadErr(); err != nil {
			return sent, u.opErr("write", peer, err)
		}
		dl := u.wdl.Load()
		if expired(dl) {
			return sent, u.opErr("write", peer, sockq.ErrTimeout)
		}
		n, err := u.q.SendBatch(msgs[sent:], queued, pastDeadline)
		sent += n
		if sent == len(msgs) {
			return sent, nil
		}
		if err != nil && !errors.Is(err, sockq.ErrTimeout) {
			return sent, u.opErr("write", peer, u.mapErr(err))
		}
		if u.nonblock.Load() {
			return sent, u.opErr("write", peer, unix.EAGAIN)
		}
		if err := u.wait(true, dgram.HeaderLen+len(msgs[sent]), dl); err != nil && err != errDeadlineChanged {
			return sent, u.opErr("write", peer, u.mapErr(err))
		}
	}
}

// mapErr turns queue-level errors into what a socket user expects.
func (u *UDPConn) mapErr(err error) error {
	switch {
	case errors.Is(err, shmq.ErrClosed), errors.Is(err, net.ErrClosed):
		if d := u.deadErr(); d != nil {
			return d
		}
		return net.ErrClosed
	case errors.Is(err, shmq.ErrTimeout):
		return sockq.ErrTimeout
	}
	return err
}

// Close closes the socket: pending reads and writes return net.ErrClosed,
// the daemon releases the socket's port and flows, and the queues' memory
// is unmapped. Closing twice returns an error matching net.ErrClosed.
func (u *UDPConn) Close() error {
	if !u.ok() || u.q == nil {
		return opError("close", "udp", nil, nil, errInvalid)
	}
	if !u.closed.CompareAndSwap(false, true) {
		return u.opErr("close", netip.AddrPort{}, net.ErrClosed)
	}
	u.teardown()
	if err := u.c.closeSocket(u); err != nil {
		return u.opErr("close", netip.AddrPort{}, err)
	}
	return nil
}

// teardown releases the process-local side once closed is set: it stops
// pending calls, waits for them to leave the queues, then lets go of the
// session memory (unmapped with the last socket of a closed Client).
func (u *UDPConn) teardown() {
	u.q.Close()
	u.life.Lock()
	defer u.life.Unlock()
	u.release()
}

func (u *UDPConn) sockID() uint32 { return u.id }

func (u *UDPConn) closeLocal() bool {
	if !u.closed.CompareAndSwap(false, true) {
		return false
	}
	u.teardown()
	return true
}

func (u *UDPConn) goneErr() error {
	if p := u.gone.Load(); p != nil {
		return *p
	}
	return nil
}

// breakWith marks the socket unusable: the daemon is gone, or dropped it.
func (u *UDPConn) breakWith(reason error) {
	u.gone.CompareAndSwap(nil, &reason)
	u.q.Break(reason)
}

// request sends a control request about this socket.
func (u *UDPConn) request(code ctlproto.Code, body ctlproto.Message) (ctlproto.Message, error) {
	if !u.ok() {
		return nil, errInvalid
	}
	if err := u.deadErr(); err != nil {
		return nil, err
	}
	_, m, fds, err := u.c.call(code, u.id, body)
	closeFDs(fds)
	return m, err
}

// SetOption sets a socket option by its Linux name, e.g. "IP_TOS" or
// "SO_MAX_PACING_RATE" (OptionNames lists them). An unknown name fails with
// an error matching unix.ENOPROTOOPT; the daemon's refusals come back as
// their errno.
func (u *UDPConn) SetOption(name string, value int) error {
	o, err := lookupOption(name)
	if err != nil {
		return u.opErr("set", netip.AddrPort{}, err)
	}
	v, err := o.encode(name, value)
	if err != nil {
		return u.opErr("set", netip.AddrPort{}, err)
	}
	_, err = u.request(ctlproto.CodeSetSockOpt, ctlproto.SetSockOpt{Level: o.level, Name: o.name, Value: v})
	if err != nil {
		if name == "SO_MAX_PACING_RATE" {
			u.pacingHint(err)
		}
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("setsockopt %s=%d: %w", name, value, err))
	}
	if o.level == unix.SOL_SOCKET && (o.name == unix.SO_TIMESTAMPING || o.name == unix.SO_TIMESTAMPING_NEW) {
		u.tsFlags.Store(uint32(value))
	}
	return nil
}

// Option returns a socket option's current value by its Linux name.
func (u *UDPConn) Option(name string) (int, error) {
	o, err := lookupOption(name)
	if err != nil {
		return 0, u.opErr("get", netip.AddrPort{}, err)
	}
	m, err := u.request(ctlproto.CodeGetSockOpt, ctlproto.GetSockOpt{Level: o.level, Name: o.name})
	if err != nil {
		return 0, u.opErr("get", netip.AddrPort{}, fmt.Errorf("getsockopt %s: %w", name, err))
	}
	v, ok := m.(*ctlproto.SockOptValue)
	if !ok {
		return 0, u.opErr("get", netip.AddrPort{}, fmt.Errorf("getsockopt %s: bypassd answered with %T: %w", name, m, unix.EPROTO))
	}
	if name == "SO_MAX_PACING_RATE" && len(v.Value) == pacingReplyLen {
		// The extended answer, read the way a u32 getsockopt reads it:
		// bytes/s.
		info, err := decodePacing(v.Value)
		if err != nil {
			return 0, u.opErr("get", netip.AddrPort{}, err)
		}
		return info.bytesPerSecond(), nil
	}
	val, err := o.decode(name, v.Value)
	if err != nil {
		return 0, u.opErr("get", netip.AddrPort{}, err)
	}
	return val, nil
}

// SetMaxPacingRate limits the socket's send rate to bytesPerSec of wire
// bytes (SO_MAX_PACING_RATE: kbit/s = bytesPerSec/125; 0 or 0xFFFFFFFF
// removes the limit). SetPacing sets the burst too.
func (u *UDPConn) SetMaxPacingRate(bytesPerSec uint32) error {
	return u.SetOption("SO_MAX_PACING_RATE", int(bytesPerSec))
}

// SetReadBuffer sets SO_RCVBUF, like net.UDPConn.SetReadBuffer.
func (u *UDPConn) SetReadBuffer(bytes int) error { return u.SetOption("SO_RCVBUF", bytes) }

// SetWriteBuffer sets SO_SNDBUF, like net.UDPConn.SetWriteBuffer.
func (u *UDPConn) SetWriteBuffer(bytes int) error { return u.SetOption("SO_SNDBUF", bytes) }

// JoinGroup joins the any-source multicast group on the socket's interface:
// the kernel sends the IGMP/MLD report and opens the NIC's filter, and
// bypassd steers the group's datagrams to every socket that joined it and
// is bound to the group's port.
func (u *UDPConn) JoinGroup(group netip.Addr) error {
	return u.group(ctlproto.CodeJoin, group, netip.Addr{})
}

// JoinSourceGroup joins group for datagrams from source only (SSM, IGMPv3).
func (u *UDPConn) JoinSourceGroup(group, source netip.Addr) error {
	if !source.IsValid() {
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("join source group %v: source address missing (use JoinGroup for any-source): %w", group, unix.EINVAL))
	}
	return u.group(ctlproto.CodeJoin, group, source)
}

// LeaveGroup leaves an any-source group joined with JoinGroup.
func (u *UDPConn) LeaveGroup(group netip.Addr) error {
	return u.group(ctlproto.CodeLeave, group, netip.Addr{})
}

// LeaveSourceGroup leaves a group joined with JoinSourceGroup.
func (u *UDPConn) LeaveSourceGroup(group, source netip.Addr) error {
	if !source.IsValid() {
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("leave source group %v: source address missing (use LeaveGroup for any-source): %w", group, unix.EINVAL))
	}
	return u.group(ctlproto.CodeLeave, group, source)
}

func (u *UDPConn) group(code ctlproto.Code, group, source netip.Addr) error {
	if !u.ok() {
		return u.opErr("set", netip.AddrPort{}, errInvalid)
	}
	what := "join"
	if code == ctlproto.CodeLeave {
		what = "leave"
	}
	group, source = group.Unmap(), source.Unmap()
	switch {
	case !group.IsMulticast():
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("%s group %v: not a multicast address: %w", what, group, unix.EINVAL))
	case group.Is6() != u.v6:
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("%s group %v: address family differs from the socket's: %w", what, group, unix.EINVAL))
	case source.IsValid() && (source.Is6() != u.v6 || source.IsMulticast() || source.IsUnspecified()):
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("%s group %v: source %v must be a unicast address of the socket's family: %w", what, group, source, unix.EINVAL))
	}
	_, err := u.request(code, ctlproto.Group{Group: group, Source: source})
	if err != nil {
		if source.IsValid() {
			return u.opErr("set", netip.AddrPort{}, fmt.Errorf("%s group %v source %v: %w", what, group, source, err))
		}
		return u.opErr("set", netip.AddrPort{}, fmt.Errorf("%s group %v: %w", what, group, err))
	}
	return nil
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
