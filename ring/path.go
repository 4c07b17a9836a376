package ring

import (
	"errors"
	"fmt"
	"net"
	"sort"
	"sync"

	"github.com/vishvananda/netns"
	"go.uber.org/zap"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
)

// A path is how frames move between a NIC queue and a ring: a provider (the
// raw queue pair the engine reads and writes) and the steering that directs
// offloaded flows into it. Providers register an opener under their name;
// Config.Provider selects one. The ring itself knows no provider: it adds
// flows to the path's steering and drives the path's provider.
type path struct {
	prov  qp.Provider
	steer qp.Steering
}

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
	// Copy and XDPMode are the afxdp options (see Config).
	Copy    afxdp.CopyMode
	XDPMode bpf.AttachMode
	// DeviceMemory is how many bytes of staging memory to reserve
	// (Config.DevMemTX); a provider without device memory ignores it.
	DeviceMemory int
	// HWTimestamps asks for hardware receive timestamps on RX frames
	// where the provider can deliver them (Caps.HWTimestamps reports it).
	HWTimestamps bool
	// Adopt is an XDP program handed over by a previous daemon: the path
	// uses it instead of attaching one, and its socket enters the XSKMAP
	// only at Ring.Activate.
	Adopt *bpf.Program
	// MaxFlows is the capacity of the interface's steering map (the
	// first ring of the interface sizes it; 0: bpf.DefaultMaxFlows).
	MaxFlows int
	Log      *zap.Logger
}

// OpenPathFunc opens a provider and its steering. On error it leaves nothing
// behind. Close of the returned steering must also release what the opener
// shares between rings (an interface's XDP program).
type OpenPathFunc func(PathConfig) (qp.Provider, qp.Steering, error)

var openers = struct {
	sync.Mutex
	m map[string]OpenPathFunc
}{m: map[string]OpenPathFunc{}}

// RegisterProvider makes a provider selectable by name in Config.Provider.
// Providers behind build tags (verbs) call it from an init function of a
// file that carries the tag. Registering a name twice panics: it is a
// programming error, found at start-up.
func RegisterProvider(name string, open OpenPathFunc) {
	openers.Lock()
	defer openers.Unlock()
	if _, dup := openers.m[name]; dup {
		panic(fmt.Sprintf("ring: provider %q registered twice", name))
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

// DefaultProvider is the provider of a Config that names none.
const DefaultProvider = "afxdp"

func openPath(name string, pc PathConfig) (path, error) {
	openers.Lock()
	open, ok := openers.m[name]
	openers.Unlock()
	if !ok {
		return path{}, fmt.Errorf("unknown provider %q: this build has %v", name, Providers())
	}
	prov, steer, err := open(pc)
	if err != nil {
		return path{}, err
	}
	return path{prov: prov, steer: steer}, nil
}

func (p path) close() error {
	// Steering first: no frame is directed at a provider that is gone.
	return errors.Join(p.steer.Close(), p.prov.Close())
}
