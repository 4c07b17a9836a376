// Command pairbench compares one busy socket on two bypassd daemons in the
// same run, for scripts/bench-scale.sh (make scale):
//
//	pairbench -a SOCK -a-server IP:PORT -b SOCK -b-server IP:PORT [-seconds 20] [-size 64]
//
// It opens one UDP socket through each daemon (their control sockets A and
// B; the daemons may serve different namespaces, a client's own namespace
// does not matter to them) and measures, against a `sockperf server` on
// each side, 64-byte ping-pong round trips and then 64-byte throughput
// (messages sent per second, sockperf's throughput mode). It switches
// between A and B every -slice (both in every block of -block, the order
// alternating), so the two sockets see the same machine: on a shared VM the
// same run's figures move by 15-30% from one second to the next, far more
// than the difference between the daemons it looks for.
//
// Beside the timings it reports each daemon's CPU time and context switches
// per round trip over the ping-pong phase (from /proc of the daemon's pid):
// what a daemon does per datagram, which scheduling noise does not move.
//
// For each block it computes A's p50 over B's and A's msg/s over B's and
// prints the median of those per-block ratios with a distribution-free 95%
// confidence interval (the sign test's order statistics), besides each
// side's p50, p99 and msg/s over the whole run. The last line holds the
// figures as key=value pairs for scripts.
package main

import (
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/bypassd/bypassd/socket"
)

// sockperf's UDP header: sequence number, flags, message length, big endian.
const (
	hdrSize    = 14
	flagClient = 0x1 // set by clients, cleared in the server's replies
	flagPong   = 0x2 // the client wants a reply
)

// side is one daemon's measured socket.
type side struct {
	name   string
	client *socket.Client
	conn   *socket.UDPConn
	server netip.AddrPort
	seq    uint64
	// rtts holds every ping-pong round trip; block the current block's.
	rtts, block []time.Duration
	sent        uint64        // throughput messages sent, all blocks
	busy        time.Duration // throughput time spent sending, all blocks
	lost        int
	deadline    time.Time // the read deadline set last
	// cpu and ctxsw are the daemon's over the ping-pong phase.
	cpu   time.Duration
	ctxsw int64
}

func main() {
	a := flag.String("a", "", "control socket of daemon A (required)")
	aSrv := flag.String("a-server", "", "sockperf server reached through A, IP:PORT (required)")
	b := flag.String("b", "", "control socket of daemon B (required)")
	bSrv := flag.String("b-server", "", "sockperf server reached through B, IP:PORT (required)")
	secs := flag.Int("seconds", 20, "seconds of ping-pong, then as many of throughput")
	size := flag.Int("size", 64, "message size in bytes (sockperf's -m)")
	block := flag.Duration("block", time.Second, "one ratio per block")
	slice := flag.Duration("slice", 50*time.Millisecond, "time on one side before switching")
	flag.Parse()
	if *a == "" || *b == "" || *aSrv == "" || *bSrv == "" {
		fail(2, errors.New("-a, -a-server, -b and -b-server are required"))
	}
	if *size < hdrSize || *size > 65507 || *secs < 1 || *slice <= 0 || *block < 2**slice {
		fail(2, fmt.Errorf("-size %d (%d..65507), -seconds %d (>= 1), -slice %v, -block %v (>= 2 slices)", *size, hdrSize, *secs, *slice, *block))
	}
	sa, err := open("A", *a, *aSrv)
	if err != nil {
		fail(1, err)
	}
	defer sa.close()
	sb, err := open("B", *b, *bSrv)
	if err != nil {
		fail(1, err)
	}
	defer sb.close()
	sides := [2]*side{sa, sb}

	msg := make([]byte, *size)
	binary.BigEndian.PutUint32(msg[10:14], uint32(*size))
	rbuf := make([]byte, 65536)
	blocks := int(time.Duration(*secs) * time.Second / *block)

	// Ping-pong. A warm-up block first (not counted), as sockperf does.
	binary.BigEndian.PutUint16(msg[8:10], flagClient|flagPong)
	var p50Ratios []float64
	var use0 [2]usage
	for blk := -1; blk < blocks; blk++ {
		if blk == 0 {
			for i, s := range sides {
				if use0[i], err = daemonUsage(s.client.DaemonPID()); err != nil {
					fail(1, err)
				}
			}
		}
		sa.block, sb.block = sa.block[:0], sb.block[:0]
		if err := alternate(sides, blk, *block, *slice, func(s *side, until time.Time) error {
			for time.Now().Before(until) {
				if err := s.pingPong(msg, rbuf); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			fail(1, err)
		}
		if blk < 0 || len(sa.block) == 0 || len(sb.block) == 0 {
			continue
		}
		sa.rtts, sb.rtts = append(sa.rtts, sa.block...), append(sb.rtts, sb.block...)
		p50Ratios = append(p50Ratios, float64(pct(sa.block, 50))/float64(pct(sb.block, 50)))
	}

	for i, s := range sides {
		u, err := daemonUsage(s.client.DaemonPID())
		if err != nil {
			fail(1, err)
		}
		s.cpu, s.ctxsw = u.cpu-use0[i].cpu, u.ctxsw-use0[i].ctxsw
	}

	// Throughput: the server does not answer (no PONG flag).
	binary.BigEndian.PutUint16(msg[8:10], flagClient)
	var mpsRatios []float64
	for blk := -1; blk < blocks; blk++ {
		var n [2]uint64
		var d [2]time.Duration
		if err := alternate(sides, blk, *block, *slice, func(s *side, until time.Time) error {
			i := 0
			if s == sb {
				i = 1
			}
			t0 := time.Now()
			for time.Now().Before(until) {
				s.seq++
				binary.BigEndian.PutUint64(msg[0:8], s.seq)
				if _, err := s.conn.Write(msg); err != nil {
					return fmt.Errorf("%s: send: %w", s.name, err)
				}
				n[i]++
			}
			d[i] += time.Since(t0)
			return nil
		}); err != nil {
			fail(1, err)
		}
		if blk < 0 {
			continue
		}
		for i, s := range sides {
			s.sent += n[i]
			s.busy += d[i]
		}
		mpsRatios = append(mpsRatios, (float64(n[0])/d[0].Seconds())/(float64(n[1])/d[1].Seconds()))
	}

	// sockperf reports half the round trip as the latency; so does this.
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 2e3 }
	for _, s := range sides {
		fmt.Printf("%s: ping-pong %d round trips (%d lost), latency (RTT/2) p50 %.3f µs, p99 %.3f µs; daemon %.1f µs CPU and %.2f context switches per round trip; throughput %.0f msg/s\n",
			s.name, len(s.rtts), s.lost, us(pct(s.rtts, 50)), us(pct(s.rtts, 99)), s.cpuPerRT(), s.ctxswPerRT(), s.mps())
	}
	pm, pl, ph := medianCI(p50Ratios)
	mm, ml, mh := medianCI(mpsRatios)
	fmt.Printf("A/B p50: %.3f [95%% CI %.3f-%.3f]; A/B msg/s: %.3f [%.3f-%.3f]; %d blocks of %v, switching every %v\n",
		pm, pl, ph, mm, ml, mh, blocks, *block, *slice)
	for _, s := range sides {
		k := strings.ToLower(s.name)
		fmt.Printf("%s_rts=%d %s_p50=%.3f %s_p99=%.3f %s_mps=%.0f %s_cpu_us=%.2f %s_ctxsw=%.3f ",
			k, len(s.rtts), k, us(pct(s.rtts, 50)), k, us(pct(s.rtts, 99)), k, s.mps(), k, s.cpuPerRT(), k, s.ctxswPerRT())
	}
	fmt.Printf("p50_ratio=%.3f p50_lo=%.3f p50_hi=%.3f mps_ratio=%.3f mps_lo=%.3f mps_hi=%.3f\n", pm, pl, ph, mm, ml, mh)
}

// usage is a process's CPU time and context switches so far.
type usage struct {
	cpu   time.Duration
	ctxsw int64
}

// daemonUsage reads pid's usage from /proc: utime+stime of
// /proc/PID/stat (clock ticks of 10 ms on Linux's USER_HZ 100) and the
// voluntary and involuntary switches of every thread.
func daemonUsage(pid int) (usage, error) {
	var u usage
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, fmt.Errorf("daemon %d: %w (run in the daemon's pid namespace)", pid, err)
	}
	// Fields after the command name, which may hold spaces: state is
	// field 3, utime 14, stime 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return u, fmt.Errorf("daemon %d: short /proc stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	u.cpu = time.Duration(ut+st) * 10 * time.Millisecond
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/status", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue // a thread that ended
		}
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && (k == "voluntary_ctxt_switches" || k == "nonvoluntary_ctxt_switches") {
				n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				u.ctxsw += n
			}
		}
	}
	return u, nil
}

func (s *side) cpuPerRT() float64 {
	return float64(s.cpu.Microseconds()) / float64(max(1, len(s.rtts)))
}

func (s *side) ctxswPerRT() float64 { return float64(s.ctxsw) / float64(max(1, len(s.rtts))) }

// open dials daemon path and opens a socket connected to server.
func open(name, path, server string) (*side, error) {
	srv, err := netip.ParseAddrPort(server)
	if err != nil {
		return nil, fmt.Errorf("%s: server %q: %w", name, server, err)
	}
	c, err := socket.Dial(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	u, err := c.DialUDP("udp4", netip.AddrPort{}, srv)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("%s: open a socket to %v: %w", name, srv, err)
	}
	return &side{name: name, client: c, conn: u, server: srv}, nil
}

func (s *side) close() {
	_ = s.conn.Close()
	_ = s.client.Close()
}

func (s *side) mps() float64 { return float64(s.sent) / s.busy.Seconds() }

// alternate runs f on the two sides by turns of slice for one block, A
// first in even blocks and B first in odd ones.
func alternate(sides [2]*side, blk int, block, slice time.Duration, f func(s *side, until time.Time) error) error {
	first := blk & 1
	end := time.Now().Add(block)
	for turn := 0; ; turn++ {
		now := time.Now()
		if !now.Before(end) {
			return nil
		}
		until := now.Add(slice)
		if until.After(end) {
			until = end
		}
		if err := f(sides[(first+turn)&1], until); err != nil {
			return err
		}
	}
}

// pingPong sends one message and waits for its reply (50-100 ms at most:
// then it is counted lost, as with bypass-perf's --reply-timeout).
func (s *side) pingPong(msg, rbuf []byte) error {
	s.seq++
	binary.BigEndian.PutUint64(msg[0:8], s.seq)
	t0 := time.Now()
	if _, err := s.conn.Write(msg); err != nil {
		return fmt.Errorf("%s: send: %w", s.name, err)
	}
	// The deadline moves only when less than half of it is left, so
	// most round trips pay no SetReadDeadline (as in bypass-perf).
	if s.deadline.Sub(t0) < 50*time.Millisecond {
		s.deadline = t0.Add(100 * time.Millisecond)
		if err := s.conn.SetReadDeadline(s.deadline); err != nil {
			return fmt.Errorf("%s: %w", s.name, err)
		}
	}
	for {
		n, err := s.conn.Read(rbuf)
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				s.lost++
				return nil
			}
			return fmt.Errorf("%s: receive: %w", s.name, err)
		}
		// A late reply to an earlier message is skipped.
		if n >= hdrSize && binary.BigEndian.Uint64(rbuf[0:8]) == s.seq && binary.BigEndian.Uint16(rbuf[8:10])&flagClient == 0 {
			s.block = append(s.block, time.Since(t0))
			return nil
		}
	}
}

// pct is the p-th percentile of d (sorted in place), 0 when empty.
func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[min(len(d)-1, int(math.Ceil(p/100*float64(len(d))))-1)]
}

// medianCI returns the median of r and the order statistics bounding a
// >= 95% confidence interval of it: k = floor((n - 1.96 sqrt(n)) / 2).
func medianCI(r []float64) (med, lo, hi float64) {
	n := len(r)
	if n == 0 {
		return math.NaN(), math.NaN(), math.NaN()
	}
	slices.Sort(r)
	med = r[n/2]
	if n%2 == 0 {
		med = (r[n/2-1] + r[n/2]) / 2
	}
	k := max(1, int((float64(n)-1.96*math.Sqrt(float64(n)))/2))
	return med, r[k-1], r[n-k]
}

func fail(code int, err error) {
	fmt.Fprintln(os.Stderr, "pairbench:", err)
	os.Exit(code)
}
