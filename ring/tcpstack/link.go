package tcpstack

import (
	"sync"
	"sync/atomic"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// link is the stack's link endpoint: IP packets in from the engine
// (Stack.Deliver), IP packets out to a queue the engine drains
// (Stack.Outbound).
type link struct {
	mtu  uint32
	wake func()
	disp atomic.Pointer[dispatcher]

	mu sync.Mutex
	// out holds serialized outbound packets, oldest first.
	out []Packet

	stats linkStats
}

// dispatcher boxes the interface so it fits an atomic.Pointer.
type dispatcher struct{ d stack.NetworkDispatcher }

var (
	_ stack.LinkEndpoint = (*link)(nil)
	_ stack.GSOEndpoint  = (*link)(nil)
)

// SupportedGSO makes the stack hand the link TCP segments of up to
// GSOMaxSize with the checksum left to it (segment.go).
func (l *link) SupportedGSO() stack.SupportedGSO { return stack.HostGSOSupported }

// GSOMaxSize bounds a large packet to 64 KiB and to maxTSOFrames frames.
func (l *link) GSOMaxSize() uint32 {
	return min(65535, maxTSOFrames*(l.mtu-40))
}

func (l *link) dispatcher() stack.NetworkDispatcher {
	if p := l.disp.Load(); p != nil {
		return p.d
	}
	return nil
}

func (l *link) MTU() uint32                                  { return l.mtu }
func (l *link) SetMTU(mtu uint32)                            { l.mtu = mtu }
func (l *link) MaxHeaderLength() uint16                      { return 0 }
func (l *link) LinkAddress() tcpip.LinkAddress               { return "" }
func (l *link) SetLinkAddress(tcpip.LinkAddress)             {}
func (l *link) Capabilities() stack.LinkEndpointCapabilities { return 0 }
func (l *link) Wait()                                        {}
func (l *link) ARPHardwareType() header.ARPHardwareType      { return header.ARPHardwareNone }
func (l *link) AddHeader(*stack.PacketBuffer)                {}
func (l *link) ParseHeader(*stack.PacketBuffer) bool         { return true }
func (l *link) Close()                                       {}
func (l *link) SetOnCloseAction(func())                      {}
func (l *link) IsAttached() bool                             { return l.disp.Load() != nil }

func (l *link) Attach(d stack.NetworkDispatcher) {
	if d == nil {
		l.disp.Store(nil)
		return
	}
	l.disp.Store(&dispatcher{d})
}

// WritePackets queues the stack's packets for the engine. Only TCP leaves:
// the stack has no business sending anything else on the ring.
func (l *link) WritePackets(pkts stack.PacketBufferList) (int, tcpip.Error) {
	n := 0
	l.mu.Lock()
	wasEmpty := len(l.out) == 0
	for _, pkt := range pkts.AsSlice() {
		n++
		if pkt.TransportProtocolNumber != tcp.ProtocolNumber {
			l.stats.TXNotTCP.Add(1)
			continue
		}
		if len(l.out) >= maxOutbound {
			l.stats.TXDropped.Add(1)
			continue
		}
		b := getBuf(pkt.Size())
		off := 0
		for _, s := range pkt.AsSlices() {
			off += copy(b[off:], s)
		}
		mss, csum := 0, false
		if g := pkt.GSOOptions; g.Type == stack.GSOTCPv4 || g.Type == stack.GSOTCPv6 {
			mss, csum = int(g.MSS), g.NeedsCsum
		}
		p := newPacket(b[:off], mss, csum)
		if n := p.Frames(); n > 1 {
			l.stats.TXTSOPackets.Add(1)
			l.stats.TXTSOFrames.Add(uint64(n))
		}
		l.out = append(l.out, p)
		l.stats.TXPackets.Add(1)
	}
	queued := len(l.out) > 0
	l.mu.Unlock()
	if wasEmpty && queued {
		l.wake()
	}
	return n, nil
}

// bufPool and bigPool recycle outbound packet buffers: frame-sized ones,
// and 64 KiB ones for large (TSO) packets; larger ones are allocated and
// dropped.
var (
	bufPool = sync.Pool{New: func() any { b := make([]byte, poolBufSize); return &b }}
	bigPool = sync.Pool{New: func() any { b := make([]byte, bigBufSize); return &b }}
)

const (
	poolBufSize = 4096
	bigBufSize  = 64 << 10
)

func getBuf(n int) []byte {
	switch {
	case n <= poolBufSize:
		return (*bufPool.Get().(*[]byte))[:n]
	case n <= bigBufSize:
		return (*bigPool.Get().(*[]byte))[:n]
	}
	return make([]byte, n)
}

func putBuf(b []byte) {
	switch cap(b) {
	case poolBufSize:
		b = b[:poolBufSize]
		bufPool.Put(&b)
	case bigBufSize:
		b = b[:bigBufSize]
		bigPool.Put(&b)
	}
}
