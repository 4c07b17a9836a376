package main

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring"
)

// The multi-queue comparison (-queues 1,2,4): for each queue count a veth
// pair with that many queues, a ring per queue of A (engines spread over the
// CPUs as the daemon does), and the kernel beside it in the same lab:
//
//   - rx: 64 flows (kernel sockets in B with distinct source ports, so the
//     peer's transmit queue choice spreads them over the queues) to 8
//     receivers, offered at the same paced rate to both paths; delivered
//     datagrams per second and loss.
//   - tx: one sender per queue (a ring endpoint each; a kernel sendmmsg
//     socket each), counted at B's XDP sink.

const (
	mqFlows     = 64
	mqReceivers = 8
	mqBatch     = 8 // datagrams per sendmmsg of one flow
)

// mqResult is one queue count's samples per case.
type mqResult struct {
	queues int
	res    map[string][]sample
}

func runQueues(o options, counts []int) error {
	var all []mqResult
	for _, q := range counts {
		p, err := netlab.CreatePair(netlab.Options{StaticNeigh: true, RxQueues: q, TxQueues: q})
		if err != nil {
			return err
		}
		b := &bench{o: o, p: p, sendCPU: -1, recvCPU: -1}
		r := mqResult{queues: q, res: map[string][]sample{}}
		for i := 0; i < o.runs; i++ {
			for _, c := range []struct {
				name string
				fn   func(int) (sample, error)
			}{{"rx-kernel", b.mqRXKernel}, {"rx-ring", b.mqRXRing}, {"tx-kernel", b.mqTXKernel}, {"tx-ring", b.mqTXRing}} {
				if !selected(c.name, o.only) {
					continue
				}
				s, err := c.fn(q)
				if err != nil {
					p.Close()
					return fmt.Errorf("%d queues, %s run %d: %w", q, c.name, i+1, err)
				}
				r.res[c.name] = append(r.res[c.name], s)
				fmt.Fprintf(os.Stderr, "%d queues %-9s run %d: sent %.3f Mpps, delivered %.3f Mpps\n", q, c.name, i+1, s.sent/1e6, s.delivered/1e6)
			}
		}
		p.Close()
		all = append(all, r)
	}
	reportQueues(o, all)
	return nil
}

// mqCPUs is where ring k's engine runs: spread over the allowed CPUs, as
// the daemon does without --cpus.
func mqCPUs(k int) []int {
	return []int{k % runtime.NumCPU()}
}

// mqOffer sends from mqFlows kernel sockets in B, flow i to dsts[i %
// len(dsts)], paced to o.rate datagrams/s in total (a default of 0.2 Mpps
// when -rate is 0: the same offered load for every path).
func (b *bench) mqOffer(dsts []netip.AddrPort, wg *sync.WaitGroup, sent *atomic.Uint64, errp *error) (stop func(), err error) {
	rate := b.o.rate
	if rate <= 0 {
		rate = 200_000
	}
	socks := make([]*mmsgSocket, mqFlows)
	err = b.p.B.NS.Do(func() error {
		for i := range socks {
			s, err := newMmsgSocket(netip.AddrPortFrom(b.p.B.Addr4(), 0), mqBatch, b.o.size)
			if err != nil {
				return err
			}
			s.setDest(dsts[i%len(dsts)], b.o.size)
			socks[i] = s
		}
		return nil
	})
	if err != nil {
		for _, s := range socks {
			if s != nil {
				s.close()
			}
		}
		return nil, err
	}
	var quit atomic.Bool
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer func() {
			for _, s := range socks {
				s.close()
			}
		}()
		start, queued := time.Now(), 0
		for i := 0; !quit.Load(); i = (i + 1) % len(socks) {
			due := start.Add(time.Duration(float64(queued) / rate * float64(time.Second)))
			if d := time.Until(due); d > 0 {
				time.Sleep(d)
			}
			n, err := socks[i].send()
			if err != nil && !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) {
				*errp = err
				return
			}
			queued += mqBatch
			sent.Add(uint64(n))
		}
	}()
	return func() { quit.Store(true) }, nil
}

// mqReceive offers load to dsts for the run's duration while one receiver
// goroutine per destination counts what its application gets.
func (b *bench) mqReceive(dsts []netip.AddrPort, recvs []func() (int, error)) (sample, error) {
	var got atomic.Uint64
	var quit atomic.Bool
	var rwg sync.WaitGroup
	rerr := make(chan error, len(recvs))
	for _, recv := range recvs {
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			runtime.LockOSThread()
			for !quit.Load() {
				n, err := recv()
				if err != nil {
					rerr <- err
					return
				}
				got.Add(uint64(n))
			}
		}()
	}
	var wg sync.WaitGroup
	var sent atomic.Uint64
	var sendErr error
	start := time.Now()
	stop, err := b.mqOffer(dsts, &wg, &sent, &sendErr)
	if err == nil {
		time.Sleep(b.o.duration)
		stop()
		wg.Wait()
	}
	el := time.Since(start).Seconds()
	time.Sleep(200 * time.Millisecond) // what is still queued
	quit.Store(true)
	rwg.Wait()
	select {
	case err = <-rerr:
	default:
	}
	if err == nil {
		err = sendErr
	}
	if err != nil {
		return sample{}, err
	}
	return sample{sent: float64(sent.Load()) / el, delivered: float64(got.Load()) / el}, nil
}

func (b *bench) mqRXKernel(int) (sample, error) {
	var socks []*mmsgSocket
	defer func() {
		for _, s := range socks {
			s.close()
		}
	}()
	var dsts []netip.AddrPort
	var recvs []func() (int, error)
	for range mqReceivers {
		var s *mmsgSocket
		if err := b.p.A.NS.Do(func() error {
			var err error
			s, err = newMmsgSocket(netip.AddrPortFrom(b.p.A.Addr4(), 0), b.o.batch, 2048)
			return err
		}); err != nil {
			return sample{}, err
		}
		socks = append(socks, s)
		tv := unix.Timeval{Usec: 100000}
		_ = unix.SetsockoptTimeval(s.fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv)
		dsts = append(dsts, netip.AddrPortFrom(b.p.A.Addr4(), uint16(s.localPort())))
		recvs = append(recvs, func() (int, error) {
			n, err := s.recv()
			if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
				return 0, nil
			}
			return n, err
		})
	}
	return b.mqReceive(dsts, recvs)
}

// mqRings opens a ring per queue of A.
func (b *bench) mqRings(q int) ([]*ring.Ring, error) {
	var rings []*ring.Ring
	err := b.p.A.NS.Do(func() error {
		for k := range q {
			r, err := ring.Open(ring.Config{Interface: b.p.A.Name, Queue: k, Poll: b.o.poll, CPUs: mqCPUs(k)})
			if err != nil {
				return err
			}
			rings = append(rings, r)
		}
		return nil
	})
	if err != nil {
		closeRings(rings)
		return nil, err
	}
	return rings, nil
}

func closeRings(rings []*ring.Ring) {
	for _, r := range rings {
		r.Close()
	}
}

func (b *bench) mqRXRing(q int) (sample, error) {
	rings, err := b.mqRings(q)
	if err != nil {
		return sample{}, err
	}
	defer closeRings(rings)
	var dsts []netip.AddrPort
	var recvs []func() (int, error)
	for i := range mqReceivers {
		ep, err := rings[i%q].BindUDP(netip.AddrPortFrom(b.p.A.Addr4(), 0))
		if err != nil {
			return sample{}, err
		}
		dsts = append(dsts, ep.LocalAddr())
		msgs := make([]ring.Message, b.o.batch)
		for j := range msgs {
			msgs[j].Buf = make([]byte, 2048)
		}
		recvs = append(recvs, func() (int, error) {
			n, err := ep.RecvBatch(msgs, time.Now().Add(100*time.Millisecond))
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return 0, nil
			}
			return n, err
		})
	}
	return b.mqReceive(dsts, recvs)
}

// mqTX runs one sender per queue for the run's duration and counts what
// arrives at B's XDP sink.
func (b *bench) mqTX(sink *xdpSink, q int, send func(k int) (int, error)) (sample, error) {
	before, err := sink.count()
	if err != nil {
		return sample{}, err
	}
	var sent atomic.Uint64
	var wg sync.WaitGroup
	errs := make(chan error, q)
	start := time.Now()
	for k := range q {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			for time.Since(start) < b.o.duration {
				n, err := send(k)
				if err != nil {
					errs <- err
					return
				}
				sent.Add(uint64(n))
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	select {
	case err := <-errs:
		return sample{}, err
	default:
	}
	after, err := sink.count()
	if err != nil {
		return sample{}, err
	}
	return sample{sent: float64(sent.Load()) / el, delivered: float64(after-before) / el}, nil
}

func (b *bench) mqTXKernel(q int) (sample, error) {
	sink, dst, err := b.sink()
	if err != nil {
		return sample{}, err
	}
	defer sink.close()
	socks := make([]*mmsgSocket, q)
	defer func() {
		for _, s := range socks {
			if s != nil {
				s.close()
			}
		}
	}()
	for k := range socks {
		if err := b.p.A.NS.Do(func() error {
			var err error
			socks[k], err = newMmsgSocket(netip.AddrPortFrom(b.p.A.Addr4(), 0), b.o.batch, b.o.size)
			return err
		}); err != nil {
			return sample{}, err
		}
		socks[k].setDest(dst, b.o.size)
	}
	return b.mqTX(sink, q, func(k int) (int, error) {
		n, err := socks[k].send()
		if err != nil && !errors.Is(err, unix.ENOBUFS) && !errors.Is(err, unix.EAGAIN) {
			return 0, fmt.Errorf("sendmmsg: %w", err)
		}
		return n, nil
	})
}

func (b *bench) mqTXRing(q int) (sample, error) {
	sink, dst, err := b.sink()
	if err != nil {
		return sample{}, err
	}
	defer sink.close()
	rings, err := b.mqRings(q)
	if err != nil {
		return sample{}, err
	}
	defer closeRings(rings)
	eps := make([]*ring.Endpoint, q)
	for k, r := range rings {
		if eps[k], err = r.BindUDP(netip.AddrPortFrom(b.p.A.Addr4(), 0)); err != nil {
			return sample{}, err
		}
		// Let the engine resolve the destination before measuring.
		if err := eps[k].Send(make([]byte, b.o.size), dst, time.Time{}); err != nil {
			return sample{}, err
		}
	}
	time.Sleep(100 * time.Millisecond)
	msgs := make([][][]byte, q)
	for k := range msgs {
		msgs[k] = b.batch()
	}
	return b.mqTX(sink, q, func(k int) (int, error) {
		return eps[k].SendBatch(msgs[k], dst, time.Time{})
	})
}

func reportQueues(o options, all []mqResult) {
	dlv := func(s sample) float64 { return s.delivered }
	snt := func(s sample) float64 { return s.sent }
	med := func(r mqResult, c string, f func(sample) float64) float64 {
		if len(r.res[c]) == 0 {
			return 0
		}
		return median(col(r.res[c], f))
	}
	rate := o.rate
	if rate <= 0 {
		rate = 200_000
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d-byte UDP, %d runs of %v per case, %d CPUs; rings spread over the CPUs (ring k on CPU k mod %d)\n",
		o.size, o.runs, o.duration, runtime.NumCPU(), runtime.NumCPU())
	fmt.Fprintf(&sb, "RX: %d flows (distinct source ports) to %d receivers, offered at %.3f Mpps to both paths; TX: a sender per queue\n\n",
		mqFlows, mqReceivers, rate/1e6)
	sb.WriteString("| queues | RX kernel: offered → delivered Mpps (loss) | RX ring: offered → delivered (loss) | RX ring/kernel | TX kernel Mpps | TX ring Mpps | TX ring/kernel |\n|---|---|---|---|---|---|---|\n")
	loss := func(r mqResult, c string) float64 {
		s := med(r, c, snt)
		if s == 0 {
			return 0
		}
		return 100 * (1 - med(r, c, dlv)/s)
	}
	for _, r := range all {
		fmt.Fprintf(&sb, "| %d | %.3f → %.3f (%.1f%%) | %.3f → %.3f (%.1f%%) | %.2fx | %.3f | %.3f | %.2fx |\n", r.queues,
			med(r, "rx-kernel", snt)/1e6, med(r, "rx-kernel", dlv)/1e6, loss(r, "rx-kernel"),
			med(r, "rx-ring", snt)/1e6, med(r, "rx-ring", dlv)/1e6, loss(r, "rx-ring"),
			ratioOrZero(med(r, "rx-ring", dlv), med(r, "rx-kernel", dlv)),
			med(r, "tx-kernel", dlv)/1e6, med(r, "tx-ring", dlv)/1e6, ratioOrZero(med(r, "tx-ring", dlv), med(r, "tx-kernel", dlv)))
	}
	sb.WriteString("\nRX ratios compare equal loads only where both offered columns reached the -rate; a loaded machine's generator falls short, and by a different amount per path.\n")
	if len(all) > 1 {
		first := all[0]
		sb.WriteString("\n")
		for _, r := range all[1:] {
			fmt.Fprintf(&sb, "%d vs %d queues: TX ring %.2fx (target >= 1.6x at 2), TX kernel %.2fx, RX ring %.2fx, RX kernel %.2fx\n",
				r.queues, first.queues,
				ratioOrZero(med(r, "tx-ring", dlv), med(first, "tx-ring", dlv)), ratioOrZero(med(r, "tx-kernel", dlv), med(first, "tx-kernel", dlv)),
				ratioOrZero(med(r, "rx-ring", dlv), med(first, "rx-ring", dlv)), ratioOrZero(med(r, "rx-kernel", dlv), med(first, "rx-kernel", dlv)))
		}
	}
	fmt.Print(sb.String())
}

// parseQueues reads -queues: a comma-separated list of queue counts.
func parseQueues(v string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(v, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &n); err != nil || n < 1 || n > 64 {
			return nil, fmt.Errorf("-queues %q: want counts from 1 to 64, e.g. 1,2,4", v)
		}
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out, nil
}
