// Command udpbench measures UDP through bypassd against the kernel path in
// one network-namespace lab: TX through a ring endpoint (in process) and
// through the shim (package socket, to a daemon) vs kernel sendmmsg, and RX
// the same ways vs kernel recvmmsg under the same offered load from the peer
// namespace. It prints a Markdown table with medians, spread (min–max) and
// ratios.
//
// Run as root: go run ./bench/udpbench -runs 5 -duration 2s
package main

import (
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/signal"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/clock/tsconv"
)

type options struct {
	runs     int
	duration time.Duration
	size     int
	batch    int
	poll     time.Duration
	only     string
	split    bool
	load     string
	rate     float64
	// statsCmp adds the shim cases with the daemon's stats publishing off.
	statsCmp bool
	// devMemCmp adds the ring TX case with egress staging on.
	devMemCmp bool
	// tsCmp adds the RX cases with receive timestamping on.
	tsCmp bool
	// tapCmp adds the ring cases on the TAP fallback path.
	tapCmp bool
	// vxlanCmp adds the kernel and ring cases on a VXLAN overlay
	// (vxlan.go).
	vxlanCmp bool
	// mtu is the lab pair's MTU (0: 1500); bulk prints throughput in
	// Gbit/s and CPU per GB (jumbo.go).
	mtu  int
	bulk bool
}

func main() {
	var o options
	flag.IntVar(&o.runs, "runs", 5, "runs per measurement (the median is reported)")
	flag.DurationVar(&o.duration, "duration", 2*time.Second, "length of one run")
	flag.IntVar(&o.size, "size", 64, "UDP payload bytes")
	flag.IntVar(&o.batch, "batch", 64, "datagrams per send/receive call")
	flag.DurationVar(&o.poll, "poll", 0, "ring engine spin time before sleeping (negative: spin forever)")
	flag.StringVar(&o.load, "load", "ring", "RX load generator in the peer namespace: ring (an AF_XDP ring, the fastest sender here) or kernel (sendmmsg)")
	flag.Float64Var(&o.rate, "rate", 0, "RX offered load in datagrams/s with -load ring (0: as fast as the sender goes)")
	flag.BoolVar(&o.statsCmp, "stats-cmp", true, "also run the shim cases with the daemon's stats files off (tx-shim-nostats, rx-shim-nostats) and print the difference")
	flag.BoolVar(&o.devMemCmp, "devmem-cmp", false, "also run the ring TX case with egress staging in device memory on (tx-ring-devmem, 256 KiB) and print the on/off ratio")
	flag.BoolVar(&o.tsCmp, "ts-cmp", false, "also run the RX ring and shim cases with receive timestamping on (rx-ring-ts, rx-shim-ts) and print the on/off difference")
	flag.BoolVar(&o.tapCmp, "tap-cmp", false, "also run the ring cases on the TAP path (tx-ring-tap, rx-ring-tap: --fallback tap) and print them next to afxdp and the kernel")
	flag.BoolVar(&o.vxlanCmp, "vxlan-cmp", false, "also run the kernel and ring cases between VXLAN devices over the pair (tx-kernel-vxlan, tx-ring-vxlan, rx-kernel-vxlan, rx-ring-vxlan: the kernel's VXLAN path vs the ring's encapsulation) and print them next to plain UDP")
	flag.BoolVar(&o.split, "split", true, "senders on CPU 0, the receiving side (threaded NAPI, receiver) on CPU 1")
	queues := flag.String("queues", "", "instead of the cases above, compare ring and kernel on veth pairs with these queue counts (e.g. 1,2,4): RX of 64 flows at one paced offered load (-rate, default 0.2 Mpps), TX with a sender per queue")
	flag.IntVar(&o.mtu, "mtu", 0, "MTU of the lab pair (0: 1500)")
	flag.BoolVar(&o.bulk, "bulk", false, "print throughput in Gbit/s and sender CPU per GB (the jumbo-frame comparison) instead of the packet-rate table")
	only := flag.String("only", "", "run only the cases whose name contains this, or one of these comma-separated strings (tx-kernel, tx-ring, tx-shim, rx-kernel, rx-ring, rx-shim)")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	flag.Parse()
	o.only = *only
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "udpbench:", err)
			os.Exit(1)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	if *queues != "" {
		counts, err := parseQueues(*queues)
		if err == nil {
			err = runQueues(o, counts)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "udpbench:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "udpbench:", err)
		pprof.StopCPUProfile()
		os.Exit(1)
	}
}

// sample is one run's result in packets per second.
type sample struct {
	sent, delivered float64
	// cpuPerPkt is the process's CPU time (user and system, all threads)
	// per datagram sent, in ns; TX cases only. Unlike the rates it does not
	// count time the threads spent preempted by other work.
	cpuPerPkt float64
}

func run(o options) error {
	if ok, why := netlab.Privileged(); !ok {
		return fmt.Errorf("needs root: %s", why)
	}
	// Static neighbours: the TX sink drops everything, ARP included.
	p, err := netlab.CreatePair(netlab.Options{StaticNeigh: true, MTU: o.mtu})
	if err != nil {
		return err
	}
	defer p.Close()
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-sig
		p.Close()
		os.Exit(130)
	}()

	b := &bench{o: o, p: p, sendCPU: -1, recvCPU: -1}
	if o.split {
		b.sendCPU, b.recvCPU = 0, 1
		for _, l := range []*netlab.Link{p.A, p.B} {
			if err := threadedNAPI(l); err != nil {
				return err
			}
		}
	}
	results := map[string][]sample{}
	cases := []struct {
		name string
		fn   func() (sample, error)
	}{
		{"tx-kernel", b.txKernel}, {"tx-ring", b.txRing}, {"tx-shim", b.txShim},
		{"rx-kernel", b.rxKernel}, {"rx-ring", b.rxRing}, {"rx-shim", b.rxShim},
	}
	if o.statsCmp {
		// The same shim cases with the daemon publishing no stats files:
		// what publishing costs the data path (interleaved with the others
		// run by run, so drift hits both alike).
		noStats := func(fn func() (sample, error)) func() (sample, error) {
			return func() (sample, error) {
				b.statsOff = true
				defer func() { b.statsOff = false }()
				return fn()
			}
		}
		cases = append(cases, struct {
			name string
			fn   func() (sample, error)
		}{"tx-shim-nostats", noStats(b.txShim)}, struct {
			name string
			fn   func() (sample, error)
		}{"rx-shim-nostats", noStats(b.rxShim)})
	}
	if o.devMemCmp {
		cases = append(cases, struct {
			name string
			fn   func() (sample, error)
		}{"tx-ring-devmem", b.txRingDevMem})
	}
	if o.tsCmp {
		// The XDP programs' own cost per frame, from the kernel's run-time
		// statistics (counted only while this is open).
		st, err := ebpf.EnableStats(unix.BPF_STATS_RUN_TIME)
		if err != nil {
			return fmt.Errorf("enable BPF run-time statistics: %w", err)
		}
		defer st.Close()
		cases = append(cases, struct {
			name string
			fn   func() (sample, error)
		}{"rx-ring-ts", b.rxRingTS}, struct {
			name string
			fn   func() (sample, error)
		}{"rx-shim-ts", b.rxShimTS})
	}
	if o.vxlanCmp {
		vx, err := b.vxlanCases()
		if err != nil {
			return err
		}
		cases = append(cases, vx...)
	}
	if o.tapCmp {
		cases = append(cases, struct {
			name string
			fn   func() (sample, error)
		}{"tx-ring-tap", b.txRingTAP}, struct {
			name string
			fn   func() (sample, error)
		}{"rx-ring-tap", b.rxRingTAP})
	}
	for i := 0; i < o.runs; i++ {
		if (o.devMemCmp || o.tsCmp) && i > 0 {
			// Staging on vs off is a small difference: alternate the
			// order run by run so neither side always goes first.
			slices.Reverse(cases)
		}
		for _, c := range cases {
			if !selected(c.name, o.only) {
				continue
			}
			s, err := c.fn()
			if err != nil {
				return fmt.Errorf("%s run %d: %w", c.name, i+1, err)
			}
			results[c.name] = append(results[c.name], s)
			fmt.Fprintf(os.Stderr, "%-10s run %d: sent %.3f Mpps, delivered %.3f Mpps%s\n", c.name, i+1, s.sent/1e6, s.delivered/1e6, cpuNote(s))
		}
	}
	if o.bulk {
		reportBulk(o, results)
		return nil
	}
	report(o, results)
	reportStats(results)
	reportDevMem(o, results, b.devMemSeen)
	reportTS(o, results, [2]xdpCost{b.xdpPlain, b.xdpTS})
	reportTAP(o, results)
	reportVXLAN(o, results)
	return nil
}

type bench struct {
	o                options
	p                *netlab.Pair
	sendCPU, recvCPU int
	// statsOff starts the shim cases' daemon without stats files.
	statsOff bool
	// devMem is the staging memory of rings openRing opens (0: off), and
	// devMemSeen sums what the staging runs counted.
	devMem     int
	devMemSeen ring.DevMemStats
	// lastRing is the ring openRing opened last.
	lastRing *ring.Ring
	// hwts is the hardware timestamp mode of rings openRing opens; shimTS
	// makes rxShim's socket ask for every timestamp.
	hwts   tsconv.Mode
	shimTS bool
	// fallback is the fallback of rings openRing opens (the TAP cases).
	fallback ring.Fallback
	// overlay: the cases run between the VXLAN devices oa and ob
	// (vxlan.go).
	overlay bool
	oa, ob  *netlab.Overlay
	// xdpPlain and xdpTS sum the XDP program's statistics of the rx-ring
	// runs without and with the timestamping variant.
	xdpPlain, xdpTS xdpCost
}

// onThread runs fn on a fresh OS thread pinned to cpu (negative: not
// pinned). The thread is never unlocked, so it exits with the goroutine and
// its affinity cannot leak to other goroutines.
func onThread(cpu int, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		if err := pinSelf(cpu); err != nil {
			errc <- err
			return
		}
		errc <- fn()
	}()
	return <-errc
}

// pinReceiver pins the NAPI threads of the receiving interface.
func (b *bench) pinReceiver(l *netlab.Link) error {
	if !b.o.split {
		return nil
	}
	return pinNAPI(l, b.recvCPU)
}

func (b *bench) engineCPUs(cpu int) []int {
	if cpu < 0 {
		return nil
	}
	return []int{cpu}
}

// sink attaches the counting XDP drop program to B's interface; the
// datagrams' destination port in B needs no socket.
func (b *bench) sink() (*xdpSink, netip.AddrPort, error) {
	var sk *xdpSink
	err := b.p.B.NS.Do(func() error {
		var err error
		sk, err = newXDPSink(b.p.B.Index)
		return err
	})
	return sk, netip.AddrPortFrom(b.addrB(), 9), err
}

func (b *bench) txKernel() (sample, error) {
	sink, dst, err := b.sink()
	if err != nil {
		return sample{}, err
	}
	defer sink.close()
	var s *mmsgSocket
	if err := b.p.A.NS.Do(func() error {
		var err error
		s, err = newMmsgSocket(netip.AddrPortFrom(b.addrA(), 0), b.o.batch, b.o.size)
		return err
	}); err != nil {
		return sample{}, err
	}
	defer s.close()
	s.setDest(dst, b.o.size)
	return b.measureTX(sink, b.sendCPU, func() (int, error) {
		n, err := s.send()
		if err != nil && !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) {
			return 0, fmt.Errorf("sendmmsg: %w", err)
		}
		return n, nil
	}, nil)
}

// measureTX calls send in a loop, on a thread pinned to cpu, for the run's
// duration, and counts what arrives at the sink. sent reports how many
// datagrams the sender put out so far (nil: the sum of send's returns).
func (b *bench) measureTX(sink *xdpSink, cpu int, send func() (int, error), sent func() uint64) (sample, error) {
	if err := b.pinReceiver(b.p.B); err != nil {
		return sample{}, err
	}
	before, err := sink.count()
	if err != nil {
		return sample{}, err
	}
	var n0, counted uint64
	if sent != nil {
		n0 = sent()
	}
	cpu0 := processCPU()
	start := time.Now()
	err = onThread(cpu, func() error {
		for time.Since(start) < b.o.duration {
			n, err := send()
			if err != nil {
				return err
			}
			counted += uint64(n)
		}
		return nil
	})
	if err != nil {
		return sample{}, err
	}
	el := time.Since(start).Seconds()
	if sent != nil {
		counted = sent() - n0
	}
	after, err := sink.count()
	if err != nil {
		return sample{}, err
	}
	busy := float64(processCPU() - cpu0)
	// The sink counts frames: a datagram larger than the MTU is several.
	frames := float64(after-before) / float64(framesPerDatagram(b.o.size, b.p.A.MTU))
	return sample{sent: float64(counted) / el, delivered: frames / el, cpuPerPkt: busy / float64(max(counted, 1))}, nil
}

// processCPU returns the user and system CPU time of the whole process, in
// ns.
func processCPU() int64 {
	var ru unix.Rusage
	_ = unix.Getrusage(unix.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// batch returns b.o.batch messages of b.o.size bytes.
func (b *bench) batch() [][]byte {
	msgs := make([][]byte, b.o.batch)
	for i := range msgs {
		msgs[i] = make([]byte, b.o.size)
	}
	return msgs
}

func (b *bench) openRing(cpu int) (*ring.Ring, *ring.Endpoint, error) {
	var r *ring.Ring
	err := b.p.A.NS.Do(func() error {
		var err error
		r, err = ring.Open(ring.Config{Interface: b.p.A.Name, Poll: b.o.poll, CPUs: b.engineCPUs(cpu), DevMemTX: b.devMem,
			HWTimestamps: b.hwts, Fallback: b.fallback})
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	if err := b.checkTimestamping(r); err != nil {
		r.Close()
		return nil, nil, err
	}
	ep, err := r.BindUDP(netip.AddrPortFrom(b.addrA(), 0))
	if err != nil {
		r.Close()
		return nil, nil, err
	}
	b.lastRing = r
	return r, ep, nil
}

func (b *bench) txRing() (sample, error) {
	sink, dst, err := b.sink()
	if err != nil {
		return sample{}, err
	}
	defer sink.close()
	r, ep, err := b.openRing(b.sendCPU)
	if err != nil {
		return sample{}, err
	}
	defer r.Close()
	// Let the engine set up the destination before measuring.
	if err := ep.Send(make([]byte, b.o.size), dst, time.Time{}); err != nil {
		return sample{}, err
	}
	time.Sleep(100 * time.Millisecond)
	msgs := b.batch()
	return b.measureTX(sink, b.recvCPU, func() (int, error) {
		return ep.SendBatch(msgs, dst, time.Time{})
	}, r.Stats().TXPackets.Load)
}

// offer runs a kernel sendmmsg sender in B towards dst for the run's
// duration and returns the number of datagrams sent.
func (b *bench) offer(dst netip.AddrPort, wg *sync.WaitGroup, sent *atomic.Uint64, errp *error) (stop func()) {
	if b.o.load == "ring" {
		return b.offerRing(dst, wg, sent, errp)
	}
	var s *mmsgSocket
	*errp = b.p.B.NS.Do(func() error {
		var err error
		s, err = newMmsgSocket(netip.AddrPortFrom(b.addrB(), 0), b.o.batch, b.o.size)
		return err
	})
	if *errp != nil {
		return func() {}
	}
	s.setDest(dst, b.o.size)
	var quit atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer s.close()
		runtime.LockOSThread() // never unlocked: the pinned thread exits with us
		if err := pinSelf(b.sendCPU); err != nil {
			*errp = err
			return
		}
		for !quit.Load() {
			n, err := s.send()
			if err != nil && !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) {
				*errp = err
				return
			}
			sent.Add(uint64(n))
		}
	}()
	return func() { quit.Store(true) }
}

// offerRing is offer with a ring in B as the sender: a kernel sender on one
// core cannot load a receiving core here.
func (b *bench) offerRing(dst netip.AddrPort, wg *sync.WaitGroup, sent *atomic.Uint64, errp *error) (stop func()) {
	var r *ring.Ring
	*errp = b.p.B.NS.Do(func() error {
		var err error
		r, err = ring.Open(ring.Config{Interface: b.p.B.Name, Poll: b.o.poll, CPUs: b.engineCPUs(b.sendCPU)})
		return err
	})
	if *errp != nil {
		return func() {}
	}
	ep, err := r.BindUDP(netip.AddrPortFrom(b.addrB(), 0))
	if err != nil {
		r.Close()
		*errp = err
		return func() {}
	}
	msgs := b.batch()
	var quit atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer r.Close()
		runtime.LockOSThread() // never unlocked: the pinned thread exits with us
		if err := pinSelf(b.sendCPU); err != nil {
			*errp = err
			return
		}
		tx0 := r.Stats().TXPackets.Load()
		start, queued := time.Now(), 0
		for !quit.Load() {
			if b.o.rate > 0 {
				// Paced: the same offered load whatever the receiver.
				due := start.Add(time.Duration(float64(queued) / b.o.rate * float64(time.Second)))
				for time.Now().Before(due) && !quit.Load() {
				}
			}
			n, err := ep.SendBatch(msgs, dst, time.Now().Add(10*time.Millisecond))
			if err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
				*errp = err
				return
			}
			queued += n
		}
		sent.Add(r.Stats().TXPackets.Load() - tx0)
	}()
	return func() { quit.Store(true) }
}

func (b *bench) rxKernel() (sample, error) {
	var s *mmsgSocket
	if err := b.p.A.NS.Do(func() error {
		var err error
		s, err = newMmsgSocket(netip.AddrPortFrom(b.addrA(), 0), b.o.batch, 2048)
		return err
	}); err != nil {
		return sample{}, err
	}
	defer s.close()
	tv := unix.Timeval{Usec: 100000}
	_ = unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
	return b.receive(netip.AddrPortFrom(b.addrA(), uint16(s.localPort())), func() (int, error) {
		n, err := s.recv()
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			return 0, nil
		}
		return n, err
	})
}

func (b *bench) rxRing() (sample, error) {
	r, ep, err := b.openRing(b.recvCPU)
	if err != nil {
		return sample{}, err
	}
	defer r.Close()
	defer b.recordXDP(r)
	msgs := make([]ring.Message, b.o.batch)
	for i := range msgs {
		msgs[i].Buf = make([]byte, 2048)
	}
	return b.receive(ep.LocalAddr(), func() (int, error) {
		n, err := ep.RecvBatch(msgs, time.Now().Add(100*time.Millisecond))
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return 0, nil
		}
		return n, err
	})
}

// receive offers load to dst for the run's duration while recv counts what
// the application gets; it keeps receiving briefly after the sender stops
// to collect what is still queued.
func (b *bench) receive(dst netip.AddrPort, recv func() (int, error)) (sample, error) {
	var wg sync.WaitGroup
	var sent atomic.Uint64
	var sendErr error
	if err := b.pinReceiver(b.p.A); err != nil {
		return sample{}, err
	}
	var got uint64
	var el float64
	err := onThread(b.recvCPU, func() error {
		start := time.Now()
		stop := b.offer(dst, &wg, &sent, &sendErr)
		if sendErr != nil {
			return sendErr
		}
		for time.Since(start) < b.o.duration {
			n, err := recv()
			if err != nil {
				stop()
				wg.Wait()
				return err
			}
			got += uint64(n)
		}
		stop()
		wg.Wait()
		el = time.Since(start).Seconds()
		for drainEnd := time.Now().Add(200 * time.Millisecond); time.Now().Before(drainEnd); {
			n, err := recv()
			if err != nil || n == 0 {
				break
			}
			got += uint64(n)
		}
		return nil
	})
	if err != nil {
		return sample{}, err
	}
	if sendErr != nil {
		return sample{}, fmt.Errorf("sender: %w", sendErr)
	}
	return sample{sent: float64(sent.Load()) / el, delivered: float64(got) / el}, nil
}

// selected reports whether case name matches -only: it contains one of the
// comma-separated strings (an empty -only selects everything).
func selected(name, only string) bool {
	for _, s := range strings.Split(only, ",") {
		if strings.Contains(name, s) {
			return true
		}
	}
	return false
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func col(ss []sample, f func(sample) float64) []float64 {
	out := make([]float64, len(ss))
	for i, s := range ss {
		out[i] = f(s)
	}
	return out
}

func report(o options, res map[string][]sample) {
	for _, c := range []string{"tx-kernel", "tx-ring", "tx-shim", "rx-kernel", "rx-ring", "rx-shim"} {
		if len(res[c]) == 0 {
			return // -only left some out
		}
	}
	sent := func(s sample) float64 { return s.sent }
	dlv := func(s sample) float64 { return s.delivered }
	row := func(name, what string, xs []float64) string {
		return fmt.Sprintf("| %s | %s | %.3f | %.3f–%.3f |", name, what, median(xs)/1e6, slices.Min(xs)/1e6, slices.Max(xs)/1e6)
	}
	var sb strings.Builder
	place := "unpinned"
	if o.split {
		place = "split (senders on CPU 0; receiving NAPI thread and receiver on CPU 1)"
	}
	offered := "as fast as the sender goes"
	if o.rate > 0 {
		offered = fmt.Sprintf("paced at %.3f Mpps", o.rate/1e6)
	}
	fmt.Fprintf(&sb, "%d-byte UDP, %d runs of %v, batch %d, ring poll %v, placement %s, RX load %s\n\n", o.size, o.runs, o.duration, o.batch, o.poll, place, offered)
	sb.WriteString("| path | measured | median Mpps | spread Mpps |\n|---|---|---|---|\n")
	for _, c := range []struct{ name, what string }{
		{"tx-kernel", "sendmmsg, arrived at peer XDP"}, {"tx-ring", "ring endpoint, arrived at peer XDP"},
		{"tx-shim", "shim (client of bypassd), arrived at peer XDP"},
	} {
		fmt.Fprintln(&sb, row(c.name, c.what, col(res[c.name], dlv)))
	}
	for _, c := range []string{"rx-kernel", "rx-ring", "rx-shim"} {
		fmt.Fprintln(&sb, row(c, "offered by peer ("+o.load+" sender)", col(res[c], sent)))
		fmt.Fprintln(&sb, row(c, "delivered to application", col(res[c], dlv)))
	}
	ratio := func(a, b string) float64 { return median(col(res[a], dlv)) / median(col(res[b], dlv)) }
	drop := func(c string) float64 { return 100 * (1 - median(col(res[c], dlv))/median(col(res[c], sent))) }
	sb.WriteString("\n")
	for _, p := range []string{"ring", "shim"} {
		fmt.Fprintf(&sb, "TX ratio %s/kernel: %.2fx (target >= 2.0x)\n", p, ratio("tx-"+p, "tx-kernel"))
		fmt.Fprintf(&sb, "RX ratio %s/kernel (delivered): %.2fx (target >= 1.5x); drops: kernel %.1f%%, %s %.1f%%\n", p, ratio("rx-"+p, "rx-kernel"), drop("rx-kernel"), p, drop("rx-"+p))
	}
	fmt.Print(sb.String())
}

// reportStats compares the shim cases with stats publishing on (the
// default, every 100 ms) and off.
func reportStats(res map[string][]sample) {
	dlv := func(s sample) float64 { return s.delivered }
	for _, c := range []string{"tx-shim", "rx-shim"} {
		on, off := res[c], res[c+"-nostats"]
		if len(on) == 0 || len(off) == 0 {
			continue
		}
		mOn, mOff := median(col(on, dlv)), median(col(off, dlv))
		fmt.Printf("%s with stats publishing on vs off: %.3f vs %.3f Mpps delivered (medians), %+.1f%% (target within ±2%%)\n",
			c, mOn/1e6, mOff/1e6, 100*(mOn/mOff-1))
	}
}
