package ring

// TCP on a ring: the engine's hooks into the ring's tcpstack.Stack (frames
// in, packets out), and the steering and kernel port reservations of TCP
// listeners and connections. The stack is created with the ring's first
// TCP socket, so a UDP-only ring carries none of it.

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/ring/tcpstack"
)

// tcpState is the ring's TCP state.
type tcpState struct {
	mu    sync.Mutex // creating the stack
	stack atomic.Pointer[tcpstack.Stack]
	// stalled: the engine left outbound packets queued for a next hop
	// being resolved (engine-owned).
	stalled bool
	// ports counts the kernel port reservations TCP sockets hold.
	ports atomic.Int64
	// delack are the connections' TCP_QUICKACK thresholds
	// (tcp_delack.go), pace their pacing rates (TCPConn.SetPacing).
	delack connRequests[int]
	pace   connRequests[*pacing.Rate]
}

// tcpFlowKey names a connection by its ends (engine-side per-connection
// state: delayed ACKs, pacing).
type tcpFlowKey struct{ local, remote netip.AddrPort }

// TCPStack returns the ring's TCP stack, creating it on first use.
func (r *Ring) TCPStack() (*tcpstack.Stack, error) {
	if s := r.tcp.stack.Load(); s != nil {
		return s, nil
	}
	r.tcp.mu.Lock()
	defer r.tcp.mu.Unlock()
	if s := r.tcp.stack.Load(); s != nil {
		return s, nil
	}
	// Segments leave as single frames: the MSS follows the interface MTU
	// as far as the ring's frames carry it (mtu.go).
	s, err := tcpstack.New(tcpstack.Config{MTU: min(r.MTU(), r.maxMTU()), Log: r.log, CongestionControl: r.cfg.TCPCongestion, TimeWait: r.cfg.TCPTimeWait, Wake: func() {
		if r.sleeping.Load() {
			_ = r.doorbell.Wake()
		}
	}})
	if err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", r.cfg.Interface, r.cfg.Queue, err)
	}
	r.tcp.stack.Store(s)
	return s, nil
}

// TCPStats returns the TCP stack's counters (zero before the first TCP
// socket).
func (r *Ring) TCPStats() tcpstack.Stats {
	if s := r.tcp.stack.Load(); s != nil {
		return s.Stats()
	}
	return tcpstack.Stats{}
}

// TCPPorts returns how many kernel port reservations the ring's TCP
// sockets and connections hold (connections in TIME-WAIT included).
func (r *Ring) TCPPorts() int { return int(r.tcp.ports.Load()) }

// TCPConnections lists the connections of the ring's TCP stack (none
// before the first TCP socket).
func (r *Ring) TCPConnections() []tcpstack.ConnInfo {
	if s := r.tcp.stack.Load(); s != nil {
		return s.Connections()
	}
	return nil
}

// closeTCP aborts every connection (the peers get resets while the engine
// still runs) and stops the stack.
func (r *Ring) closeTCP() {
	r.tcp.mu.Lock()
	s := r.tcp.stack.Load()
	r.tcp.mu.Unlock()
	if s != nil {
		s.Close()
	}
}

// ---- engine hooks ----

// tcpReceive hands a received TCP frame to the stack; false when the ring
// has no TCP stack (the frame was not ours to take).
func (e *engine) tcpReceive(frame []byte) bool {
	s := e.r.tcp.stack.Load()
	if s == nil {
		return false
	}
	off := ipOffset(frame)
	if off < 0 {
		return false
	}
	if len(e.delack.conns) > 0 {
		e.delackReceived(frame[off:])
	}
	s.Deliver(frame[off:])
	e.yieldDue = true
	return true
}

// ipOffset returns where the IP header starts in an Ethernet frame (after
// up to two VLAN tags), or -1.
func ipOffset(frame []byte) int {
	off := 12
	for range 3 {
		if len(frame) < off+2 {
			return -1
		}
		switch binary.BigEndian.Uint16(frame[off:]) {
		case 0x8100, 0x88a8:
			off += 4
		case 0x0800, 0x86dd:
			return off + 2
		default:
			return -1
		}
	}
	return -1
}

// tcpTransmit builds frames for the stack's outbound packets: next hop
// from the same cache as UDP, Ethernet header in front, a large (TSO)
// packet cut into frames of one MSS (tcpstack.Packet) unless the provider
// segments it in hardware (qp.Segmenter). A packet to a next hop being
// resolved stops the batch (the resolution wakes the engine), as does a
// lack of send buffers for all of a packet's frames. A delayed ACK waits
// in its connection's state (tcp_delack.go), packets of a paced
// connection in its queue for their departure times (tcp_pacing.go,
// always cut in software: frame by frame is how they are spread out).
func (e *engine) tcpTransmit() (int, error) {
	s := e.r.tcp.stack.Load()
	if s == nil {
		return 0, nil
	}
	r := e.r
	seg, _ := r.prov.(qp.Segmenter)
	r.tcp.stalled = false
	e.delackSync()
	e.tcpPaceSync()
	var postErr error
	n := s.Outbound(func(p *tcpstack.Packet) tcpstack.Verdict {
		// The connection's delayed-ACK and pacing state, looked up with
		// one parse of the headers, only when some connection has either.
		if len(e.delack.conns) > 0 || len(e.tcpPace.conns) > 0 {
			if sg, ok := parseTCPSegment(p.IP, false); ok {
				if len(e.delack.conns) > 0 && e.delackOutbound(p, sg) {
					return tcpstack.Held
				}
				if pc := e.tcpPacedConn(sg); pc != nil {
					pc.q = append(pc.q, *p)
					return tcpstack.Held
				}
			}
		}
		d, v := e.tcpDest(p)
		if d == nil {
			return v
		}
		if seg != nil && p.Frames() > 1 {
			var room bool
			if room, postErr = e.tcpRoom(1); !room {
				return tcpstack.Stop
			}
			if e.sendLarge(seg, p, d) {
				return tcpstack.Sent
			}
		}
		var sent bool
		if sent, postErr = e.tcpFrames(p, d, 0, p.Frames()); !sent {
			return tcpstack.Stop
		}
		return tcpstack.Sent
	})
	if postErr != nil {
		return n, postErr
	}
	// After the stack's queue, so that an ACK it just handed over counts
	// in the next deadline, and what it handed a paced connection in the
	// next departure.
	if len(e.delack.conns) > 0 {
		if err := e.delackFlush(); err != nil {
			return n, err
		}
	}
	m, err := e.tcpPaceSend()
	return n + m, err
}

// sendLarge hands a large packet to a provider that segments it in
// hardware, in one buffer and as the stack built it (tcpstack.Packet.Large
// says what the device fills in); false when the provider cannot take it
// and the engine cuts it in software. The ring's counters count the frames
// the device puts on the wire, as for software segmentation.
func (e *engine) sendLarge(seg qp.Segmenter, p *tcpstack.Packet, d *dest) bool {
	mss, hdr, ok := p.Large()
	if !ok {
		return false
	}
	size := 14 + len(p.IP)
	var f qp.Frame
	if !seg.AllocTSO(&f, size, 14+hdr) {
		return false
	}
	b := f.Buf[:size]
	putEthernet(b, d, p.IP)
	copy(b[14:], p.IP)
	f.Buf, f.MSS, f.HeaderLen, f.SendQueue = b, uint16(mss), uint16(14+hdr), 0
	e.tx = append(e.tx, f)
	frames := p.Frames()
	e.r.stats.TCPTXPackets.Add(uint64(frames))
	e.r.stats.TCPTXBytes.Add(uint64(len(p.IP) + (frames-1)*hdr))
	return true
}

// putEthernet writes the Ethernet header of an IP packet to next hop d.
func putEthernet(b []byte, d *dest, ip []byte) {
	et := uint16(0x0800)
	if ip[0]>>4 == 6 {
		et = 0x86dd
	}
	copy(b[0:6], d.next.DstMAC)
	copy(b[6:12], d.next.SrcMAC)
	binary.BigEndian.PutUint16(b[12:], et)
}

// tcpDest returns the next hop of p's destination; nil with the verdict
// for p when there is none to send to now (Stop: being resolved, Sent:
// dropped and counted).
func (e *engine) tcpDest(p *tcpstack.Packet) (*dest, tcpstack.Verdict) {
	r := e.r
	dst, err := tcpstack.Destination(p.IP)
	if err != nil {
		r.stats.TXErrors.Add(1)
		return nil, tcpstack.Sent
	}
	d, ok := e.nextHop(destKey{addr: dst})
	if !ok {
		r.tcp.stalled = true
		return nil, tcpstack.Stop
	}
	if d.state == destFailed {
		r.stats.TXUnreachable.Add(1)
		return nil, tcpstack.Sent
	}
	return d, tcpstack.Sent
}

// tcpRoom makes room for n frames in the batch, posting it when full:
// false when the provider's queue cannot take the batch now.
func (e *engine) tcpRoom(n int) (bool, error) {
	if len(e.tx)+n > cap(e.tx) {
		e.backlog = append(e.backlog, e.tx...)
		e.tx = e.tx[:0]
		if err := e.post(); err != nil || len(e.backlog) > 0 {
			return false, err
		}
	}
	return true, nil
}

// tcpFrames builds frames [from, to) of p to next hop d and stages them for
// the provider: false when the send buffers (or the batch) cannot take
// them all now, and nothing was built. A frame that does not fit its
// buffer drops the packet (counted) and reports true.
func (e *engine) tcpFrames(p *tcpstack.Packet, d *dest, from, to int) (bool, error) {
	r := e.r
	frames := to - from
	if room, err := e.tcpRoom(frames); !room {
		return false, err
	}
	base := len(e.tx)
	if got := e.allocTX(e.tx[base:base+frames], 14+p.FrameLen(from)); got < frames {
		r.prov.FreeTX(e.tx[base : base+got])
		r.stats.TXNoBuffer.Add(1)
		return false, nil
	}
	e.tx = e.tx[:base+frames]
	for i := from; i < to; i++ {
		fr := &e.tx[base+i-from]
		l := 14 + p.FrameLen(i)
		if len(fr.Buf) < l {
			r.prov.FreeTX(e.tx[base:])
			e.tx = e.tx[:base]
			r.stats.TXErrors.Add(1)
			return true, nil
		}
		b := fr.Buf[:l]
		putEthernet(b, d, p.IP)
		p.Build(i, b[14:])
		fr.Buf = b
		fr.SendQueue = 0
		r.stats.TCPTXBytes.Add(uint64(l - 14))
	}
	e.stage(e.tx[base:])
	r.stats.TCPTXPackets.Add(uint64(frames))
	return true, nil
}

// tcpPending reports whether the stack has packets the engine can send now
// (paced ones wait for their time: paceTimeout covers them).
func (e *engine) tcpPending() bool {
	s := e.r.tcp.stack.Load()
	return s != nil && !e.r.tcp.stalled && s.OutboundPending()
}

// ---- ports and steering ----

// tcpPort is a reserved local TCP port shared by a listener and the
// connections it accepted, or held by one connection: the kernel keeps it
// for us until the last of them is gone, TIME-WAIT included. Releasing it
// when a connection entered TIME-WAIT let the kernel hand the same port to
// the next connect while the stack still held the old connection on it
// (EADDRINUSE after a few hundred connect/close cycles: a birthday
// collision in the odd half of the ephemeral range). Holding it also
// makes the kernel's ephemeral choice (bind to port 0, which never picks
// a port any socket holds) skip every port in TIME-WAIT here.
//
// While a binding or a listener holds the port, it is exclusively ours.
// Once only connections hold it, the reservation lets a socket that sets
// SO_REUSEADDR bind the port if the port's own socket set it: Linux's
// rule (two sockets that both set it conflict only when one listens), so
// that a restarted server binds again while its old connections close.
type tcpPort struct {
	resv *route.Reservation
	// reuse is SO_REUSEADDR of the socket that bound the port.
	reuse atomic.Bool
	// onRelease, when not nil, is called once the reservation is closed.
	onRelease func()

	mu sync.Mutex
	// refs counts the holders (connections in TIME-WAIT included), owner
	// whether a binding or listener is one of them; shared: SO_REUSEADDR
	// is on on the reservation.
	refs   int
	owner  bool
	shared bool
}

// ref adds a connection as a holder.
func (p *tcpPort) ref() *tcpPort {
	p.mu.Lock()
	p.refs++
	p.mu.Unlock()
	return p
}

// unref drops a connection.
func (p *tcpPort) unref() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refs--
	p.settleLocked()
}

// disown drops the binding or listener; with connect, the binding's
// holding passes to its connection (connected is true).
func (p *tcpPort) disown(connected bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.owner = false
	if !connected {
		p.refs--
	}
	p.settleLocked()
}

func (p *tcpPort) settleLocked() {
	switch {
	case p.refs == 0:
		_ = p.resv.Close()
		if p.onRelease != nil {
			p.onRelease()
		}
	case !p.owner && p.reuse.Load() && !p.shared:
		p.shared = p.resv.SetReuseAddr(true) == nil
	}
}

// reserveTCP reserves addr's port in the kernel. With reuse
// (SO_REUSEADDR), a port whose holders are all in TIME-WAIT (here, or a
// kernel socket's) is taken too; the reservation is exclusive afterwards
// either way. It binds without SO_REUSEADDR first: the kernel remembers
// the first binder's flag for the port and would let later SO_REUSEADDR
// binders share it without looking at ours again.
func (r *Ring) reserveTCP(addr netip.AddrPort, reuse bool) (*tcpPort, error) {
	network := "tcp6"
	if addr.Addr().Is4() {
		network = "tcp4"
	}
	resv, err := route.ReservePort(r.ns, network, addr)
	if err != nil && reuse && addr.Port() != 0 && errors.Is(err, unix.EADDRINUSE) {
		if resv, err = route.ReservePort(r.ns, network, addr, route.ReserveOptions{ReuseAddr: true}); err == nil {
			if err = resv.SetReuseAddr(false); err != nil {
				_ = resv.Close()
			}
		}
	}
	if err != nil {
		return nil, err
	}
	r.tcp.ports.Add(1)
	p := &tcpPort{resv: resv, refs: 1, owner: true, onRelease: func() { r.tcp.ports.Add(-1) }}
	p.reuse.Store(reuse)
	return p, nil
}

// steerTCP steers flows to the ring (all or none).
func (r *Ring) steerTCP(flows []qp.Flow) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return errRingClosed
	}
	for i, f := range flows {
		if err := r.addFlowLocked(f); err != nil {
			r.delFlowsLocked(flows[:i])
			return fmt.Errorf("steer %v: %w", f, err)
		}
	}
	return nil
}

func (r *Ring) unsteerTCP(flows []qp.Flow) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.delFlowsLocked(flows)
}

// carries reports whether steering s can carry flow f: only the XDP
// program looks into VXLAN datagrams; on the TAP path an overlay's traffic
// stays with the kernel's device. UDP and TCP flows go to every path (the
// TAP's tc filters match both).
func carries(s qp.Steering, f qp.Flow) bool {
	if f.VNI != 0 {
		_, isXDP := s.(*afxdp.Steering)
		return isXDP
	}
	return true
}

// addTCPAddrs gives the stack every address of the interface of addr's
// family (all of them for the unspecified address), as cached (fresh:
// asked of the kernel again).
func (r *Ring) addTCPAddrs(s *tcpstack.Stack, v4, fresh bool) ([]netip.Addr, error) {
	addrs, err := r.cachedAddrs(v4, fresh)
	if err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if err := s.AddAddress(a); err != nil {
			return nil, err
		}
	}
	return addrs, nil
}

// ---- bindings ----

// TCPBinding is a TCP socket bound on the ring and not yet listening or
// connecting: its address and its kernel port reservation. Listen or
// Connect take it over; Close releases an unused one.
type TCPBinding struct {
	r     *Ring
	s     *tcpstack.Stack
	local netip.AddrPort
	// dsts are the addresses a listener receives on: the bound one, or
	// every interface address of its family for the unspecified address.
	dsts []netip.Addr
	port *tcpPort
	used atomic.Bool
}

// SetReuseAddr sets SO_REUSEADDR for Listen and Connect: a listener may
// take a port whose earlier connections still wait in TIME-WAIT (a
// restarted server), a connection may leave from one (to another peer),
// and once this socket's own connections wait in TIME-WAIT, a later
// socket setting it may bind the port.
func (b *TCPBinding) SetReuseAddr(on bool) {
	b.port.reuse.Store(on)
}

// BindTCP binds addr (an address of the interface, or the unspecified
// address of a family; port 0 picks a free port) and reserves the port in
// the kernel. reuseAddr is SO_REUSEADDR: a port whose connections all wait
// in TIME-WAIT may be bound again if they set it too.
func (r *Ring) BindTCP(addr netip.AddrPort, reuseAddr bool) (*TCPBinding, error) {
	addr = unmap(addr)
	fail := func(err error) error {
		return fmt.Errorf("ring %s/%d: bind tcp %v: %w", r.cfg.Interface, r.cfg.Queue, addr, err)
	}
	if !addr.Addr().IsValid() || addr.Addr().IsMulticast() {
		return nil, fail(unix.EINVAL)
	}
	s, err := r.TCPStack()
	if err != nil {
		return nil, fail(err)
	}
	// The cached addresses first (two netlink round trips per bind
	// otherwise); a miss asks the kernel again: the notification of an
	// address just added may not have arrived yet.
	var ifAddrs []netip.Addr
	for _, fresh := range []bool{false, true} {
		if ifAddrs, err = r.addTCPAddrs(s, addr.Addr().Is4(), fresh); err != nil {
			return nil, fail(err)
		}
		if addr.Addr().IsUnspecified() && len(ifAddrs) > 0 || slices.Contains(ifAddrs, addr.Addr()) {
			break
		}
	}
	dsts := ifAddrs
	if !addr.Addr().IsUnspecified() {
		owned := false
		for _, a := range ifAddrs {
			owned = owned || a == addr.Addr()
		}
		if !owned {
			return nil, fail(fmt.Errorf("%v is not an address of %s: %w", addr.Addr(), r.cfg.Interface, unix.EADDRNOTAVAIL))
		}
		dsts = []netip.Addr{addr.Addr()}
	}
	if len(dsts) == 0 {
		return nil, fail(fmt.Errorf("%s has no %s address: %w", r.cfg.Interface, familyName(addr.Addr()), unix.EADDRNOTAVAIL))
	}
	port, err := r.reserveTCP(addr, reuseAddr)
	if err != nil {
		return nil, fail(err)
	}
	return &TCPBinding{r: r, s: s, local: unmap(port.resv.Addr()), dsts: dsts, port: port}, nil
}

// LocalAddr returns the bound address with its port.
func (b *TCPBinding) LocalAddr() netip.AddrPort { return b.local }

// Close releases the reservation of a binding that neither listened nor
// connected.
func (b *TCPBinding) Close() {
	if !b.used.Swap(true) {
		b.port.disown(false)
	}
}

func (b *TCPBinding) take() error {
	if b.used.Swap(true) {
		return fmt.Errorf("tcp %v: the binding is in use already: %w", b.local, unix.EINVAL)
	}
	return nil
}

// ---- listeners ----

// TCPListener is a TCP socket listening on the ring: its stack endpoint,
// its kernel port reservation and its 3-tuple steering entries (every
// segment to its port comes to the ring: SYNs and its connections'
// segments until they have entries of their own).
type TCPListener struct {
	r     *Ring
	l     *tcpstack.Listener
	local netip.AddrPort
	port  *tcpPort
	flows []qp.Flow
	once  sync.Once
	done  chan struct{}
}

// ListenTCP binds addr (see BindTCP) and listens with room for backlog
// connections waiting for Accept (0: 128).
func (r *Ring) ListenTCP(addr netip.AddrPort, backlog int) (*TCPListener, error) {
	b, err := r.BindTCP(addr, false)
	if err != nil {
		return nil, err
	}
	l, err := b.Listen(backlog)
	if err != nil {
		b.Close()
		return nil, err
	}
	return l, nil
}

// Listen turns the binding into a listener (0: a backlog of 128).
func (b *TCPBinding) Listen(backlog int) (*TCPListener, error) {
	r := b.r
	if err := b.take(); err != nil {
		return nil, err
	}
	if backlog <= 0 {
		backlog = 128
	}
	l := &TCPListener{r: r, local: b.local, port: b.port, done: make(chan struct{})}
	var err error
	if l.l, err = b.s.Listen(b.local, backlog, b.port.reuse.Load()); err != nil {
		b.port.disown(false)
		return nil, fmt.Errorf("ring %s/%d: listen tcp %v: %w", r.cfg.Interface, r.cfg.Queue, b.local, err)
	}
	for _, d := range b.dsts {
		l.flows = append(l.flows, qp.Flow{Proto: unix.IPPROTO_TCP, Dst: netip.AddrPortFrom(d, b.local.Port())})
	}
	if err := r.steerTCP(l.flows); err != nil {
		l.l.Close()
		b.port.disown(false)
		return nil, fmt.Errorf("ring %s/%d: listen tcp %v: %w", r.cfg.Interface, r.cfg.Queue, b.local, err)
	}
	return l, nil
}

// LocalAddr returns the address listened on, with the port.
func (l *TCPListener) LocalAddr() netip.AddrPort { return l.local }

// Addr returns the address listened on (net.Listener).
func (l *TCPListener) Addr() net.Addr { return net.TCPAddrFromAddrPort(l.local) }

// Notify calls fn whenever a connection may be waiting for AcceptTCP;
// the returned function stops it.
func (l *TCPListener) Notify(fn func()) (stop func()) {
	e := waiter.NewFunctionEntry(waiter.ReadableEvents, func(waiter.EventMask) { fn() })
	l.l.WQ.EventRegister(&e)
	return func() { l.l.WQ.EventUnregister(&e) }
}

// AcceptTCP takes one connection that completed its handshake, without
// waiting (unix.EAGAIN when none), and steers its 5-tuple to the ring, so
// it outlives the listener.
func (l *TCPListener) AcceptTCP() (*TCPConn, error) {
	select {
	case <-l.done:
		return nil, net.ErrClosed
	default:
	}
	ep, peer, err := l.l.Accept()
	if err != nil {
		return nil, err
	}
	local, _ := ep.Addrs()
	c := &TCPConn{r: l.r, ep: ep, port: l.port.ref(), local: local, peer: peer,
		flow: qp.Flow{Proto: unix.IPPROTO_TCP, Dst: local, Src: peer}}
	if err := l.r.steerTCP([]qp.Flow{c.flow}); err != nil {
		ep.EP.Abort()
		c.port.unref()
		return nil, fmt.Errorf("accept %v: %w", peer, err)
	}
	return c, nil
}

// Accept waits for a connection (net.Listener); the net.Conn's Close
// releases it like TCPConn.Close.
func (l *TCPListener) Accept() (net.Conn, error) {
	ready := make(chan struct{}, 1)
	stop := l.Notify(func() {
		select {
		case ready <- struct{}{}:
		default:
		}
	})
	defer stop()
	for {
		c, err := l.AcceptTCP()
		if !errors.Is(err, unix.EAGAIN) {
			if err != nil {
				return nil, err
			}
			return c.NetConn(), nil
		}
		select {
		case <-ready:
		case <-l.done:
			return nil, net.ErrClosed
		}
	}
}

// Close stops listening: connections not accepted yet are reset, the
// steering entries go, and the port stays reserved while accepted
// connections use it.
func (l *TCPListener) Close() error {
	l.once.Do(func() {
		close(l.done)
		l.l.Close()
		l.r.unsteerTCP(l.flows)
		l.port.disown(false)
	})
	return nil
}

// ---- connections ----

// TCPConn is one TCP connection on the ring: its stack endpoint, its
// 5-tuple steering entry and its share of the port reservation.
type TCPConn struct {
	r           *Ring
	ep          *tcpstack.Endpoint
	port        *tcpPort
	local, peer netip.AddrPort
	flow        qp.Flow
	once        sync.Once
}

// lingerMax bounds how long a closed connection keeps its steering while
// the stack finishes it (FIN handshake, retransmissions); then it is
// aborted.
const lingerMax = 2 * time.Minute

// ConnectTCP binds laddr (the unspecified address: the route's source
// address; port 0: a free port) and starts connecting to raddr (see
// TCPBinding.Connect).
func (r *Ring) ConnectTCP(ctx context.Context, laddr, raddr netip.AddrPort) (*TCPConn, error) {
	laddr, raddr = unmap(laddr), unmap(raddr)
	if !laddr.Addr().IsValid() || laddr.Addr().IsUnspecified() {
		if !raddr.Addr().IsValid() {
			return nil, fmt.Errorf("ring %s/%d: connect tcp %v: %w", r.cfg.Interface, r.cfg.Queue, raddr, unix.EINVAL)
		}
		next, err := r.res.Resolve(ctx, raddr.Addr())
		if err != nil {
			return nil, fmt.Errorf("ring %s/%d: connect tcp %v: %w: %w", r.cfg.Interface, r.cfg.Queue, raddr, err, unix.ENETUNREACH)
		}
		laddr = netip.AddrPortFrom(next.Src.Unmap(), laddr.Port())
	}
	b, err := r.BindTCP(laddr, false)
	if err != nil {
		return nil, err
	}
	c, err := b.Connect(ctx, raddr, nil)
	if err != nil {
		b.Close()
		return nil, err
	}
	return c, nil
}

// Connect starts connecting to raddr and returns at once: the 5-tuple is
// steered to the ring before the SYN leaves; the endpoint becomes writable
// when the handshake ends, and Endpoint().Err then says how it ended. A
// binding to the unspecified address connects from the route's source
// address.
// setup, when not nil, sets options on the endpoint before the SYN leaves
// (TCP_MAXSEG, buffer sizes).
func (b *TCPBinding) Connect(ctx context.Context, raddr netip.AddrPort, setup func(tcpip.Endpoint)) (_ *TCPConn, err error) {
	r := b.r
	raddr = unmap(raddr)
	fail := func(err error) error {
		return fmt.Errorf("ring %s/%d: connect tcp %v: %w", r.cfg.Interface, r.cfg.Queue, raddr, err)
	}
	if !raddr.Addr().IsValid() || raddr.Port() == 0 || raddr.Addr().IsUnspecified() || raddr.Addr().IsMulticast() {
		return nil, fail(unix.EINVAL)
	}
	if raddr.Addr().Is4() != b.local.Addr().Is4() {
		return nil, fail(unix.EAFNOSUPPORT)
	}
	local := b.local
	if local.Addr().IsUnspecified() {
		next, err := r.res.Resolve(ctx, raddr.Addr())
		if err != nil {
			return nil, fail(fmt.Errorf("%w: %w", err, unix.ENETUNREACH))
		}
		local = netip.AddrPortFrom(next.Src.Unmap(), local.Port())
	}
	if err := b.take(); err != nil {
		return nil, fail(err)
	}
	c := &TCPConn{r: r, port: b.port, local: local, peer: raddr,
		flow: qp.Flow{Proto: unix.IPPROTO_TCP, Dst: local, Src: raddr}}
	if err := r.steerTCP([]qp.Flow{c.flow}); err != nil {
		b.port.disown(false)
		return nil, fail(err)
	}
	if c.ep, err = b.s.Connect(local, raddr, b.port.reuse.Load(), setup); err != nil {
		r.unsteerTCP([]qp.Flow{c.flow})
		b.port.disown(false)
		return nil, fail(err)
	}
	b.port.disown(true)
	return c, nil
}

// DialTCP connects and waits for the handshake (or ctx).
func (r *Ring) DialTCP(ctx context.Context, laddr, raddr netip.AddrPort) (*TCPConn, error) {
	c, err := r.ConnectTCP(ctx, laddr, raddr)
	if err != nil {
		return nil, err
	}
	e, ch := waiter.NewChannelEntry(waiter.WritableEvents | waiter.EventErr | waiter.EventHUp)
	c.ep.WQ.EventRegister(&e)
	defer c.ep.WQ.EventUnregister(&e)
	for c.ep.Connecting() {
		select {
		case <-ch:
		case <-ctx.Done():
			c.Abort()
			return nil, ctx.Err()
		}
	}
	if err := c.ep.Err(); err != nil {
		c.Abort()
		return nil, fmt.Errorf("ring %s/%d: connect tcp %v: %w", r.cfg.Interface, r.cfg.Queue, c.peer, err)
	}
	return c, nil
}

// Endpoint returns the connection's stack endpoint.
func (c *TCPConn) Endpoint() *tcpstack.Endpoint { return c.ep }

// LocalAddr and RemoteAddr return the connection's addresses.
func (c *TCPConn) LocalAddr() netip.AddrPort  { return c.local }
func (c *TCPConn) RemoteAddr() netip.AddrPort { return c.peer }

// NetConn returns the connection as a net.Conn (gVisor's gonet adapter)
// whose Close is c.Close.
func (c *TCPConn) NetConn() net.Conn { return &netConn{TCPConn: c.ep.Conn(), c: c} }

type netConn struct {
	*gonet.TCPConn
	c *TCPConn
}

func (n *netConn) Close() error { return n.c.Close() }

// Close closes the connection the orderly way (FIN after the queued data)
// and releases its steering and port once the stack is done with it, in
// the background.
func (c *TCPConn) Close() error {
	c.once.Do(func() {
		c.ep.EP.Close()
		go c.reap()
	})
	return nil
}

// Abort resets the connection (RST) and releases it.
func (c *TCPConn) Abort() {
	c.once.Do(func() {
		c.ep.EP.Abort()
		go c.reap()
	})
}

// reap waits until the stack finished the connection, then releases its
// steering entry and port.
func (c *TCPConn) reap() {
	deadline := time.Now().Add(lingerMax)
	for !c.ep.Finished() {
		if time.Now().After(deadline) {
			c.r.log.Debug("tcp connection lingered too long; aborted", zap.Stringer("local", c.local), zap.Stringer("peer", c.peer))
			c.ep.EP.Abort()
			break
		}
		select {
		case <-c.r.done:
			deadline = time.Time{}
		case <-time.After(20 * time.Millisecond):
		}
	}
	c.SetQuickAckThreshold(0)
	c.SetPacing(nil)
	// The kernel keeps the port while the stack holds the connection on
	// it, TIME-WAIT included (see tcpPort). Segments the peer had in
	// flight when the connection ended (after a reset, a whole window of
	// them) still arrive for a while: while the flow is steered the stack
	// answers them; unsteered, they reach the kernel, which answers with
	// resets of its own and counts them (in TIME-WAIT, only a
	// retransmitted FIN can come: the peer's LAST-ACK then ends on the
	// reset). Flow entries are counted, so a new connection with the same
	// addresses keeps its own.
	if c.ep.TimeWait() {
		c.holdTimeWait()
	} else {
		c.port.unref()
	}
	select {
	case <-c.r.done:
	case <-time.After(straggleTime):
	}
	c.r.unsteerTCP([]qp.Flow{c.flow})
}

// holdTimeWait gives the connection's share of the port back when its
// TIME-WAIT ends, without a goroutine meanwhile: the stack notifies the
// endpoint's waiters then (the timer expired, or the stack closed); a
// slow timer looks again in case no notification comes (TIME-WAIT is
// extended by segments that arrive in it).
func (c *TCPConn) holdTimeWait() {
	var (
		once  sync.Once
		entry waiter.Entry
		timer *time.Timer
	)
	release := func() {
		once.Do(func() {
			c.ep.WQ.EventUnregister(&entry)
			timer.Stop()
			c.port.unref()
		})
	}
	timer = time.AfterFunc(c.r.tcpTimeWait()+time.Second, func() {
		if c.ep.TimeWait() {
			timer.Reset(timeWaitRecheck)
			return
		}
		release()
	})
	// Notify holds the queue's lock while it calls back: unregister
	// from another goroutine.
	entry = waiter.NewFunctionEntry(waiter.EventHUp|waiter.EventErr, func(waiter.EventMask) {
		if !c.ep.TimeWait() {
			go release()
		}
	})
	c.ep.WQ.EventRegister(&entry)
	if !c.ep.TimeWait() {
		release()
	}
}

// timeWaitRecheck is how often a connection whose TIME-WAIT outlasted the
// stack's timeout (extended by a segment) is looked at again.
const timeWaitRecheck = 5 * time.Second

// tcpTimeWait is how long the ring's stack keeps a connection in
// TIME-WAIT.
func (r *Ring) tcpTimeWait() time.Duration {
	if s := r.tcp.stack.Load(); s != nil {
		return s.TimeWaitTimeout()
	}
	return 0
}

// straggleTime is how long a finished connection's flow stays steered to
// the ring: a few round trips of a LAN or a loaded host.
const straggleTime = 500 * time.Millisecond
