package afxdp

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"github.com/bypassd/bypassd/bpf"
	"github.com/bypassd/bypassd/ring/qp"
)

// The XDP steering program is per interface while rings are per (interface,
// queue): rings of one interface share one attached program, attached by the
// first and detached by the last.
var programs = struct {
	sync.Mutex
	m map[qp.IfaceKey]*sharedProgram
}{m: map[qp.IfaceKey]*sharedProgram{}}

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

// forget drops slot's references to flows without touching the program's
// map: the ring holding them was handed over, and the new daemon's ring
// (in tests, in this very process) holds references of its own.
func (sp *sharedProgram) forget(flows []qp.Flow, slot uint32) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, f := range flows {
		owners := sp.owners[f]
		if owners[slot] == 0 {
			continue
		}
		if owners[slot]--; owners[slot] == 0 {
			delete(owners, slot)
		}
		if len(owners) == 0 {
			delete(sp.owners, f)
			delete(sp.steered, f)
		}
	}
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

// acquireProgram attaches the steering program to the interface, or shares
// the one already attached by another ring of this process. Attaching needs
// the calling thread to be in the interface's namespace.
func acquireProgram(key qp.IfaceKey, opts bpf.Options) (*sharedProgram, error) {
	programs.Lock()
	defer programs.Unlock()
	if sp, ok := programs.m[key]; ok {
		sp.refs++
		return sp, nil
	}
	p, err := bpf.Attach(key.Ifindex, opts)
	if err != nil {
		return nil, err
	}
	sp := &sharedProgram{prog: p, refs: 1, owners: map[qp.Flow]map[uint32]int{}, steered: map[qp.Flow]uint32{}}
	programs.m[key] = sp
	return sp, nil
}

func releaseProgram(key qp.IfaceKey) error {
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
func adoptProgram(key qp.IfaceKey, p *bpf.Program) *sharedProgram {
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
func abandonProgram(key qp.IfaceKey) error {
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
