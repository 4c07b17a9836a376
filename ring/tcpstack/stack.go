package tcpstack

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"gvisor.dev/gvisor/pkg/buffer"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv6"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// nicID is the stack's only interface: the ring.
const nicID tcpip.NICID = 1

// maxOutbound bounds the packets the stack may queue for the engine; more
// are dropped (and counted), as a full NIC queue drops, and TCP sends them
// again.
const maxOutbound = 8192

// Config describes a ring's stack.
type Config struct {
	// MTU is the interface's MTU; the stack's MSS follows from it.
	MTU int
	// Wake is called when the stack queued outbound packets while the
	// queue was empty: the engine should drain it (ring its doorbell).
	Wake func()
	// CongestionControl is "cubic" (the default) or "reno". gVisor
	// before 2026-08 could set CUBIC's congestion window to 0 for good
	// after a retransmission timeout (an ACK could lower cwnd below 1);
	// the module in go.mod bounds the target at cwnd (RFC 9438 4.2).
	// TestTCPLoss at 5% loss is the regression test.
	CongestionControl string
	// TimeWait is how long a closed connection stays in TIME-WAIT (0:
	// gVisor's default, 60 s, as Linux).
	TimeWait time.Duration
	// Log receives the stack's rare events (nil: none).
	Log *zap.Logger
}

// Stack is one ring's TCP/IP stack.
type Stack struct {
	cfg  Config
	s    *stack.Stack
	link *link

	mu    sync.Mutex
	addrs map[netip.Addr]bool

	// pend and pendOff are the engine's batch of outbound packets being
	// sent (engine-owned; see Outbound).
	pend    []Packet
	pendOff int
}

// New creates a stack with no addresses yet (AddAddress).
func New(cfg Config) (*Stack, error) {
	if cfg.MTU < 576 {
		return nil, fmt.Errorf("tcpstack: MTU %d is too small for TCP (at least 576)", cfg.MTU)
	}
	if cfg.CongestionControl == "" {
		cfg.CongestionControl = "cubic"
	}
	if cfg.Log == nil {
		cfg.Log = zap.NewNop()
	}
	if cfg.Wake == nil {
		cfg.Wake = func() {}
	}
	s := stack.New(stack.Options{
		NetworkProtocols: []stack.NetworkProtocolFactory{ipv4.NewProtocol,
			// No duplicate address detection: the kernel owns the
			// addresses and did it already.
			ipv6.NewProtocolWithOptions(ipv6.Options{DADConfigs: stack.DADConfigurations{DupAddrDetectTransmits: 0}})},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocolCUBIC},
	})
	st := &Stack{cfg: cfg, s: s, addrs: map[netip.Addr]bool{}}
	st.link = &link{mtu: uint32(cfg.MTU), wake: cfg.Wake}
	opts := []tcpip.SettableTransportProtocolOption{
		ptr(tcpip.TCPSACKEnabled(true)),
		ptr(tcpip.TCPRACKLossDetection),
		ptr(tcpip.CongestionControlOption(cfg.CongestionControl)),
		ptr(tcpip.TCPModerateReceiveBufferOption(true)),
	}
	if cfg.TimeWait > 0 {
		opts = append(opts, ptr(tcpip.TCPTimeWaitTimeoutOption(cfg.TimeWait)))
	}
	for _, o := range opts {
		if err := s.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			s.Close()
			return nil, fmt.Errorf("tcpstack: set %T: %s", o, err)
		}
	}
	if err := s.CreateNIC(nicID, st.link); err != nil {
		s.Close()
		return nil, fmt.Errorf("tcpstack: create interface: %s", err)
	}
	// Every destination is on-link for the stack: the engine resolves
	// the real next hop with the kernel's tables.
	s.SetRouteTable([]tcpip.Route{
		{Destination: header.IPv4EmptySubnet, NIC: nicID},
		{Destination: header.IPv6EmptySubnet, NIC: nicID},
	})
	return st, nil
}

func ptr[T any](v T) *T { return &v }

// AddAddress makes the stack accept and send from addr (an address of the
// ring's interface). Adding an address twice is a no-op.
func (s *Stack) AddAddress(addr netip.Addr) error {
	addr = addr.Unmap()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.addrs[addr] {
		return nil
	}
	pa := tcpip.ProtocolAddress{Protocol: netProto(addr), AddressWithPrefix: tcpAddr(addr).WithPrefix()}
	if err := s.s.AddProtocolAddress(nicID, pa, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("tcpstack: add address %v: %s", addr, err)
	}
	s.addrs[addr] = true
	return nil
}

// TimeWaitTimeout is how long a connection stays in TIME-WAIT (gVisor's
// default, 60 s, as Linux's).
func (s *Stack) TimeWaitTimeout() time.Duration {
	var tw tcpip.TCPTimeWaitTimeoutOption
	if err := s.s.TransportProtocolOption(tcp.ProtocolNumber, &tw); err != nil {
		return tcp.DefaultTCPTimeWaitTimeout
	}
	return time.Duration(tw)
}

// Close stops the stack: every connection is aborted (its peer gets a
// reset once the engine sends what is queued) and its goroutines end.
func (s *Stack) Close() {
	s.s.Close()
	s.s.Wait()
}

// Deliver hands the stack one received IP packet (IPv4 or IPv6, without
// the link header). It copies the packet; the caller keeps its buffer.
func (s *Stack) Deliver(ip []byte) {
	if len(ip) == 0 {
		return
	}
	var proto tcpip.NetworkProtocolNumber
	switch ip[0] >> 4 {
	case 4:
		proto = ipv4.ProtocolNumber
	case 6:
		proto = ipv6.ProtocolNumber
	default:
		s.link.stats.RXDropped.Add(1)
		return
	}
	d := s.link.dispatcher()
	if d == nil {
		s.link.stats.RXDropped.Add(1)
		return
	}
	pkt := stack.NewPacketBuffer(stack.PacketBufferOptions{Payload: buffer.MakeWithData(ip)})
	s.link.stats.RXPackets.Add(1)
	d.DeliverNetworkPacket(proto, pkt)
	pkt.DecRef()
}

// Verdict is what the engine did with an outbound packet.
type Verdict int

const (
	// Sent: the packet's frames are built; its buffer is reused.
	Sent Verdict = iota
	// Stop: the packet stays queued and is offered first next time.
	Stop
	// Held: the engine keeps the packet (a paced connection's queue) and
	// calls Release when done with it.
	Held
)

// Release returns the buffer of a packet the engine held.
func (p *Packet) Release() {
	putBuf(p.IP)
	*p = Packet{}
}

// Outbound offers the stack's queued outbound IP packets to send, oldest
// first, until send answers Stop. A packet may have to become several
// frames (Packet.Frames). It returns how many packets were taken. Engine
// thread only.
func (s *Stack) Outbound(send func(p *Packet) Verdict) int {
	if s.pendOff == len(s.pend) {
		l := s.link
		l.mu.Lock()
		s.pend, l.out = l.out, s.pend[:0]
		l.mu.Unlock()
		s.pendOff = 0
	}
	n := 0
	for s.pendOff < len(s.pend) {
		p := &s.pend[s.pendOff]
		v := send(p)
		if v == Stop {
			break
		}
		if v == Sent {
			putBuf(p.IP)
		}
		*p = Packet{}
		s.pendOff++
		n++
	}
	return n
}

// OutboundPending reports whether packets wait in the outbound queue.
// Engine thread only.
func (s *Stack) OutboundPending() bool {
	if s.pendOff < len(s.pend) {
		return true
	}
	l := s.link
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.out) > 0
}

// Destination returns the destination address of an outbound IP packet.
func Destination(ip []byte) (netip.Addr, error) {
	switch {
	case len(ip) >= header.IPv4MinimumSize && ip[0]>>4 == 4:
		return netip.AddrFrom4([4]byte(ip[16:20])), nil
	case len(ip) >= header.IPv6MinimumSize && ip[0]>>4 == 6:
		return netip.AddrFrom16([16]byte(ip[24:40])), nil
	}
	return netip.Addr{}, errors.New("tcpstack: not an IP packet")
}

// Flow returns the addresses of an outbound TCP packet: the local
// (source) and remote (destination) ends.
func Flow(ip []byte) (local, remote netip.AddrPort, ok bool) {
	var src, dst netip.Addr
	off := 0
	switch {
	case len(ip) >= header.IPv4MinimumSize && ip[0]>>4 == 4:
		src, dst = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
		off = int(ip[0]&0xf) * 4
	case len(ip) >= header.IPv6MinimumSize && ip[0]>>4 == 6:
		src, dst = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40]))
		off = header.IPv6MinimumSize
	default:
		return local, remote, false
	}
	if len(ip) < off+4 {
		return local, remote, false
	}
	sp, dp := uint16(ip[off])<<8|uint16(ip[off+1]), uint16(ip[off+2])<<8|uint16(ip[off+3])
	return netip.AddrPortFrom(src, sp), netip.AddrPortFrom(dst, dp), true
}

func netProto(a netip.Addr) tcpip.NetworkProtocolNumber {
	if a.Is4() {
		return ipv4.ProtocolNumber
	}
	return ipv6.ProtocolNumber
}

func tcpAddr(a netip.Addr) tcpip.Address {
	if a.Is4() {
		return tcpip.AddrFrom4(a.As4())
	}
	return tcpip.AddrFrom16(a.As16())
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	fa := tcpip.FullAddress{NIC: nicID, Port: ap.Port()}
	if a := ap.Addr().Unmap(); a.IsValid() && !a.IsUnspecified() {
		fa.Addr = tcpAddr(a)
	}
	return fa
}

func addrPort(fa tcpip.FullAddress) netip.AddrPort {
	a, _ := netip.AddrFromSlice(fa.Addr.AsSlice())
	return netip.AddrPortFrom(a.Unmap(), fa.Port)
}

// Stats are a stack's counters: the link's, and gVisor's TCP ones.
type Stats struct {
	// RXPackets are IP packets the engine delivered, RXDropped those
	// the stack could not take; TXPackets are packets the stack queued
	// for the engine, TXDropped those dropped because the queue was
	// full, TXNotTCP non-TCP packets the stack tried to send (dropped);
	// TXTSOPackets are large packets (part of TXPackets) the engine
	// cuts into frames, TXTSOFrames the frames they become.
	RXPackets, RXDropped, TXPackets, TXDropped, TXNotTCP uint64
	TXTSOPackets, TXTSOFrames                            uint64
	// From gVisor: connections opened actively (connect) and passively
	// (accept), currently established, failed attempts, resets sent
	// and received, retransmitted segments, fast retransmits, timeouts
	// (RTO), SACK and TLP recoveries, segments sent and received,
	// segments received and dropped as invalid (a malformed header;
	// malformed options are skipped, as Linux skips them) and, apart,
	// for a wrong checksum, SYN cookies sent because a listener's SYN queue was full,
	// and SYNs or handshake ACKs dropped because its accept queue was.
	ActiveOpens, PassiveOpens, Established, FailedAttempts   uint64
	ResetsSent, ResetsReceived, Retransmits, FastRetransmits uint64
	Timeouts, SACKRecovery, TLPRecovery                      uint64
	SegmentsSent, SegmentsReceived, ChecksumErrors           uint64
	InvalidSegments, SynCookiesSent, ListenOverflows         uint64
}

// Stats returns the stack's counters now.
func (s *Stack) Stats() Stats {
	l := &s.link.stats
	t := s.s.Stats().TCP
	return Stats{
		RXPackets: l.RXPackets.Load(), RXDropped: l.RXDropped.Load(), TXPackets: l.TXPackets.Load(),
		TXDropped: l.TXDropped.Load(), TXNotTCP: l.TXNotTCP.Load(),
		TXTSOPackets: l.TXTSOPackets.Load(), TXTSOFrames: l.TXTSOFrames.Load(),
		ActiveOpens: t.ActiveConnectionOpenings.Value(), PassiveOpens: t.PassiveConnectionOpenings.Value(),
		Established: t.CurrentEstablished.Value(), FailedAttempts: t.FailedConnectionAttempts.Value(),
		ResetsSent: t.ResetsSent.Value(), ResetsReceived: t.ResetsReceived.Value(),
		Retransmits: t.Retransmits.Value(), FastRetransmits: t.FastRetransmit.Value(),
		Timeouts: t.Timeouts.Value(), SACKRecovery: t.SACKRecovery.Value(), TLPRecovery: t.TLPRecovery.Value(),
		SegmentsSent: t.SegmentsSent.Value(), SegmentsReceived: t.ValidSegmentsReceived.Value(),
		ChecksumErrors: t.ChecksumErrors.Value(), InvalidSegments: t.InvalidSegmentsReceived.Value(),
		SynCookiesSent:  t.ListenOverflowSynCookieSent.Value(),
		ListenOverflows: t.ListenOverflowSynDrop.Value() + t.ListenOverflowAckDrop.Value(),
	}
}

// linkStats are the link endpoint's counters.
type linkStats struct {
	RXPackets, RXDropped, TXPackets, TXDropped, TXNotTCP atomic.Uint64
	TXTSOPackets, TXTSOFrames                            atomic.Uint64
}

// ConnInfo describes one connection of the stack (bypassctl's
// connections topic).
type ConnInfo struct {
	Local, Remote netip.AddrPort
	// State is the TCP state ("ESTABLISHED", "CLOSE-WAIT", ...).
	State string
	// RTT and RTTVar are the smoothed round-trip time and its variation,
	// RTO the retransmission timeout; Cwnd and Ssthresh are in segments.
	RTT, RTTVar, RTO time.Duration
	Cwnd, Ssthresh   uint32
	// Retransmits are segments sent again, Timeouts retransmission
	// timer expiries; SegmentsSent and SegmentsReceived count every
	// segment of the connection.
	Retransmits, Timeouts, SegmentsSent, SegmentsReceived uint64
	// SendQueued and RecvQueued are bytes in the send and receive
	// buffers.
	SendQueued, RecvQueued int
}

// Info describes the connection now.
func (e *Endpoint) Info() ConnInfo {
	var ti tcpip.TCPInfoOption
	_ = e.EP.GetSockOpt(&ti)
	ci := ConnInfo{State: tcp.EndpointState(e.EP.State()).String(), RTT: ti.RTT, RTTVar: ti.RTTVar, RTO: ti.RTO,
		Cwnd: ti.SndCwnd, Ssthresh: ti.SndSsthresh}
	ci.Local, ci.Remote = e.Addrs()
	ci.SendQueued, _ = e.EP.GetSockOptInt(tcpip.SendQueueSizeOption)
	ci.RecvQueued, _ = e.EP.GetSockOptInt(tcpip.ReceiveQueueSizeOption)
	// gVisor answers -1 where a queue does not apply (a closed endpoint).
	ci.SendQueued, ci.RecvQueued = max(ci.SendQueued, 0), max(ci.RecvQueued, 0)
	if st, ok := e.EP.Stats().(*tcp.Stats); ok {
		ci.Retransmits = st.SendErrors.Retransmits.Value()
		ci.Timeouts = st.SendErrors.Timeouts.Value()
		ci.SegmentsSent = st.SegmentsSent.Value()
		ci.SegmentsReceived = st.SegmentsReceived.Value()
	}
	return ci
}

// Connections lists the stack's connections (listeners excluded),
// including those no client holds any more (closing, or established and
// not accepted yet).
func (s *Stack) Connections() []ConnInfo {
	var out []ConnInfo
	for _, te := range s.s.RegisteredEndpoints() {
		ep, ok := te.(*tcp.Endpoint)
		if !ok || tcp.EndpointState(ep.State()) == tcp.StateListen {
			continue
		}
		out = append(out, (&Endpoint{EP: ep}).Info())
	}
	return out
}
