package afxdp

import (
	"cmp"
	"errors"
	"fmt"
	"os"
	"slices"
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

	// mu guards flows: which rings (slots) have endpoints on each flow,
	// and the slot the program steers it to now. A flow such as a
	// multicast group or an SO_REUSEADDR port can have endpoints on
	// several rings of the interface; the program holds one slot per
	// flow, and the entry goes only with the last ring's endpoints.
	mu    sync.Mutex
	flows map[qp.Flow]flowOwners
}

// flowOwners is one flow's rings and the one it is steered to. Most flows
// have one ring: a short list, not a map, since a daemon holds one per
// bound socket.
type flowOwners struct {
	steered uint32
	refs    []slotRefs
}

type slotRefs struct {
	slot uint32
	n    int32
}

// drop removes one of slot's references and reports whether slot had one.
func (o *flowOwners) drop(slot uint32) bool {
	for i := range o.refs {
		if o.refs[i].slot == slot {
			if o.refs[i].n--; o.refs[i].n == 0 {
				o.refs = slices.Delete(o.refs, i, i+1)
			}
			return true
		}
	}
	return false
}

func (o *flowOwners) holds(slot uint32) bool {
	return slices.ContainsFunc(o.refs, func(r slotRefs) bool { return r.slot == slot })
}

// addFlow steers f to slot. The newest ring to add a flow gets its
// frames, as the most recently bound of several SO_REUSEADDR sockets does.
func (sp *sharedProgram) addFlow(f qp.Flow, slot uint32) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if err := sp.prog.AddFlow(bpf.Flow(f), slot); err != nil {
		return err
	}
	o := sp.flows[f]
	if i := slices.IndexFunc(o.refs, func(r slotRefs) bool { return r.slot == slot }); i >= 0 {
		o.refs[i].n++
	} else {
		o.refs = append(o.refs, slotRefs{slot: slot, n: 1})
	}
	o.steered = slot
	sp.flows[f] = o
	return nil
}

// deleteFlow drops slot's reference to f: the entry goes with the last
// reference, and a flow steered to slot while other rings still have
// endpoints on it is steered to one of them.
func (sp *sharedProgram) deleteFlow(f qp.Flow, slot uint32) error {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	o, ok := sp.flows[f]
	if !ok || !o.drop(slot) {
		return nil
	}
	if len(o.refs) == 0 {
		delete(sp.flows, f)
		if err := sp.prog.DeleteFlow(bpf.Flow(f)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	sp.flows[f] = o
	if o.steered != slot {
		return nil
	}
	next := slices.MinFunc(o.refs, func(a, b slotRefs) int { return cmp.Compare(a.slot, b.slot) }).slot
	if err := sp.prog.AddFlow(bpf.Flow(f), next); err != nil {
		return fmt.Errorf("steer %s to the remaining ring of queue %d: %w", f, next, err)
	}
	o.steered = next
	sp.flows[f] = o
	return nil
}

// forget drops slot's references to flows without touching the program's
// map: the ring holding them was handed over, and the new daemon's ring
// (in tests, in this very process) holds references of its own.
func (sp *sharedProgram) forget(flows []qp.Flow, slot uint32) {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for _, f := range flows {
		o, ok := sp.flows[f]
		if !ok || !o.drop(slot) {
			continue
		}
		if len(o.refs) == 0 {
			delete(sp.flows, f)
		} else {
			sp.flows[f] = o
		}
	}
}

// slotFlows lists the flows slot holds references to.
func (sp *sharedProgram) slotFlows(slot uint32) []qp.Flow {
	sp.mu.Lock()
	defer sp.mu.Unlock()
	var out []qp.Flow
	for f, o := range sp.flows {
		if o.holds(slot) {
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
	sp := &sharedProgram{prog: p, refs: 1, flows: map[qp.Flow]flowOwners{}}
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
	sp := &sharedProgram{prog: p, refs: 1, flows: map[qp.Flow]flowOwners{}}
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
