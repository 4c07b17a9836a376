package main

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// Conn is the transport seam: everything bypass-perf needs from a UDP socket.
// The shim's *socket.UDPConn and Go's *net.UDPConn both provide it, so the
// protocol, modes and statistics are the same code on both.
type Conn interface {
	ReadFromUDPAddrPort(b []byte) (int, netip.AddrPort, error)
	WriteToUDPAddrPort(b []byte, addr netip.AddrPort) (int, error)
	SetReadDeadline(t time.Time) error
	Close() error
}

// Datagram is one received datagram of a batch read.
type Datagram struct {
	Buf  []byte // receives the payload
	N    int    // bytes stored in Buf
	Addr netip.AddrPort
	// RX is the receive timestamp when the socket reports them (zero
	// otherwise): the converted hardware stamp (RXHardware) or else the
	// software one.
	RX         time.Time
	RXHardware bool
}

// BatchConn is implemented by transports that move several datagrams per
// call (the shim); bypass-perf uses it when present.
type BatchConn interface {
	Conn
	// ReadBatch fills msgs from the front and returns how many it filled,
	// waiting (until the read deadline) only for the first.
	ReadBatch(msgs []Datagram) (int, error)
	// WriteBatch sends each buffer as one datagram to dst and returns how
	// many were sent.
	WriteBatch(bufs [][]byte, dst netip.AddrPort) (int, error)
}

// Poller is implemented by transports that can read without waiting.
// under-load then collects replies in its sending goroutine (see
// underLoadPolling).
type Poller interface {
	// TryRead reads one datagram if one is queued; ok is false when none
	// is.
	TryRead(b []byte) (n int, from netip.AddrPort, ok bool, err error)
}

// Pacer is implemented by sockets that accept SO_MAX_PACING_RATE.
type Pacer interface {
	SetMaxPacingRate(bytesPerSec uint32) error
}

// Transport opens UDP sockets.
type Transport interface {
	// ListenUDP opens a socket bound to laddr (port 0: any) on network
	// "udp4" or "udp6".
	ListenUDP(network string, laddr netip.AddrPort) (Conn, error)
	// Name says which sockets these are, for the banner.
	Name() string
	// Close releases what the transport holds (not the sockets it opened).
	Close() error
}

// networkFor returns "udp4" or "udp6" for addr.
func networkFor(addr netip.Addr) string {
	if addr.Unmap().Is4() {
		return "udp4"
	}
	return "udp6"
}

// wildcard returns the unspecified address of addr's family.
func wildcard(addr netip.Addr) netip.Addr {
	if addr.Unmap().Is4() {
		return netip.IPv4Unspecified()
	}
	return netip.IPv6Unspecified()
}

// kernelTransport is ordinary kernel sockets (Go's net package), for
// comparison with the shim.
type kernelTransport struct{}

func (kernelTransport) Name() string { return "kernel sockets" }
func (kernelTransport) Close() error { return nil }

func (kernelTransport) ListenUDP(network string, laddr netip.AddrPort) (Conn, error) {
	c, err := net.ListenUDP(network, net.UDPAddrFromAddrPort(laddr))
	if err != nil {
		return nil, err
	}
	return &kernelConn{UDPConn: c}, nil
}

// kernelConn adds SO_MAX_PACING_RATE to *net.UDPConn.
type kernelConn struct {
	*net.UDPConn
}

func (c *kernelConn) SetMaxPacingRate(bytesPerSec uint32) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, int(bytesPerSec))
	}); err != nil {
		return err
	}
	if serr != nil {
		return fmt.Errorf("setsockopt SO_MAX_PACING_RATE: %w", serr)
	}
	return nil
}

// TryRead is recvfrom(MSG_DONTWAIT) on the socket.
func (c *kernelConn) TryRead(b []byte) (int, netip.AddrPort, bool, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, netip.AddrPort{}, false, err
	}
	var (
		n    int
		from unix.Sockaddr
		rerr error
	)
	if err := rc.Read(func(fd uintptr) bool {
		n, from, rerr = unix.Recvfrom(int(fd), b, unix.MSG_DONTWAIT)
		return true // never wait in the netpoller
	}); err != nil {
		return 0, netip.AddrPort{}, false, err
	}
	switch {
	case errors.Is(rerr, unix.EAGAIN), errors.Is(rerr, unix.EINTR):
		return 0, netip.AddrPort{}, false, nil
	case rerr != nil:
		return 0, netip.AddrPort{}, false, rerr
	}
	switch sa := from.(type) {
	case *unix.SockaddrInet4:
		return n, netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), uint16(sa.Port)), true, nil
	case *unix.SockaddrInet6:
		return n, netip.AddrPortFrom(netip.AddrFrom16(sa.Addr), uint16(sa.Port)), true, nil
	}
	return n, netip.AddrPort{}, true, nil
}

// isTimeout reports whether err is a read deadline expiring.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, unix.EAGAIN) || errors.Is(err, os.ErrDeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
