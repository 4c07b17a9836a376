package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/route"
	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

// ErrClosed is returned by Serve on a Daemon that was closed.
var ErrClosed = errors.New("daemon: closed")

// writeTimeout bounds one reply to a client: a client that stops reading
// its control socket loses its session instead of blocking the daemon.
const writeTimeout = 5 * time.Second

// Daemon is a running bypassd: its rings, its control socket and its client
// sessions.
type Daemon struct {
	cfg   config.Resolved
	log   *zap.Logger
	rings []*ringInfo
	// devices are the served interfaces' NIC facts, probed at start.
	devices []*deviceFacts
	// limits are the process limits raised at start (raiseNofile).
	limits ctldoc.Limits
	locks  []*ifaceLock
	ln     *ctlproto.Listener
	// nl reads links and queues in the daemon's network namespace
	// (devices, vanished interfaces).
	nl   *netlink.Handle
	nlMu sync.Mutex
	// qosMu guards qosNow, each interface's traffic-class state (qos.go).
	qosMu  sync.Mutex
	qosNow map[string]qos.Config

	// nextSocket numbers sockets daemon-wide, so a socket id never names
	// another client's socket by accident.
	nextSocket atomic.Uint32
	// ringDoorbells makes HELLO pass the rings' shared doorbells instead
	// of lane doorbells, as daemons before lane doorbells did: the tests
	// of a takeover from such a daemon set it.
	ringDoorbells atomic.Bool

	started time.Time
	ctl     ctlCounters
	stats   statsState
	metrics *metricsServer

	mu       sync.Mutex
	sessions map[*session]struct{}
	serving  bool
	// stopping is set once shutdown began: no new session is admitted.
	stopping bool
	sessWG   sync.WaitGroup

	// netns is the network namespace New ran in, where rings reopen;
	// recoverWG counts the goroutines waiting for a vanished interface.
	netns     netns.NsHandle
	recoverWG sync.WaitGroup

	// pz is a pause for a takeover; gone is closed once the daemon was
	// handed over (handedOver), which Serve and Close then respect.
	pz         pauseState
	gone       chan struct{}
	handedOver bool
	// built: a taking-over daemon built from a state (adopt.go build) and
	// not started yet; adopted are its sessions until they run.
	built   bool
	adopted []*session
	// quiesceAt is when the handover stopped this daemon's engines (tests
	// measure the data path's blackout from it to ring.StartedAt of the
	// taking-over daemon's rings).
	quiesceAt time.Time

	stopOnce  sync.Once
	stop      chan struct{} // closed by Close to end Serve
	served    chan struct{} // closed when Serve returns
	lnOnce    sync.Once
	lnErr     error
	closeOnce sync.Once
	closeErr  error
}

// ringInfo is one open ring and how to name it in logs.
type ringInfo struct {
	// r is the ring; with a TAP fallback a new one replaces it when its
	// interface comes back after vanishing (see ringdown.go).
	r   atomic.Pointer[ring.Ring]
	it  config.Interface
	log *zap.Logger
	// rates is the interface's rate table (shared by its rings).
	rates *pacing.Table
	// cfg is what the ring was opened with, to open it again.
	cfg ring.Config
	// down is why the ring's interface is gone (nil: the ring serves).
	down atomic.Pointer[error]
	// homed counts the sockets whose home this ring is (see homeRing).
	homed atomic.Int64
	// doorbell wakes the ring's engine; owned here so that a ring opened
	// again keeps the doorbell every session received at HELLO.
	doorbell *shmq.Bell
}

// ring returns the ring now serving ri.
func (ri *ringInfo) ring() *ring.Ring { return ri.r.Load() }

// New validates cfg, prepares the stats directory, creates the control
// socket, locks the interfaces and opens one ring per configured interface
// queue. The rings are opened on the calling thread, so it must be in the
// interfaces' network namespace (the daemon serves one namespace). On error
// nothing is left behind.
func New(cfg config.Config, log *zap.Logger) (_ *Daemon, err error) {
	d, err := newDaemon(cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = d.release()
		}
	}()
	rc := &d.cfg
	if err := prepareStatsDir(rc.StatsDir, log); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if d.ln, err = ctlproto.Listen(rc.SocketPath, rc.SocketMode, rc.SocketGID); err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	if err := d.resolveInterfaces(); err != nil {
		return nil, err
	}
	locked := map[string]bool{}
	for _, it := range rc.Interfaces {
		if locked[it.Name] {
			continue
		}
		l, err := lockInterface(rc.RunDir, it.Name)
		if err != nil {
			return nil, fmt.Errorf("daemon: %w", err)
		}
		d.locks = append(d.locks, l)
		locked[it.Name] = true
	}
	if err := d.openRings(nil); err != nil {
		return nil, err
	}
	if err := d.start(); err != nil {
		return nil, err
	}
	return d, nil
}

// newDaemon validates cfg and returns a Daemon holding nothing yet.
func newDaemon(cfg config.Config, log *zap.Logger) (*Daemon, error) {
	if log == nil {
		log = zap.NewNop()
	}
	rc, err := cfg.Resolve()
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d := &Daemon{cfg: rc, log: log, sessions: map[*session]struct{}{}, started: time.Now(), netns: netns.None(),
		stop: make(chan struct{}), served: make(chan struct{}), gone: make(chan struct{})}
	d.stats.clients = map[int]*clientStats{}
	d.qosNow = map[string]qos.Config{}
	if d.limits, err = raiseNofile(); err != nil {
		// Serve anyway, with fewer sockets.
		log.Warn("cannot raise the open-file limit; the daemon serves fewer sockets", zap.Error(err))
		err = nil
	}
	return d, nil
}

// resolveInterfaces opens the daemon's netlink handle and expands the
// configured interfaces into their queues.
func (d *Daemon) resolveInterfaces() (err error) {
	rc := &d.cfg
	if d.nl, err = netlink.NewHandle(unix.NETLINK_ROUTE); err != nil {
		return fmt.Errorf("daemon: netlink: %w", err)
	}
	if rc.Interfaces, err = expandInterfaces(rc.Interfaces, rc.Queues, func(name string) (int, error) {
		return rxQueueCount(d.nl, name)
	}); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if err := config.CheckDevMem(rc.Config); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.cfg.Interfaces = rc.Interfaces
	return nil
}

// openRings opens one ring per configured interface queue, on the calling
// thread's network namespace; adopt, when not nil, gives what a ring
// takes over from a previous daemon.
func (d *Daemon) openRings(adopt func(i int, it config.Interface) (*ring.Adoption, *shmq.Bell, error)) (err error) {
	rc, log := &d.cfg, d.log
	if d.netns, err = netns.Get(); err != nil {
		return fmt.Errorf("daemon: open the network namespace: %w", err)
	}
	hwts, err := hwTimestampMode(rc.Interfaces, *rc.HWTSConversion, log)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	fallback, err := ring.ParseFallback(rc.Fallback)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	for _, it := range rc.Interfaces {
		if d.device(it.Name) == nil {
			d.devices = append(d.devices, probeDevice(it.Name, d.nl, log))
		}
	}
	cpus := engineCPUs(rc.Interfaces, rc.CPUs, func(name string) string { return d.device(name).bus })
	for k, it := range rc.Interfaces {
		rlog := log.With(zap.String("iface", it.Name), zap.Int("queue", it.Queue))
		// The doorbell of an adopted ring is the one its clients hold.
		var ad *ring.Adoption
		var bell *shmq.Bell
		if adopt != nil {
			if ad, bell, err = adopt(k, it); err != nil {
				return fmt.Errorf("daemon: ring %s: %w", it, err)
			}
		} else if bell, err = shmq.NewBell(); err != nil {
			return fmt.Errorf("daemon: ring %s doorbell: %w", it, err)
		}
		rcfg := ring.Config{
			Doorbell:         bell,
			Fallback:         fallback,
			HWTimestamps:     hwts,
			Interface:        it.Name,
			Queue:            it.Queue,
			Provider:         chooseProvider(rc.Provider, d.device(it.Name).rdma, rlog),
			Frames:           rc.Frames,
			FrameSize:        rc.FrameSize,
			XDPMode:          rc.XDPMode,
			CPUs:             cpus[k],
			RealtimePriority: rc.EnginePriority,
			Poll:             rc.EnginePoll,
			RXPoll:           rc.RXPoll,
			QueueBytes:       rc.QueueBytes,
			MaxFlows:         rc.MaxFlows,
			DevMemTX:         rc.DevMemTX,
			DevMemInline:     rc.DevMemInline,
			TCPCongestion:    rc.TCPCongestion,
			Log:              rlog,
		}
		rcfg.Adopt = ad
		r, err := ring.Open(rcfg)
		if err != nil {
			_ = bell.Close()
			if errors.Is(err, unix.EBUSY) {
				return fmt.Errorf("daemon: open ring %s: %w (another bypassd, or another AF_XDP/XDP user, probably holds it: check `ps -C bypassd` and `bpftool net`)", it, err)
			}
			return fmt.Errorf("daemon: open ring %s: %w", it, err)
		}
		rcfg.Adopt = nil // a ring reopened after its interface vanished starts afresh
		ri := &ringInfo{it: it, log: rlog, cfg: rcfg, doorbell: bell}
		ri.r.Store(r)
		d.rings = append(d.rings, ri)
		d.applyQoS(ri)
	}
	d.logQoS()
	d.openRateTables()
	return nil
}

// start starts the stats publisher and the metrics server.
func (d *Daemon) start() error {
	if err := d.startStats(); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	if err := d.startMetrics(); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.logReady()
	return nil
}

// logReady logs that the daemon serves, with its settings.
func (d *Daemon) logReady() {
	rc := &d.cfg
	d.log.Info("bypassd ready", zap.Uint64("nofile_soft", d.limits.NofileSoft), zap.Uint64("nofile_hard", d.limits.NofileHard), zap.String("socket", rc.SocketPath), zap.Stringers("interfaces", rc.Interfaces),
		zap.Int("queue_bytes", rc.QueueBytes), zap.Int32("rx_poll_us", pollMicros(rc.RXPoll)),
		zap.Duration("engine_poll", rc.EnginePoll), zap.Int("max_sockets", rc.MaxSockets),
		zap.Int64("max_queue_memory", rc.MaxQueueMemory), zap.String("stats_dir", rc.StatsDir),
		zap.Duration("stats_interval", rc.StatsInterval), zap.String("metrics", d.MetricsAddr()),
		zap.Int("dev_mem_tx", rc.DevMemTX), zap.Int("dev_mem_max", rc.DevMemMax))
	if err := route.ParkStatus(); err != nil {
		// Then every bound socket costs a descriptor: RLIMIT_NOFILE
		// bounds the sockets the daemon serves.
		d.log.Warn("port reservations keep a descriptor each (io_uring file tables unavailable); raise RLIMIT_NOFILE for many bound sockets",
			zap.Uint64("nofile_soft", d.limits.NofileSoft), zap.Error(err))
	}
}

// SocketPath returns the control socket's path.
func (d *Daemon) SocketPath() string { return d.cfg.SocketPath }

// Rings returns the daemon's rings, in configuration order.
func (d *Daemon) Rings() []*ring.Ring {
	out := make([]*ring.Ring, len(d.rings))
	for i, ri := range d.rings {
		out[i] = ri.ring()
	}
	return out
}

// SetLogLevel changes the log level at run time. It needs config.Config.LogLevel.
func (d *Daemon) SetLogLevel(l zapcore.Level) error {
	if d.cfg.LogLevel == nil {
		return errors.New("daemon: log level is fixed: the daemon was started without config.Config.LogLevel")
	}
	d.cfg.LogLevel.SetLevel(l)
	d.log.Info("log level changed", zap.Stringer("level", l))
	return nil
}

// Sessions returns the number of connected clients.
func (d *Daemon) Sessions() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.sessions)
}

// Serve accepts clients until ctx ends, Close is called or accepting fails,
// then shuts down gracefully: every client is sent SHUTDOWN and its session
// closed (releasing all its sockets), and the control socket is removed.
// The rings stay open until Close. Serve may be called once; it returns nil
// after a requested stop.
func (d *Daemon) Serve(ctx context.Context) error {
	d.mu.Lock()
	if d.serving || d.stopping {
		d.mu.Unlock()
		return fmt.Errorf("daemon: Serve called twice or after Close: %w", ErrClosed)
	}
	d.serving = true
	d.mu.Unlock()
	defer close(d.served)

	acceptDone := make(chan error, 1)
	go func() { acceptDone <- d.acceptLoop() }()
	ringFailed := d.watchRings()
	var err error
	for stop := false; !stop; {
		stop = true
		select {
		case <-d.gone:
			d.log.Info("stopping: handed over to a new daemon")
			<-acceptDone
			d.sessWG.Wait()
			return nil
		case f := <-ringFailed:
			if d.recoverRing(f, ringFailed) {
				// Its interface vanished; the TAP fallback waits for it
				// to come back, and the daemon goes on.
				stop = false
				continue
			}
			err = f.err
			// Its clients' sockets can no longer be served: stop, so
			// they get a clear error now and a supervisor can restart us.
			d.log.Error("shutting down: a ring stopped", zap.Error(err))
		case <-ctx.Done():
			d.log.Info("shutting down: stop requested")
		case <-d.stop:
			d.log.Info("shutting down: daemon closed")
		case err = <-acceptDone:
			acceptDone = nil
			if err == nil && d.isHandedOver() {
				// The accept loop saw the handover before gone was
				// closed: stop as handed over, leaving the control
				// socket (the new daemon's now) in place.
				<-d.gone
				d.log.Info("stopping: handed over to a new daemon")
				d.sessWG.Wait()
				return nil
			}
			d.log.Error("shutting down: cannot accept clients", zap.Error(err))
		}
	}
	d.shutdown()
	if acceptDone != nil {
		<-acceptDone
	}
	return err
}

// ringFailure is a ring whose engine stopped on its own.
type ringFailure struct {
	ri  *ringInfo
	r   *ring.Ring
	err error
}

// watchRings returns a channel that yields the rings whose engine stops on
// its own (a vanished interface, a dead queue).
func (d *Daemon) watchRings() chan ringFailure {
	failed := make(chan ringFailure, len(d.rings))
	for _, ri := range d.rings {
		d.watchRing(ri, ri.ring(), failed)
	}
	return failed
}

func (d *Daemon) watchRing(ri *ringInfo, r *ring.Ring, failed chan<- ringFailure) {
	go func() {
		<-r.Done()
		if err := r.Err(); err != nil {
			failed <- ringFailure{ri: ri, r: r, err: fmt.Errorf("ring %s: %w", ri.it, err)}
		}
	}()
}

// acceptLoop admits clients until the listener is closed.
func (d *Daemon) acceptLoop() error {
	var delay time.Duration
	for {
		c, err := d.ln.Accept()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			// Paused for a takeover.
			if d.park(nil) {
				continue
			}
			if d.isHandedOver() {
				return nil
			}
		}
		if err != nil {
			if d.isStopping() {
				return nil
			}
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			// A broken listening socket will not recover; anything else
			// (out of descriptors or memory, a connection that died while
			// being accepted) is transient: wait and retry rather than
			// stop serving everybody.
			if errors.Is(err, unix.EBADF) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTSOCK) {
				return fmt.Errorf("daemon: accept on %s: %w", d.cfg.SocketPath, err)
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			d.log.Warn("accept failed; retrying", zap.Error(err), zap.Duration("delay", delay))
			select {
			case <-time.After(delay):
			case <-d.stop:
			}
			continue
		}
		delay = 0
		d.admit(c)
	}
}

func (d *Daemon) isHandedOver() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.handedOver
}

func (d *Daemon) isStopping() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.stopping
}

// admit starts a session for a new connection.
func (d *Daemon) admit(c *ctlproto.Conn) {
	cred, err := c.PeerCred()
	if err != nil {
		d.log.Warn("client refused: cannot read its credentials", zap.Error(err))
		_ = c.Close()
		return
	}
	s := newSession(d, c, *cred)
	d.mu.Lock()
	if d.stopping {
		d.mu.Unlock()
		s.sendShutdown()
		_ = c.Close()
		return
	}
	d.sessions[s] = struct{}{}
	d.sessWG.Add(1)
	d.mu.Unlock()
	s.log.Debug("client connected")
	go s.run()
}

// forget removes a finished session.
func (d *Daemon) forget(s *session) {
	d.mu.Lock()
	delete(d.sessions, s)
	d.mu.Unlock()
	d.sessWG.Done()
}

// shutdown stops accepting, tells every client and waits until every
// session released what it held. It is idempotent.
func (d *Daemon) shutdown() {
	d.mu.Lock()
	d.stopping = true
	sessions := make([]*session, 0, len(d.sessions))
	for s := range d.sessions {
		sessions = append(sessions, s)
	}
	d.mu.Unlock()
	d.closeListener()
	for _, s := range sessions {
		s.stop()
	}
	d.sessWG.Wait()
	if len(sessions) > 0 {
		d.log.Info("all clients disconnected", zap.Int("clients", len(sessions)))
	}
}

func (d *Daemon) closeListener() {
	d.lnOnce.Do(func() {
		if d.ln != nil {
			d.lnErr = d.ln.Close()
		}
	})
}

// Close shuts the daemon down: it ends Serve (as a stop request would),
// or, if Serve is not running, disconnects clients itself; then it closes
// every ring (detaching the XDP program), removes the control socket and
// releases the interface locks. It is idempotent.
func (d *Daemon) Close() error {
	d.closeOnce.Do(func() {
		d.mu.Lock()
		serving := d.serving
		d.stopping = true
		d.mu.Unlock()
		d.stopOnce.Do(func() { close(d.stop) })
		if serving {
			<-d.served
		} else {
			d.shutdown()
		}
		d.closeErr = d.release()
		d.log.Info("bypassd stopped")
	})
	return d.closeErr
}

// abandon frees this process's descriptors after a handover (the rings
// were released then) without removing the socket file or the lock files,
// which the new daemon uses.
func (d *Daemon) abandon() error {
	for _, ri := range d.rings {
		_ = ri.doorbell.Close() // the new daemon has its duplicate
	}
	d.rings = nil
	if d.nl != nil {
		d.nl.Close()
		d.nl = nil
	}
	if d.netns.IsOpen() {
		_ = d.netns.Close()
	}
	for _, l := range d.locks {
		_ = l.f.Close()
	}
	d.locks = nil
	if d.ln != nil {
		d.lnOnce.Do(d.ln.Abandon)
	}
	return nil
}

// release frees the resources New acquired, in reverse order.
func (d *Daemon) release() error {
	var errs []error
	// Readers of the rings' counters stop before the rings close.
	if err := d.stopMetrics(); err != nil {
		errs = append(errs, err)
	}
	if err := d.stopStats(); err != nil {
		errs = append(errs, err)
	}
	d.recoverWG.Wait() // stopping is set: they return within a poll
	if d.built {
		d.discardBuilt()
		return nil
	}
	if d.isHandedOver() {
		return d.abandon()
	}
	for i := len(d.rings) - 1; i >= 0; i-- {
		if err := d.rings[i].ring().Close(); err != nil {
			errs = append(errs, fmt.Errorf("close ring %s: %w", d.rings[i].it, err))
		}
		_ = d.rings[i].doorbell.Close()
	}
	d.rings = nil
	if d.nl != nil {
		d.nl.Close()
		d.nl = nil
	}
	if d.netns.IsOpen() {
		_ = d.netns.Close()
	}
	for _, l := range d.locks {
		if err := l.release(); err != nil {
			errs = append(errs, err)
		}
	}
	d.locks = nil
	d.closeListener()
	if d.lnErr != nil && !errors.Is(d.lnErr, os.ErrNotExist) {
		errs = append(errs, d.lnErr)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("daemon: close: %w", err)
	}
	return nil
}
