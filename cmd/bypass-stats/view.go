package main

import (
	"bufio"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/stats"
)

const separator = "======================================================================"

// viewer prints one cycle of a view.
type viewer struct {
	o    *options
	t    *target
	w    io.Writer
	snap *stats.Snapshot
	// prev and elapsed are set in delta mode (-d 2).
	prev    *stats.Snapshot
	elapsed time.Duration
	// prevSock indexes prev's sockets by id.
	prevSock map[uint32]*stats.Socket
	// dsnap is the daemon's snapshot of this cycle, read when needed.
	dsnap *stats.Snapshot
}

func (v *viewer) deltas() bool { return v.prev != nil }

// count returns a counter as shown: the total, or in delta mode its rate
// per second since the previous reading.
func (v *viewer) count(cur, prev uint64, havePrev bool) uint64 {
	if !v.deltas() {
		return cur
	}
	if !havePrev || cur < prev {
		prev = 0
	}
	secs := v.elapsed.Seconds()
	if secs <= 0 {
		return 0
	}
	return uint64(float64(cur-prev)/secs + 0.5)
}

// sock returns a socket counter as shown (gauges as they are).
func (v *viewer) sock(s *stats.Socket, c stats.SocketCounter) uint64 {
	if c.IsGauge() || !v.deltas() {
		return s.Counters[c]
	}
	if v.prevSock == nil {
		v.prevSock = map[uint32]*stats.Socket{}
		for i := range v.prev.Sockets {
			v.prevSock[v.prev.Sockets[i].ID] = &v.prev.Sockets[i]
		}
	}
	p, ok := v.prevSock[s.ID]
	var pv uint64
	if ok {
		pv = p.Counters[c]
	}
	return v.count(s.Counters[c], pv, ok)
}

// ring returns a ring counter as shown.
func (v *viewer) ring(r *stats.Ring, c stats.RingCounter, prev *stats.Snapshot) uint64 {
	if prev == nil || !v.deltas() || c.IsGauge() {
		return r.Counters[c]
	}
	for i := range prev.Rings {
		if prev.Rings[i].Index == r.Index {
			return v.count(r.Counters[c], prev.Rings[i].Counters[c], true)
		}
	}
	return v.count(r.Counters[c], 0, false)
}

// daemonCount returns a daemon counter as shown.
func (v *viewer) daemonCount(d *stats.Daemon, c stats.DaemonCounter) uint64 {
	if c.IsGauge() || !v.deltas() || v.prev.Daemon == nil {
		return d.Counters[c]
	}
	return v.count(d.Counters[c], v.prev.Daemon.Counters[c], true)
}

func kb(bytes uint64) uint64 { return bytes / 1024 }

// pollPercent is the share of RX batches the application picked up without
// being woken (VMA's poll hit rate): "na" with no batches.
func pollPercent(batches, wakeups uint64) string {
	if batches == 0 {
		return "na"
	}
	hits := batches - min(wakeups, batches)
	return strconv.FormatFloat(100*float64(hits)/float64(batches), 'f', 1, 64)
}

func (v *viewer) print() error {
	bw := bufio.NewWriter(v.w)
	defer bw.Flush()
	v.w = bw
	if v.t.isDaemon() {
		return v.printDaemon()
	}
	v.title()
	switch v.o.view {
	case 1, 2:
		v.table()
	case 3:
		if err := v.full(); err != nil {
			return err
		}
	case 4:
		v.groups([]*stats.Snapshot{v.snap})
	case 5:
		v.netstat([]*stats.Snapshot{v.snap})
	}
	return nil
}

// title is the line that starts every cycle.
func (v *viewer) title() {
	h := &v.snap.Header
	name := h.Command
	if h.Program != "" && h.Program != h.Command {
		name += " \"" + h.Program + "\""
	}
	mode := "totals"
	if !h.ResetTime.IsZero() {
		mode += " since " + h.ResetTime.Format("15:04:05") + " (zeroed)"
	}
	if v.deltas() {
		mode = fmt.Sprintf("per second over the last %.1fs", v.elapsed.Seconds())
	}
	fmt.Fprintf(v.w, "%s\npid %d (%s), client of bypassd %d, %s; %s; updated %s\n", separator, h.PID, name, h.WriterPID,
		plural(h.SocketsTotal, "socket"), mode, h.Updated.Format("15:04:05.000"))
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}

// table prints views 1 and 2: two lines per socket.
func (v *viewer) table() {
	w := v.w
	unit := ""
	if v.deltas() {
		unit = "/s"
	}
	// Column groups: offloaded 43 wide, kernel 21, queue 29; every data
	// line starts with the socket id and " Rx:" or " Tx:" (12 wide).
	q := ""
	if v.o.view == 2 {
		q = "  " + center("queue (bytes)", 29)
	}
	fmt.Fprintf(w, "%-12s%s  %s%s\n", "  socket", center("offloaded"+unit, 43), center("kernel"+unit, 21), q)
	q = ""
	if v.o.view == 2 {
		q = fmt.Sprintf("  %9s %9s %9s", "cur", "max", "drop")
	}
	fmt.Fprintf(w, "%12s%10s %10s %8s %6s %5s  %10s %10s%s\n", "", "pkt", "Kbyte", "eagain", "error", "poll%", "pkt", "Kbyte", q)
	list, note := v.shown([]*stats.Snapshot{v.snap})
	for _, l := range list {
		s := l.s
		rx := fmt.Sprintf("%10d %10d %8d %6d %5s  %10d %10d",
			v.sock(s, stats.SockRXPackets), kb(v.sock(s, stats.SockRXBytes)), v.sock(s, stats.SockRXWakeups),
			v.sock(s, stats.SockRXDropped), pollPercent(v.sock(s, stats.SockRXBatches), v.sock(s, stats.SockRXWakeups)),
			v.sock(s, stats.SockRXKernelPackets), kb(v.sock(s, stats.SockRXKernelBytes)))
		tx := fmt.Sprintf("%10d %10d %8d %6d %5s  %10d %10d",
			v.sock(s, stats.SockTXPackets), kb(v.sock(s, stats.SockTXBytes)), v.sock(s, stats.SockTXWakeups),
			v.sock(s, stats.SockTXErrors)+v.sock(s, stats.SockTXUnreachable), "na",
			v.sock(s, stats.SockTXKernelPackets), kb(v.sock(s, stats.SockTXKernelBytes)))
		if v.o.view == 2 {
			rx += fmt.Sprintf("  %9d %9d %9d", s.Counters[stats.SockRXQueueBytes], s.Counters[stats.SockRXQueueMaxBytes], v.sock(s, stats.SockRXDropped))
			tx += fmt.Sprintf("  %9d %9d %9s", s.Counters[stats.SockTXQueueBytes], s.Counters[stats.SockTXQueueMaxBytes], "na")
		}
		fmt.Fprintf(w, "%8d Rx:%s\n%8s Tx:%s\n", s.ID, rx, "", tx)
	}
	if note != "" {
		fmt.Fprintf(w, "Shown: %s\n", note)
		v.totals()
	}
	fmt.Fprintln(w, strings.Repeat("-", len(separator)))
}

// totals prints the process's totals line (closed sockets included).
func (v *viewer) totals() {
	c := v.snap.Client
	if c == nil {
		return
	}
	t := &c.Totals
	var p *stats.SocketCounters
	if v.deltas() && v.prev.Client != nil {
		p = &v.prev.Client.Totals
	}
	n := func(x stats.SocketCounter) uint64 {
		if p == nil || x.IsGauge() {
			return t[x]
		}
		return v.count(t[x], p[x], true)
	}
	fmt.Fprintf(v.w, "Totals (closed sockets included): Rx %d / %d, Tx %d / %d [kilobytes/packets], Rx dropped %d, Tx dropped %d\n",
		kb(n(stats.SockRXBytes)), n(stats.SockRXPackets), kb(n(stats.SockTXBytes)), n(stats.SockTXPackets),
		n(stats.SockRXDropped), n(stats.SockTXErrors)+n(stats.SockTXUnreachable))
}

// center returns s framed by dashes to exactly width characters.
func center(s string, width int) string {
	pad := width - len(s) - 2
	if pad < 2 {
		return s
	}
	l := pad / 2
	return strings.Repeat("-", l) + " " + s + " " + strings.Repeat("-", pad-l)
}

func familyName(f uint16) string {
	if f == unix.AF_INET6 {
		return "IPv6"
	}
	return "IPv4"
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func addrString(ap netip.AddrPort, valid bool) string {
	if !valid {
		return "*:*"
	}
	return ap.String()
}

// full prints view 3: a block per socket, then the rings they use.
func (v *viewer) full() error {
	w := v.w
	used := map[int]bool{}
	list, note := v.shown([]*stats.Snapshot{v.snap})
	for _, l := range list {
		if l.s.Ring >= 0 {
			used[l.s.Ring] = true
		}
		v.socketBlock(l.s)
	}
	if note != "" {
		fmt.Fprintf(w, "%s\nShown: %s\n", separator, note)
	}
	if c := v.snap.Client; c != nil && len(v.o.sockets) == 0 {
		fmt.Fprintf(w, "%s\nProcess: %d open sockets (limit %d), %d opened since it connected; queue memory %d KiB (limit %d KiB)\n",
			separator, c.Sockets, c.MaxSockets, c.SocketsOpened, c.QueueMemory/1024, c.QueueMemoryLimit/1024)
		t := &c.Totals
		fmt.Fprintf(w, "\tTotals (closed sockets included): Rx %d / %d, Tx %d / %d [kilobytes/packets], Rx dropped %d, Tx dropped %d\n",
			kb(t[stats.SockRXBytes]), t[stats.SockRXPackets], kb(t[stats.SockTXBytes]), t[stats.SockTXPackets],
			t[stats.SockRXDropped], t[stats.SockTXErrors]+t[stats.SockTXUnreachable])
	}
	if len(used) == 0 {
		fmt.Fprintln(w, separator)
		return nil
	}
	ds, err := v.daemonSnap()
	if err != nil {
		return err
	}
	for i := range ds.Rings {
		if used[ds.Rings[i].Index] {
			v.ringBlock(&ds.Rings[i], nil, ds)
		}
	}
	fmt.Fprintln(w, separator)
	return nil
}

// ringName names a ring of the daemon file d.
func ringName(d *stats.Snapshot, idx int) string {
	if d != nil {
		for _, r := range d.Rings {
			if r.Index == idx {
				return fmt.Sprintf("%s:%d", r.Interface, r.Queue)
			}
		}
	}
	return "?"
}

func (v *viewer) socketBlock(s *stats.Socket) {
	w := v.w
	fmt.Fprintf(w, "%s\n\tSocket=[%d]\n", separator, s.ID)
	ring := "no ring yet (not bound)"
	if s.Ring >= 0 {
		ring = "ring " + strconv.Itoa(s.Ring)
		if ds, err := v.daemonSnap(); err == nil {
			ring += " (" + ringName(ds, s.Ring) + ")"
		}
	}
	var flags []string
	if s.Flags&stats.SocketReuseAddr != 0 {
		flags = append(flags, "reuse address")
	}
	if s.Flags&stats.SocketBroken != 0 {
		flags = append(flags, "BROKEN (its queues failed; see bypassd's log)")
	}
	extra := ""
	if len(flags) > 0 {
		extra = ", " + strings.Join(flags, ", ")
	}
	fmt.Fprintf(w, "\t- UDP, %s, %s, queues %d KiB each%s\n", familyName(s.Family), ring, s.QueueBytes/1024, extra)
	fmt.Fprintf(w, "\t- Local Address   = [%s]\n", addrString(s.Local, s.Flags&stats.SocketBound != 0))
	fmt.Fprintf(w, "\t- Foreign Address = [%s]\n", addrString(s.Peer, s.Flags&stats.SocketConnected != 0))
	fmt.Fprintf(w, "\t- Options: ttl %d, multicast ttl %d, tos 0x%02x, multicast loop %s\n", s.TTL, s.MulticastTTL, s.TOS,
		onOff(s.Flags&stats.SocketMulticastLoop != 0))
	batches, wakeups := v.sock(s, stats.SockRXBatches), v.sock(s, stats.SockRXWakeups)
	fmt.Fprintf(w, "\tRx Offload: %d / %d / %d / %d [kilobytes/packets/eagains/errors]\n",
		kb(v.sock(s, stats.SockRXBytes)), v.sock(s, stats.SockRXPackets), wakeups, v.sock(s, stats.SockRXDropped))
	fmt.Fprintf(w, "\tRx queue: cur %d / max %d / limit %d [bytes], dropped %d [packets]\n",
		s.Counters[stats.SockRXQueueBytes], s.Counters[stats.SockRXQueueMaxBytes], s.QueueBytes, v.sock(s, stats.SockRXDropped))
	pct := pollPercent(batches, wakeups)
	if pct != "na" {
		pct += "%"
	}
	fmt.Fprintf(w, "\tRx poll: %d / %d (%s) [miss/hit]\n", wakeups, batches-min(wakeups, batches), pct)
	fmt.Fprintf(w, "\tTx Offload: %d / %d / %d / %d [kilobytes/packets/eagains/errors]\n",
		kb(v.sock(s, stats.SockTXBytes)), v.sock(s, stats.SockTXPackets), v.sock(s, stats.SockTXWakeups),
		v.sock(s, stats.SockTXErrors)+v.sock(s, stats.SockTXUnreachable))
	fmt.Fprintf(w, "\tTx queue: cur %d / max %d / limit %d [bytes]\n",
		s.Counters[stats.SockTXQueueBytes], s.Counters[stats.SockTXQueueMaxBytes], s.QueueBytes)
	fmt.Fprintf(w, "\tTx drops: %d / %d [unreachable/errors]\n", v.sock(s, stats.SockTXUnreachable), v.sock(s, stats.SockTXErrors))
	fmt.Fprintf(w, "\tKernel path: %d / %d, %d / %d [rx kilobytes/packets, tx kilobytes/packets]\n",
		kb(v.sock(s, stats.SockRXKernelBytes)), v.sock(s, stats.SockRXKernelPackets),
		kb(v.sock(s, stats.SockTXKernelBytes)), v.sock(s, stats.SockTXKernelPackets))
	if s.GroupCount > 0 {
		var gs []string
		for _, g := range s.Groups {
			gs = append(gs, groupString(g))
		}
		if s.GroupCount > len(s.Groups) {
			gs = append(gs, fmt.Sprintf("and %d more", s.GroupCount-len(s.Groups)))
		}
		fmt.Fprintf(w, "\tMulticast: %s\n", strings.Join(gs, ", "))
	}
}

func groupString(g stats.Membership) string {
	if g.Source.IsValid() {
		return g.Group.String() + " from " + g.Source.String()
	}
	return g.Group.String()
}

// ringBlock prints one ring (view 3). prev is the previous daemon
// snapshot in delta mode.
func (v *viewer) ringBlock(r *stats.Ring, prev *stats.Snapshot, _ *stats.Snapshot) {
	w := v.w
	c := func(x stats.RingCounter) uint64 { return v.ring(r, x, prev) }
	zc := "copy"
	if r.Flags&stats.RingZeroCopy != 0 {
		zc = "zero-copy"
	}
	state := ""
	if r.Flags&stats.RingStopped != 0 {
		state = ", ENGINE STOPPED (see bypassd's log)"
	}
	fmt.Fprintf(w, "%s\nRING=[%d] %s queue %d (ifindex %d): %s %s (%s), %s%s\n", separator, r.Index, r.Interface, r.Queue,
		r.Ifindex, r.Provider, r.Mode, zc, plural(r.Sockets, "socket"), state)
	fmt.Fprintf(w, "\tTx Offload: %d / %d [kilobytes/packets]\n", kb(c(stats.RingTXBytes)), c(stats.RingTXPackets))
	fmt.Fprintf(w, "\tRx Offload: %d / %d [kilobytes/packets]\n", kb(c(stats.RingRXBytes)), c(stats.RingRXPackets))
	fmt.Fprintf(w, "\tRx drops: %d / %d / %d / %d [no socket/malformed/checksum/queue full]\n",
		c(stats.RingRXNoEndpoint), c(stats.RingRXMalformed), c(stats.RingRXChecksum), c(stats.RingRXQueueFull))
	fmt.Fprintf(w, "\tTx drops: %d / %d / %d [unreachable/errors/link down]\n",
		c(stats.RingTXUnreachable), c(stats.RingTXErrors), c(stats.RingTXLinkDown))
	fmt.Fprintf(w, "\tRx Handoff: %d / %d / %d [to other rings/from other rings/dropped, inbox full]\n",
		c(stats.RingRXHandedOff), c(stats.RingRXHandoffIn), c(stats.RingRXHandoffDropped))
	fmt.Fprintf(w, "\tVXLAN: %d / %d [decapsulated frames/encapsulated packets]\n",
		c(stats.RingRXDecapsulated), c(stats.RingTXEncapsulated))
	fmt.Fprintf(w, "\tTx fragments: %d, buffer waits: %d, engine wake-ups: %d\n",
		c(stats.RingTXFragments), c(stats.RingTXBufferWaits), c(stats.RingEngineWakeups))
	fmt.Fprintf(w, "\tQueue pair: %d / %d / %d [rx packets/tx packets/rx dropped by the kernel]\n",
		c(stats.RingProviderRXPackets), c(stats.RingProviderTXPackets), c(stats.RingProviderRXDropped))
	fmt.Fprintf(w, "\tStarvation: %d / %d [fill/completion], kicks %d, invalid descriptors %d\n",
		c(stats.RingFillStarved), c(stats.RingCompletionStarved), c(stats.RingKicks), c(stats.RingInvalidDescs))
	fmt.Fprintf(w, "\tUMEM: %d KiB (%d rx + %d tx frames of %d bytes)\n", r.UMEMBytes()/1024, r.RXFrames, r.TXFrames, r.FrameSize)
	fmt.Fprintf(w, "\tDev Mem Alloc: %d\n", r.DevMemAlloc)
	fmt.Fprintf(w, "\tDev Mem Stats: %d / %d / %d [kilobytes/packets/oob]\n",
		kb(c(stats.RingDevMemStagedBytes)), c(stats.RingDevMemStagedPackets), c(stats.RingDevMemOOB))
	fmt.Fprintf(w, "\tDev Mem Inline: %d, errors: %d\n", c(stats.RingDevMemInline), c(stats.RingDevMemErrors))
	fmt.Fprintf(w, "\tPacing: %d / %d / %d / %d [paced sockets/paced packets/delayed/late]\n",
		c(stats.RingPacedQueues), c(stats.RingTXPaced), c(stats.RingTXPaceWaits), c(stats.RingTXPaceLate))
	fmt.Fprintf(w, "\tRate table (%s): %d of %d used, shared %d, nearest %d, refused %d / %d [full/range]\n", r.Interface,
		c(stats.RingRateEntries), c(stats.RingRateCapacity), c(stats.RingRateShared), c(stats.RingRateNearest),
		c(stats.RingRateRefusedFull), c(stats.RingRateRefusedRange))
	// Gauges: the snapshot's values, never deltas.
	fmt.Fprintf(w, "\tHW Timestamps: mode %d (%s), estimated error %d ns\n", r.Counters[stats.RingHWTSMode],
		tsconv.Mode(r.Counters[stats.RingHWTSMode]), r.Counters[stats.RingHWTSErrorNs])
	if r.Counters[stats.RingTAPIfindex] != 0 {
		fallback := [...]string{"none", "auto", "tap"}[min(r.Counters[stats.RingTAPFallback], 2)]
		path := "fast path"
		if r.Counters[stats.RingTAPActive] != 0 {
			path = "TAP"
		}
		fmt.Fprintf(w, "\tTap fd: %d, Tap Device: ifindex %d, fallback %s, flows on the %s\n", r.Counters[stats.RingTAPFD],
			r.Counters[stats.RingTAPIfindex], fallback, path)
		fmt.Fprintf(w, "\tVF Plugouts: %d, plug-ins %d, tx dropped at a switch %d\n",
			c(stats.RingVFPlugouts), c(stats.RingVFPlugins), c(stats.RingTAPTXDropped))
		fmt.Fprintf(w, "\tTap Rx Offload: %d / %d [kilobytes/packets]\n", kb(c(stats.RingTAPRXBytes)), c(stats.RingTAPRXPackets))
		fmt.Fprintf(w, "\tTap Tx Offload: %d / %d [kilobytes/packets]\n", kb(c(stats.RingTAPTXBytes)), c(stats.RingTAPTXPackets))
	}
	if r.Counters[stats.RingTCPRXFrames]+r.Counters[stats.RingTCPTXFrames]+r.Counters[stats.RingTCPActiveOpens]+r.Counters[stats.RingTCPPassiveOpens] != 0 {
		v.tcpLines(r, c)
	}
	fmt.Fprintf(w, "\tReassembly: %d / %d / %d / %d / %d / %d [reassembled/timeouts/evicted/overlaps/invalid/too big]\n",
		c(stats.RingReasmReassembled), c(stats.RingReasmTimeouts), c(stats.RingReasmEvicted), c(stats.RingReasmOverlaps),
		c(stats.RingReasmInvalid), c(stats.RingReasmTooBig))
	fmt.Fprintf(w, "\tXDP (%s, all queues): %d / %d / %d / %d / %d [redirected/passed/no socket/fragments/malformed]\n", r.Interface,
		c(stats.RingXDPRedirected), c(stats.RingXDPPassed), c(stats.RingXDPNoSocket), c(stats.RingXDPFragments), c(stats.RingXDPMalformed))
	fmt.Fprintf(w, "\tXDP queues (%s): %d / %d [to the receiving queue's ring, not the home's/on a queue without a ring]\n", r.Interface,
		c(stats.RingXDPOtherQueue), c(stats.RingXDPNoQueueSocket))
}

// tcpLines prints the ring's TCP counters (VMA's -v views show TCP beside
// UDP); only for rings that carried TCP. Established is a gauge.
func (v *viewer) tcpLines(r *stats.Ring, c func(stats.RingCounter) uint64) {
	w := v.w
	fmt.Fprintf(w, "\tTCP Rx: %d / %d [kilobytes/frames], Tx: %d / %d [kilobytes/frames]\n",
		kb(c(stats.RingTCPRXBytes)), c(stats.RingTCPRXFrames), kb(c(stats.RingTCPTXBytes)), c(stats.RingTCPTXFrames))
	fmt.Fprintf(w, "\tTCP connections: %d established, %d / %d / %d [active opens/passive opens/failed attempts]\n",
		r.Counters[stats.RingTCPEstablished], c(stats.RingTCPActiveOpens), c(stats.RingTCPPassiveOpens), c(stats.RingTCPFailedAttempts))
	fmt.Fprintf(w, "\tTCP segments: %d / %d [sent/received], retransmits %d (fast %d), timeouts %d\n",
		c(stats.RingTCPSegmentsSent), c(stats.RingTCPSegmentsReceived), c(stats.RingTCPRetransmits),
		c(stats.RingTCPFastRetransmits), c(stats.RingTCPTimeouts))
	fmt.Fprintf(w, "\tTCP resets: %d / %d [sent/received], drops: %d / %d / %d / %d [invalid/checksum/stack queue/listen overflow], SYN cookies %d\n",
		c(stats.RingTCPResetsSent), c(stats.RingTCPResetsReceived), c(stats.RingTCPInvalidSegments), c(stats.RingTCPChecksumErrors),
		c(stats.RingTCPStackDropped), c(stats.RingTCPListenOverflows), c(stats.RingTCPSynCookies))
	fmt.Fprintf(w, "\tTCP TSO: %d / %d / %d [large segments/frames they became/cut by the device], delayed ACKs %d\n",
		c(stats.RingTCPTSOPackets), c(stats.RingTCPTSOFrames), c(stats.RingTCPTSOHardware), c(stats.RingTCPDelayedAcks))
}

// groups prints view 4: the multicast memberships of the given clients.
func (v *viewer) groups(clients []*stats.Snapshot) {
	w := v.w
	fmt.Fprintf(w, "%-40s %-40s %8s  %-24s %s\n", "group", "source", "socket", "local address", "pid")
	n := 0
	list, note := v.shown(clients)
	for _, l := range list {
		s, c := l.s, l.c
		for _, g := range s.Groups {
			src := "*"
			if g.Source.IsValid() {
				src = g.Source.String()
			}
			fmt.Fprintf(w, "%-40s %-40s %8d  %-24s %d\n", g.Group, src, s.ID,
				addrString(s.Local, s.Flags&stats.SocketBound != 0), c.Header.PID)
			n++
		}
		if s.GroupCount > len(s.Groups) {
			fmt.Fprintf(w, "%-40s %-40s %8d  (%d more memberships not listed)\n", "...", "", s.ID, s.GroupCount-len(s.Groups))
		}
	}
	if n == 0 {
		fmt.Fprintln(w, "(no multicast memberships)")
	}
	if note != "" {
		fmt.Fprintf(w, "Shown: the memberships of %s\n", note)
	}
	fmt.Fprintln(w, strings.Repeat("-", len(separator)))
}

// netstat prints view 5: one line per socket, like `netstat -uanp`.
func (v *viewer) netstat(clients []*stats.Snapshot) {
	w := v.w
	fmt.Fprintf(w, "%-6s %-8s %8s %8s %-46s %-46s %s\n", "Proto", "Offload", "Recv-Q", "Send-Q", "Local Address", "Foreign Address", "PID/Program name")
	list, note := v.shown(clients)
	for _, l := range list {
		s, c := l.s, l.c
		name := c.Header.Command
		if name == "" {
			name = c.Header.Program
		}
		proto := "udp"
		if s.Family == unix.AF_INET6 {
			proto = "udp6"
		}
		offload := "Yes"
		if s.Flags&stats.SocketBound == 0 {
			offload = "No"
		}
		fmt.Fprintf(w, "%-6s %-8s %8d %8d %-46s %-46s %d/%s\n", proto, offload,
			s.Counters[stats.SockRXQueueBytes], s.Counters[stats.SockTXQueueBytes],
			addrString(s.Local, s.Flags&stats.SocketBound != 0), addrString(s.Peer, s.Flags&stats.SocketConnected != 0),
			c.Header.PID, name)
	}
	if note != "" {
		fmt.Fprintf(w, "Shown: %s\n", note)
	}
}

// clientTable prints the daemon's clients, one line each from their
// files' summary blocks (never their socket blocks): totals per client
// however many sockets they have. In delta mode the counters are totals
// too (the daemon's previous snapshot holds no clients).
func (v *viewer) clientTable() error {
	clients, err := v.t.clientSummaries()
	if err != nil {
		return err
	}
	if len(clients) == 0 {
		return nil
	}
	activity := func(c *stats.Snapshot) uint64 { return socketActivity(&c.Client.Totals) }
	list, note := cut(clients, v.o.paging(len(clients), false), activity, "client")
	fmt.Fprintf(v.w, "%-24s %8s  %10s %10s  %10s %10s  %10s\n", "client (pid command)", "sockets", "rx pkt", "rx Kbyte", "tx pkt", "tx Kbyte", "drops")
	for _, c := range list {
		t := &c.Client.Totals
		name := c.Header.Command
		if name == "" {
			name = c.Header.Program
		}
		fmt.Fprintf(v.w, "%-24s %8d  %10d %10d  %10d %10d  %10d\n", strconv.Itoa(c.Header.PID)+" "+name, c.Client.Sockets,
			t[stats.SockRXPackets], kb(t[stats.SockRXBytes]), t[stats.SockTXPackets], kb(t[stats.SockTXBytes]),
			t[stats.SockRXDropped]+t[stats.SockTXErrors]+t[stats.SockTXUnreachable])
	}
	if note != "" {
		fmt.Fprintf(v.w, "Shown: %s\n", note)
	}
	return nil
}

// daemonSnap reads the daemon's file once per cycle (view 3 names the
// ring of every socket it shows).
func (v *viewer) daemonSnap() (*stats.Snapshot, error) {
	if v.dsnap != nil {
		return v.dsnap, nil
	}
	dr, err := v.t.daemonFile()
	if err != nil {
		return nil, err
	}
	if v.dsnap, err = dr.Read(); err != nil {
		return nil, err
	}
	return v.dsnap, nil
}

// printDaemon prints the daemon's own file in the chosen view.
func (v *viewer) printDaemon() error {
	w := v.w
	h := &v.snap.Header
	d := v.snap.Daemon
	mode := "totals"
	if !h.ResetTime.IsZero() {
		mode += " since " + h.ResetTime.Format("15:04:05") + " (zeroed)"
	}
	if v.deltas() {
		mode = fmt.Sprintf("per second over the last %.1fs", v.elapsed.Seconds())
	}
	fmt.Fprintf(w, "%s\nbypassd %d (%s), %s, log level %s; %s; updated %s\n", separator, h.PID, d.Version,
		plural(len(v.snap.Rings), "ring"), ctlproto.LogLevelName(int32(d.LogLevel)), mode, h.Updated.Format("15:04:05.000"))
	fmt.Fprintf(w, "clients %d (%d since start), sockets %d (%d opened), control requests %d (%d failed), malformed %d\n",
		v.daemonCount(d, stats.DaemonSessions), v.daemonCount(d, stats.DaemonSessionsTotal),
		v.daemonCount(d, stats.DaemonSockets), v.daemonCount(d, stats.DaemonSocketsTotal),
		v.daemonCount(d, stats.DaemonRequests), v.daemonCount(d, stats.DaemonRequestErrors), v.daemonCount(d, stats.DaemonMalformed))
	switch v.o.view {
	case 1, 2:
		unit := ""
		if v.deltas() {
			unit = "/s"
		}
		fmt.Fprintf(w, "%-20s  %-33s\n", "ring", center("offloaded"+unit, 33))
		fmt.Fprintf(w, "%-20s  %10s %10s %10s\n", "", "pkt", "Kbyte", "drops")
		for i := range v.snap.Rings {
			r := &v.snap.Rings[i]
			c := func(x stats.RingCounter) uint64 { return v.ring(r, x, v.prev) }
			rxDrops := c(stats.RingRXNoEndpoint) + c(stats.RingRXMalformed) + c(stats.RingRXChecksum) + c(stats.RingRXQueueFull)
			txDrops := c(stats.RingTXUnreachable) + c(stats.RingTXErrors) + c(stats.RingTXLinkDown)
			name := fmt.Sprintf("[%d] %s:%d", r.Index, r.Interface, r.Queue)
			fmt.Fprintf(w, "%-16s Rx: %10d %10d %10d\n", name, c(stats.RingRXPackets), kb(c(stats.RingRXBytes)), rxDrops)
			fmt.Fprintf(w, "%-16s Tx: %10d %10d %10d\n", "", c(stats.RingTXPackets), kb(c(stats.RingTXBytes)), txDrops)
		}
		if err := v.clientTable(); err != nil {
			return err
		}
		fmt.Fprintln(w, strings.Repeat("-", len(separator)))
	case 3:
		for i := range v.snap.Rings {
			v.ringBlock(&v.snap.Rings[i], v.prev, v.snap)
		}
		fmt.Fprintf(w, "%s\n\tcontrol socket %s, per-client limits: %d sockets, default queue %d KiB\n%s\n",
			separator, d.SocketPath, d.MaxSockets, d.QueueBytes/1024, separator)
	case 4, 5:
		clients, err := v.t.clients()
		if err != nil {
			return err
		}
		if v.o.view == 4 {
			v.groups(clients)
		} else {
			v.netstat(clients)
		}
	}
	return nil
}
