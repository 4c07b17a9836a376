package ring

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring/packet"
	"github.com/bypassd/bypassd/ring/route"
)

// table is the engine's view of the bound endpoints. It is immutable once
// published: writers copy it, change the copy and swap the pointer, so the
// engine reads it without locks.
type table struct {
	// byAddr maps a bound local address (possibly the unspecified address
	// of its family) to the endpoints bound there.
	byAddr map[netip.AddrPort][]*Endpoint
	all    []*Endpoint
}

func (t *table) with(ep *Endpoint) *table {
	n := &table{byAddr: make(map[netip.AddrPort][]*Endpoint, len(t.byAddr)+1), all: append(t.all[:len(t.all):len(t.all)], ep)}
	for k, v := range t.byAddr {
		n.byAddr[k] = v
	}
	n.byAddr[ep.local] = append(n.byAddr[ep.local][:len(n.byAddr[ep.local]):len(n.byAddr[ep.local])], ep)
	return n
}

func (t *table) without(ep *Endpoint) *table {
	n := &table{byAddr: make(map[netip.AddrPort][]*Endpoint, len(t.byAddr))}
	for k, v := range t.byAddr {
		var kept []*Endpoint
		for _, e := range v {
			if e != ep {
				kept = append(kept, e)
			}
		}
		if len(kept) > 0 {
			n.byAddr[k] = kept
		}
	}
	for _, e := range t.all {
		if e != ep {
			n.all = append(n.all, e)
		}
	}
	return n
}

// lookup finds the endpoints for a datagram to dst: the exact address first,
// then the wildcard address of dst's family.
func (t *table) lookup(dst netip.AddrPort) []*Endpoint {
	if eps, ok := t.byAddr[dst]; ok {
		return eps
	}
	any := netip.IPv4Unspecified()
	if dst.Addr().Is6() {
		any = netip.IPv6Unspecified()
	}
	return t.byAddr[netip.AddrPortFrom(any, dst.Port())]
}

// Endpoint is a UDP socket bound on a ring. Its user side (Send, Recv) may be
// used from any goroutines; the ring's engine is the other side of its queues.
type Endpoint struct {
	r     *Ring
	local netip.AddrPort
	peer  atomic.Pointer[netip.AddrPort]
	resv  *route.Reservation
	flows []bpf.Flow

	// User side of the queues: producer of tx, consumer of rx.
	txq, rxq *shmq.Queue
	// Engine side of the same memory.
	etx, erx *shmq.Queue
	// rxWait wakes a reader sleeping on an empty RX queue; txWait wakes a
	// writer waiting for room in the TX queue.
	rxWait, txWait *shmq.Waiter
	txMu, rxMu     sync.Mutex

	closeOnce sync.Once
	closed    atomic.Bool
	// broken is set by the engine when a queue turned out corrupt.
	broken atomic.Bool

	// engine-owned
	touched bool

	stats EndpointStats
}

// EndpointStats are an endpoint's counters.
type EndpointStats struct {
	RXPackets, RXBytes, RXDropped       atomic.Uint64
	TXPackets, TXBytes, TXDropped       atomic.Uint64
	TXUnreachable, TXErrors, RXChecksum atomic.Uint64
}

// BindUDP binds a UDP endpoint to addr on the ring. addr's IP must be one
// of the interface's addresses or the unspecified address of its family
// (all of them); port 0 picks a free port. The port is also reserved in the
// kernel with an ordinary socket so no other program can take it.
func (r *Ring) BindUDP(addr netip.AddrPort) (*Endpoint, error) {
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	if !addr.Addr().IsValid() {
		return nil, fmt.Errorf("ring %s/%d: bind %v: invalid address", r.cfg.Interface, r.cfg.Queue, addr)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, errRingClosed
	}
	ip := addr.Addr()
	var dsts []netip.Addr
	if ip.IsUnspecified() {
		addrs, err := r.interfaceAddrs(ip.Is4())
		if err != nil {
			return nil, fmt.Errorf("ring %s/%d: bind %v: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
		}
		dsts = addrs
	} else {
		local, err := r.isLocal(ip)
		if err != nil {
			return nil, fmt.Errorf("ring %s/%d: bind %v: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
		}
		if !local {
			return nil, unixErr(unix.EADDRNOTAVAIL, "ring %s/%d: bind %v: %v is not an address of %s", r.cfg.Interface, r.cfg.Queue, addr, ip, r.cfg.Interface)
		}
		dsts = []netip.Addr{ip}
	}
	network := "udp6"
	if ip.Is4() {
		network = "udp4"
	}
	resv, err := route.ReservePort(r.ns, network, addr)
	if err != nil {
		return nil, fmt.Errorf("ring %s/%d: bind %v: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
	}
	ep := &Endpoint{r: r, local: resv.Addr(), resv: resv}
	ep.local = netip.AddrPortFrom(ep.local.Addr().Unmap(), ep.local.Port())
	if err := ep.initQueues(r.cfg.QueueBytes); err != nil {
		_ = resv.Close()
		return nil, fmt.Errorf("ring %s/%d: bind %v: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
	}
	for _, d := range dsts {
		f := bpf.Flow{Proto: unix.IPPROTO_UDP, Dst: netip.AddrPortFrom(d, ep.local.Port())}
		if err := r.prog.AddFlow(f, uint32(r.cfg.Queue)); err != nil {
			ep.release()
			return nil, fmt.Errorf("ring %s/%d: bind %v: steer flow: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
		}
		ep.flows = append(ep.flows, f)
	}
	r.table.Store(r.table.Load().with(ep))
	return ep, nil
}

func (ep *Endpoint) initQueues(capacity int) error {
	size := shmq.Size(capacity)
	var err error
	txMem, rxMem := make([]byte, size), make([]byte, size)
	if ep.txq, err = shmq.Init(txMem, capacity); err != nil {
		return fmt.Errorf("TX queue: %w", err)
	}
	if ep.rxq, err = shmq.Init(rxMem, capacity); err != nil {
		return fmt.Errorf("RX queue: %w", err)
	}
	if ep.etx, err = shmq.Attach(txMem); err != nil {
		return fmt.Errorf("TX queue: %w", err)
	}
	if ep.erx, err = shmq.Attach(rxMem); err != nil {
		return fmt.Errorf("RX queue: %w", err)
	}
	if ep.rxWait, err = shmq.NewWaiter(); err != nil {
		return err
	}
	if ep.txWait, err = shmq.NewWaiter(); err != nil {
		_ = ep.rxWait.Close()
		return err
	}
	return nil
}

// release frees what BindUDP acquired (flows, reservation, waiters).
func (ep *Endpoint) release() {
	for _, f := range ep.flows {
		if err := ep.r.prog.DeleteFlow(f); err != nil && !errors.Is(err, os.ErrNotExist) {
			ep.r.log.Warn("delete flow failed")
		}
	}
	ep.flows = nil
	_ = ep.resv.Close()
	if ep.rxWait != nil {
		_ = ep.rxWait.Close()
	}
	if ep.txWait != nil {
		_ = ep.txWait.Close()
	}
}

// LocalAddr returns the bound address (with the port the kernel picked for
// port 0).
func (ep *Endpoint) LocalAddr() netip.AddrPort { return ep.local }

// Connect sets the default destination and, like a connected kernel UDP
// socket, makes the endpoint accept datagrams from peer only. The zero
// AddrPort disconnects.
func (ep *Endpoint) Connect(peer netip.AddrPort) error {
	if peer.IsValid() {
		peer = netip.AddrPortFrom(peer.Addr().Unmap(), peer.Port())
		if peer.Addr().Is4() != ep.local.Addr().Is4() {
			return unixErr(unix.EAFNOSUPPORT, "connect %v: endpoint is bound to %v", peer, ep.local)
		}
	}
	ep.peer.Store(&peer)
	return nil
}

// Stats returns the endpoint's counters.
func (ep *Endpoint) Stats() *EndpointStats { return &ep.stats }

// Close unbinds the endpoint: steering entries and the port reservation are
// released, blocked Send and Recv calls return net.ErrClosed.
func (ep *Endpoint) Close() error {
	ep.closeOnce.Do(func() {
		ep.closed.Store(true)
		// Closing the waiters unblocks Send and Recv calls sleeping on
		// them (they return net.ErrClosed).
		_ = ep.rxWait.Close()
		_ = ep.txWait.Close()
		r := ep.r
		r.mu.Lock()
		r.table.Store(r.table.Load().without(ep))
		r.mu.Unlock()
		// Delete steering first so no new frame is redirected for it,
		// then wait for the engine to drop its references.
		for _, f := range ep.flows {
			_ = r.prog.DeleteFlow(f)
		}
		ep.flows = nil
		r.sync()
		// Blocked callers hold the locks while waiting: they have returned
		// once the locks are ours.
		ep.txMu.Lock()
		ep.rxMu.Lock()
		ep.release()
		ep.rxMu.Unlock()
		ep.txMu.Unlock()
	})
	return nil
}

func (ep *Endpoint) closedErr() error {
	if ep.broken.Load() {
		return fmt.Errorf("endpoint %v: queue corrupted: %w", ep.local, net.ErrClosed)
	}
	return net.ErrClosed
}

// Send queues one datagram to dst (the connected peer when dst is the zero
// AddrPort). It blocks while the TX queue is full, until deadline (zero: no
// deadline; in the past: never blocks, returning EAGAIN).
func (ep *Endpoint) Send(b []byte, dst netip.AddrPort, deadline time.Time) error {
	_, err := ep.SendBatch([][]byte{b}, dst, deadline)
	return err
}

// SendBatch queues datagrams to dst and returns how many were queued. It
// wakes the engine once for the whole batch.
func (ep *Endpoint) SendBatch(msgs [][]byte, dst netip.AddrPort, deadline time.Time) (int, error) {
	if dst.IsValid() {
		dst = netip.AddrPortFrom(dst.Addr().Unmap(), dst.Port())
		if dst.Addr().Is4() != ep.local.Addr().Is4() {
			return 0, unixErr(unix.EAFNOSUPPORT, "send to %v from %v", dst, ep.local)
		}
	} else if p := ep.peer.Load(); p == nil || !p.IsValid() {
		return 0, unixErr(unix.EDESTADDRREQ, "send from %v: no destination and not connected", ep.local)
	}
	limit := packet.MaxUDPPayload4
	if ep.local.Addr().Is6() {
		limit = packet.MaxUDPPayload6
	}
	ep.txMu.Lock()
	defer ep.txMu.Unlock()
	h := dgram.Header{Addr: dst}
	sent := 0
	var err error
	for sent < len(msgs) {
		if ep.closed.Load() || ep.broken.Load() {
			err = ep.closedErr()
			break
		}
		m := msgs[sent]
		if len(m) > limit {
			err = unixErr(unix.EMSGSIZE, "send %d bytes from %v: UDP payload limit is %d", len(m), ep.local, limit)
			break
		}
		rec, rerr := ep.txq.Reserve(dgram.HeaderLen + len(m))
		if rerr == nil {
			dgram.Put(rec, &h)
			copy(rec[dgram.HeaderLen:], m)
			if err = ep.txq.Commit(dgram.HeaderLen+len(m), dgram.TypeDatagram); err != nil {
				break
			}
			sent++
			continue
		}
		if !errors.Is(rerr, shmq.ErrFull) {
			err = fmt.Errorf("send %d bytes from %v: %w", len(m), ep.local, rerr)
			break
		}
		// Full: let the engine see what is queued, then wait for room.
		ep.publishTX()
		if err = ep.waitTX(dgram.HeaderLen+len(m), deadline); err != nil {
			break
		}
	}
	ep.publishTX()
	return sent, err
}

func (ep *Endpoint) publishTX() {
	if ep.txq.Publish() {
		ep.r.doorbell.Wake()
	}
}

func (ep *Endpoint) waitTX(n int, deadline time.Time) error {
	if ep.closed.Load() || ep.broken.Load() {
		return ep.closedErr()
	}
	return ep.waitErr("send", ep.r.userPolicy.WaitWritable(ep.txq, n, ep.txWait, deadline))
}

// waitErr turns a queue wait's error into what a socket user expects.
func (ep *Endpoint) waitErr(op string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, shmq.ErrTimeout):
		return fmt.Errorf("%s on %v: %w", op, ep.local, errTimeout)
	case errors.Is(err, shmq.ErrClosed):
		return ep.closedErr()
	}
	return fmt.Errorf("%s on %v: %w", op, ep.local, err)
}

// Message is one datagram of a batch receive.
type Message struct {
	// Buf receives the payload; N is how many bytes were stored (a longer
	// datagram is truncated, as recvfrom(2) does).
	Buf  []byte
	N    int
	Addr netip.AddrPort
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
	if len(msgs) == 0 {
		return 0, nil
	}
	ep.rxMu.Lock()
	defer ep.rxMu.Unlock()
	var h dgram.Header
	for {
		if ep.closed.Load() {
			return 0, ep.closedErr()
		}
		n := 0
		for n < len(msgs) {
			rec, _, err := ep.rxq.Peek()
			if err != nil {
				if !errors.Is(err, shmq.ErrEmpty) {
					return n, fmt.Errorf("receive on %v: %w", ep.local, err)
				}
				break
			}
			payload, perr := dgram.Parse(rec, &h)
			if perr == nil {
				msgs[n].N = copy(msgs[n].Buf, payload)
				msgs[n].Addr = h.Addr
				n++
			}
			ep.rxq.Advance()
		}
		if n > 0 {
			if ep.rxq.Release() {
				ep.r.doorbell.Wake()
			}
			return n, nil
		}
		if err := ep.waitRX(deadline); err != nil {
			return 0, err
		}
	}
}

func (ep *Endpoint) waitRX(deadline time.Time) error {
	return ep.waitErr("receive", ep.r.userPolicy.WaitReadable(ep.rxq, ep.rxWait, deadline))
}

// errTimeout is what a deadline produces: both EAGAIN (as the kernel's
// SO_RCVTIMEO) and os.ErrDeadlineExceeded (as Go's net package).
var errTimeout = timeoutError{}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }
func (timeoutError) Is(target error) bool {
	return target == os.ErrDeadlineExceeded || target == unix.EAGAIN
}
