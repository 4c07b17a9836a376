package daemon

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

// raiseNofile lifts the process's RLIMIT_NOFILE soft limit to its hard
// limit and returns both. A session costs the daemon three descriptors
// (its connection, its session memfd and its client eventfd) whatever its
// number of sockets, but every bound socket still holds one: the kernel
// socket reserving its port (and carrying its multicast memberships), so
// the hard limit bounds the bound sockets of the host.
func raiseNofile() (ctldoc.Limits, error) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		return ctldoc.Limits{}, fmt.Errorf("read RLIMIT_NOFILE: %w", err)
	}
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &want); err != nil {
			return ctldoc.Limits{NofileSoft: rl.Cur, NofileHard: rl.Max},
				fmt.Errorf("raise the RLIMIT_NOFILE soft limit from %d to %d: %w", rl.Cur, rl.Max, err)
		}
		rl.Cur = rl.Max
	}
	return ctldoc.Limits{NofileSoft: rl.Cur, NofileHard: rl.Max}, nil
}
