// Package config turns the daemon's flags, BYPASSD_* environment variables
// and config file into one validated Config: the settings table
// (settings.go, one entry per option: flag, environment variable, default,
// parser), the defaults (WithDefaults), and every check of a value and of
// how values combine (Resolve). docs/configuration.md lists the same
// settings, and a test holds the two together.
//
// A new daemon option is one entry in the settings table, a Config field,
// its check in Resolve when one value alone cannot be judged, and its row in
// docs/configuration.md; the code that uses it reads Config.
//
// The package opens nothing: what only the running system can tell (which
// provider an interface gets, which timestamp mode its NIC supports, how
// many queues it has) package daemon finds at start, and logs.
package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"os/user"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/stats"
)

// Defaults of Config fields left at their zero value.
const (
	DefaultSocketMode os.FileMode = 0o660
	DefaultRunDir                 = "/run/bypassd"
	DefaultStatsDir               = "/run/bypassd/stats"
	DefaultQueueBytes             = 1 << 20
	// DefaultMaxSockets and DefaultMaxQueueMemory let one client hold
	// 10,000 sockets with default queues. The queue memory is address
	// space in the session's sparse memfd: pages are committed as queues
	// fill, an idle socket commits 8 KiB.
	DefaultMaxSockets           = 16384
	DefaultMaxQueueMemory int64 = 32 << 30
	// MaxQueueMemoryLimit bounds --max-queue-memory (the session memory's
	// arena, see internal/shmsess).
	MaxQueueMemoryLimit int64 = 1 << 46
	DefaultFrames             = 4096
	// DefaultMaxFlows holds 100,000 bound sockets with room to spare (the
	// kernel preallocates about 100 bytes per entry: 26 MB).
	DefaultMaxFlows = 262144
	// MaxFlowsLimit bounds --max-flows.
	MaxFlowsLimit = 1 << 24
	// DefaultDevMemMax is the per-interface cap on staging memory: the
	// on-device memory of a single-port ConnectX.
	DefaultDevMemMax = 256 << 10
)

// Limits of the queue size a client may ask for in OPEN (and of
// Config.QueueBytes).
const (
	MinQueueBytes = shmq.MinCapacity
	MaxQueueBytes = 16 << 20
)

// maxQueueID is the highest queue id a ring can name: the XDP program's
// XSKMAP grows with the interface's queues (bpf.Options.Queues), and the
// kernel refuses a queue the interface does not have.
const maxQueueID = 1<<16 - 1

// AllQueues as Interface.Count: every receive queue the interface has
// (limited by Config.Queues).
const AllQueues = -1

// Interface names queues of an interface to serve, a ring each.
type Interface struct {
	Name string
	// Queue is the first (or only) queue.
	Queue int
	// Count is how many queues from Queue on: 0 or 1 for one, AllQueues
	// for every receive queue the interface has (Config.Queues limits it).
	Count int
}

func (i Interface) String() string {
	switch {
	case i.Count == AllQueues && i.Queue == 0:
		return i.Name
	case i.Count == AllQueues:
		return fmt.Sprintf("%s:%d-", i.Name, i.Queue)
	case i.Count > 1:
		return fmt.Sprintf("%s:%d-%d", i.Name, i.Queue, i.Queue+i.Count-1)
	}
	return i.Name + ":" + strconv.Itoa(i.Queue)
}

// ParseInterface parses "IFACE" (every receive queue), "IFACE:QUEUE" (one
// queue) or "IFACE:FIRST-LAST" (a range of queues).
func ParseInterface(s string) (Interface, error) {
	name, q, hasQueue := strings.Cut(strings.TrimSpace(s), ":")
	it := Interface{Name: name, Count: AllQueues}
	if hasQueue {
		lo, hi, isRange := strings.Cut(q, "-")
		first, err := strconv.Atoi(lo)
		last := first
		if err == nil && isRange {
			last, err = strconv.Atoi(hi)
		}
		if err != nil || last < first {
			return Interface{}, fmt.Errorf("interface %q: queues %q are not a number or range (use IFACE, IFACE:QUEUE or IFACE:FIRST-LAST, e.g. eth1:0-3)", s, q)
		}
		it.Queue, it.Count = first, last-first+1
	}
	if err := it.Validate(); err != nil {
		return Interface{}, err
	}
	return it, nil
}

func (i Interface) Validate() error {
	switch {
	case i.Name == "":
		return errors.New("interface: empty name (use IFACE or IFACE:QUEUE, e.g. eth1:0)")
	case len(i.Name) > 15 || strings.ContainsAny(i.Name, "/: \t"):
		return fmt.Errorf("interface %q: not a valid interface name (at most 15 characters, no '/', ':' or spaces)", i.Name)
	case i.Queue < 0 || i.Queue > maxQueueID:
		return fmt.Errorf("interface %s: queue %d out of range 0..%d", i.Name, i.Queue, maxQueueID)
	case i.Count < AllQueues || i.Queue+max(i.Count, 1)-1 > maxQueueID:
		return fmt.Errorf("interface %s: queues %d..%d out of range 0..%d", i.Name, i.Queue, i.Queue+i.Count-1, maxQueueID)
	}
	return nil
}

// Config is everything the daemon is configured with. A zero field means
// its default.
type Config struct {
	// Interfaces lists the interface queues to serve, a ring each. At
	// least one is required; an interface may appear with several queues.
	Interfaces []Interface
	// Queues limits an interface given without queues (Count AllQueues)
	// to its first Queues receive queues (0: all of them).
	Queues int

	// SocketPath is the control socket (default ctlproto.DefaultPath).
	SocketPath string
	// SocketMode is the socket file's permission bits (default 0660):
	// together with SocketGroup it decides who may connect.
	SocketMode os.FileMode
	// SocketGroup is a group name or numeric gid the socket file is given
	// (empty: the daemon's own group).
	SocketGroup string

	// RunDir holds the per-interface lock files (default /run/bypassd).
	RunDir string
	// StatsDir holds the stats files: "<pid>" per client process and
	// "bypassd.<pid>" for the daemon (docs/stats-file.md). It is created at
	// start, and files that dead processes or a crashed daemon left are
	// removed (default /run/bypassd/stats). One directory per daemon.
	StatsDir string

	// RXPoll is how long clients spin on an empty queue before sleeping
	// on its eventfd (BYPASSD_RX_POLL; told to clients in the HELLO reply,
	// in whole microseconds): 0 never spins, negative spins forever.
	RXPoll time.Duration
	// EnginePoll is how long an idle ring engine spins before sleeping
	// (ring.Config.Poll): 0 sleeps at once, negative spins forever.
	EnginePoll time.Duration

	// QueueBytes is the data capacity of each of a socket's two queues
	// when the client does not ask for a size (default 1 MiB); a power of
	// two in MinQueueBytes..MaxQueueBytes.
	QueueBytes int
	// MaxSockets is the most sockets one client connection may have open
	// (default 1024); more fail with EMFILE.
	MaxSockets int
	// MaxQueueMemory bounds the shared memory of one client connection's
	// sockets, in bytes (default 256 MiB); more fail with ENOMEM.
	MaxQueueMemory int64
	// MaxFlows is the capacity of each interface's flow steering map
	// (default DefaultMaxFlows): a bind or join needing one more entry
	// fails with ENOSPC and counts flows_full.
	MaxFlows int

	// Provider picks each ring's raw queue pair backend: "auto" (the
	// default: verbs where the binary has it and the interface has an RDMA
	// port for raw packet QPs, afxdp otherwise), "afxdp", "verbs" or "tap"
	// (see qp.Register).
	Provider string
	// Fallback is what a ring does when its fast path is unavailable or
	// lost: "auto" (the default: a standby TAP path takes the flows over
	// and gives them back when the fast path returns), "tap" (the TAP
	// path only, like Provider "tap") or "none" (see ring.Fallback).
	Fallback string

	// TCPCongestion is the TCP stacks' congestion control: "cubic" (the
	// default) or "reno".
	TCPCongestion string
	// TCPQuickAckThreshold is VMA's TCP_QUICKACK threshold: on a
	// connection with TCP_QUICKACK on, segments of more payload bytes
	// than this are acknowledged the delayed way (0: off, every ACK at
	// once).
	TCPQuickAckThreshold int

	// Frames is the UMEM frame count of each ring (default 4096).
	Frames int
	// FrameSize is each ring's buffer size, 2048 or 4096 (0, the
	// default: ring.DefaultFrameSize of the interface's MTU).
	FrameSize int
	// XDPMode selects native or generic XDP (default: native, generic
	// when the driver refuses).
	XDPMode bpf.AttachMode
	// CPUs pins the ring engine threads, the k-th ring on the k-th CPU of
	// the list (wrapping). Empty: each ring on its queue's interrupt CPUs
	// where /proc/interrupts names them, else spread over the allowed CPUs
	// one per ring; a lone ring is not pinned.
	CPUs []int
	// HWTSConversion is the requested hardware timestamp conversion mode
	// (BYPASSD_HW_TS_CONVERSION, VMA's modes 0..4; nil: 3, sync to
	// system). The effective mode is the lowest every interface
	// supports; New logs it once with the reason.
	HWTSConversion *tsconv.Mode

	// DevMemTX is the device memory each ring stages egress frames in,
	// in bytes (BYPASSD_RING_DEV_MEM_TX; rounded up to 64; 0: off).
	DevMemTX int
	// DevMemMax caps the staging memory of all rings of one interface
	// (default DefaultDevMemMax); a configuration asking for more is
	// refused at start.
	DevMemMax int
	// DevMemInline is the inline threshold: frames of at most this many
	// bytes are never staged (default 204; negative: 0, every frame is a
	// candidate).
	DevMemInline int

	// StatsInterval is how often the stats files are rewritten (default
	// 100 ms; at least 1 ms). Negative: no stats files at all (the data
	// path is the same either way; publishing costs one pass over the
	// counters per interval).
	StatsInterval time.Duration
	// MetricsAddr is the host:port where /metrics is served for
	// Prometheus (empty: not served). A port of 0 picks a free one; see
	// Daemon.MetricsAddr.
	MetricsAddr string
	// MetricsMaxClients is how many client processes get metrics series
	// of their own (default stats.DefaultMaxClients); the rest are summed
	// under pid="other", so the series count stays bounded.
	MetricsMaxClients int
	// Version is the daemon's version string, shown in its stats file and
	// in bypassd_build_info.
	Version string

	// EnginePriority runs the ring engine threads under SCHED_FIFO at
	// this priority (ring.Config.RealtimePriority; 0: normal scheduler).
	EnginePriority int
	// Pacing configures every interface's rate table (Device is filled
	// in per interface; a hardware provider's own range replaces
	// MinKbps/MaxKbps).
	Pacing pacing.TableConfig
	// QoS is the traffic-class state of the interfaces it names (from
	// --qos-file); the others start from qos.Default with TrafficClass
	// (nil: not forced) and TTL (0: not forced). QoSPath, when set, is
	// where SET_QOS changes are saved (the same file), so they survive
	// a restart.
	QoS          QoSFile
	QoSPath      string
	TrafficClass *uint8
	TTL          uint8

	// LogLevel, if set, is the level of the logger given to New, so that
	// Daemon.SetLogLevel can change it at run time.
	LogLevel *zap.AtomicLevel
}

// DefaultStatsInterval is how often stats files are rewritten by default.
const DefaultStatsInterval = 100 * time.Millisecond

// WithDefaults returns c with zero fields set to their defaults.
func (c Config) WithDefaults() Config {
	if c.SocketPath == "" {
		c.SocketPath = ctlproto.DefaultPath
	}
	if c.SocketMode == 0 {
		c.SocketMode = DefaultSocketMode
	}
	if c.RunDir == "" {
		c.RunDir = DefaultRunDir
	}
	if c.StatsDir == "" {
		c.StatsDir = DefaultStatsDir
	}
	if c.QueueBytes == 0 {
		c.QueueBytes = DefaultQueueBytes
	}
	if c.MaxSockets == 0 {
		c.MaxSockets = DefaultMaxSockets
	}
	if c.MaxQueueMemory == 0 {
		c.MaxQueueMemory = DefaultMaxQueueMemory
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = DefaultMaxFlows
	}
	if c.Frames == 0 {
		c.Frames = DefaultFrames
	}
	if c.Provider == "" {
		c.Provider = ProviderAuto
	}
	if c.Fallback == "" {
		c.Fallback = ring.FallbackAuto.String()
		if c.DevMemTX > 0 {
			// Staging needs a fixed provider (see CheckDevMem): asking
			// for device memory turns the default TAP path off.
			c.Fallback = ring.FallbackNone.String()
		}
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	if c.DevMemMax == 0 {
		c.DevMemMax = DefaultDevMemMax
	}
	if c.DevMemTX > 0 {
		c.DevMemTX = (c.DevMemTX + 63) &^ 63
	}
	if c.MetricsMaxClients == 0 {
		c.MetricsMaxClients = stats.DefaultMaxClients
	}
	if c.Version == "" {
		c.Version = "dev"
	}
	if c.HWTSConversion == nil {
		m := tsconv.DefaultMode
		c.HWTSConversion = &m
	}
	return c
}

// Validate checks c (after applying defaults) and resolves SocketGroup.
// Its errors say which setting is wrong and what is accepted.
func (c Config) Validate() error {
	_, err := c.Resolve()
	return err
}

// Resolved is a validated Config, defaults applied, with the socket group
// looked up.
type Resolved struct {
	Config
	SocketGID int // -1: keep
}

// Resolve applies the defaults and checks every value and how values
// combine; the first wrong setting is the error, saying what is accepted.
func (c Config) Resolve() (Resolved, error) {
	c = c.WithDefaults()
	r := Resolved{Config: c, SocketGID: -1}
	if len(c.Interfaces) == 0 {
		return r, errors.New("no interface configured: give at least one with --interface IFACE[:QUEUE] (or BYPASSD_INTERFACES)")
	}
	seen := map[Interface]bool{}
	for _, it := range c.Interfaces {
		if err := it.Validate(); err != nil {
			return r, err
		}
		if seen[it] {
			return r, fmt.Errorf("interface %s given twice", it)
		}
		seen[it] = true
	}
	if !strings.HasPrefix(c.SocketPath, "/") {
		return r, fmt.Errorf("socket path %q: give an absolute path such as %s", c.SocketPath, ctlproto.DefaultPath)
	}
	if c.SocketMode&^os.ModePerm != 0 {
		return r, fmt.Errorf("socket mode %#o: only permission bits (0..0777) are allowed", uint32(c.SocketMode))
	}
	if c.SocketGroup != "" {
		gid, err := LookupGroup(c.SocketGroup)
		if err != nil {
			return r, err
		}
		r.SocketGID = gid
	}
	if err := checkPoll("rx poll", c.RXPoll); err != nil {
		return r, err
	}
	if err := checkPoll("engine poll", c.EnginePoll); err != nil {
		return r, err
	}
	if err := CheckQueueBytes(c.QueueBytes); err != nil {
		return r, err
	}
	if c.MaxSockets < 1 || c.MaxSockets > shmsess.MaxSlots {
		return r, fmt.Errorf("max sockets %d: must be 1 to %d per client", c.MaxSockets, shmsess.MaxSlots)
	}
	if min := shmsess.SocketSpan(c.QueueBytes); c.MaxQueueMemory < min {
		return r, fmt.Errorf("max queue memory %d bytes: too small for even one socket with %d-byte queues (needs %d)", c.MaxQueueMemory, c.QueueBytes, min)
	}
	if c.MaxQueueMemory > MaxQueueMemoryLimit {
		return r, fmt.Errorf("max queue memory %d bytes: at most %d (64 TiB) of address space per client", c.MaxQueueMemory, MaxQueueMemoryLimit)
	}
	if c.MaxFlows < 1 || c.MaxFlows > MaxFlowsLimit {
		return r, fmt.Errorf("max flows %d: must be 1 to %d", c.MaxFlows, MaxFlowsLimit)
	}
	if c.Frames < 64 || c.Frames&(c.Frames-1) != 0 {
		return r, fmt.Errorf("frames %d: must be a power of two, at least 64", c.Frames)
	}
	if c.FrameSize != 0 && c.FrameSize != 2048 && c.FrameSize != 4096 {
		return r, fmt.Errorf("frame size %d: must be 2048 or 4096 (or 0: chosen from the interface MTU)", c.FrameSize)
	}
	if err := checkProvider(c.Provider); err != nil {
		return r, err
	}
	if _, err := ring.ParseFallback(c.Fallback); err != nil {
		return r, err
	}
	if c.TCPQuickAckThreshold < 0 || c.TCPQuickAckThreshold > 65535 {
		return r, fmt.Errorf("TCP_QUICKACK threshold %d: want 0 (off) to 65535 bytes", c.TCPQuickAckThreshold)
	}
	switch c.TCPCongestion {
	case "", "reno", "cubic":
	default:
		return r, fmt.Errorf("TCP congestion control %q: use reno or cubic", c.TCPCongestion)
	}
	switch c.XDPMode {
	case bpf.ModeAuto, bpf.ModeNative, bpf.ModeGeneric:
	default:
		return r, fmt.Errorf("XDP mode %v: must be auto, native or generic", c.XDPMode)
	}
	if !c.HWTSConversion.Valid() {
		return r, fmt.Errorf("hardware timestamp conversion mode %d: use 0 (disable), 1 (raw), 2 (best), 3 (sync) or 4 (ptp)", int(*c.HWTSConversion))
	}
	if c.Queues < 0 {
		return r, fmt.Errorf("queues %d: give a count of queues per interface (0: all)", c.Queues)
	}
	for _, cpu := range c.CPUs {
		if cpu < 0 || cpu >= 1<<16 {
			return r, fmt.Errorf("CPU %d: not a CPU number", cpu)
		}
	}
	if err := CheckDevMem(c); err != nil {
		return r, err
	}
	if c.StatsInterval > 0 && c.StatsInterval < time.Millisecond {
		return r, fmt.Errorf("stats interval %v: at least 1ms (negative turns stats files off; so does --stats-interval 0)", c.StatsInterval)
	}
	if c.MetricsAddr != "" {
		if _, _, err := net.SplitHostPort(c.MetricsAddr); err != nil {
			return r, fmt.Errorf("metrics address %q: want HOST:PORT such as 127.0.0.1:9465 (empty: no metrics)", c.MetricsAddr)
		}
	}
	if c.EnginePriority < 0 || c.EnginePriority > 99 {
		return r, fmt.Errorf("engine priority %d: want 0 (normal scheduler) or a SCHED_FIFO priority 1..99", c.EnginePriority)
	}
	if err := c.validateQoS(); err != nil {
		return r, err
	}
	if err := c.Pacing.Validate(); err != nil {
		return r, err
	}
	if c.MetricsMaxClients < 0 {
		return r, fmt.Errorf("metrics max clients %d: must be positive", c.MetricsMaxClients)
	}
	return r, nil
}

func checkPoll(what string, d time.Duration) error {
	if d >= 0 && d/time.Microsecond > math.MaxInt32 {
		return fmt.Errorf("%s %v: too long (at most %d µs; use -1 to spin forever)", what, d, math.MaxInt32)
	}
	return nil
}

func CheckQueueBytes(n int) error {
	if n < MinQueueBytes || n > MaxQueueBytes || n&(n-1) != 0 {
		return fmt.Errorf("queue bytes %d: must be a power of two from %d (4 KiB) to %d (16 MiB)", n, MinQueueBytes, MaxQueueBytes)
	}
	return nil
}

// LookupGroup resolves a group name or a numeric gid.
func LookupGroup(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 || n > math.MaxUint32-1 {
			return 0, fmt.Errorf("socket group %s: not a valid gid", s)
		}
		return n, nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: %w (create it with `groupadd %s`, or give a numeric gid)", s, err, s)
	}
	gid, err := strconv.Atoi(g.Gid)
	if err != nil {
		return 0, fmt.Errorf("socket group %q: gid %q is not numeric", s, g.Gid)
	}
	return gid, nil
}

// ParseCPUList reads a CPU list like "0,2-3" (the kernel's cpulist format).
func ParseCPUList(v string) ([]int, error) {
	var cpus []int
	seen := map[int]bool{}
	for _, part := range strings.Split(v, ",") {
		part = strings.TrimSpace(part)
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		b := a
		if err == nil && isRange {
			b, err = strconv.Atoi(hi)
		}
		if err != nil || a < 0 || b < a || b >= 1<<16 {
			return nil, fmt.Errorf("%q is not a CPU or range (want a list like 0,2-3)", part)
		}
		for c := a; c <= b; c++ {
			if !seen[c] {
				seen[c] = true
				cpus = append(cpus, c)
			}
		}
	}
	return cpus, nil
}
