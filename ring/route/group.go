package route

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Multicast membership through the reservation socket: the kernel then sends
// the IGMP/MLD reports and programs the NIC's multicast MAC filter, while the
// datagrams themselves are steered to the ring by XDP. The protocol-
// independent MCAST_* options take an interface index for both families and
// both any-source and source-specific membership.

// groupReq mirrors struct group_req (64-bit layout).
type groupReq struct {
	iface uint32
	_     uint32
	group [128]byte
}

// groupSourceReq mirrors struct group_source_req (64-bit layout).
type groupSourceReq struct {
	iface  uint32
	_      uint32
	group  [128]byte
	source [128]byte
}

// putSockaddr writes a sockaddr_in or sockaddr_in6 for a into b.
func putSockaddr(b *[128]byte, a netip.Addr) {
	if a.Is4() {
		binary.NativeEndian.PutUint16(b[0:], unix.AF_INET)
		v := a.As4()
		copy(b[4:8], v[:])
		return
	}
	binary.NativeEndian.PutUint16(b[0:], unix.AF_INET6)
	v := a.As16()
	copy(b[8:24], v[:])
}

// JoinGroup joins group on interface ifindex; a valid source makes the
// membership source-specific. Both must be of the reservation's family.
func (r *Reservation) JoinGroup(group, source netip.Addr, ifindex int) error {
	return r.membership(true, group, source, ifindex)
}

// LeaveGroup ends a membership made by JoinGroup.
func (r *Reservation) LeaveGroup(group, source netip.Addr, ifindex int) error {
	return r.membership(false, group, source, ifindex)
}

func (r *Reservation) membership(join bool, group, source netip.Addr, ifindex int) error {
	group, source = group.Unmap(), source.Unmap()
	v4 := r.network == "udp4"
	if !group.IsMulticast() || group.Is4() != v4 || (source.IsValid() && source.Is4() != v4) {
		return fmt.Errorf("route: %s group %v source %v: not a multicast group of the socket's family: %w", r.network, group, source, unix.EINVAL)
	}
	level := unix.IPPROTO_IPV6
	if v4 {
		level = unix.IPPROTO_IP
	}
	var opt int
	var p unsafe.Pointer
	var size uintptr
	if source.IsValid() {
		req := &groupSourceReq{iface: uint32(ifindex)}
		putSockaddr(&req.group, group)
		putSockaddr(&req.source, source)
		opt, p, size = unix.MCAST_LEAVE_SOURCE_GROUP, unsafe.Pointer(req), unsafe.Sizeof(*req)
		if join {
			opt = unix.MCAST_JOIN_SOURCE_GROUP
		}
	} else {
		req := &groupReq{iface: uint32(ifindex)}
		putSockaddr(&req.group, group)
		opt, p, size = unix.MCAST_LEAVE_GROUP, unsafe.Pointer(req), unsafe.Sizeof(*req)
		if join {
			opt = unix.MCAST_JOIN_GROUP
		}
	}
	var serr error
	if err := r.withFD(func(fd int) error {
		_, _, e := unix.Syscall6(unix.SYS_SETSOCKOPT, uintptr(fd), uintptr(level), uintptr(opt), uintptr(p), size, 0)
		if e != 0 {
			serr = e
		}
		return nil
	}); err != nil {
		return err
	}
	if serr != nil {
		verb := "leave"
		if join {
			verb = "join"
		}
		return fmt.Errorf("route: %s group %v source %v on ifindex %d: %w", verb, group, source, ifindex, serr)
	}
	return nil
}
