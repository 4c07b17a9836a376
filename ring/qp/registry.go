package qp

import (
	"encoding/json"
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
)

// A path is how frames move between a NIC queue and a ring: a Provider (the
// raw queue pair the engine reads and writes) and the Steering that directs
// offloaded flows into it. Each provider package registers an opener under
// its name from an init function (Register); package ring opens paths by
// name and knows no provider. This registry lives here, in the seam, so that
// providers need not import the engine and the engine need not import the
// providers' glue.

// PathConfig is what an opener gets to open a path for one ring.
type PathConfig struct {
	// Interface, Ifindex and Queue name the ring's NIC queue; MAC and MTU
	// are the interface's.
	Interface string
	Ifindex   int
	Queue     int
	// Queues is how many receive queues the interface has allocated (the
	// most `ethtool -L` can give it).
	Queues int
	MAC    net.HardwareAddr
	MTU    int
	// NS is the interface's network namespace (netns.None(): this
	// process's); openers run on a thread that is in it.
	NS netns.NsHandle
	// Frames and FrameSize size the provider's buffer pool (provider
	// defaults when 0).
	Frames, FrameSize int
	// Copy and XDPMode are the afxdp options (see ring.Config).
	Copy    CopyMode
	XDPMode bpf.AttachMode
	// DeviceMemory is how many bytes of staging memory to reserve
	// (ring.Config.DevMemTX); a provider without device memory ignores it.
	DeviceMemory int
	// HWTimestamps asks for hardware receive timestamps on RX frames
	// where the provider can deliver them (Caps.HWTimestamps reports it).
	HWTimestamps bool
	// Adopt is an XDP program handed over by a previous daemon: the path
	// uses it instead of attaching one, and its socket enters the XSKMAP
	// only at Ring.Activate.
	Adopt *bpf.Program
	// AdoptPath is the fast path's socket and the standby TAP a previous
	// daemon handed over (live upgrade, state version 2): the openers take
	// the descriptors they use (setting them to -1), and the TAP path's
	// steering is made only at Ring.ArmStandby.
	AdoptPath *PathHandover
	// MaxFlows is the capacity of the interface's steering map (the
	// first ring of the interface sizes it; 0: bpf.DefaultMaxFlows).
	MaxFlows int
	Log      *zap.Logger
}

// CopyMode chooses between zero-copy and copy binding, for providers that
// have both (afxdp).
type CopyMode int

const (
	// CopyAuto tries zero-copy and falls back to copy mode when the driver
	// refuses it.
	CopyAuto CopyMode = iota
	// CopyForce binds in copy mode.
	CopyForce
	// ZeroCopyRequired fails when the driver has no zero-copy support.
	ZeroCopyRequired
)

// OpenFunc opens a provider and its steering. On error it leaves nothing
// behind. Close of the returned steering must also release what the opener
// shares between rings (an interface's XDP program).
type OpenFunc func(PathConfig) (Provider, Steering, error)

var openers = struct {
	sync.Mutex
	m map[string]OpenFunc
}{m: map[string]OpenFunc{}}

// Register makes a provider selectable by name (ring.Config.Provider).
// Providers behind build tags (verbs) call it from an init function of a
// file that carries the tag. Registering a name twice panics: it is a
// programming error, found at start-up.
func Register(name string, open OpenFunc) {
	openers.Lock()
	defer openers.Unlock()
	if _, dup := openers.m[name]; dup {
		panic(fmt.Sprintf("qp: provider %q registered twice", name))
	}
	openers.m[name] = open
}

// Providers lists the registered provider names, sorted.
func Providers() []string {
	openers.Lock()
	defer openers.Unlock()
	names := make([]string, 0, len(openers.m))
	for n := range openers.m {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Open opens the path of the provider registered as name.
func Open(name string, pc PathConfig) (Provider, Steering, error) {
	openers.Lock()
	open, ok := openers.m[name]
	openers.Unlock()
	if !ok {
		return nil, nil, fmt.Errorf("unknown provider %q: this build has %v", name, Providers())
	}
	return open(pc)
}

// PathHandover is a ring's fast path as a previous daemon handed it over:
// descriptors (owned by whoever holds the PathHandover until an opener
// takes them; taken ones are set to -1) and the provider's layout of them
// (for afxdp: afxdp.Layout as JSON).
type PathHandover struct {
	// XSK and UMEM are the AF_XDP socket and its UMEM's memfd.
	XSK, UMEM int
	// TAP is the standby TAP device's descriptor, -1 without one.
	TAP    int
	Layout json.RawMessage
}

// Close closes the descriptors nobody took.
func (h *PathHandover) Close() {
	for _, fd := range []*int{&h.XSK, &h.UMEM, &h.TAP} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}
