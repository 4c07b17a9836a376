package main

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// xdpSink counts and drops every frame arriving on an interface with a tiny
// XDP program. As the receiver of a TX benchmark it costs the sending core
// (veth runs the peer's receive path there) almost nothing, the way a real
// NIC's remote end would, so the sender's own path is what gets measured.
type xdpSink struct {
	counts *ebpf.Map
	prog   *ebpf.Program
	link   link.Link
}

// newXDPSink attaches the sink to ifindex in the calling thread's network
// namespace.
func newXDPSink(ifindex int) (*xdpSink, error) {
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, fmt.Errorf("sink counter map: %w", err)
	}
	insns := asm.Instructions{
		asm.StoreImm(asm.R10, -4, 0, asm.Word),
		asm.Mov.Reg(asm.R2, asm.R10),
		asm.Add.Imm(asm.R2, -4),
		asm.LoadMapPtr(asm.R1, counts.FD()),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "drop"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Imm(asm.R0, 1).WithSymbol("drop"), // XDP_DROP
		asm.Return(),
	}
	// Frags-aware, so that veth takes it natively whatever the MTU (a plain
	// program is refused above about 3,500: ERANGE).
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.XDP, Instructions: insns, License: "MIT", Flags: unix.BPF_F_XDP_HAS_FRAGS})
	if err != nil {
		counts.Close()
		return nil, fmt.Errorf("load sink program: %w", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: prog, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		prog.Close()
		counts.Close()
		return nil, fmt.Errorf("attach sink program: %w", err)
	}
	return &xdpSink{counts: counts, prog: prog, link: l}, nil
}

// count returns the frames dropped so far (all CPUs).
func (s *xdpSink) count() (uint64, error) {
	var per []uint64
	if err := s.counts.Lookup(uint32(0), &per); err != nil {
		return 0, err
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

func (s *xdpSink) close() {
	s.link.Close()
	s.prog.Close()
	s.counts.Close()
}
