package bpf

import (
	"fmt"
	"time"
)

// RunStats returns how often the attached program ran and its total run
// time. The kernel counts only while run-time statistics are enabled
// (ebpf.EnableStats(unix.BPF_STATS_RUN_TIME), or the sysctl
// kernel.bpf_stats_enabled=1); benchmarks use it for the program's cost
// per frame.
func (p *Program) RunStats() (runs uint64, total time.Duration, err error) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	if p.closed {
		return 0, 0, errClosed
	}
	st, err := p.prog.Stats()
	if err != nil {
		return 0, 0, fmt.Errorf("bpf: read program statistics: %w", err)
	}
	return st.RunCount, st.Runtime, nil
}
