package netlab

import (
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
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:    "netlab_loss",
		Type:    ebpf.SchedCLS,
		License: "MIT",
		Instructions: asm.Instructions{
			asm.FnGetPrandomU32.Call(),
			asm.Mod.Imm(asm.R0, 100),
			asm.JLT.Imm(asm.R0, int32(percent), "drop"),
			asm.Mov.Imm(asm.R0, tcxPass),
			asm.Return(),
			asm.Mov.Imm(asm.R0, tcxDrop).WithSymbol("drop"),
			asm.Return(),
		},
	})
	if err != nil {
		tb.Fatalf("netlab: load the loss program: %v", err)
	}
	tb.Cleanup(func() { _ = prog.Close() })
	for _, at := range []ebpf.AttachType{ebpf.AttachTCXIngress, ebpf.AttachTCXEgress} {
		var lk link.Link
		err := l.NS.Do(func() error {
			var err error
			lk, err = link.AttachTCX(link.TCXOptions{Interface: l.Index, Program: prog, Attach: at})
			return err
		})
		if err != nil {
			tb.Fatalf("netlab: attach the loss program to %s (%v): %v", l.Name, at, err)
		}
		tb.Cleanup(func() { _ = lk.Close() })
	}
}
