package daemon

// The connections QUERY topic (bypassctl connections): the TCP connections
// of every ring's stack, joined with the client socket holding each.

import (
	"cmp"
	"net/netip"
	"slices"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

// connOwner is the client socket holding a connection.
type connOwner struct {
	uid               uint32
	pid               int32
	socket            uint32
	bytesIn, bytesOut uint64
	wakeups           uint64
}

func (d *Daemon) queryConnections(caller *session) (any, error) {
	owners := map[[2]netip.AddrPort]connOwner{}
	d.mu.Lock()
	sessions := make([]*session, 0, len(d.sessions))
	for s := range d.sessions {
		sessions = append(sessions, s)
	}
	d.mu.Unlock()
	for _, s := range sessions {
		s.pub.Lock()
		for _, k := range s.sockets {
			st := k.stream
			if st == nil || st.conn == nil {
				continue
			}
			o := connOwner{uid: s.cred.Uid, pid: s.cred.Pid, socket: k.id}
			if st.pump != nil {
				o.bytesIn = st.pump.Stats().RXBytes.Load()
				o.bytesOut = st.pump.Stats().TXBytes.Load()
				o.wakeups = st.pump.Stats().Wakeups.Load()
			}
			owners[[2]netip.AddrPort{st.conn.LocalAddr(), st.conn.RemoteAddr()}] = o
		}
		s.pub.Unlock()
	}
	admin := caller.isAdmin()
	doc := ctldoc.ConnectionsDoc{Connections: []ctldoc.ConnectionDoc{}}
	for i, ri := range d.rings {
		r := ri.ring()
		name, queue := r.Interface()
		for _, c := range r.TCPConnections() {
			o, held := owners[[2]netip.AddrPort{c.Local, c.Remote}]
			if !admin && (!held || o.uid != caller.cred.Uid) {
				continue
			}
			doc.Connections = append(doc.Connections, ctldoc.ConnectionDoc{
				Ring: i, Interface: name, Queue: queue, Local: c.Local.String(), Remote: c.Remote.String(), State: c.State,
				PID: o.pid, Socket: o.socket,
				RTTMicros: c.RTT.Microseconds(), RTTVarMicros: c.RTTVar.Microseconds(), RTOMillis: c.RTO.Milliseconds(),
				Cwnd: c.Cwnd, Ssthresh: c.Ssthresh, Retransmits: c.Retransmits, Timeouts: c.Timeouts,
				SegmentsOut: c.SegmentsSent, SegmentsIn: c.SegmentsReceived, BytesIn: o.bytesIn, BytesOut: o.bytesOut,
				SendQueued: c.SendQueued, RecvQueued: c.RecvQueued, PumpWakeups: o.wakeups,
			})
		}
	}
	slices.SortFunc(doc.Connections, func(a, b ctldoc.ConnectionDoc) int {
		return cmp.Or(cmp.Compare(a.Ring, b.Ring), cmp.Compare(a.Local, b.Local), cmp.Compare(a.Remote, b.Remote))
	})
	return doc, nil
}
