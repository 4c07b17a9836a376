package ring

import (
	"fmt"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/bpf"
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
func acquireProgram(key progKey, opts bpf.Options) (*bpf.Program, error) {
	programs.Lock()
	defer programs.Unlock()
	if sp, ok := programs.m[key]; ok {
		sp.refs++
		return sp.prog, nil
	}
	p, err := bpf.Attach(key.ifindex, opts)
	if err != nil {
		return nil, err
	}
	programs.m[key] = &sharedProgram{prog: p, refs: 1}
	return p, nil
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
