package ring

import (
	"net/netip"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/sockq"
	"github.com/bypassd/bypassd/ring/wire/packet"
)

// The in-process user side of an endpoint bound with BindUDP (or Bind
// without Queues): tests, benchmarks and tools that live in the daemon's
// process use it; clients use package socket instead.

// Message is one datagram of a batch receive.
type Message = sockq.Message

// Send queues one datagram to dst (the connected peer when dst is the zero
// AddrPort). It blocks while the TX queue is full, until deadline (zero: no
// deadline; in the past: never blocks, failing with an error that matches
// EAGAIN and os.ErrDeadlineExceeded).
func (ep *Endpoint) Send(b []byte, dst netip.AddrPort, deadline time.Time) error {
	_, err := ep.SendBatch([][]byte{b}, dst, deadline)
	return err
}

// SendBatch queues datagrams to dst and returns how many were queued; the
// engine is woken once for the whole batch.
func (ep *Endpoint) SendBatch(msgs [][]byte, dst netip.AddrPort, deadline time.Time) (int, error) {
	if ep.user == nil {
		return 0, unixErr(unix.EOPNOTSUPP, "send from %v: the endpoint's user is another process", ep.local)
	}
	if dst.IsValid() {
		dst = unmap(dst)
		if dst.Addr().Is4() != ep.local.Addr().Is4() {
			return 0, unixErr(unix.EAFNOSUPPORT, "send to %v from %v", dst, ep.local)
		}
	} else if !ep.Peer().IsValid() {
		return 0, unixErr(unix.EDESTADDRREQ, "send from %v: no destination and not connected", ep.local)
	}
	limit := packet.MaxUDPPayload4
	if ep.local.Addr().Is6() {
		limit = packet.MaxUDPPayload6
	}
	for i, m := range msgs {
		if len(m) > limit {
			n, err := ep.user.SendBatch(msgs[:i], dst, deadline)
			if err == nil {
				err = unixErr(unix.EMSGSIZE, "send %d bytes from %v: UDP payload limit is %d", len(m), ep.local, limit)
			}
			return n, err
		}
	}
	return ep.user.SendBatch(msgs, dst, deadline)
}

// Recv receives one datagram into b, returning its length and sender. A
// datagram longer than b is truncated (the rest discarded), as recvfrom(2)
// does. It blocks until a datagram arrives, the deadline passes (an error
// matching both os.ErrDeadlineExceeded and EAGAIN) or the endpoint closes
// (net.ErrClosed).
func (ep *Endpoint) Recv(b []byte, deadline time.Time) (int, netip.AddrPort, error) {
	m := [1]Message{{Buf: b}}
	if _, err := ep.RecvBatch(m[:], deadline); err != nil {
		return 0, netip.AddrPort{}, err
	}
	return m[0].N, m[0].Addr, nil
}

// RecvBatch waits like Recv for the first datagram, then fills msgs with
// those already queued, without blocking again, and returns how many.
func (ep *Endpoint) RecvBatch(msgs []Message, deadline time.Time) (int, error) {
	if ep.user == nil {
		return 0, unixErr(unix.EOPNOTSUPP, "receive on %v: the endpoint's user is another process", ep.local)
	}
	return ep.user.RecvBatch(msgs, deadline)
}
