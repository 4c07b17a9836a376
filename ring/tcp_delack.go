package ring

// The TCP_QUICKACK threshold (VMA's semantics): on a connection with
// TCP_QUICKACK on and a threshold set, segments whose payload exceeds the
// threshold are acknowledged the delayed way, the others at once. gVisor
// acknowledges every batch of segments at once, so the delay is the
// engine's: the stack's pure ACK that answers a single large segment waits
// up to delackTimeout, and any later packet of the connection (data, or
// the ACK of a second large segment: every other full segment is
// acknowledged at once, as RFC 1122 asks) carries a newer acknowledgement
// and replaces it.

import (
	"encoding/binary"
	"net/netip"
	"time"

	"github.com/bypassd/bypassd/ring/tcpstack"
)

// delackTimeout is how long an ACK may wait: Linux's minimum delayed-ACK
// timeout (TCP_DELACK_MIN).
const delackTimeout = 40 * time.Millisecond

// delackConn is one connection's delayed-ACK state, engine-owned.
type delackConn struct {
	threshold int
	// large counts segments over the threshold received since the
	// connection last sent an ACK.
	large int
	// held is the ACK being delayed (IP nil: none), due at deadline.
	held     tcpstack.Packet
	deadline int64
}

// delackState is the engine's delayed ACKs.
type delackState struct {
	gen   uint64
	conns map[tcpFlowKey]*delackConn
	// next is the earliest deadline of a held ACK (0: none).
	next int64
	// dirty: a connection lost its threshold; the next flush sends its
	// held ACK and forgets it.
	dirty bool
}

// SetQuickAckThreshold delays the ACKs of received segments with more than
// n bytes of payload (0: every ACK leaves at once, the stack's way). The
// daemon sets it on connections with TCP_QUICKACK on when
// BYPASSD_TCP_QUICKACK_THRESHOLD is set.
func (c *TCPConn) SetQuickAckThreshold(n int) {
	if c.r.tcp.delack.set(tcpFlowKey{c.local, c.peer}, n, n <= 0) {
		_ = c.r.doorbell.Wake()
	}
}

// delackSync applies the threshold changes made since the last pass; a
// connection that loses its threshold sends its held ACK.
func (e *engine) delackSync() {
	ds := &e.delack
	applyRequests(&e.r.tcp.delack, &ds.gen, &ds.conns, func(dc *delackConn, n int) { dc.threshold = n }, func(dc *delackConn) {
		dc.threshold = 0
		dc.deadline = 0 // flushed at once
		ds.dirty = true
	})
}

// delackReceived notes the payload of a segment the stack is about to
// receive (ip: the IP packet).
func (e *engine) delackReceived(ip []byte) {
	sg, ok := parseTCPSegment(ip, true)
	if !ok || sg.payload == 0 {
		return
	}
	dc := e.delack.conns[tcpFlowKey{sg.local, sg.remote}]
	if dc == nil || dc.threshold == 0 {
		return
	}
	if sg.payload > dc.threshold {
		dc.large++
	} else {
		dc.large = 0 // a small segment: its ACK leaves at once
	}
}

// delackOutbound holds p (its headers parsed: sg) if it is the pure ACK
// of a single large segment; any other packet of the connection replaces
// a held ACK. held reports that the engine kept p.
func (e *engine) delackOutbound(p *tcpstack.Packet, sg tcpSegment) (held bool) {
	dc := e.delack.conns[tcpFlowKey{sg.local, sg.remote}]
	if dc == nil {
		return false
	}
	if dc.held.IP != nil {
		dc.held.Release() // p acknowledges as much, or more
	}
	// An ACK with SACK blocks reports a hole (data out of order): it
	// leaves at once, as Linux's would, so the peer's loss recovery is
	// not slowed.
	if dc.threshold > 0 && dc.large == 1 && sg.payload == 0 && sg.flags == tcpFlagACK && !sg.sack {
		dc.held = *p
		dc.deadline = e.monotonic() + int64(delackTimeout)
		if e.delack.next == 0 || dc.deadline < e.delack.next {
			e.delack.next = dc.deadline
		}
		e.r.stats.TCPDelayedAcks.Add(1)
		return true
	}
	dc.large = 0
	return false
}

// delackFlush sends the held ACKs whose deadline passed, forgets the
// connections without a threshold, and notes the next deadline. It walks
// the connections only when a deadline passed or one lost its threshold,
// not on every pass of the engine.
func (e *engine) delackFlush() error {
	ds := &e.delack
	now := e.monotonic()
	if !ds.dirty && (ds.next == 0 || ds.next > now) {
		return nil
	}
	ds.dirty = false
	ds.next = 0
	for k, dc := range ds.conns {
		if dc.held.IP != nil {
			if dc.deadline > now {
				if ds.next == 0 || dc.deadline < ds.next {
					ds.next = dc.deadline
				}
				continue
			}
			d, v := e.tcpDest(&dc.held)
			if d == nil && v == tcpstack.Stop {
				// Next hop being resolved: the answer wakes the
				// engine, and the next pass tries again.
				ds.dirty = true
				continue
			}
			if d != nil {
				sent, err := e.tcpFrames(&dc.held, d, 0, 1)
				if err != nil || !sent {
					ds.dirty = true // out of send buffers: completions wake the engine
					return err
				}
			}
			dc.held.Release()
			dc.large = 0
		}
		if dc.threshold == 0 {
			delete(ds.conns, k)
		}
	}
	return nil
}

// tcpFlagACK is the flags byte of a pure ACK.
const tcpFlagACK = 0x10

// tcpSegment is what the delayed ACKs read of a TCP segment.
type tcpSegment struct {
	// local and remote are the connection's ends.
	local, remote netip.AddrPort
	payload       int
	flags         byte
	// sack: the segment carries SACK blocks (option 5).
	sack bool
}

// parseTCPSegment reads a TCP segment's connection (received: local is
// the destination), payload length, flags and whether it carries SACK
// blocks.
func parseTCPSegment(ip []byte, received bool) (tcpSegment, bool) {
	var sg tcpSegment
	src, dst, ok := tcpstack.Flow(ip)
	if !ok {
		return sg, false
	}
	hl, total := 0, len(ip)
	switch ip[0] >> 4 {
	case 4:
		hl = int(ip[0]&0xf) * 4
		total = min(total, int(binary.BigEndian.Uint16(ip[2:])))
	case 6:
		hl = 40
		total = min(total, 40+int(binary.BigEndian.Uint16(ip[4:])))
	}
	if len(ip) < hl+20 {
		return sg, false
	}
	doff := int(ip[hl+12]>>4) * 4
	sg.local, sg.remote = src, dst
	if received {
		sg.local, sg.remote = dst, src
	}
	sg.payload = max(total-hl-doff, 0)
	sg.flags = ip[hl+13]
	opts := ip[hl+20 : min(hl+max(doff, 20), len(ip))]
	for len(opts) > 0 && opts[0] != 0 { // 0: end of options
		if opts[0] == 1 { // no-op
			opts = opts[1:]
			continue
		}
		if len(opts) < 2 || opts[1] < 2 || int(opts[1]) > len(opts) {
			break
		}
		if opts[0] == 5 {
			sg.sack = true
			break
		}
		opts = opts[opts[1]:]
	}
	return sg, true
}
