package main

import (
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// mmsgSocket is a kernel UDP socket driven with sendmmsg/recvmmsg batches,
// the fastest way an ordinary application uses the kernel path.
type mmsgSocket struct {
	fd    int
	hdrs  []mmsghdr
	iovs  []unix.Iovec
	bufs  [][]byte
	addr  unix.RawSockaddrInet6
	addr4 unix.RawSockaddrInet4
}

// mmsghdr mirrors struct mmsghdr.
type mmsghdr struct {
	hdr unix.Msghdr
	n   uint32
	_   [4]byte
}

func newMmsgSocket(local netip.AddrPort, batch, bufSize int) (*mmsgSocket, error) {
	fam := unix.AF_INET6
	if local.Addr().Is4() {
		fam = unix.AF_INET
	}
	fd, err := unix.Socket(fam, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8<<20)
	if err := unix.Bind(fd, sockaddr(local)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("bind %v: %w", local, err)
	}
	s := &mmsgSocket{fd: fd, hdrs: make([]mmsghdr, batch), iovs: make([]unix.Iovec, batch), bufs: make([][]byte, batch)}
	for i := range s.hdrs {
		s.bufs[i] = make([]byte, bufSize)
		s.iovs[i].Base = &s.bufs[i][0]
		s.iovs[i].SetLen(bufSize)
		s.hdrs[i].hdr.Iov = &s.iovs[i]
		s.hdrs[i].hdr.SetIovlen(1)
	}
	return s, nil
}

func sockaddr(ap netip.AddrPort) unix.Sockaddr {
	if ap.Addr().Is4() {
		return &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().As4()}
	}
	return &unix.SockaddrInet6{Port: int(ap.Port()), Addr: ap.Addr().As16()}
}

func (s *mmsgSocket) localPort() int {
	sa, err := unix.Getsockname(s.fd)
	if err != nil {
		return 0
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return a.Port
	case *unix.SockaddrInet6:
		return a.Port
	}
	return 0
}

// setDest makes every message of the batch go to dst with size bytes.
func (s *mmsgSocket) setDest(dst netip.AddrPort, size int) {
	var name unsafe.Pointer
	var namelen uint32
	if dst.Addr().Is4() {
		s.addr4 = unix.RawSockaddrInet4{Family: unix.AF_INET, Addr: dst.Addr().As4()}
		p := (*[2]byte)(unsafe.Pointer(&s.addr4.Port))
		p[0], p[1] = byte(dst.Port()>>8), byte(dst.Port())
		name, namelen = unsafe.Pointer(&s.addr4), unix.SizeofSockaddrInet4
	} else {
		s.addr = unix.RawSockaddrInet6{Family: unix.AF_INET6, Addr: dst.Addr().As16()}
		p := (*[2]byte)(unsafe.Pointer(&s.addr.Port))
		p[0], p[1] = byte(dst.Port()>>8), byte(dst.Port())
		name, namelen = unsafe.Pointer(&s.addr), unix.SizeofSockaddrInet6
	}
	for i := range s.hdrs {
		s.hdrs[i].hdr.Name = (*byte)(name)
		s.hdrs[i].hdr.Namelen = namelen
		s.iovs[i].SetLen(size)
	}
}

// send sends the whole batch once and returns how many went out.
func (s *mmsgSocket) send() (int, error) {
	n, _, e := unix.Syscall6(unix.SYS_SENDMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(len(s.hdrs)), 0, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

// recv receives up to a batch, waiting at most for the socket's receive
// timeout, and returns how many datagrams arrived.
func (s *mmsgSocket) recv() (int, error) {
	for i := range s.hdrs {
		s.hdrs[i].hdr.Name = nil
		s.hdrs[i].hdr.Namelen = 0
	}
	n, _, e := unix.Syscall6(unix.SYS_RECVMMSG, uintptr(s.fd), uintptr(unsafe.Pointer(&s.hdrs[0])), uintptr(len(s.hdrs)), unix.MSG_WAITFORONE, 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}

func (s *mmsgSocket) close() { unix.Close(s.fd) }
