// Package arrivals records when datagrams reach a kernel UDP socket, with
// the kernel's receive timestamps (SO_TIMESTAMPNS), and measures paced
// traffic from them: the rate per time window, the largest burst beyond a
// rate (token-bucket conformance) and the jitter of the gaps between
// arrivals. Pacing tests and the pacing benchmark use it on the receiving
// side of a lab; it owns no sending and no lab set-up.
//
// On veth the timestamp is taken when the sender's frame enters the peer
// (netif_rx, in the sender's system call), so arrival times are departure
// times shifted by a constant, and the receiver's own scheduling does not
// distort them.
package arrivals

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Arrival is one received datagram.
type Arrival struct {
	// T is the kernel's receive time, ns since the epoch.
	T int64
	// From is the sender.
	From netip.AddrPort
	// Len is the UDP payload length.
	Len int
}

// Recorder collects the arrivals of one socket until Stop.
type Recorder struct {
	c    *net.UDPConn
	done chan struct{}
	mu   sync.Mutex
	got  []Arrival
	err  error
}

// Record turns on receive timestamps on c, enlarges its buffer so a
// reader that falls behind loses nothing (SO_RCVBUFFORCE, needs
// CAP_NET_ADMIN; best effort) and starts recording. expect is how many
// datagrams are expected: room for them is allocated up front, so that
// the recording does not make the garbage collector stop a process whose
// pacing is being measured.
func Record(c *net.UDPConn, expect int) (*Recorder, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("arrivals: %w", err)
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1)
		_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 64<<20)
	}); err != nil {
		return nil, fmt.Errorf("arrivals: %w", err)
	}
	if serr != nil {
		return nil, fmt.Errorf("arrivals: SO_TIMESTAMPNS: %w", serr)
	}
	r := &Recorder{c: c, done: make(chan struct{}), got: make([]Arrival, 0, max(expect, 0))}
	go r.loop(rc)
	return r, nil
}

func (r *Recorder) loop(rc interface {
	Read(func(uintptr) bool) error
}) {
	defer close(r.done)
	buf := make([]byte, 65536)
	oob := make([]byte, unix.CmsgSpace(int(unsafe.Sizeof(unix.Timespec{}))))
	var batch []Arrival
	flush := func() {
		r.mu.Lock()
		r.got = append(r.got, batch...)
		r.mu.Unlock()
		batch = batch[:0]
	}
	for {
		var rerr error
		err := rc.Read(func(fd uintptr) bool {
			for {
				n, oobn, _, from, err := unix.Recvmsg(int(fd), buf, oob, unix.MSG_DONTWAIT)
				if err == unix.EAGAIN {
					flush()
					return false
				}
				if err != nil {
					rerr = err
					return true
				}
				a := Arrival{Len: n, From: addrOf(from)}
				if a.T, err = timestamp(oob[:oobn]); err != nil {
					rerr = err
					return true
				}
				batch = append(batch, a)
			}
		})
		flush()
		if err == nil {
			err = rerr
		}
		if err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) && !errors.Is(err, net.ErrClosed) {
				r.mu.Lock()
				r.err = err
				r.mu.Unlock()
			}
			return
		}
	}
}

func timestamp(oob []byte) (int64, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return 0, fmt.Errorf("arrivals: control message: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SCM_TIMESTAMPNS && len(m.Data) >= int(unsafe.Sizeof(unix.Timespec{})) {
			ts := *(*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
			return ts.Nano(), nil
		}
	}
	return 0, errors.New("arrivals: datagram without a receive timestamp")
}

func addrOf(sa unix.Sockaddr) netip.AddrPort {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port))
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port))
	}
	return netip.AddrPort{}
}

// Stop ends the recording (the socket stays open) and returns what was
// received, in arrival order.
func (r *Recorder) Stop() ([]Arrival, error) {
	_ = r.c.SetReadDeadline(time.Now())
	<-r.done
	_ = r.c.SetReadDeadline(time.Time{})
	r.mu.Lock()
	defer r.mu.Unlock()
	got := r.got
	slices.SortStableFunc(got, func(a, b Arrival) int { return cmpInt64(a.T, b.T) })
	return got, r.err
}

// Count returns how many datagrams arrived so far.
func (r *Recorder) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// From returns the arrivals from one sender.
func From(all []Arrival, from netip.AddrPort) []Arrival {
	var out []Arrival
	for _, a := range all {
		if a.From == from {
			out = append(out, a)
		}
	}
	return out
}
