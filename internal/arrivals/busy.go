package arrivals

import (
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// MachineBusy samples, every 20 ms until Stop, whether the machine had
// more runnable threads than CPUs (/proc/loadavg's running count, the
// reader itself being one of them): a pacing test's slow window is then
// the machine's doing, not the pacer's (a fast one never is). Moved over a
// window reports that the machine was over-committed in it.
func MachineBusy() *Sampler {
	var ticks uint64 // only the sampling goroutine touches it
	return Sample(20*time.Millisecond, func() uint64 {
		ticks += uint64(overCommitted())
		return ticks
	})
}

// overCommitted reports 1 when /proc/loadavg's running count exceeds the
// CPUs plus the reader, else 0.
func overCommitted() int {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 4 {
		return 0
	}
	running, _, _ := strings.Cut(f[3], "/")
	n, err := strconv.Atoi(running)
	if err != nil || n <= runtime.NumCPU()+1 {
		return 0
	}
	return 1
}
