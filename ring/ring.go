// Package ring owns the daemon's fast path: one ring per (interface, queue),
// each a raw queue pair (a qp.Provider such as the afxdp socket) driven by an
// engine on its own locked OS thread. The engine demultiplexes received
// frames to UDP endpoints, reassembles IP fragments, and transmits what
// endpoints queue, building Ethernet/IP/UDP headers from per-destination
// templates whose next hop comes from the kernel's routing and neighbour
// tables.
//
// Endpoints exchange datagrams with their users through single-producer,
// single-consumer queues (internal/shmq) carrying internal/dgram records; in
// the daemon those queues live in memfds shared with client processes, in
// tests and benchmarks they are plain memory in this process.
//
// A ring reaches its NIC through paths, a provider and the steering that
// feeds it, opened by name (qp.Register, providers.go): the fast path (afxdp, or
// verbs) and, with a fallback (Config.Fallback), a TAP path it switches its
// flows to while the fast path is lost.
//
// The package does not own the XDP program (package bpf), the TAP devices
// and tc filters of the fallback path (package tap), header encoding
// (ring/wire/packet), fragment reassembly (ring/wire/reassembly), next-hop lookup
// (ring/route) or client sessions (package daemon).
package ring

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/ring/sched/qos"
	"github.com/bypassd/bypassd/ring/wire/reassembly"
)

// Config describes one ring.
type Config struct {
	// Interface is the network interface name (in the calling thread's
	// network namespace).
	Interface string
	// Queue is the interface's receive/transmit queue id.
	Queue int

	// Provider names the raw queue pair backend (see qp.Register):
	// "afxdp" (the default when empty).
	Provider string
	// Fallback is what happens when the provider's path is unavailable or
	// lost (default FallbackNone; the daemon's default is FallbackAuto).
	Fallback Fallback

	// Frames and FrameSize size the provider's buffer pool (afxdp
	// defaults: 4096 frames; FrameSize 0 is DefaultFrameSize of the
	// interface's MTU). An MTU whose frames do not fit one buffer makes
	// the afxdp path use multi-buffer descriptor chains.
	Frames, FrameSize int
	// Copy selects zero-copy or copy mode (default: zero-copy when the
	// driver supports it).
	Copy qp.CopyMode
	// XDPMode selects native or generic attach (default: native, generic
	// when the driver refuses).
	XDPMode bpf.AttachMode

	// DevMemTX is how many bytes of device memory egress frames are
	// staged in (BYPASSD_RING_DEV_MEM_TX; rounded up to 64). 0, or a
	// provider without device memory: frames go from their TX buffers.
	DevMemTX int
	// DevMemInline is the inline threshold: frames of at most this many
	// bytes are never staged (default 204; negative: 0, every frame is a
	// candidate).
	DevMemInline int

	// CPUs pins the engine thread to these CPUs (empty: no pinning), like
	// VMA's internal thread affinity.
	CPUs []int
	// RealtimePriority runs the engine thread under SCHED_FIFO at this
	// priority (1..99; 0: the normal scheduler). Paced departures then
	// keep time on a machine whose CPUs are busy with other work.
	RealtimePriority int

	// Batch is the largest number of frames moved per provider call
	// (default 64).
	Batch int
	// Poll is how long the engine spins looking for work before it sleeps
	// (VMA's RX poll): 0 sleeps at once, negative spins forever. Default 0.
	Poll time.Duration
	// RXPoll is how long a blocked Recv or Send spins on its queue before
	// sleeping on the queue's eventfd (VMA_RX_POLL): 0 sleeps at once,
	// negative spins forever. Default 0.
	RXPoll time.Duration
	// QueueBytes is the data capacity of each endpoint queue (each
	// direction), a power of two (default 1 MiB).
	QueueBytes int
	// SkipRXChecksum disables UDP checksum verification of received
	// datagrams (for NICs that verified them already).
	SkipRXChecksum bool
	// TCPCongestion is the TCP stack's congestion control: "cubic" (the
	// default) or "reno" (see ring/tcpstack).
	TCPCongestion string
	// ResolveTimeout bounds neighbour resolution for a new destination
	// (default 3s).
	ResolveTimeout time.Duration
	// TCPTimeWait is how long the TCP stack keeps a closed connection in
	// TIME-WAIT, holding its port (0: 60 s, as Linux). Tests shorten it.
	TCPTimeWait time.Duration
	// Reassembly bounds IP fragment reassembly.
	Reassembly reassembly.Config
	// HWTimestamps is the requested hardware timestamp conversion mode
	// (BYPASSD_HW_TS_CONVERSION). Other than 0 (disable, the default
	// here) it asks the path for hardware receive stamps (the
	// timestamping XDP program where the attach is native); Open then
	// lowers the conversion mode to what the interface supports and says
	// why in its "ring open" log line (HWTimestampMode reports it).
	HWTimestamps tsconv.Mode
	// Doorbell, when not nil, is the eventfd that wakes the engine,
	// owned by the caller: a ring opened again after its interface came
	// back keeps the doorbell its clients already hold. Nil: the ring
	// makes its own.
	Doorbell *shmq.Bell

	// Adopt opens the ring on objects a previous daemon handed over (live
	// upgrade, see handover.go); nil for a fresh ring.
	Adopt *Adoption
	// MaxFlows is the capacity of the interface's flow steering map
	// (--max-flows; 0: bpf.DefaultMaxFlows). A bind that needs an entry
	// in a full map fails with ENOSPC and counts Stats.FlowsFull.
	MaxFlows int

	Log *zap.Logger
}

func (c *Config) setDefaults() {
	if c.Batch <= 0 {
		c.Batch = 64
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = 1 << 20
	}
	if c.ResolveTimeout == 0 {
		c.ResolveTimeout = 3 * time.Second
	}
	if c.Log == nil {
		c.Log = zap.NewNop()
	}
	if c.DevMemTX > 0 {
		c.DevMemTX = (c.DevMemTX + 63) &^ 63
	}
}

// Ring is one raw queue pair and its engine.
type Ring struct {
	cfg     Config
	log     *zap.Logger
	ifindex int
	// mtu is the interface MTU the ring serves: read at Open, followed at
	// run time (mtu.go).
	mtu atomic.Int64
	// frameAuto: the frame size was chosen from the MTU (Config.FrameSize
	// 0), so a re-opened fast path chooses again.
	frameAuto bool
	mac       net.HardwareAddr
	ns        netns.NsHandle
	prov      qp.Provider
	// fb holds the ring's paths: the fast path and the TAP fallback.
	fb  fallbackState
	hw  *hwClock // nil: no hardware timestamps
	res *route.Resolver
	nl  *netlink.Handle

	// mu serializes endpoint registration, steering changes and ring close.
	mu     sync.Mutex
	table  atomic.Pointer[table]
	closed bool
	// flowRefs counts the endpoints using each steering entry.
	flowRefs map[qp.Flow]int
	// overlays are the VXLAN devices endpoints are bound on, by ifindex
	// (overlay.go); ovList is the same for the engine.
	overlays map[int]*overlay
	ovList   atomic.Pointer[[]*overlay]
	// standbyDeferred: an adopting ring (Config.Adopt) adds flows to its
	// standby TAP path only at Activate (handover.go).
	standbyDeferred bool
	// eps is every bound endpoint (guarded by mu); nEps its size for
	// readers without the lock.
	eps  map[*Endpoint]struct{}
	nEps atomic.Int64
	// lanes are the client sessions' announce bitmaps the engine drains
	// (copy-on-write under mu).
	lanes atomic.Pointer[[]*Lane]
	// inproc is a stack (linked through Endpoint.nextAnnounced) of the
	// endpoints announced by in-process users, new bindings and pacing
	// changes, for the engine's next iteration.
	inproc atomic.Pointer[Endpoint]
	// retireGen counts retire batches: the engine prunes its references
	// to retired endpoints when it changes.
	retireGen atomic.Uint64
	// retireMu guards the batch of endpoints waiting to leave the table
	// and whether a closer is already removing one (see retire).
	retireMu   sync.Mutex
	retiring   *retireBatch
	retireBusy bool

	// doorbell wakes the sleeping engine: users ring it when they announce
	// work to a sleeping engine, resolvers when a next hop is ready, Close
	// when it stops.
	doorbell *shmq.Bell
	// epfd is the epoll set the sleeping engine polls beside its
	// provider: the ring's doorbell and every lane's own (lane.go).
	// epMu keeps lanes from changing it once closeDoorbells closed it
	// (a session may close its lane of a ring closed before: its number
	// may name another file by then); epClosed says so.
	epfd     int
	epMu     sync.Mutex
	epClosed bool
	// epoch counts engine iterations; synced is how far a writer that
	// changed the endpoint table waits before freeing what it removed.
	epoch    atomic.Uint64
	sleeping atomic.Bool
	stop     atomic.Bool
	// deferStart: opened on a handed-over socket (Config.Adopt.Path), the
	// engine starts only at Activate; quiesced and quiescedEPs are what
	// Quiesce left for Abandon (handover.go).
	deferStart  bool
	startedAt   time.Time
	quiesced    *afxdp.Steering
	quiescedEPs []*Endpoint
	// addrs caches the interface's addresses (cachedAddrs).
	addrs atomic.Pointer[addrCache]
	// adoptedEps are the endpoints adopted since Open, until Activate
	// (copy-on-write under mu): the engine reads their reservations'
	// backlogs.
	adoptedEps atomic.Pointer[[]*Endpoint]
	// backlogWanted asks the engine to read the adopted endpoints'
	// reservations (handover.go).
	backlogWanted atomic.Bool
	done          chan struct{}
	fatal         atomic.Pointer[error]

	resolved chan resolution
	// qosCfg is the interface's QoS state (SetQoS; nil: qos.Default).
	qosCfg atomic.Pointer[qos.Config]
	// ctx ends with the ring; it bounds background next-hop resolutions.
	ctx    context.Context
	cancel context.CancelFunc
	// userPolicy is how endpoint users wait on their queues.
	userPolicy shmq.Policy

	stats Stats
	eng   engine
	// tcp is the ring's TCP stack (tcp.go), created on first use.
	tcp tcpState

	// group is the interface's rings, where frames homed on another ring
	// go; inbox is where the others put this ring's (handoff.go).
	group    *ringGroup
	groupKey qp.IfaceKey
	inbox    *inbox
}

// Open creates the ring for cfg.Interface and cfg.Queue: opens the
// provider's path (for afxdp: attaches the XDP steering program, shared with
// other rings of the interface, and opens the AF_XDP socket), and starts the
// engine thread. The interface is looked up in
// the calling thread's network namespace.
func Open(cfg Config) (_ *Ring, err error) {
	cfg.setDefaults()
	if cfg.QueueBytes&(cfg.QueueBytes-1) != 0 || cfg.QueueBytes < 4096 || cfg.QueueBytes > 1<<30 {
		return nil, fmt.Errorf("ring %s/%d: queue size %d: must be a power of two from 4 KiB to 1 GiB", cfg.Interface, cfg.Queue, cfg.QueueBytes)
	}
	if cfg.DevMemTX < 0 {
		return nil, fmt.Errorf("ring %s/%d: device memory %d bytes: must be 0 (off) or positive", cfg.Interface, cfg.Queue, cfg.DevMemTX)
	}
	if cfg.RealtimePriority < 0 || cfg.RealtimePriority > 99 {
		return nil, fmt.Errorf("ring %s/%d: real-time priority %d: want 0 (normal scheduler) or 1..99", cfg.Interface, cfg.Queue, cfg.RealtimePriority)
	}
	if cfg.ResolveTimeout < 0 {
		return nil, fmt.Errorf("ring %s/%d: negative resolve timeout %v", cfg.Interface, cfg.Queue, cfg.ResolveTimeout)
	}
	r := &Ring{cfg: cfg, log: cfg.Log.With(zap.String("ring", fmt.Sprintf("%s/%d", cfg.Interface, cfg.Queue))),
		done: make(chan struct{}), resolved: make(chan resolution, 64), userPolicy: shmq.Policy{Spin: cfg.RXPoll}}
	var cleanups []func()
	defer func() {
		if err != nil {
			for i := len(cleanups) - 1; i >= 0; i-- {
				cleanups[i]()
			}
		}
	}()
	if r.ns, err = callerNS(); err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", cfg.Interface, cfg.Queue, err)
	}
	cleanups = append(cleanups, func() { r.ns.Close() })
	if r.nl, err = netlinkHandle(r.ns); err != nil {
		return nil, fmt.Errorf("ring %s/%d: netlink: %w", cfg.Interface, cfg.Queue, err)
	}
	cleanups = append(cleanups, r.nl.Close)
	link, err := r.nl.LinkByName(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("ring %s/%d: no interface %q in this network namespace: %w (check `ip link`)", cfg.Interface, cfg.Queue, cfg.Interface, err)
	}
	attrs := link.Attrs()
	r.ifindex, r.mac = attrs.Index, attrs.HardwareAddr
	mtu := attrs.MTU
	r.mtu.Store(int64(mtu))
	if cfg.Queue < 0 || (attrs.NumRxQueues > 0 && cfg.Queue >= attrs.NumRxQueues) {
		return nil, fmt.Errorf("ring %s/%d: interface %s has %d receive queue(s): queue %d does not exist", cfg.Interface, cfg.Queue, cfg.Interface, attrs.NumRxQueues, cfg.Queue)
	}
	if len(r.mac) != 6 {
		return nil, fmt.Errorf("ring %s/%d: interface %s is not Ethernet (link type %s)", cfg.Interface, cfg.Queue, cfg.Interface, link.Type())
	}
	if cfg.Provider == "" {
		cfg.Provider = DefaultProvider
		r.cfg.Provider = DefaultProvider
	}
	if cfg.FrameSize == 0 {
		cfg.FrameSize, r.frameAuto = DefaultFrameSize(mtu), true
		r.cfg.FrameSize = cfg.FrameSize
	}
	pc := qp.PathConfig{Interface: cfg.Interface, Ifindex: r.ifindex, Queue: cfg.Queue, Queues: attrs.NumRxQueues, MaxFlows: cfg.MaxFlows,
		MAC: r.mac, MTU: mtu, NS: r.ns, Frames: cfg.Frames, FrameSize: cfg.FrameSize, Copy: cfg.Copy,
		XDPMode: cfg.XDPMode, DeviceMemory: cfg.DevMemTX, HWTimestamps: deviceStamps(cfg),
		Log: r.log}
	if cfg.Adopt != nil {
		pc.Adopt, pc.AdoptPath = cfg.Adopt.Program, cfg.Adopt.Path
		r.deferStart = cfg.Adopt.Path != nil
		if cfg.Adopt.Path != nil {
			// Whatever the openers did not take goes with the ring.
			defer cfg.Adopt.Path.Close()
		}
	}
	if err = r.openPaths(pc); err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", cfg.Interface, cfg.Queue, err)
	}
	cleanups = append(cleanups, func() { _ = r.closePaths() })
	caps := r.prov.Caps()
	if max := caps.MaxFrame - afxdp.FrameOverhead; mtu > max {
		return nil, fmt.Errorf("ring %s/%d: MTU %d is larger than the %s path's %d-byte frames carry (max MTU %d): use --frame-size 4096 (MTUs up to %d in one buffer, larger ones in multi-buffer chains) or lower the MTU",
			cfg.Interface, cfg.Queue, mtu, caps.Provider, caps.FrameSize, max, afxdp.MaxSingleBufferMTU(4096))
	}
	var hwWhy string
	if r.hw, hwWhy, err = r.openHWClock(); err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", cfg.Interface, cfg.Queue, err)
	}
	if r.hw != nil {
		cleanups = append(cleanups, func() { _ = r.hw.close() })
	}
	if r.res, err = route.NewResolver(r.ns, r.ifindex, r.log); err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", cfg.Interface, cfg.Queue, err)
	}
	cleanups = append(cleanups, func() { _ = r.res.Close() })
	if r.doorbell = cfg.Doorbell; r.doorbell == nil {
		if r.doorbell, err = shmq.NewBell(); err != nil {
			return nil, fmt.Errorf("ring %s/%d: doorbell: %w", cfg.Interface, cfg.Queue, err)
		}
		cleanups = append(cleanups, func() { _ = r.doorbell.Close() })
	}
	if r.epfd, err = unix.EpollCreate1(unix.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("ring %s/%d: epoll for the doorbells: %w (check the process's open-file limit)", cfg.Interface, cfg.Queue, err)
	}
	cleanups = append(cleanups, func() { unix.Close(r.epfd) })
	if err := r.watchDoorbell(r.doorbell.FD(), unix.EPOLL_CTL_ADD); err != nil {
		return nil, fmt.Errorf("ring %s/%d: watch the doorbell: %w", cfg.Interface, cfg.Queue, err)
	}
	r.table.Store(&table{})
	r.lanes.Store(&[]*Lane{})
	r.adoptedEps.Store(&[]*Endpoint{})
	r.eps = map[*Endpoint]struct{}{}
	r.flowRefs = map[qp.Flow]int{}
	r.overlays = map[int]*overlay{}
	r.ovList.Store(&[]*overlay{})
	r.standbyDeferred = cfg.Adopt != nil
	r.eng.init(r)
	if err = r.eng.initStaging(); err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", cfg.Interface, cfg.Queue, err)
	}
	fields := []zap.Field{zap.String("provider", caps.Provider), zap.String("mode", caps.Mode), zap.Stringer("fallback", r.fb.mode), zap.Int("mtu", mtu),
		zap.Int("frames", caps.RXFrames+caps.TXFrames), zap.Int("frame_size", caps.FrameSize), zap.Bool("multi_buffer", caps.MultiBuffer)}
	if prog := r.Program(); prog != nil && prog.FallbackReason() != nil {
		fields = append(fields, zap.NamedError("native_xdp_refused", prog.FallbackReason()))
	}
	if cfg.HWTimestamps != tsconv.ModeDisable {
		fields = append(fields, zap.Int("hw_ts_mode", int(r.HWTimestampMode())), zap.Bool("hw_ts_frames", caps.HWTimestamps))
		if hwWhy != "" {
			fields = append(fields, zap.String("hw_ts_reason", hwWhy))
		}
		if prog := r.Program(); prog != nil && prog.RXTimestampsRefused() != nil {
			fields = append(fields, zap.NamedError("hw_ts_xdp_refused", prog.RXTimestampsRefused()))
		}
	}
	// A slot holds the largest frame (a linearized chain with
	// multi-buffer); pages of slots never written are never committed.
	r.inbox = newInbox(handoffSlots, max(caps.FrameSize, caps.MaxFrame))
	if err = r.joinGroup(); err != nil {
		return nil, fmt.Errorf("ring %s/%d: %w", cfg.Interface, cfg.Queue, err)
	}
	r.log.Info("ring open", fields...)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	if !r.deferStart {
		r.start()
		r.startWatch()
	}
	return r, nil
}

// start starts the engine thread (and the hardware clock's sampler).
func (r *Ring) start() {
	r.startedAt = time.Now()
	if r.hw != nil {
		go r.hw.run(r.ctx)
	}
	go r.run()
}

// DefaultFrameSize is the frame size a ring uses when none is configured:
// 2048 bytes while one such frame holds the interface's largest frame
// (MTU 1774), else 4096 — one buffer up to MTU 3822, and above that the
// shorter descriptor chains (three buffers at MTU 9000 instead of six).
func DefaultFrameSize(mtu int) int {
	if afxdp.NeedsMultiBuffer(mtu, 2048) {
		return 4096
	}
	return 2048
}

// MTU returns the interface MTU the ring was opened for: what its paths,
// header templates and fragmentation use.
func (r *Ring) MTU() int { return int(r.mtu.Load()) }

// closeDoorbells closes the epoll set and the ring's doorbell if it is the
// ring's own.
func (r *Ring) closeDoorbells() error {
	r.epMu.Lock()
	r.epClosed = true
	err := unix.Close(r.epfd)
	r.epMu.Unlock()
	if r.cfg.Doorbell == nil {
		err = errors.Join(err, r.doorbell.Close())
	}
	return err
}

// watchDoorbell adds the eventfd fd to the engine's epoll set
// (unix.EPOLL_CTL_ADD) or removes it (unix.EPOLL_CTL_DEL), edge-triggered:
// every write is an event, so the engine never reads the eventfds (a
// system call per datagram saved).
func (r *Ring) watchDoorbell(fd, op int) error {
	r.epMu.Lock()
	defer r.epMu.Unlock()
	if r.epClosed {
		return errRingClosed
	}
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLET, Fd: int32(fd)}
	return unix.EpollCtl(r.epfd, op, fd, &ev)
}

// Doorbell is the ring's own eventfd that wakes the engine (which polls
// it through its epoll set, out of the netpoller). Clients ring their lane
// doorbells instead, except those of a session adopted from a daemon
// without lane doorbells, which still ring this one; so it is handed over
// with the ring.
func (r *Ring) Doorbell() *shmq.Bell { return r.doorbell }

// Ifindex returns the ring's interface index.
func (r *Ring) Ifindex() int { return r.ifindex }

// Caps reports the provider's capabilities.
func (r *Ring) Caps() qp.Caps { return r.prov.Caps() }

// Interface returns the ring's interface name and queue.
func (r *Ring) Interface() (string, int) { return r.cfg.Interface, r.cfg.Queue }

// Endpoints returns how many endpoints are bound on the ring.
func (r *Ring) Endpoints() int { return int(r.nEps.Load()) }

// endpoints returns the bound endpoints (a copy).
func (r *Ring) endpoints() []*Endpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Endpoint, 0, len(r.eps))
	for ep := range r.eps {
		out = append(out, ep)
	}
	return out
}

// Program returns the XDP steering program the ring uses, nil when its
// provider is steered otherwise.
func (r *Ring) Program() *bpf.Program {
	if s, ok := r.mainSteering().(*afxdp.Steering); ok {
		return s.Program()
	}
	return nil
}

// Flows lists the flows steered to the ring, as the kernel reports them
// (the fast path's steering; the TAP's without one).
func (r *Ring) Flows() ([]qp.Flow, error) {
	st := r.mainSteering()
	if st == nil {
		return nil, errRingClosed
	}
	return st.Flows()
}

// TCPFlows counts the TCP flows steered to the ring (listeners' 3-tuples,
// connections' 5-tuples), as the kernel reports them.
func (r *Ring) TCPFlows() (int, error) {
	flows, err := r.Flows()
	n := 0
	for _, f := range flows {
		if f.Proto == unix.IPPROTO_TCP {
			n++
		}
	}
	return n, err
}

// Done is closed when the engine has stopped: after Close, or when it failed
// (then Err says why).
func (r *Ring) Done() <-chan struct{} { return r.done }

// Err returns the error that stopped the engine, if any.
func (r *Ring) Err() error {
	if p := r.fatal.Load(); p != nil {
		return *p
	}
	return nil
}

// Close stops the engine, closes every endpoint and releases the path: the
// steering (for afxdp the XSKMAP slot and, with the last ring of the
// interface, the program) and the queue.
func (r *Ring) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil
	}
	r.closed = true
	r.mu.Unlock()
	r.leaveGroup()
	eps := r.endpoints()
	for _, ep := range eps {
		_ = ep.Close()
	}
	r.closeTCP()
	r.stop.Store(true)
	r.cancel()
	r.doorbell.Wake()
	<-r.done
	var errs []error
	if r.hw != nil {
		<-r.hw.done
		errs = append(errs, r.hw.close())
	}
	r.stopWatch()
	errs = append(errs, r.closePaths())
	errs = append(errs, r.res.Close())
	errs = append(errs, r.closeDoorbells())
	r.nl.Close()
	r.ns.Close()
	st := &r.stats
	r.log.Info("ring closed",
		zap.Uint64("rx_packets", st.RXPackets.Load()), zap.Uint64("rx_bytes", st.RXBytes.Load()),
		zap.Uint64("tx_packets", st.TXPackets.Load()), zap.Uint64("tx_bytes", st.TXBytes.Load()),
		zap.Uint64("rx_queue_full", st.RXQueueFull.Load()), zap.Uint64("rx_checksum_errors", st.RXChecksum.Load()),
		zap.Uint64("tx_unreachable", st.TXUnreachable.Load()), zap.Uint64("engine_wakeups", st.Wakeups.Load()))
	return errors.Join(errs...)
}

// sync waits until the engine has finished the iteration it was in, so that
// an endpoint removed from the table is no longer referenced by it.
func (r *Ring) sync() {
	start := r.epoch.Load()
	r.doorbell.Wake()
	for r.epoch.Load() < start+2 {
		select {
		case <-r.done:
			return
		default:
		}
		if r.sleeping.Load() && r.epoch.Load() > start {
			// The engine went to sleep after the table changed.
			return
		}
		time.Sleep(20 * time.Microsecond)
	}
}

func (r *Ring) run() {
	runtime.LockOSThread()
	defer close(r.done)
	if len(r.cfg.CPUs) > 0 {
		if err := pinThread(r.cfg.CPUs); err != nil {
			r.log.Warn("cannot pin engine thread", zap.Ints("cpus", r.cfg.CPUs), zap.Error(err))
		}
	}
	if err := r.eng.loop(); err != nil {
		r.fatal.Store(&err)
		r.log.Error("ring engine stopped", zap.Error(err))
		// Nobody will serve the queues any more: fail their users now
		// rather than let them wait forever.
		for _, ep := range r.endpoints() {
			ep.broken.Store(true)
			ep.noteActivity()
			if ep.user != nil {
				ep.user.Break(fmt.Errorf("ring %s/%d stopped: %w", r.cfg.Interface, r.cfg.Queue, err))
			}
		}
	}
}

// interfaceAddrs lists the interface's addresses of one family (for a
// wildcard bind).
func (r *Ring) interfaceAddrs(v4 bool) ([]netip.Addr, error) {
	fam := netlink.FAMILY_V6
	if v4 {
		fam = netlink.FAMILY_V4
	}
	link, err := r.nl.LinkByIndex(r.ifindex)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", r.cfg.Interface, err)
	}
	addrs, err := r.nl.AddrList(link, fam)
	if err != nil {
		return nil, fmt.Errorf("interface %s: list addresses: %w", r.cfg.Interface, err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			out = append(out, ip.Unmap())
		}
	}
	return out, nil
}

// addrCache is the interface's addresses as of a resolver generation.
type addrCache struct {
	gen    uint64
	v4, v6 []netip.Addr
}

// cachedAddrs returns the interface's addresses of one family, asking the
// kernel only when the resolver's generation moved (an address change
// bumps it) or fresh is set: binds and opens at scale would otherwise make
// two netlink round trips each.
func (r *Ring) cachedAddrs(v4, fresh bool) ([]netip.Addr, error) {
	g := r.res.Generation()
	if c := r.addrs.Load(); c != nil && c.gen == g && !fresh {
		if v4 {
			return c.v4, nil
		}
		return c.v6, nil
	}
	a4, err := r.interfaceAddrs(true)
	if err != nil {
		return nil, err
	}
	a6, err := r.interfaceAddrs(false)
	if err != nil {
		return nil, err
	}
	r.addrs.Store(&addrCache{gen: g, v4: a4, v6: a6})
	if v4 {
		return a4, nil
	}
	return a6, nil
}

// Owns reports whether addr is one of the ring's interface's addresses.
// A miss asks the kernel again: the notification of an address just added
// may not have arrived yet.
func (r *Ring) Owns(addr netip.Addr) (bool, error) {
	if ok, err := r.ownsLocal(addr); ok || err != nil {
		return ok, err
	}
	vx, err := r.overlayOf(addr.Unmap())
	return vx != nil, err
}

// ownsLocal reports whether addr is one of the interface's addresses.
func (r *Ring) ownsLocal(addr netip.Addr) (bool, error) {
	addr = addr.Unmap()
	for _, fresh := range []bool{false, true} {
		addrs, err := r.cachedAddrs(addr.Is4(), fresh)
		if err != nil {
			return false, err
		}
		if slices.Contains(addrs, addr) {
			return true, nil
		}
	}
	return false, nil
}

// HasFamily reports whether the interface has an address of the family
// (cached like Owns).
func (r *Ring) HasFamily(v4 bool) (bool, error) {
	for _, fresh := range []bool{false, true} {
		addrs, err := r.cachedAddrs(v4, fresh)
		if err != nil || len(addrs) > 0 {
			return len(addrs) > 0, err
		}
	}
	return false, nil
}

// pinThread restricts the calling OS thread to cpus.
func pinThread(cpus []int) error {
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	return unix.SchedSetaffinity(0, &set)
}

var errRingClosed = fmt.Errorf("ring closed: %w", net.ErrClosed)

// unixErr wraps an errno with context so errors.Is works on both.
func unixErr(errno unix.Errno, format string, args ...any) error {
	return fmt.Errorf("%s: %w", fmt.Sprintf(format, args...), errno)
}
