package netlab

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// ioTimeout only protects tests from hanging when a packet is lost; it is
// not a performance assertion.
const ioTimeout = 5 * time.Second

// udpEcho starts a UDP echo server in dst's namespace and sends payload from
// src's namespace to dst's address of the given family; it returns the reply.
func udpEcho(t *testing.T, src, dst *Link, to netip.Addr, payload []byte) []byte {
	t.Helper()
	var srv *net.UDPConn
	err := dst.NS.Do(func() error {
		var err error
		srv, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(to, 0)))
		return err
	})
	if err != nil {
		t.Fatalf("listen in %s: %v", dst.NS.Name, err)
	}
	// Closed on return so no socket outlives the call and pins the namespace.
	defer srv.Close()
	go func() {
		buf := make([]byte, 65536)
		for {
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if _, err := srv.WriteToUDPAddrPort(buf[:n], from); err != nil {
				return
			}
		}
	}()
	srvAddr := srv.LocalAddr().(*net.UDPAddr).AddrPort()

	var cli *net.UDPConn
	err = src.NS.Do(func() error {
		var err error
		cli, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(srvAddr))
		return err
	})
	if err != nil {
		t.Fatalf("dial %s from %s: %v", srvAddr, src.NS.Name, err)
	}
	defer cli.Close()
	if err := cli.SetDeadline(time.Now().Add(ioTimeout)); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Write(payload); err != nil {
		t.Fatalf("send to %s: %v", srvAddr, err)
	}
	buf := make([]byte, 65536)
	n, err := cli.Read(buf)
	if err != nil {
		t.Fatalf("no echo from %s: %v", srvAddr, err)
	}
	return buf[:n]
}

// icmpPing sends one ICMP (v4 or v6) echo request from src's namespace to
// dst over a raw socket and waits for the matching reply.
func icmpPing(src *Link, dst netip.Addr) error {
	return src.NS.Do(func() error {
		family, proto, reqType, replyType := unix.AF_INET, unix.IPPROTO_ICMP, byte(8), byte(0)
		if dst.Is6() {
			family, proto, reqType, replyType = unix.AF_INET6, unix.IPPROTO_ICMPV6, 128, 129
		}
		fd, err := unix.Socket(family, unix.SOCK_RAW|unix.SOCK_CLOEXEC, proto)
		if err != nil {
			return fmt.Errorf("raw socket: %w", err)
		}
		defer unix.Close(fd)
		tv := unix.NsecToTimeval(ioTimeout.Nanoseconds())
		if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
			return err
		}
		id := uint16(os.Getpid())
		seq := uint16(time.Now().UnixNano())
		msg := []byte{reqType, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'n', 'e', 't', 'l', 'a', 'b'}
		var sa unix.Sockaddr
		if dst.Is4() {
			binary.BigEndian.PutUint16(msg[2:], ^onesSum(0, msg))
			sa = &unix.SockaddrInet4{Addr: dst.As4()}
		} else {
			sa = &unix.SockaddrInet6{Addr: dst.As16()} // kernel fills the ICMPv6 checksum
		}
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return fmt.Errorf("send echo request to %s: %w", dst, err)
		}
		buf := make([]byte, 1500)
		for {
			n, from, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return fmt.Errorf("no echo reply from %s: %w", dst, err)
			}
			pkt := buf[:n]
			if dst.Is4() { // raw IPv4 sockets deliver the IP header too
				if n < 20 {
					continue
				}
				pkt = pkt[int(pkt[0]&0x0f)*4:]
			}
			if len(pkt) < 8 || pkt[0] != replyType || binary.BigEndian.Uint16(pkt[4:]) != id || binary.BigEndian.Uint16(pkt[6:]) != seq {
				continue
			}
			if got := sockaddrAddr(from); got != dst {
				return fmt.Errorf("echo reply from %s, want %s", got, dst)
			}
			return nil
		}
	})
}

func sockaddrAddr(sa unix.Sockaddr) netip.Addr {
	switch sa := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrFrom4(sa.Addr)
	case *unix.SockaddrInet6:
		return netip.AddrFrom16(sa.Addr)
	}
	return netip.Addr{}
}

// onesSum adds b to the ones-complement sum s (RFC 1071), folded to 16 bits.
func onesSum(s uint32, b []byte) uint16 {
	for len(b) >= 2 {
		s += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

// frameUDPChecksumOK parses an Ethernet frame carrying UDP over IPv4 or IPv6
// (without extension headers) and reports whether the UDP checksum, and
// for IPv4 the header checksum, verify. ok is false for other frames.
func frameUDPChecksumOK(frame []byte, dstPort uint16) (isOurs, valid bool) {
	if len(frame) < 14 {
		return false, false
	}
	var pseudo []byte
	var udp []byte
	switch binary.BigEndian.Uint16(frame[12:]) {
	case unix.ETH_P_IP:
		ip := frame[14:]
		if len(ip) < 20 || ip[9] != unix.IPPROTO_UDP {
			return false, false
		}
		ihl := int(ip[0]&0x0f) * 4
		total := int(binary.BigEndian.Uint16(ip[2:]))
		if ihl < 20 || total > len(ip) || total < ihl+8 {
			return false, false
		}
		udp = ip[ihl:total]
		if binary.BigEndian.Uint16(udp[2:]) != dstPort {
			return false, false
		}
		if onesSum(0, ip[:ihl]) != 0xffff {
			return true, false
		}
		pseudo = append(append([]byte{}, ip[12:20]...), 0, unix.IPPROTO_UDP, byte(len(udp)>>8), byte(len(udp)))
	case unix.ETH_P_IPV6:
		ip := frame[14:]
		if len(ip) < 40 || ip[6] != unix.IPPROTO_UDP {
			return false, false
		}
		plen := int(binary.BigEndian.Uint16(ip[4:]))
		if plen < 8 || 40+plen > len(ip) {
			return false, false
		}
		udp = ip[40 : 40+plen]
		if binary.BigEndian.Uint16(udp[2:]) != dstPort {
			return false, false
		}
		pseudo = append(append([]byte{}, ip[8:40]...), 0, 0, byte(plen>>8), byte(plen), 0, 0, 0, unix.IPPROTO_UDP)
	default:
		return false, false
	}
	if binary.BigEndian.Uint16(udp[6:]) == 0 {
		return true, false // "no checksum" is not what a NIC would send here
	}
	return true, onesSum(uint32(onesSum(0, pseudo)), udp) == 0xffff
}

// nsInode returns the inode number identifying ns's namespace.
func nsInode(t *testing.T, ns *NS) uint64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Fstat(int(ns.Handle()), &st); err != nil {
		t.Fatalf("fstat %s: %v", ns.Name, err)
	}
	return st.Ino
}

// leftovers lists what still exists of namespaces/interfaces: named
// entries in /run/netns and `ip netns list`, mounts, links of these names in
// the root namespace, and references from this process (fds, threads) to
// the namespace inodes, which would keep them alive.
func leftovers(t *testing.T, nsNames, ifNames []string, inodes []uint64) []string {
	t.Helper()
	var left []string
	for _, n := range nsNames {
		if _, err := os.Lstat(filepath.Join(netnsRunDir, n)); err == nil {
			left = append(left, "file "+filepath.Join(netnsRunDir, n))
		}
	}
	out, err := execOutput("ip", "netns", "list")
	if err != nil {
		t.Fatalf("ip netns list: %v", err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		for _, n := range nsNames {
			if len(f) > 0 && f[0] == n {
				left = append(left, "ip netns list: "+n)
			}
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nsNames {
		if bytes.Contains(mounts, []byte(" "+filepath.Join(netnsRunDir, n)+" ")) {
			left = append(left, "mount "+n)
		}
	}
	for _, n := range ifNames {
		_, err := netlink.LinkByName(n)
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			left = append(left, fmt.Sprintf("root link %s (err=%v)", n, err))
		}
	}
	if len(inodes) > 0 {
		left = append(left, nsReferences(t, inodes)...)
	}
	return left
}

// nsReferences lists fds and threads of this process that refer to (and so
// keep alive) a network namespace with one of the given nsfs inode numbers:
// namespace fds, threads inside it, and sockets created in it (found with
// SIOCGSKNS, which opens the namespace of a socket).
func nsReferences(t *testing.T, inodes []uint64) []string {
	t.Helper()
	want := map[uint64]bool{}
	for _, ino := range inodes {
		want[ino] = true
	}
	var refs []string
	threads, _ := filepath.Glob("/proc/self/task/*/ns/net")
	for _, p := range threads {
		var st unix.Stat_t
		if err := unix.Stat(p, &st); err == nil && want[st.Ino] {
			refs = append(refs, "thread "+p)
		}
	}
	fds, _ := os.ReadDir("/proc/self/fd")
	for _, e := range fds {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		var st unix.Stat_t
		if unix.Fstat(fd, &st) != nil {
			continue // closed meanwhile (e.g. the ReadDir fd itself)
		}
		if st.Mode&unix.S_IFMT == unix.S_IFSOCK {
			nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
			if err != nil {
				continue
			}
			err = unix.Fstat(nsfd, &st)
			unix.Close(nsfd)
			if err != nil {
				continue
			}
			if want[st.Ino] {
				refs = append(refs, fmt.Sprintf("socket fd %d", fd))
			}
			continue
		}
		if want[st.Ino] {
			target, _ := os.Readlink(filepath.Join("/proc/self/fd", e.Name()))
			refs = append(refs, fmt.Sprintf("fd %d -> %s", fd, target))
		}
	}
	return refs
}

func execOutput(name string, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := execCommand(name, args...)
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.String(), err
}

// linkInfo fetches the kernel's view of l.
func linkInfo(t *testing.T, l *Link) netlink.Link {
	t.Helper()
	link, err := l.NS.Netlink().LinkByName(l.Name)
	if err != nil {
		t.Fatalf("link %s in %s: %v", l.Name, l.NS.Name, err)
	}
	return link
}
