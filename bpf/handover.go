package bpf

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// Handles are descriptors of an attached program's kernel objects, so that
// another process (a new bypassd taking over) can adopt the program with
// its flows while it stays attached.
type Handles struct {
	Link, Prog int
	// Maps by their name in the object ("flows", "xsks", ...).
	Maps map[string]int
	Mode AttachMode
}

// Close closes every descriptor in h.
func (h Handles) Close() {
	for _, fd := range h.fds() {
		if fd >= 0 {
			unix.Close(fd)
		}
	}
}

func (h Handles) fds() []int {
	out := []int{h.Link, h.Prog}
	for _, fd := range h.Maps {
		out = append(out, fd)
	}
	return out
}

// mapsByName lists the program's maps with their object names.
func (m *steerMaps) byName() map[string]**ebpf.Map {
	return map[string]**ebpf.Map{"counters": &m.Counters, "five_tuples": &m.FiveTuples, "flows": &m.Flows,
		"frags": &m.Frags, "vxlan_ports": &m.VxlanPorts, "xsks": &m.Xsks}
}

// Handover returns duplicates of the program's descriptors (the caller's
// to close). The device-bound timestamping variant is not handed over: its
// adopter could not tell it apart, and freeing it has its own rules.
func (p *Program) Handover() (h Handles, err error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return Handles{}, errClosed
	}
	if p.rxts {
		return Handles{}, errors.New("bpf: the hardware-timestamping program cannot be handed over")
	}
	h = Handles{Link: -1, Prog: -1, Maps: map[string]int{}, Mode: p.mode}
	defer func() {
		if err != nil {
			h.Close()
		}
	}()
	dup := func(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }
	raw, ok := p.link.(interface{ FD() int })
	if !ok {
		return h, fmt.Errorf("bpf: link %T has no descriptor", p.link)
	}
	if h.Link, err = dup(raw.FD()); err != nil {
		return h, fmt.Errorf("bpf: duplicate link: %w", err)
	}
	if h.Prog, err = dup(p.prog.FD()); err != nil {
		return h, fmt.Errorf("bpf: duplicate program: %w", err)
	}
	for name, m := range p.objs.byName() {
		fd, err := dup((*m).FD())
		if err != nil {
			return h, fmt.Errorf("bpf: duplicate map %s: %w", name, err)
		}
		h.Maps[name] = fd
	}
	return h, nil
}

// Adopt takes over a program attached to ifindex by another process, from
// the descriptors it handed over (Handover), and owns them from now on
// (also on error: they are closed). The program stays attached throughout
// and keeps its flows.
func Adopt(ifindex int, h Handles) (_ *Program, err error) {
	p := &Program{ifindex: ifindex, mode: h.Mode}
	taken := map[int]bool{}
	defer func() {
		if err != nil {
			if p.link != nil {
				_ = p.link.Close()
			}
			if p.prog != nil {
				_ = p.prog.Close()
			}
			_ = p.objs.Close()
			for _, fd := range h.fds() {
				if fd >= 0 && !taken[fd] {
					unix.Close(fd)
				}
			}
		}
	}()
	taken[h.Prog] = true
	if p.prog, err = ebpf.NewProgramFromFD(h.Prog); err != nil {
		return nil, fmt.Errorf("bpf: adopt program: %w", err)
	}
	for name, m := range p.objs.byName() {
		fd, ok := h.Maps[name]
		if !ok {
			return nil, fmt.Errorf("bpf: adopt: map %s missing", name)
		}
		taken[fd] = true
		if *m, err = ebpf.NewMapFromFD(fd); err != nil {
			return nil, fmt.Errorf("bpf: adopt map %s: %w", name, err)
		}
	}
	p.slots = p.objs.Xsks.MaxEntries()
	taken[h.Link] = true
	if p.link, err = link.NewFromFD(h.Link); err != nil {
		return nil, fmt.Errorf("bpf: adopt link: %w", err)
	}
	if ok, err := p.Attached(); err != nil || !ok {
		return nil, fmt.Errorf("bpf: adopt: the handed-over program is not attached to ifindex %d (%v)", ifindex, err)
	}
	return p, nil
}

// Abandon closes this process's descriptors of the program without
// detaching it: after a Handover, the adopter's keep it attached.
func (p *Program) Abandon() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	return errors.Join(p.link.Close(), p.prog.Close(), p.objs.Close())
}
