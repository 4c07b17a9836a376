package route

import (
	"errors"
	"fmt"
	"net/netip"

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
	if r.s = newSock(fd, "reserve "+r.network+" "+r.addr.String()); !r.s.open() {
		return nil, fmt.Errorf("route: adopt reservation %s: the socket could not be parked", r.addr)
	}
	return &r, nil
}

// Dup returns a duplicate of the reserving socket (the caller's to close),
// to hand it over.
func (r *Reservation) Dup() (int, error) {
	dup := -1
	err := r.withFD(func(fd int) error {
		var err error
		dup, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return -1, fmt.Errorf("route: duplicate %s %s: %w", r.network, r.addr, err)
	}
	return dup, nil
}

// Hold makes the reserving socket keep up to bytes of datagrams (as root,
// beyond net.core.rmem_max): while no AF_XDP socket serves the port (a
// live upgrade), the kernel queues its traffic here for the next owner to
// read (ReadBacklog) instead of dropping it.
func (r *Reservation) Hold(bytes int) error {
	return r.withFD(func(fd int) error {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes); err != nil {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, bytes); err != nil {
				return fmt.Errorf("route: hold %d bytes on %s: %w", bytes, r.addr, err)
			}
		}
		return nil
	})
}

// ReadBacklog reads one datagram the kernel queued on the reserving socket
// into buf without waiting. ok is false when there is none.
func (r *Reservation) ReadBacklog(buf []byte) (n int, src netip.AddrPort, ok bool, err error) {
	err = r.withFD(func(fd int) error {
		for {
			var from unix.Sockaddr
			var err error
			n, _, _, from, err = unix.Recvmsg(fd, buf, nil, unix.MSG_DONTWAIT|unix.MSG_TRUNC)
			switch {
			case errors.Is(err, unix.EINTR):
				continue
			case errors.Is(err, unix.EAGAIN):
				return nil
			case err != nil:
				return fmt.Errorf("route: read backlog of %s: %w", r.addr, err)
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
			ok = true
			return nil
		}
	})
	if !ok {
		n = 0
	}
	return n, src, ok, err
}
