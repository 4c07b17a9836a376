package ring

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/qp"
)

// The XDP steering program is per interface while rings are per (interface,
// queue): rings of one interface share one attached program, attached by the
// first and detached by the last.
var programs = struct {
	sync.Mutex
	m map[progKey]*sharedProgram
}{m: map[progKey]*sharedProgram{}}

// progKey names an interface across network namespaces: the namespace's
// inode and the interface index.
type progKey struct {
	nsDev, nsIno uint64
	ifindex      int
}

type sharedProgram struct {
	prog *bpf.Program
	refs int

	// mu guards owners and steered: which rings (slots) have endpoints on
	// each flow, and the slot the program steers it to now. A flow such as
	// a multicast group or an SO_REUSEADDR port can have endpoints on
	// several rings of the interface; the program holds one slot per
	// flow, and the entry goes only with the last ring's endpoints.
	mu      sync.Mutex
	owners  map[qp.Flow]map[uint32]int
	steered map[qp.Flow]uint32
}

// addFlow steers f to slot. The newest ring to add a flow gets its
// frames, as the most recently bound of several SO_REUSEADDR sockets does.
func (sp *sharedProgram) addFlow(f qp.Flow, slot uint32) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err := sp.prog.AddFlow(bpf.Flow(f), slot); err != nil {
		return err
	}
	if sp.owners[f] == nil {
		sp.owners[f] = map[uint32]int{}
	}
	sp.owners[f][slot]++
	sp.steered[f] = slot
	return nil
}

// deleteFlow drops slot's reference to f: the entry goes with the last
// reference, and a flow steered to slot while other rings still have
// endpoints on it is steered to one of them.
func (sp *sharedProgram) deleteFlow(f qp.Flow, slot uint32) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	owners := sp.owners[f]
	if owners[slot] == 0 {
		return nil
	}
	if owners[slot]--; owners[slot] == 0 {
		delete(owners, slot)
	}
	if len(owners) == 0 {
		delete(sp.owners, f)
		delete(sp.steered, f)
		if err := sp.prog.DeleteFlow(bpf.Flow(f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	if sp.steered[f] != slot {
		return nil
	}
	next := slot
	for s := range owners {
		if next == slot || s < next {
			next = s
		}
	}
	if err := sp.prog.AddFlow(bpf.Flow(f), next); err != nil {
		return fmt.Errorf("steer %s to the remaining ring of queue %d: %w", f, next, err)
	}
	sp.steered[f] = next
	return nil
}

// slotFlows lists the flows slot holds references to.
func (sp *sharedProgram) slotFlows(slot uint32) []qp.Flow {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out []qp.Flow
	for f, owners := range sp.owners {
		if owners[slot] > 0 {
			out = append(out, f)
		}
	}
	return out
}

func nsKey(ifindex int) (progKey, error) {
	var st unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &st); err != nil {
		return progKey{}, fmt.Errorf("stat network namespace: %w", err)
	}
	return progKey{nsDev: st.Dev, nsIno: st.Ino, ifindex: ifindex}, nil
}

// homeNS identifies the network namespace the process started in (package
// initialization runs on the main thread before any goroutine can have
// switched a thread elsewhere). /proc/self/ns/net would not do: it is the
// main thread's current namespace, and Go may run a goroutine that entered
// another namespace on that thread.
var homeNS = func() (st unix.Stat_t) {
	_ = unix.Stat("/proc/thread-self/ns/net", &st)
	return st
}()

// callerNS returns the calling thread's network namespace when it is not
// the process's, and netns.None() when it is: then nothing needs setns(2)
// (and so CAP_SYS_ADMIN) to reach the namespace later.
func callerNS() (netns.NsHandle, error) {
	var thread unix.Stat_t
	if err := unix.Stat("/proc/thread-self/ns/net", &thread); err != nil {
		return netns.None(), fmt.Errorf("stat network namespace: %w", err)
	}
	if homeNS.Ino != 0 && homeNS.Dev == thread.Dev && homeNS.Ino == thread.Ino {
		return netns.None(), nil
	}
	ns, err := netns.Get()
	if err != nil {
		return netns.None(), fmt.Errorf("open the calling thread's network namespace: %w", err)
	}
	return ns, nil
}

// netlinkHandle returns a netlink handle for ns (netns.None(): the current
// one, without entering it).
func netlinkHandle(ns netns.NsHandle) (*netlink.Handle, error) {
	if !ns.IsOpen() {
		return netlink.NewHandle()
	}
	return netlink.NewHandleAt(ns)
}

// acquireProgram attaches the steering program to the interface, or shares
// the one already attached by another ring of this process. Attaching needs
// the calling thread to be in the interface's namespace.
func acquireProgram(key progKey, opts bpf.Options) (*sharedProgram, error) {
	programs.Lock()
	defer programs.Unlock()
	if sp, ok := programs.m[key]; ok {
		sp.refs++
		return sp, nil
	}
	p, err := bpf.Attach(key.ifindex, opts)
	if err != nil {
		return nil, err
	}
	sp := &sharedProgram{prog: p, refs: 1, owners: map[qp.Flow]map[uint32]int{}, steered: map[qp.Flow]uint32{}}
	programs.m[key] = sp
	return sp, nil
}

func releaseProgram(key progKey) error {
	programs.Lock()
	defer programs.Unlock()
	sp, ok := programs.m[key]
	if !ok {
		return nil
	}
	if sp.refs--; sp.refs > 0 {
		return nil
	}
	delete(programs.m, key)
	return sp.prog.Close()
}

// adoptProgram registers a program handed over by a previous daemon as the
// interface's shared program (another ring of the interface adopting it
// again gets the registered one; the duplicate is abandoned).
func adoptProgram(key progKey, p *bpf.Program) *sharedProgram {
	programs.Lock()
	defer programs.Unlock()
	if sp, ok := programs.m[key]; ok {
		sp.refs++
		if sp.prog != p {
			_ = p.Abandon()
		}
		return sp
	}
	sp := &sharedProgram{prog: p, refs: 1, owners: map[qp.Flow]map[uint32]int{}, steered: map[qp.Flow]uint32{}}
	programs.m[key] = sp
	return sp
}

// abandonProgram drops a reference like releaseProgram, but the last one
// closes this process's descriptors without detaching the program: a new
// daemon holds it now.
func abandonProgram(key progKey) error {
	programs.Lock()
	defer programs.Unlock()
	sp, ok := programs.m[key]
	if !ok {
		return nil
	}
	if sp.refs--; sp.refs > 0 {
		return nil
	}
	delete(programs.m, key)
	return sp.prog.Abandon()
}
