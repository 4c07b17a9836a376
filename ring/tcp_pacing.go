package ring

// Pacing of TCP connections (SO_MAX_PACING_RATE on a stream socket). The
// stack's outbound queue is shared by all of the ring's connections, so a
// paced connection's packets cannot wait there: the engine moves them into
// a queue of the connection's own and sends them frame by frame at the
// connection's departure times (the same GCRA pacer as a UDP endpoint's,
// charged with each frame's wire bytes, so a 64 KiB TSO packet is spread
// out, not sent as a burst). Unpaced connections never wait behind paced
// ones, and pure ACKs are not paced. The queue holds what the stack counts
// as in flight, so it is bounded by the connection's send buffer, which
// the daemon bounds while the connection is paced (PacedSendBuffer).

import (
	"time"

	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/ring/tcpstack"
)

// PacedSendBuffer is the send buffer for a connection paced at r: what the
// rate sends in pacedQueueTime, within [pacedSendBufferMin,
// pacedSendBufferMax]. Without a bound, TCP's window, and gVisor's send
// buffer tuned to it, fill the engine's queue: at 10 Mbit/s that measured
// half a second of queue, an RTT and a retransmission timeout (3 s) to
// match, and a stall of seconds when the queue was released at once and a
// burst was lost. Linux avoids this with TCP small queues (the stack keeps
// what the pacer has not sent); here the stack cannot hold it back, so its
// send buffer does: the queue adds at most about pacedQueueTime to the
// RTT.
func PacedSendBuffer(r pacing.Rate) int {
	b := int64(r.Kbps) * 125 * int64(pacedQueueTime) / int64(time.Second)
	return int(min(max(b, pacedSendBufferMin), pacedSendBufferMax))
}

const (
	// pacedQueueTime leaves the client time to refill the send buffer
	// (gVisor wakes writers when half of it is free) before the queue
	// runs dry on a loaded machine.
	pacedQueueTime     = 200 * time.Millisecond
	pacedSendBufferMin = 32 << 10
	pacedSendBufferMax = 4 << 20 // gVisor's largest send buffer
)

// tcpPaced is one paced connection's state, engine-owned.
type tcpPaced struct {
	// applied is the rate (nil: no longer paced; the queue drains at
	// once and the state goes).
	applied *pacing.Rate
	pacer   pacing.Pacer
	// q holds the connection's packets, oldest first; frame is the next
	// frame of q[0] to send.
	q     []tcpstack.Packet
	frame int
	// waiting: the head frame waits for its departure (counted once).
	waiting bool
}

// tcpPaceState is the engine's TCP pacing.
type tcpPaceState struct {
	gen   uint64
	conns map[tcpFlowKey]*tcpPaced
	// next is the earliest departure of a queued frame (0: none).
	next int64
}

// SetPacing paces the connection's transmissions at r from its next packet
// on; nil removes pacing. As for Endpoint.SetPacing, the rate table is the
// caller's business.
func (c *TCPConn) SetPacing(r *pacing.Rate) {
	var rc *pacing.Rate
	if r != nil && r.Kbps != 0 {
		v := *r
		rc = &v
	}
	if c.r.tcp.pace.set(tcpFlowKey{c.local, c.peer}, rc, rc == nil) {
		_ = c.r.doorbell.Wake()
	}
}

// tcpPaceSync applies the rate changes made since the last pass.
func (e *engine) tcpPaceSync() {
	ps := &e.tcpPace
	applyRequests(&e.r.tcp.pace, &ps.gen, &ps.conns, func(pc *tcpPaced, r *pacing.Rate) {
		if pc.applied == nil || *pc.applied != *r {
			pc.applied = r
			pc.pacer.Set(*r, e.monotonic())
		}
	}, func(pc *tcpPaced) { pc.applied = nil })
}

// tcpPacedConn returns the paced connection of a packet whose headers are
// sg (nil: none, or one no longer paced whose queue is empty). Pure ACKs are not paced (as
// Linux's fq does not pace them): queued behind the connection's data they
// would slow the peer's sending, and they carry no payload to pace.
func (e *engine) tcpPacedConn(sg tcpSegment) *tcpPaced {
	if len(e.tcpPace.conns) == 0 || sg.payload == 0 && sg.flags == tcpFlagACK {
		return nil
	}
	pc := e.tcpPace.conns[tcpFlowKey{sg.local, sg.remote}]
	if pc == nil || pc.applied == nil && len(pc.q) == 0 {
		return nil
	}
	return pc
}

// tcpPaceSend sends the paced connections' frames whose departure time has
// come (all of a connection's queue once it is no longer paced) and notes
// the next departure. It returns how many frames it sent: the engine's
// work, so it does not idle between the frames of a large packet.
func (e *engine) tcpPaceSend() (int, error) {
	ps := &e.tcpPace
	ps.next = 0
	n := 0
	for k, pc := range ps.conns {
	queue:
		for len(pc.q) > 0 {
			p := &pc.q[0]
			to := p.Frames()
			wire := 0
			if pc.applied != nil {
				to = pc.frame + 1
				wire = 14 + p.FrameLen(pc.frame)
				e.now = e.monotonic()
				due := pc.pacer.Due(wire)
				if due > e.now {
					if ps.next == 0 || due < ps.next {
						ps.next = due
					}
					if !pc.waiting {
						pc.waiting = true
						e.r.stats.TXPaceWaits.Add(1)
					}
					break
				}
				if pc.waiting && e.now-due > pc.pacer.BurstNs() {
					e.r.stats.TXPaceLate.Add(1) // it waited, and the engine woke too late
				}
			}
			d, v := e.tcpDest(p)
			switch {
			case d == nil && v == tcpstack.Stop:
				break queue // next hop being resolved: it wakes the engine
			case d != nil:
				sent, err := e.tcpFrames(p, d, pc.frame, to)
				if err != nil || !sent {
					// Out of send buffers or batch room: due now, so the
					// engine keeps going (completions free buffers)
					// rather than sleeping past the departure.
					ps.next = e.monotonic()
					return n, err
				}
				n += to - pc.frame
				if pc.applied != nil {
					pc.waiting = false
					pc.pacer.Charge(e.now, wire)
					e.r.stats.TXPaced.Add(1)
				}
				pc.frame = to
				if pc.frame < p.Frames() {
					continue
				}
			}
			p.Release()
			pc.q, pc.frame = pc.q[1:], 0
		}
		if pc.applied == nil && len(pc.q) == 0 {
			delete(ps.conns, k)
		}
	}
	return n, nil
}
