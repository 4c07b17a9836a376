package netlab

import (
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// WriteAwaitAck writes b on a kernel TCP connection (a test's peer) and
// polls the socket's TCP_INFO until nothing it sent is unacknowledged. It
// returns how long after the write the acknowledgement was seen (an upper
// bound of when it arrived: the polls are about 1 ms apart) and the
// connection's total retransmissions then, so a test can tell an ACK the
// other side delayed from one that only a retransmission drew out.
func WriteAwaitAck(c *net.TCPConn, b []byte, timeout time.Duration) (delay time.Duration, retrans uint32, err error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, 0, err
	}
	info := func() (*unix.TCPInfo, error) {
		var ti *unix.TCPInfo
		var ierr error
		if err := rc.Control(func(fd uintptr) { ti, ierr = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) }); err != nil {
			return nil, err
		}
		return ti, ierr
	}
	start := time.Now()
	if _, err := c.Write(b); err != nil {
		return 0, 0, err
	}
	for {
		ti, err := info()
		if err != nil {
			return 0, 0, fmt.Errorf("TCP_INFO: %w", err)
		}
		d := time.Since(start)
		if ti.Unacked == 0 {
			return d, ti.Total_retrans, nil
		}
		if d > timeout {
			return d, ti.Total_retrans, fmt.Errorf("%d segments still unacknowledged after %v", ti.Unacked, d)
		}
		time.Sleep(time.Millisecond)
	}
}
