package route

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"sync"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// reserveRcvBuf is the receive buffer of a reservation socket: it is never
// read, so what little reaches it (while the XDP program is being attached)
// just fills it and the kernel drops the rest.
const reserveRcvBuf = 4096

// Reservation is an ordinary kernel UDP or TCP socket bound to a port that
// a ring serves, so that the kernel never hands the port to someone else.
// A TCP reservation is bound and never listens: a SYN that reaches the
// kernel for it is answered with a reset, the kernel never accepts a
// connection on our port.
type Reservation struct {
	network string
	addr    netip.AddrPort

	mu sync.Mutex
	s  sock
}

// ReserveOptions tune a reservation.
type ReserveOptions struct {
	// ReuseAddr sets SO_REUSEADDR, so that several reservations (or kernel
	// sockets) that all set it may share the port, as multicast receivers
	// do. Off by default: the port is then exclusively ours.
	ReuseAddr bool
}

// ReservePort binds an ordinary kernel socket (UDP; SO_REUSEADDR off unless
// opts says otherwise) to addr inside namespace ns (netns.None() means the
// current one) and returns it; Close releases it. At most one opts may be
// given. If addr's port is 0, the kernel picks one: Addr tells which. A port
// in use is an error wrapping unix.EADDRINUSE that names addr.
//
// The socket's receive buffer is tiny and it is never read: traffic for the
// port is steered away by XDP, and anything that still reaches it is dropped
// by the kernel once the buffer is full. A "udp6" reservation is IPv6-only
// (IPV6_V6ONLY), so it never also takes the IPv4 port; reserve that with
// "udp4". An IPv6 link-local addr needs a zone (interface name or index in ns).
func ReservePort(ns netns.NsHandle, network string, addr netip.AddrPort, opts ...ReserveOptions) (*Reservation, error) {
	var o ReserveOptions
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		return nil, fmt.Errorf("route: reserve %s %s: %d option sets given, pass at most one: %w", network, addr, len(opts), unix.EINVAL)
	}
	ip := addr.Addr()
	var family int
	sockType, proto := unix.SOCK_DGRAM, unix.IPPROTO_UDP
	switch network {
	case "tcp4", "tcp6":
		sockType, proto = unix.SOCK_STREAM, unix.IPPROTO_TCP
	}
	switch network {
	case "udp4", "tcp4":
		family = unix.AF_INET
		ip = ip.Unmap()
		if !ip.Is4() {
			return nil, fmt.Errorf("route: reserve %s %s: not an IPv4 address: %w", network, addr, unix.EINVAL)
		}
	case "udp6", "tcp6":
		family = unix.AF_INET6
		if !ip.Is6() || ip.Is4In6() {
			return nil, fmt.Errorf("route: reserve %s %s: not an IPv6 address (use \"udp4\" or \"tcp4\" for IPv4): %w", network, addr, unix.EINVAL)
		}
	default:
		return nil, fmt.Errorf("route: reserve %s: unknown network %q, want \"udp4\", \"udp6\", \"tcp4\" or \"tcp6\": %w", addr, network, unix.EINVAL)
	}

	var (
		fd    = -1
		bound netip.AddrPort
	)
	err := inNS(ns, func() error {
		sa, err := sockaddr(ip, addr.Port())
		if err != nil {
			return err
		}
		s, err := unix.Socket(family, sockType|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("create socket: %w", err)
		}
		ok := false
		defer func() {
			if !ok {
				unix.Close(s)
			}
		}()
		if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_RCVBUF, reserveRcvBuf); err != nil {
			return fmt.Errorf("set SO_RCVBUF: %w", err)
		}
		if o.ReuseAddr {
			if err := unix.SetsockoptInt(s, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
				return fmt.Errorf("set SO_REUSEADDR: %w", err)
			}
		}
		if family == unix.AF_INET6 {
			if err := unix.SetsockoptInt(s, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 1); err != nil {
				return fmt.Errorf("set IPV6_V6ONLY: %w", err)
			}
		}
		if err := unix.Bind(s, sa); err != nil {
			return err
		}
		local, err := unix.Getsockname(s)
		if err != nil {
			return fmt.Errorf("read bound address: %w", err)
		}
		switch la := local.(type) {
		case *unix.SockaddrInet4:
			bound = netip.AddrPortFrom(netip.AddrFrom4(la.Addr), uint16(la.Port))
		case *unix.SockaddrInet6:
			bound = netip.AddrPortFrom(netip.AddrFrom16(la.Addr).WithZone(ip.Zone()), uint16(la.Port))
		default:
			return fmt.Errorf("read bound address: unexpected %T", local)
		}
		ok = true
		fd = s
		return nil
	})
	if err != nil {
		switch {
		case errors.Is(err, unix.EADDRINUSE):
			return nil, fmt.Errorf("route: reserve %s %s: the port is already in use by another socket in that namespace; choose another port or stop its owner: %w", network, addr, err)
		case errors.Is(err, unix.EADDRNOTAVAIL):
			return nil, fmt.Errorf("route: reserve %s %s: the address is not assigned in that namespace; bind to one of its addresses or the unspecified address: %w", network, addr, err)
		case errors.Is(err, unix.EACCES):
			return nil, fmt.Errorf("route: reserve %s %s: permission denied (ports below net.ipv4.ip_unprivileged_port_start need CAP_NET_BIND_SERVICE): %w", network, addr, err)
		}
		return nil, fmt.Errorf("route: reserve %s %s: %w", network, addr, err)
	}
	r := &Reservation{network: network, addr: bound, s: newSock(fd, "reserve "+network+" "+bound.String())}
	if !r.s.open() {
		return nil, fmt.Errorf("route: reserve %s %s: the socket could not be parked", network, bound)
	}
	return r, nil
}

// sockaddr builds the bind address; a zone is resolved in the current
// (target) namespace.
func sockaddr(ip netip.Addr, port uint16) (unix.Sockaddr, error) {
	if ip.Is4() {
		return &unix.SockaddrInet4{Port: int(port), Addr: ip.As4()}, nil
	}
	sa := &unix.SockaddrInet6{Port: int(port), Addr: ip.As16()}
	if z := ip.Zone(); z != "" {
		if n, err := strconv.ParseUint(z, 10, 32); err == nil {
			sa.ZoneId = uint32(n)
		} else {
			ifi, err := net.InterfaceByName(z)
			if err != nil {
				return nil, fmt.Errorf("zone %q: no such interface in the namespace: %w", z, err)
			}
			sa.ZoneId = uint32(ifi.Index)
		}
	} else if ip.IsLinkLocalUnicast() {
		return nil, fmt.Errorf("link-local address without a zone: write it as %s%%<interface>: %w", ip, unix.EINVAL)
	}
	return sa, nil
}

// Addr is the address the socket is bound to (with the kernel-chosen port
// when 0 was asked for).
func (r *Reservation) Addr() netip.AddrPort { return r.addr }

// Close releases the port. A second Close returns an error wrapping
// net.ErrClosed.
//
// As with any socket, a program being started concurrently by this process
// holds an inherited copy of the descriptor until its exec has finished, so
// for that moment the port can still be in use after Close returns.
func (r *Reservation) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.s.open() {
		return fmt.Errorf("route: release %s %s: %w", r.network, r.addr, net.ErrClosed)
	}
	if err := r.closeSock(); err != nil {
		return fmt.Errorf("route: release %s %s: %w", r.network, r.addr, err)
	}
	return nil
}

// SetReuseAddr turns SO_REUSEADDR of the reservation's socket on or off.
// The kernel reads it when another socket binds the port: with it on, a
// binder that sets SO_REUSEADDR too may share the (never listening) port,
// as a TCP socket in TIME-WAIT lets a restarted server bind; with it off,
// the port is exclusively ours. Ports bound with port 0 are never chosen
// while any socket holds them, either way.
func (r *Reservation) SetReuseAddr(on bool) error {
	v := 0
	if on {
		v = 1
	}
	err := r.withFD(func(fd int) error { return unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, v) })
	if err != nil {
		return fmt.Errorf("route: %s reservation %v: set SO_REUSEADDR %d: %w", r.network, r.addr, v, err)
	}
	return nil
}
