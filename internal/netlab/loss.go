package netlab

import (
	"sync"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
)

// tcxDrop is TCX_DROP, tcxPass TCX_PASS (linux/bpf.h).
const (
	tcxPass = 0
	tcxDrop = 2
)

// Loss drops percent (1..99) of the frames l receives and of those it
// sends, at random, with a tc BPF program of the test's own (TCX, held by
// this process: it goes with the test, or with the process). The kernel
// has no netem qdisc here; this is the lab's lossy link.
func (l *Link) Loss(tb testing.TB, percent int) {
	tb.Helper()
	if percent < 1 || percent > 99 {
		tb.Fatalf("netlab: loss of %d%%: want 1..99", percent)
	}
	l.drop(tb, "netlab_loss", asm.Instructions{
		asm.FnGetPrandomU32.Call(),
		asm.Mod.Imm(asm.R0, 100),
		asm.JLT.Imm(asm.R0, int32(percent), "drop"),
		asm.Mov.Imm(asm.R0, tcxPass),
		asm.Return(),
		asm.Mov.Imm(asm.R0, tcxDrop).WithSymbol("drop"),
		asm.Return(),
	})
}

// Blackhole drops every frame l receives and sends, as if the host behind
// it vanished (its cable pulled: the kernel there still holds its sockets
// but nothing reaches it or leaves it), until restore is called or the
// test ends.
func (l *Link) Blackhole(tb testing.TB) (restore func()) {
	tb.Helper()
	return l.drop(tb, "netlab_hole", asm.Instructions{asm.Mov.Imm(asm.R0, tcxDrop), asm.Return()})
}

// drop attaches the SchedCLS program insns to both directions of l; the
// returned function detaches it (so does the test's end).
func (l *Link) drop(tb testing.TB, name string, insns asm.Instructions) func() {
	tb.Helper()
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: name, Type: ebpf.SchedCLS, License: "MIT", Instructions: insns})
	if err != nil {
		tb.Fatalf("netlab: load %s: %v", name, err)
	}
	var links []link.Link
	var once sync.Once
	detach := func() {
		once.Do(func() {
			for _, lk := range links {
				_ = lk.Close()
			}
			_ = prog.Close()
		})
	}
	tb.Cleanup(detach)
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		var lk link.Link
		err := l.NS.Do(func() error {
			var err error
			lk, err = link.AttachTCX(link.TCXOptions{Interface: l.Index, Program: prog, Attach: at})
			return err
		})
		if err != nil {
			tb.Fatalf("netlab: attach %s to %s (%v): %v", name, l.Name, at, err)
		}
		links = append(links, lk)
	}
	return detach
}
