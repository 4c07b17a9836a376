package ring

import (
	"fmt"
	"sync"

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

func nsKey(ns netns.NsHandle, ifindex int) (progKey, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(ns), &st); err != nil {
		return progKey{}, fmt.Errorf("stat network namespace: %w", err)
	}
	return progKey{nsDev: st.Dev, nsIno: st.Ino, ifindex: ifindex}, nil
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
