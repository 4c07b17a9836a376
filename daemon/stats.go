package daemon

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/stats"
)

// The daemon's counters live where they are cheapest to keep: the ring
// engine's atomics (rings, endpoints), the XDP program's per-CPU map, and
// the control-plane counters below. Publishing reads them every
// StatsInterval and writes snapshots into the stats files, so the data path
// pays nothing for a reader; the metrics collector reads the same values
// on each scrape. Zeroing (bypass-stats -z) only moves a baseline kept
// here: the atomics and the Prometheus counters never go back.

// ctlCounters are the control plane's counters.
type ctlCounters struct {
	sessionsTotal   atomic.Uint64
	socketsTotal    atomic.Uint64
	malformed       atomic.Uint64
	malformedCloses atomic.Uint64
	// requests and errors by request code (index: code, 0 = unknown).
	requests, errors [maxCode + 1]atomic.Uint64
}

// maxCode bounds the request codes counted separately.
const maxCode = 31

func (c *ctlCounters) count(code ctlproto.Code, failed bool) {
	i := int(code.Request())
	if i > maxCode || !code.Request().Known() {
		i = 0
	}
	if failed {
		c.errors[i].Add(1)
	} else {
		c.requests[i].Add(1)
	}
}

// clientStats is the stats of one client process: every session its pid
// opened (usually one) and the file they share.
type clientStats struct {
	pid     int
	uid     uint32
	command string
	program string
	started time.Time

	// mu guards everything below; lock order: clientStats.mu, then a
	// session's pub.
	mu       sync.Mutex
	sessions []*session
	w        *stats.Writer
	// retired sums the counters of the client's sessions that ended.
	retired stats.SocketCounters
	opened  uint64
	// zero is a pending reset, applied at the next publication; base are
	// the values at the last reset (per socket id, and of the totals).
	zero      bool
	resets    uint64
	resetTime time.Time
	base      map[uint32]stats.SocketCounters
	baseTotal stats.SocketCounters
	// blocks and order are publish's buffers, kept so that a client with
	// many sockets does not allocate them every interval.
	blocks []stats.Socket
	order  []int32
	// seen is the sum of the sessions' changes read before the last full
	// publication; fresh tells that one happened since the set of
	// sessions last changed; queued that it found bytes in a queue (whose
	// occupancy falls as the client reads, which moves no counter). With
	// none of them calling for it, publish only touches the file: an idle
	// client costs O(1) per interval, not O(sockets).
	seen   uint64
	fresh  bool
	queued bool
}

// statsState is the daemon's stats publication (nil Writer: files off).
type statsState struct {
	mu      sync.Mutex
	clients map[int]*clientStats
	// daemon file
	w         *stats.Writer
	zero      bool
	resets    uint64
	resetTime time.Time
	ringBase  []stats.RingCounters
	ctlBase   stats.DaemonCounters

	stop chan struct{}
	done chan struct{}
}

// statsMode is the stats files' permission bits: readable by whoever may
// use the control socket (its group, and others if they may connect).
func (d *Daemon) statsMode() os.FileMode {
	return 0o600 | d.cfg.SocketMode&0o044
}

// startStats creates the daemon's own stats file and starts publishing.
func (d *Daemon) startStats() error {
	st := &d.stats
	if d.cfg.StatsInterval < 0 {
		return nil
	}
	w, err := stats.Create(stats.DaemonPath(d.cfg.StatsDir, os.Getpid()), stats.FileSpec{
		Kind: stats.KindDaemon, PID: os.Getpid(), UID: uint32(os.Geteuid()), Command: procComm(os.Getpid()),
		Program: "bypassd", Started: d.started, RingSlots: min(len(d.rings), stats.MaxRingSlots),
		Mode: d.statsMode(), GID: d.cfg.SocketGID,
	})
	if err != nil {
		return err
	}
	st.w = w
	st.ringBase = make([]stats.RingCounters, len(d.rings))
	st.stop, st.done = make(chan struct{}), make(chan struct{})
	d.publish()
	go d.publishLoop()
	return nil
}

// stopStats stops publishing and removes the daemon's file; the clients'
// files went with their sessions.
func (d *Daemon) stopStats() error {
	st := &d.stats
	if st.stop == nil {
		return nil
	}
	select {
	case <-st.stop:
	default:
		close(st.stop)
	}
	<-st.done
	st.mu.Lock()
	defer st.mu.Unlock()
	var errs []error
	for _, c := range st.clients {
		c.mu.Lock()
		if c.w != nil {
			errs = append(errs, c.w.Close())
			c.w = nil
		}
		c.mu.Unlock()
	}
	if st.w != nil {
		errs = append(errs, st.w.Close())
		st.w = nil
	}
	return errors.Join(errs...)
}

func (d *Daemon) publishLoop() {
	st := &d.stats
	defer close(st.done)
	t := time.NewTicker(d.cfg.StatsInterval)
	defer t.Stop()
	for {
		select {
		case <-st.stop:
			return
		case <-t.C:
			d.publish()
		}
	}
}

// publish writes one snapshot into every stats file.
func (d *Daemon) publish() {
	st := &d.stats
	st.mu.Lock()
	clients := make([]*clientStats, 0, len(st.clients))
	for _, c := range st.clients {
		clients = append(clients, c)
	}
	if st.w != nil {
		snap := d.daemonSnapshot(true)
		if err := st.w.Publish(snap); err != nil {
			d.log.Warn("cannot publish the daemon's stats", zap.Error(err))
		}
	}
	st.mu.Unlock()
	for _, c := range clients {
		c.publish(d)
	}
}

// procComm returns a process's name as the kernel knows it.
func procComm(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// joinClient attaches a session that said HELLO to its process's stats,
// creating the process's stats file with its first session.
func (d *Daemon) joinClient(s *session, program string) {
	st := &d.stats
	pid := int(s.cred.Pid)
	st.mu.Lock()
	defer st.mu.Unlock()
	c := st.clients[pid]
	if c == nil {
		c = &clientStats{pid: pid, uid: s.cred.Uid, command: procComm(pid), program: program, started: time.Now(),
			base: map[uint32]stats.SocketCounters{}}
		if st.w != nil {
			w, err := stats.Create(stats.ClientPath(d.cfg.StatsDir, pid), stats.FileSpec{
				Kind: stats.KindClient, PID: pid, UID: c.uid, Command: c.command, Program: program, Started: c.started,
				SocketSlots: min(d.cfg.MaxSockets, stats.MaxSocketSlots), Mode: d.statsMode(), GID: d.cfg.SocketGID,
			})
			if err != nil {
				// The client works without its file; only bypass-stats
				// cannot show it.
				s.log.Warn("cannot create the client's stats file", zap.Error(err))
			} else {
				c.w = w
			}
		}
		st.clients[pid] = c
	}
	c.mu.Lock()
	c.sessions = append(c.sessions, s)
	c.fresh = false
	c.mu.Unlock()
	s.client = c
	if c.w != nil {
		c.publish(d)
	}
}

// leaveClient detaches a finished session (after release); the last one
// of a process removes its stats file.
func (d *Daemon) leaveClient(s *session) {
	c := s.client
	if c == nil {
		return
	}
	st := &d.stats
	st.mu.Lock()
	defer st.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sessions = slices.DeleteFunc(c.sessions, func(x *session) bool { return x == s })
	c.fresh = false
	s.pub.Lock()
	for i, v := range s.retired {
		if !stats.SocketCounter(i).IsGauge() {
			c.retired[i] += v
		}
	}
	c.opened += s.opened
	s.pub.Unlock()
	if len(c.sessions) > 0 {
		return
	}
	if c.w != nil {
		if err := c.w.Close(); err != nil {
			s.log.Warn("cannot remove the client's stats file", zap.Error(err))
		}
		c.w = nil
	}
	delete(st.clients, c.pid)
}

// retire adds a closed endpoint's final counters to the session's totals.
// The caller holds s.pub.
func (s *session) retire(ep *ring.Endpoint) {
	var c stats.SocketCounters
	endpointCounters(ep, &c)
	for i, v := range c {
		s.retired[i] += v
	}
	delete(s.closing, ep)
	s.changes.Add(1)
}

// endpointCounters adds an endpoint's counters into c.
func endpointCounters(ep *ring.Endpoint, c *stats.SocketCounters) {
	es := ep.Stats()
	c[stats.SockRXPackets] += es.RXPackets.Load()
	c[stats.SockRXBytes] += es.RXBytes.Load()
	c[stats.SockRXDropped] += es.RXDropped.Load()
	c[stats.SockRXBatches] += es.RXBatches.Load()
	c[stats.SockRXWakeups] += es.RXWakeups.Load()
	c[stats.SockTXPackets] += es.TXPackets.Load()
	c[stats.SockTXBytes] += es.TXBytes.Load()
	c[stats.SockTXUnreachable] += es.TXUnreachable.Load()
	c[stats.SockTXErrors] += es.TXErrors.Load()
	c[stats.SockTXWakeups] += es.TXWakeups.Load()
}

// socketBlock describes k (raw counters, no baseline). The caller holds
// the session's pub.
func (d *Daemon) socketBlock(k *socket) stats.Socket {
	o := k.headerOptions()
	b := stats.Socket{ID: k.id, Family: k.family, Ring: d.ringIndex(k.home), QueueBytes: uint32(k.queueBytes),
		TTL: o.TTL, MulticastTTL: o.MulticastTTL, TOS: o.TOS}
	if o.MulticastLoop {
		b.Flags |= stats.SocketMulticastLoop
	}
	if k.reuseAddr {
		b.Flags |= stats.SocketReuseAddr
	}
	if k.ep == nil {
		for _, g := range k.pending {
			b.Groups = append(b.Groups, stats.Membership{Group: g.group, Source: g.source})
		}
		b.GroupCount = len(b.Groups)
		return b
	}
	b.Flags |= stats.SocketBound
	b.Local = k.ep.LocalAddr()
	if p := k.ep.Peer(); p.IsValid() {
		b.Flags |= stats.SocketConnected
		b.Peer = p
	}
	if k.ep.Broken() {
		b.Flags |= stats.SocketBroken
	}
	for _, m := range k.ep.Memberships() {
		if len(m.Sources) == 0 {
			b.Groups = append(b.Groups, stats.Membership{Group: m.Group})
		}
		for _, src := range m.Sources {
			b.Groups = append(b.Groups, stats.Membership{Group: m.Group, Source: src})
		}
	}
	b.GroupCount = len(b.Groups)
	endpointCounters(k.ep, &b.Counters)
	// Occupancy only of sockets that carried traffic: reading an idle
	// socket's queue headers would fault its pages into the daemon (two
	// per socket, 800 MB for 100,000 sockets). A socket whose first
	// datagrams still wait in its TX queue reads 0 until one is sent.
	if k.tx != nil && stats.SocketActivity(func(x stats.SocketCounter) uint64 { return b.Counters[x] }) != 0 {
		b.Counters[stats.SockRXQueueBytes] = uint64(shmq.Occupancy(k.rx, k.queueBytes))
		b.Counters[stats.SockTXQueueBytes] = uint64(shmq.Occupancy(k.tx, k.queueBytes))
	}
	return b
}

func (d *Daemon) ringIndex(ri *ringInfo) int {
	for i, r := range d.rings {
		if r == ri {
			return i
		}
	}
	return -1
}

// clientView is what one reading of a client's counters gives.
type clientView struct {
	sockets  []stats.Socket // raw counters, by id (when asked for)
	nsockets int
	total    stats.SocketCounters
	queueMem int64
	opened   uint64
}

// view reads the client's sockets and totals (raw). The caller holds c.mu.
func (c *clientStats) view(d *Daemon, withSockets bool) clientView {
	var v clientView
	if withSockets {
		v.sockets = c.blocks[:0]
	}
	v.total = c.retired
	v.opened = c.opened
	for _, s := range c.sessions {
		s.pub.Lock()
		for i, x := range s.retired {
			v.total[i] += x
		}
		for ep := range s.closing {
			endpointCounters(ep, &v.total)
		}
		for _, k := range s.sockets {
			b := d.socketBlock(k)
			for i, x := range b.Counters {
				v.total[i] += x
			}
			if withSockets {
				// Sampled maxima: the engine does not track occupancy.
				k.rxMax = max(k.rxMax, b.Counters[stats.SockRXQueueBytes])
				k.txMax = max(k.txMax, b.Counters[stats.SockTXQueueBytes])
				b.Counters[stats.SockRXQueueMaxBytes] = k.rxMax
				b.Counters[stats.SockTXQueueMaxBytes] = k.txMax
				v.sockets = append(v.sockets, b)
			}
		}
		v.queueMem += s.queueMem
		v.opened += s.opened
		v.nsockets += len(s.sockets)
		s.pub.Unlock()
	}
	v.total[stats.SockRXQueueMaxBytes], v.total[stats.SockTXQueueMaxBytes] = 0, 0
	if withSockets {
		c.sortByID(v.sockets)
		c.blocks = v.sockets
	}
	return v
}

// sortByID puts blocks in socket id order. The blocks are large: an index
// is sorted, then each block is moved once, in place (a second buffer
// would cost the daemon another block per socket).
func (c *clientStats) sortByID(blocks []stats.Socket) {
	c.order = c.order[:0]
	for i := range blocks {
		c.order = append(c.order, int32(i))
	}
	order := c.order
	slices.SortFunc(order, func(a, b int32) int { return cmp.Compare(blocks[a].ID, blocks[b].ID) })
	// Follow each cycle of the permutation; order[j] = j marks a place
	// done.
	for i := range order {
		if int(order[i]) == i {
			continue
		}
		tmp := blocks[i]
		j := i
		for {
			k := int(order[j])
			order[j] = int32(j)
			if k == i {
				blocks[j] = tmp
				break
			}
			blocks[j] = blocks[k]
			j = k
		}
	}
}

// publish writes the client's snapshot, applying a pending reset first.
func (c *clientStats) publish(d *Daemon) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.w == nil {
		return
	}
	var changes uint64
	for _, s := range c.sessions {
		changes += s.changes.Load()
	}
	if c.fresh && !c.zero && !c.queued && changes == c.seen {
		if err := c.w.Touch(); err != nil {
			d.log.Warn("cannot publish a client's stats", zap.Int("pid", c.pid), zap.Error(err))
		}
		return
	}
	c.seen, c.fresh = changes, true
	v := c.view(d, true)
	c.queued = false
	for i := range v.sockets {
		if v.sockets[i].Counters[stats.SockRXQueueBytes]|v.sockets[i].Counters[stats.SockTXQueueBytes] != 0 {
			c.queued = true
			break
		}
	}
	if c.zero {
		c.zero = false
		c.resets++
		c.resetTime = time.Now()
		clear(c.base)
		for _, b := range v.sockets {
			c.base[b.ID] = b.Counters
		}
		c.baseTotal = v.total
		// Maxima start over from what is queued now.
		for _, s := range c.sessions {
			s.pub.Lock()
			for _, k := range s.sockets {
				k.rxMax, k.txMax = 0, 0
			}
			s.pub.Unlock()
		}
		for i := range v.sockets {
			b := &v.sockets[i]
			b.Counters[stats.SockRXQueueMaxBytes] = b.Counters[stats.SockRXQueueBytes]
			b.Counters[stats.SockTXQueueMaxBytes] = b.Counters[stats.SockTXQueueBytes]
		}
	}
	if len(c.base) > 0 { // only after a reset
		live := make(map[uint32]bool, len(v.sockets))
		for i := range v.sockets {
			b := &v.sockets[i]
			live[b.ID] = true
			base := c.base[b.ID]
			subtract(b.Counters[:], base[:], stats.SocketCounter.IsGauge)
		}
		for id := range c.base {
			if !live[id] {
				delete(c.base, id) // ids are never reused by a live socket of the daemon
			}
		}
	}
	total := v.total
	subtract(total[:], c.baseTotal[:], stats.SocketCounter.IsGauge)
	nsock := v.nsockets
	snap := &stats.Snapshot{
		Header: stats.Header{Interval: d.cfg.StatsInterval, Resets: c.resets, ResetTime: c.resetTime, SocketsTotal: nsock},
		Client: &stats.Client{Sockets: nsock, MaxSockets: d.cfg.MaxSockets, SocketsOpened: v.opened,
			QueueMemory: v.queueMem, QueueMemoryLimit: d.cfg.MaxQueueMemory, Totals: total},
		Sockets: v.sockets,
	}
	if err := c.w.Publish(snap); err != nil {
		d.log.Warn("cannot publish a client's stats", zap.Int("pid", c.pid), zap.Error(err))
	}
}

// subtract takes base off the counters that are not gauges; a counter
// below its base (cannot happen with monotonic sources) reads 0.
func subtract[T ~int](c, base []uint64, gauge func(T) bool) {
	for i := range c {
		if gauge(T(i)) || i >= len(base) {
			continue
		}
		if c[i] >= base[i] {
			c[i] -= base[i]
		} else {
			c[i] = 0
		}
	}
}

// ringBlocks reads every ring's counters (raw).
func (d *Daemon) ringBlocks() []stats.Ring {
	out := make([]stats.Ring, 0, len(d.rings))
	progs := map[*bpf.Program]bpf.Counters{}
	for i, ri := range d.rings {
		r := ri.ring()
		caps := r.Caps()
		b := stats.Ring{Index: i, Interface: ri.it.Name, Queue: ri.it.Queue, Ifindex: r.Ifindex(),
			Provider: caps.Provider, Mode: caps.Mode, RXFrames: caps.RXFrames, TXFrames: caps.TXFrames,
			FrameSize: caps.FrameSize, Sockets: r.Endpoints()}
		if caps.ZeroCopy {
			b.Flags |= stats.RingZeroCopy
		}
		if r.Err() != nil {
			b.Flags |= stats.RingStopped
		}
		c := &b.Counters
		rs := r.Stats()
		c[stats.RingRXPackets] = rs.RXPackets.Load()
		c[stats.RingRXBytes] = rs.RXBytes.Load()
		c[stats.RingTXPackets] = rs.TXPackets.Load()
		c[stats.RingTXBytes] = rs.TXBytes.Load()
		c[stats.RingRXNoEndpoint] = rs.RXNoEndpoint.Load()
		c[stats.RingFlowsFull] = rs.FlowsFull.Load()
		c[stats.RingRXMalformed] = rs.RXMalformed.Load()
		c[stats.RingRXChecksum] = rs.RXChecksum.Load()
		c[stats.RingRXQueueFull] = rs.RXQueueFull.Load()
		c[stats.RingTXFragments] = rs.TXFragments.Load()
		c[stats.RingTXBufferWaits] = rs.TXNoBuffer.Load()
		c[stats.RingTXUnreachable] = rs.TXUnreachable.Load()
		c[stats.RingTXErrors] = rs.TXErrors.Load()
		c[stats.RingTXLinkDown] = rs.TXLinkDown.Load()
		c[stats.RingEngineWakeups] = rs.Wakeups.Load()
		ps := r.ProviderStats()
		c[stats.RingProviderRXPackets] = ps.RXPackets
		c[stats.RingProviderTXPackets] = ps.TXPackets
		c[stats.RingProviderRXDropped] = ps.RXDropped
		c[stats.RingFillStarved] = ps.FillEmpty
		c[stats.RingCompletionStarved] = ps.TXNoBuffer
		c[stats.RingKicks] = ps.Kicks
		c[stats.RingInvalidDescs] = ps.InvalidDescs
		c[stats.RingTCPTSOHardware] = ps.TXTSOPackets
		rsm := r.ReassemblyStats()
		c[stats.RingReasmReassembled] = rsm.Reassembled
		c[stats.RingReasmTimeouts] = rsm.Timeouts
		c[stats.RingReasmEvicted] = rsm.Evicted
		c[stats.RingReasmOverlaps] = rsm.Overlaps
		c[stats.RingReasmInvalid] = rsm.Invalid
		c[stats.RingReasmTooBig] = rsm.TooBig
		// Rings of one interface share its program: read it once.
		p := r.Program()
		xc, ok := progs[p]
		if !ok && p != nil { // nil: the ring's provider is not steered by XDP
			var err error
			if xc, err = p.Counters(); err != nil {
				d.log.Debug("cannot read the XDP program's counters", zap.String("iface", ri.it.Name), zap.Error(err))
			}
			progs[p] = xc
		}
		c[stats.RingXDPRedirected] = xc.Redirected
		c[stats.RingXDPPassed] = xc.Passed
		c[stats.RingXDPNoSocket] = xc.NoSocket
		c[stats.RingXDPFragments] = xc.Fragments
		c[stats.RingXDPMalformed] = xc.Malformed
		c[stats.RingXDPOtherQueue] = xc.OtherQueue
		c[stats.RingXDPNoQueueSocket] = xc.NoQueueSocket
		c[stats.RingRXHandedOff] = rs.RXHandedOff.Load()
		c[stats.RingRXHandoffIn] = rs.RXHandoffIn.Load()
		c[stats.RingRXHandoffDropped] = rs.RXHandoffDropped.Load()
		c[stats.RingRXDecapsulated] = rs.RXDecapsulated.Load()
		c[stats.RingTXEncapsulated] = rs.TXEncapsulated.Load()
		dm := r.DevMemStats()
		b.DevMemAlloc = int64(dm.Capacity)
		c[stats.RingDevMemStagedPackets] = dm.StagedPackets
		c[stats.RingDevMemStagedBytes] = dm.StagedBytes
		c[stats.RingDevMemInline] = dm.InlinePackets
		c[stats.RingDevMemOOB] = dm.OOBPackets
		c[stats.RingDevMemErrors] = dm.ReleaseErrors + dm.CopyErrors
		c[stats.RingHWTSMode] = uint64(r.HWTimestampMode())
		if e, ok := r.HWTimestampErrorNs(); ok && e > 0 {
			c[stats.RingHWTSErrorNs] = uint64(e)
		}
		ri.pacingCounters(c)
		fallbackCounters(r, c)
		tcpCounters(r, c)
		out = append(out, b)
	}
	return out
}

// daemonCounters reads the control plane's counters.
func (d *Daemon) daemonCounters() stats.DaemonCounters {
	var c stats.DaemonCounters
	d.mu.Lock()
	c[stats.DaemonSessions] = uint64(len(d.sessions))
	d.mu.Unlock()
	c[stats.DaemonSessionsTotal] = d.ctl.sessionsTotal.Load()
	c[stats.DaemonSockets] = d.openSockets()
	c[stats.DaemonSocketsTotal] = d.ctl.socketsTotal.Load()
	for i := range d.ctl.requests {
		c[stats.DaemonRequests] += d.ctl.requests[i].Load()
		c[stats.DaemonRequestErrors] += d.ctl.errors[i].Load()
	}
	c[stats.DaemonMalformed] = d.ctl.malformed.Load()
	c[stats.DaemonMalformedCloses] = d.ctl.malformedCloses.Load()
	c[stats.DaemonStatsFiles] = uint64(len(d.stats.clients))
	return c
}

// openSockets counts the sockets of every session.
func (d *Daemon) openSockets() uint64 {
	d.mu.Lock()
	sessions := make([]*session, 0, len(d.sessions))
	for s := range d.sessions {
		sessions = append(sessions, s)
	}
	d.mu.Unlock()
	var n uint64
	for _, s := range sessions {
		s.pub.Lock()
		n += uint64(len(s.sockets))
		s.pub.Unlock()
	}
	return n
}

// logLevel is the current zap level (info when fixed).
func (d *Daemon) logLevel() zapcore.Level {
	if d.cfg.LogLevel == nil {
		return zapcore.InfoLevel
	}
	return d.cfg.LogLevel.Level()
}

// daemonSnapshot builds the daemon file's snapshot; zeroed applies (and
// first takes, if one is pending) the reset baseline. The caller holds
// d.stats.mu.
func (d *Daemon) daemonSnapshot(zeroed bool) *stats.Snapshot {
	st := &d.stats
	rings := d.ringBlocks()
	ctl := d.daemonCounters()
	if zeroed {
		if st.zero {
			st.zero = false
			st.resets++
			st.resetTime = time.Now()
			for i := range rings {
				st.ringBase[i] = rings[i].Counters
			}
			st.ctlBase = ctl
		}
		for i := range rings {
			subtract(rings[i].Counters[:], st.ringBase[i][:], stats.RingCounter.IsGauge)
		}
		subtract(ctl[:], st.ctlBase[:], stats.DaemonCounter.IsGauge)
	}
	return &stats.Snapshot{
		Header: stats.Header{Interval: d.cfg.StatsInterval, Resets: st.resets, ResetTime: st.resetTime},
		Daemon: &stats.Daemon{LogLevel: int8(d.logLevel()), MaxSockets: d.cfg.MaxSockets, QueueBytes: d.cfg.QueueBytes,
			Version: d.cfg.Version, SocketPath: d.cfg.SocketPath, Counters: ctl},
		Rings: rings,
	}
}

// isAdmin reports whether the session's user may change the daemon: root
// or the daemon's own user.
func (s *session) isAdmin() bool {
	return s.cred.Uid == 0 || s.cred.Uid == uint32(os.Geteuid())
}

// onSetLogLevel serves SET_LOG_LEVEL (bypass-stats -l).
func (s *session) onSetLogLevel(h ctlproto.Header, m *ctlproto.LogLevel) bool {
	if !s.isAdmin() {
		return s.fail(h, fmt.Errorf("set log level: uid %d is neither root nor the daemon's user (uid %d): %w", s.cred.Uid, os.Geteuid(), unix.EPERM))
	}
	prev := s.d.logLevel()
	if err := s.d.SetLogLevel(zapcore.Level(m.Level)); err != nil {
		return s.fail(h, fmt.Errorf("%w: %w", err, unix.EOPNOTSUPP))
	}
	s.log.Info("log level set by a client", zap.Stringer("from", prev), zap.Stringer("to", zapcore.Level(m.Level)))
	return s.reply(ctlproto.ReplyHeader(h), ctlproto.LogLevel{Level: int32(prev)})
}

// onZeroStats serves ZERO_STATS (bypass-stats -z): the reset is applied at
// the next publication.
func (s *session) onZeroStats(h ctlproto.Header, m *ctlproto.ZeroStats) bool {
	d := s.d
	st := &d.stats
	if st.w == nil {
		return s.fail(h, fmt.Errorf("zero stats: this daemon publishes no stats files (--stats-interval 0): %w", unix.EOPNOTSUPP))
	}
	pid := int(m.PID)
	if (pid == ctlproto.ZeroStatsAll || m.Daemon) && !s.isAdmin() {
		return s.fail(h, fmt.Errorf("zero the daemon's stats: uid %d is neither root nor the daemon's user (uid %d): %w", s.cred.Uid, os.Geteuid(), unix.EPERM))
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case m.Daemon:
		st.zero = true
	case pid == ctlproto.ZeroStatsAll:
		st.zero = true
		for _, c := range st.clients {
			c.mu.Lock()
			c.zero = true
			c.mu.Unlock()
		}
	default:
		c := st.clients[pid]
		if c == nil {
			return s.fail(h, fmt.Errorf("zero stats of pid %d: not a client of this daemon: %w", pid, unix.ESRCH))
		}
		if !s.isAdmin() && c.uid != s.cred.Uid {
			return s.fail(h, fmt.Errorf("zero stats of pid %d: it belongs to uid %d, you are uid %d: %w", pid, c.uid, s.cred.Uid, unix.EPERM))
		}
		c.mu.Lock()
		c.zero = true
		c.mu.Unlock()
	}
	s.log.Info("stats zeroed by a client", zap.Int("target_pid", pid), zap.Bool("daemon", m.Daemon))
	return s.reply(ctlproto.ReplyHeader(h), ctlproto.Empty{})
}

// tcpCounters fills the ring's TCP counters (all 0 on a ring that never
// carried a TCP socket).
func tcpCounters(r *ring.Ring, c *stats.RingCounters) {
	rs := r.Stats()
	c[stats.RingTCPRXFrames] = rs.TCPRXPackets.Load()
	c[stats.RingTCPRXBytes] = rs.TCPRXBytes.Load()
	c[stats.RingTCPTXFrames] = rs.TCPTXPackets.Load()
	c[stats.RingTCPTXBytes] = rs.TCPTXBytes.Load()
	t := r.TCPStats()
	c[stats.RingTCPActiveOpens] = t.ActiveOpens
	c[stats.RingTCPPassiveOpens] = t.PassiveOpens
	c[stats.RingTCPEstablished] = t.Established
	c[stats.RingTCPFailedAttempts] = t.FailedAttempts
	c[stats.RingTCPResetsSent] = t.ResetsSent
	c[stats.RingTCPResetsReceived] = t.ResetsReceived
	c[stats.RingTCPSegmentsSent] = t.SegmentsSent
	c[stats.RingTCPSegmentsReceived] = t.SegmentsReceived
	c[stats.RingTCPRetransmits] = t.Retransmits
	c[stats.RingTCPFastRetransmits] = t.FastRetransmits
	c[stats.RingTCPTimeouts] = t.Timeouts
	c[stats.RingTCPInvalidSegments] = t.InvalidSegments
	c[stats.RingTCPChecksumErrors] = t.ChecksumErrors
	c[stats.RingTCPSynCookies] = t.SynCookiesSent
	c[stats.RingTCPListenOverflows] = t.ListenOverflows
	c[stats.RingTCPStackDropped] = t.RXDropped + t.TXDropped + t.TXNotTCP
	c[stats.RingTCPTSOPackets] = t.TXTSOPackets
	c[stats.RingTCPTSOFrames] = t.TXTSOFrames
	c[stats.RingTCPDelayedAcks] = rs.TCPDelayedAcks.Load()
}
