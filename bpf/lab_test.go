package bpf

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"golang.org/x/sys/unix"
)

// ioTimeout bounds every blocking read so a broken path fails instead of
// hanging; it is never used to judge speed.
const ioTimeout = 5 * time.Second

// attachIn attaches the program to l from inside l's namespace and detaches
// it when the test ends.
func attachIn(t *testing.T, l *netlab.Link, opts Options) *Program {
	t.Helper()
	p, err := tryAttachIn(l, opts)
	if err != nil {
		t.Fatalf("Attach(%s, %+v): %v", l.Name, opts, err)
	}
	t.Cleanup(func() {
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return p
}

func tryAttachIn(l *netlab.Link, opts Options) (*Program, error) {
	var p *Program
	err := l.NS.Do(func() error {
		var err error
		p, err = Attach(l.Index, opts)
		return err
	})
	return p, err
}

// xdpState reports the program id and IFLA_XDP_ATTACHED mode netlink shows
// for l (0, 0 when nothing is attached).
func xdpState(t *testing.T, l *netlab.Link) (progID, mode uint32) {
	t.Helper()
	link, err := l.NS.Netlink().LinkByIndex(l.Index)
	if err != nil {
		t.Fatalf("netlink query %s: %v", l.Name, err)
	}
	x := link.Attrs().Xdp
	if x == nil || !x.Attached {
		return 0, 0
	}
	return x.ProgId, x.AttachMode
}

// Values of IFLA_XDP_ATTACHED.
const (
	xdpAttachedDrv = 1
	xdpAttachedSkb = 2
)

// localPort returns the port the kernel gave c.
func localPort(c *net.UDPConn) uint16 {
	return c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
}

// send sends each payload as one datagram from c to dst.
func send(t *testing.T, c *net.UDPConn, dst netip.AddrPort, payloads ...[]byte) {
	t.Helper()
	for _, p := range payloads {
		if _, err := c.WriteToUDPAddrPort(p, dst); err != nil {
			t.Fatalf("send %d bytes %s -> %s: %v", len(p), c.LocalAddr(), dst, err)
		}
	}
}

// recvUDP reads n datagrams and returns them.
func recvUDP(t *testing.T, c *net.UDPConn, n int) [][]byte {
	t.Helper()
	var out [][]byte
	buf := make([]byte, 65536)
	for len(out) < n {
		if err := c.SetReadDeadline(time.Now().Add(ioTimeout)); err != nil {
			t.Fatal(err)
		}
		k, _, err := c.ReadFromUDPAddrPort(buf)
		if err != nil {
			t.Fatalf("kernel socket %s received %d of %d datagrams: %v", c.LocalAddr(), len(out), n, err)
		}
		out = append(out, bytes.Clone(buf[:k]))
	}
	return out
}

// payloads returns n distinct payloads of size bytes (size >= 8).
func payloads(tag string, n, size int) [][]byte {
	var out [][]byte
	for i := range n {
		p := bytes.Repeat([]byte{byte('a' + i%26)}, size)
		copy(p, fmt.Sprintf("%s%03d", tag, i))
		out = append(out, p)
	}
	return out
}

func counters(t *testing.T, p *Program) Counters {
	t.Helper()
	c, err := p.Counters()
	if err != nil {
		t.Fatalf("Counters: %v", err)
	}
	return c
}

func (c Counters) sub(o Counters) Counters {
	return Counters{
		Redirected: c.Redirected - o.Redirected,
		Passed:     c.Passed - o.Passed,
		NoSocket:   c.NoSocket - o.NoSocket,
		Fragments:  c.Fragments - o.Fragments,
		Malformed:  c.Malformed - o.Malformed,

		OtherQueue:    c.OtherQueue - o.OtherQueue,
		NoQueueSocket: c.NoQueueSocket - o.NoQueueSocket,
	}
}

// ping sends one ICMP(v6) echo request from inside ns to dst over a raw
// socket and waits for the matching reply.
func ping(t *testing.T, ns *netlab.NS, dst netip.Addr) {
	t.Helper()
	err := ns.Do(func() error {
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
		const id, seq = 0xbd, 1
		msg := []byte{reqType, 0, 0, 0, 0, id, 0, seq, 'b', 'y', 'p', 'a', 's', 's', 'd'}
		var sa unix.Sockaddr
		if dst.Is4() {
			binary.BigEndian.PutUint16(msg[2:], icmpChecksum(msg))
			sa = &unix.SockaddrInet4{Addr: dst.As4()}
		} else {
			sa = &unix.SockaddrInet6{Addr: dst.As16()} // the kernel fills the ICMPv6 checksum
		}
		if err := unix.Sendto(fd, msg, 0, sa); err != nil {
			return fmt.Errorf("send echo request: %w", err)
		}
		buf := make([]byte, 1500)
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil {
				return fmt.Errorf("no echo reply from %s: %w", dst, err)
			}
			icmp := buf[:n]
			if dst.Is4() && n > 0 { // raw IPv4 sockets deliver the IP header too
				icmp = buf[int(buf[0]&0x0f)*4 : n]
			}
			if len(icmp) >= 8 && icmp[0] == replyType && icmp[5] == id && icmp[7] == seq {
				return nil
			}
		}
	})
	if err != nil {
		t.Fatalf("ping %s from %s: %v", dst, ns.Name, err)
	}
}

func icmpChecksum(b []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

// fragmentCount is how many IP fragments a UDP datagram of payload bytes
// becomes on a link with this MTU (fragment payloads are multiples of 8).
func fragmentCount(mtu, payload int, v6 bool) int {
	udp := payload + 8
	hdr, perFrag := 20, (mtu-20)&^7
	if v6 {
		hdr, perFrag = 40, (mtu-40-8)&^7 // IPv6 header + Fragment header
	}
	if udp+hdr <= mtu {
		return 1
	}
	return (udp + perFrag - 1) / perFrag
}
