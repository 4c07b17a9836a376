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
	out [][]byte

	stats linkStats
}

// dispatcher boxes the interface so it fits an atomic.Pointer.
type dispatcher struct{ d stack.NetworkDispatcher }

var _ stack.LinkEndpoint = (*link)(nil)

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
		l.out = append(l.out, b[:off])
		l.stats.TXPackets.Add(1)
	}
	queued := len(l.out) > 0
	l.mu.Unlock()
	if wasEmpty && queued {
		l.wake()
	}
	return n, nil
}

// bufPool recycles outbound packet buffers (MTU-sized, larger ones are
// allocated and dropped).
var bufPool = sync.Pool{New: func() any { b := make([]byte, poolBufSize); return &b }}

const poolBufSize = 4096

func getBuf(n int) []byte {
	if n > poolBufSize {
		return make([]byte, n)
	}
	return (*bufPool.Get().(*[]byte))[:n]
}

func putBuf(b []byte) {
	if cap(b) != poolBufSize {
		return
	}
	b = b[:poolBufSize]
	bufPool.Put(&b)
}
