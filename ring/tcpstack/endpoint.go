package tcpstack

import (
	"fmt"
	"net/netip"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"
)

// Endpoint is one TCP connection of the stack (connecting, established or
// closing).
type Endpoint struct {
	EP tcpip.Endpoint
	WQ *waiter.Queue
}

// Listener is a listening TCP endpoint.
type Listener struct {
	EP tcpip.Endpoint
	WQ *waiter.Queue
}

// Listen creates a listening endpoint on addr (the unspecified address:
// every address of the stack of that family) with room for backlog
// connections that completed the handshake and were not accepted yet;
// reuseAddr is SO_REUSEADDR.
func (s *Stack) Listen(addr netip.AddrPort, backlog int, reuseAddr bool) (*Listener, error) {
	wq := &waiter.Queue{}
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, netProto(addr.Addr().Unmap()), wq)
	if terr != nil {
		return nil, fmt.Errorf("tcpstack: listen %v: %w", addr, Errno(terr))
	}
	if addr.Addr().Is6() && !addr.Addr().Is4In6() {
		ep.SocketOptions().SetV6Only(true)
	}
	// SO_REUSEADDR: the port may be bound while connections of an earlier
	// listener on it wait in TIME_WAIT (its accepted endpoints inherit
	// the flag), as Linux allows a restarted server.
	ep.SocketOptions().SetReuseAddress(reuseAddr)
	if terr := ep.Bind(fullAddr(addr)); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("tcpstack: listen %v: bind: %w", addr, Errno(terr))
	}
	if terr := ep.Listen(backlog); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("tcpstack: listen %v: %w", addr, Errno(terr))
	}
	return &Listener{EP: ep, WQ: wq}, nil
}

// Accept takes one established connection without waiting: unix.EAGAIN
// when there is none.
func (l *Listener) Accept() (*Endpoint, netip.AddrPort, error) {
	var peer tcpip.FullAddress
	ep, wq, terr := l.EP.Accept(&peer)
	if terr != nil {
		return nil, netip.AddrPort{}, Errno(terr)
	}
	return &Endpoint{EP: ep, WQ: wq}, addrPort(peer), nil
}

// Close stops listening; connections not accepted yet are reset.
func (l *Listener) Close() { l.EP.Close() }

// Connect starts connecting from laddr (a concrete address and port the
// caller reserved) to raddr and returns at once; the endpoint becomes
// writable when the handshake ends (Err then tells how). reuseAddr is
// SO_REUSEADDR: laddr may be a port whose connections wait in TIME-WAIT
// (if they set it too), to another peer: a connection with the same
// addresses fails with EADDRNOTAVAIL, as on Linux. setup, when not nil,
// sets options before the SYN is sent.
func (s *Stack) Connect(laddr, raddr netip.AddrPort, reuseAddr bool, setup func(tcpip.Endpoint)) (*Endpoint, error) {
	wq := &waiter.Queue{}
	ep, terr := s.s.NewEndpoint(tcp.ProtocolNumber, netProto(raddr.Addr().Unmap()), wq)
	if terr != nil {
		return nil, fmt.Errorf("tcpstack: connect %v: %w", raddr, Errno(terr))
	}
	ep.SocketOptions().SetReuseAddress(reuseAddr)
	if terr := ep.Bind(fullAddr(laddr)); terr != nil {
		ep.Close()
		return nil, fmt.Errorf("tcpstack: connect %v: bind %v: %w", raddr, laddr, Errno(terr))
	}
	if setup != nil {
		setup(ep)
	}
	terr = ep.Connect(fullAddr(raddr))
	if _, started := terr.(*tcpip.ErrConnectStarted); terr != nil && !started {
		ep.Close()
		errno := Errno(terr)
		if _, inUse := terr.(*tcpip.ErrPortInUse); inUse {
			// The bind succeeded: the addresses are a connection's
			// still (TIME-WAIT), which Linux's connect reports so.
			errno = unix.EADDRNOTAVAIL
		}
		return nil, fmt.Errorf("tcpstack: connect %v from %v: %w", raddr, laddr, errno)
	}
	return &Endpoint{EP: ep, WQ: wq}, nil
}

// Conn returns the endpoint as a net.Conn (gVisor's gonet adapter), for
// users in this process.
func (e *Endpoint) Conn() *gonet.TCPConn { return gonet.NewTCPConn(e.WQ, e.EP) }

// Connecting reports whether the handshake of an active open is still
// going on.
func (e *Endpoint) Connecting() bool {
	st := tcp.EndpointState(e.EP.State())
	return st == tcp.StateConnecting || st == tcp.StateSynSent || st == tcp.StateSynRecv
}

// Finished reports whether the connection no longer needs its steering:
// closed, failed, or in TIME-WAIT (where only a retransmitted FIN can
// still arrive).
func (e *Endpoint) Finished() bool {
	return e.TimeWait() || e.Closed()
}

// TimeWait reports whether the connection waits in TIME-WAIT: it still
// holds its addresses in the stack.
func (e *Endpoint) TimeWait() bool { return tcp.EndpointState(e.EP.State()) == tcp.StateTimeWait }

// Closed reports whether the connection is gone from the stack (closed or
// failed) and holds nothing there any more.
func (e *Endpoint) Closed() bool {
	switch tcp.EndpointState(e.EP.State()) {
	case tcp.StateClose, tcp.StateError, tcp.StateInitial, tcp.StateBound:
		return true
	}
	return false
}

// Err returns the connection's pending error as an errno (nil: none) and
// clears it, like SO_ERROR.
func (e *Endpoint) Err() error {
	if terr := e.EP.LastError(); terr != nil {
		return Errno(terr)
	}
	return nil
}

// Addrs returns the local and remote addresses.
func (e *Endpoint) Addrs() (local, remote netip.AddrPort) {
	if la, err := e.EP.GetLocalAddress(); err == nil {
		local = addrPort(la)
	}
	if ra, err := e.EP.GetRemoteAddress(); err == nil {
		remote = addrPort(ra)
	}
	return local, remote
}

// Errno translates a gVisor error into the errno a kernel socket call
// would fail with.
func Errno(terr tcpip.Error) unix.Errno {
	switch terr.(type) {
	case nil:
		return 0
	case *tcpip.ErrWouldBlock:
		return unix.EAGAIN
	case *tcpip.ErrConnectionRefused:
		return unix.ECONNREFUSED
	case *tcpip.ErrConnectionReset:
		return unix.ECONNRESET
	case *tcpip.ErrConnectionAborted, *tcpip.ErrAborted:
		return unix.ECONNABORTED
	case *tcpip.ErrTimeout:
		return unix.ETIMEDOUT
	case *tcpip.ErrClosedForSend:
		return unix.EPIPE
	case *tcpip.ErrClosedForReceive, *tcpip.ErrNotConnected:
		return unix.ENOTCONN
	case *tcpip.ErrPortInUse, *tcpip.ErrDuplicateAddress:
		return unix.EADDRINUSE
	case *tcpip.ErrBadLocalAddress:
		return unix.EADDRNOTAVAIL
	case *tcpip.ErrNetworkUnreachable:
		return unix.ENETUNREACH
	case *tcpip.ErrHostUnreachable:
		return unix.EHOSTUNREACH
	case *tcpip.ErrInvalidEndpointState:
		return unix.EINVAL
	case *tcpip.ErrAlreadyConnected:
		return unix.EISCONN
	case *tcpip.ErrAlreadyConnecting:
		return unix.EALREADY
	case *tcpip.ErrInvalidOptionValue, *tcpip.ErrBadAddress:
		return unix.EINVAL
	case *tcpip.ErrUnknownProtocolOption, *tcpip.ErrNotSupported:
		return unix.ENOPROTOOPT
	case *tcpip.ErrNoBufferSpace:
		return unix.ENOBUFS
	case *tcpip.ErrMessageTooLong:
		return unix.EMSGSIZE
	}
	return unix.EIO
}
