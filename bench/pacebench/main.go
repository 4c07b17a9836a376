// Command pacebench measures bypassd's packet pacing from the outside, for
// scripts/bench-pacing.sh (make bench):
//
//	pacebench accuracy [-rates 10,100,500] [-seconds 5] [-size 1400] -dst IP
//	pacebench idle -pid PID [-sockets 1000] [-seconds 10] [-unpaced]
//
// accuracy runs in the receiving namespace: for each rate in turn, one
// socket on the bypassd shim (BYPASSD_SOCKET) sends size-byte datagrams as
// fast as its pacing lets it to a kernel socket here, which timestamps the
// arrivals (package internal/arrivals). It prints the rate error per
// 1-second window (mean and worst) and the inter-departure jitter, |gap −
// ideal gap|, at p50 and p99. The kernel cannot pace UDP on this machine
// (no fq qdisc), so there is no kernel row to compare with.
//
// idle opens that many paced sockets that send nothing and reports the CPU
// time the daemon (PID) used over the period, from /proc/PID/stat; with
// -unpaced the same sockets without pacing, the baseline.
package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/bypassd/bypassd/internal/arrivals"
	"github.com/bypassd/bypassd/socket"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: pacebench accuracy|idle [flags] (see the package documentation)")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "accuracy":
		err = accuracy(os.Args[2:])
	case "idle":
		err = idle(os.Args[2:])
	default:
		err = fmt.Errorf("unknown mode %q: want accuracy or idle", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pacebench:", err)
		os.Exit(1)
	}
}

func accuracy(args []string) error {
	fs := flag.NewFlagSet("accuracy", flag.ExitOnError)
	rates := fs.String("rates", "10,100,500", "rates in Mbit/s, one run each")
	secs := fs.Int("seconds", 5, "measured 1-second windows per rate")
	size := fs.Int("size", 1400, "UDP payload bytes")
	dst := fs.String("dst", "", "address of this namespace to receive on (required)")
	_ = fs.Parse(args)
	addr, err := netip.ParseAddr(*dst)
	if err != nil {
		return fmt.Errorf("-dst %q: %w", *dst, err)
	}
	c, err := socket.Default()
	if err != nil {
		return err
	}
	defer c.Close()
	fmt.Printf("| rate | windows | mean error | worst window | jitter p50 | jitter p99 |\n|---|---|---|---|---|---|\n")
	for _, r := range strings.Split(*rates, ",") {
		mbps, err := strconv.Atoi(strings.TrimSpace(r))
		if err != nil || mbps <= 0 {
			return fmt.Errorf("-rates: %q is not a rate in Mbit/s", r)
		}
		if err := runRate(c, addr, mbps, *secs, *size); err != nil {
			return fmt.Errorf("%d Mbit/s: %w", mbps, err)
		}
	}
	return nil
}

// runRate measures one paced socket at mbps.
func runRate(c *socket.Client, addr netip.Addr, mbps, secs, size int) error {
	k, err := net.ListenUDP("udp", net.UDPAddrFromAddrPort(netip.AddrPortFrom(addr, 0)))
	if err != nil {
		return err
	}
	defer k.Close()
	rec, err := arrivals.Record(k, mbps*1_000_000/8/(size+arrivals.WireOverhead4)*(secs+2))
	if err != nil {
		return err
	}
	// 4 MiB hold 67 ms at 500 Mbit/s: the sender never lets it run dry.
	u, err := c.DialUDPConfig("udp", netip.AddrPort{}, k.LocalAddr().(*net.UDPAddr).AddrPort(),
		socket.ListenConfig{QueueBytes: 4 << 20, Pacing: socket.Pacing{Kbps: uint32(mbps) * 1000}})
	if err != nil {
		return err
	}
	defer u.Close()
	var wg sync.WaitGroup
	var sendErr error
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		b := make([]byte, size)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := u.Write(b); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				sendErr = err
				return
			}
		}
	}()
	// Half a second to settle (the burst allowance, threads starting),
	// then the windows.
	time.Sleep(time.Duration(secs)*time.Second + 700*time.Millisecond)
	close(stop)
	_ = u.SetWriteDeadline(time.Now())
	wg.Wait()
	arr, err := rec.Stop()
	if err = errors.Join(err, sendErr); err != nil {
		return err
	}
	if len(arr) < 2 {
		return fmt.Errorf("only %d datagrams arrived", len(arr))
	}
	want := float64(mbps) * 1e6
	start := arr[0].T + int64(500*time.Millisecond)
	acc := arrivals.MeasureAccuracy(arr, arrivals.WireOverhead4, start, time.Second, secs, want)
	var steady []arrivals.Arrival
	for _, a := range arr {
		if a.T >= start && a.T < start+int64(secs)*int64(time.Second) {
			steady = append(steady, a)
		}
	}
	j := arrivals.GapJitter(steady, arrivals.WireOverhead4, want)
	fmt.Printf("| %d Mbit/s | %d | %.3f%% | %+.3f%% | %.1f µs | %.1f µs |\n", mbps, secs, 100*acc.Mean, 100*acc.Worst,
		float64(j.P50)/1e3, float64(j.P99)/1e3)
	return nil
}

func idle(args []string) error {
	fs := flag.NewFlagSet("idle", flag.ExitOnError)
	pid := fs.Int("pid", 0, "the daemon's pid (required)")
	n := fs.Int("sockets", 1000, "paced sockets that send nothing")
	secs := fs.Int("seconds", 10, "measurement period")
	unpaced := fs.Bool("unpaced", false, "open the sockets without pacing (the baseline)")
	_ = fs.Parse(args)
	if *pid <= 0 {
		return errors.New("-pid is required")
	}
	c, err := socket.Default()
	if err != nil {
		return err
	}
	defer c.Close()
	for i := 0; i < *n; i++ {
		cfg := socket.ListenConfig{QueueBytes: 4096}
		if !*unpaced {
			// 16 distinct rates (the default table), 1..16 Mbit/s.
			cfg.Pacing = socket.Pacing{Kbps: uint32(1000 * (1 + i%16))}
		}
		u, err := c.ListenUDPConfig("udp", netip.AddrPort{}, cfg)
		if err != nil {
			return fmt.Errorf("socket %d: %w", i, err)
		}
		defer u.Close()
	}
	time.Sleep(time.Second)
	before, err := cpuTicks(*pid)
	if err != nil {
		return err
	}
	t0 := time.Now()
	time.Sleep(time.Duration(*secs) * time.Second)
	after, err := cpuTicks(*pid)
	if err != nil {
		return err
	}
	// USER_HZ is 100 on Linux.
	used := float64(after-before) / 100
	kind := "paced"
	if *unpaced {
		kind = "unpaced"
	}
	fmt.Printf("idle daemon with %d %s silent sockets: %.2f%% of one CPU over %.0f s (%.2f s of CPU)\n",
		*n, kind, 100*used/time.Since(t0).Seconds(), time.Since(t0).Seconds(), used)
	return nil
}

// cpuTicks returns utime+stime of pid in clock ticks.
func cpuTicks(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command may contain spaces: fields start after the last ')'.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseUint(f[11], 10, 64)
	st, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return ut + st, nil
}
