package route

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"golang.org/x/sys/unix"
)

// AdoptReservation wraps fd, a reserving socket another process handed
// over (live upgrade), and owns it from now on (closed on error too). Its
// kernel multicast memberships and whatever it received come with it.
func AdoptReservation(fd int) (*Reservation, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("route: adopt reservation: %w", err)
	}
	var r Reservation
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		r.network, r.addr = "udp4", netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		r.network, r.addr = "udp6", netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port))
	default:
		unix.Close(fd)
		return nil, fmt.Errorf("route: adopt reservation: descriptor is a %T socket, not UDP", sa)
	}
	if typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE); err != nil || typ != unix.SOCK_DGRAM {
		unix.Close(fd)
		return nil, fmt.Errorf("route: adopt reservation %s: not a datagram socket", r.addr)
	}
	r.f = os.NewFile(uintptr(fd), "reserve "+r.network+" "+r.addr.String())
	return &r, nil
}

// Dup returns a duplicate of the reserving socket (the caller's to close),
// to hand it over.
func (r *Reservation) Dup() (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return -1, fmt.Errorf("route: duplicate %s %s: %w", r.network, r.addr, net.ErrClosed)
	}
	fd, err := unix.FcntlInt(r.f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("route: duplicate %s %s: %w", r.network, r.addr, err)
	}
	return fd, nil
}

// Hold makes the reserving socket keep up to bytes of datagrams (as root,
// beyond net.core.rmem_max): while no AF_XDP socket serves the port (a
// live upgrade), the kernel queues its traffic here for the next owner to
// read (ReadBacklog) instead of dropping it.
func (r *Reservation) Hold(bytes int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return net.ErrClosed
	}
	fd := int(r.f.Fd())
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes); err != nil {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bytes); err != nil {
			return fmt.Errorf("route: hold %d bytes on %s: %w", bytes, r.addr, err)
		}
	}
	return nil
}

// ReadBacklog reads one datagram the kernel queued on the reserving socket
// into buf without waiting. ok is false when there is none.
func (r *Reservation) ReadBacklog(buf []byte) (n int, src netip.AddrPort, ok bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f == nil {
		return 0, src, false, net.ErrClosed
	}
	for {
		var from unix.Sockaddr
		n, _, _, from, err = unix.Recvmsg(int(r.f.Fd()), buf, nil, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case errors.Is(err, unix.EAGAIN):
			return 0, src, false, nil
		case err != nil:
			return 0, src, false, fmt.Errorf("route: read backlog of %s: %w", r.addr, err)
		}
		if n > len(buf) {
			continue // larger than any frame the ring could carry: skip
		}
		switch a := from.(type) {
		case *unix.SockaddrInet4:
			src = netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
		case *unix.SockaddrInet6:
			src = netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
		}
		return n, src, true, nil
	}
}
