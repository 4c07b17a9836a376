package ring_test

import (
	"context"
	"errors"
	"math"
	"net"
	"net/netip"
	"runtime"
	"runtime/debug"
	"sync"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/arrivals"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/pacing"
)

// pacedFlow is one endpoint sending as fast as its pacing lets it (its
// TX queue stays full: backpressure) to its own kernel receiver.
type pacedFlow struct {
	rate pacing.Rate
	ep   *ring.Endpoint
	rec  *arrivals.Recorder
	dst  netip.AddrPort
}

// blast sends size-byte datagrams to dst until ctx ends; Send blocks while
// the endpoint's queue is full.
func blast(ctx context.Context, ep *ring.Endpoint, dst netip.AddrPort, size int) error {
	b := make([]byte, size)
	for ctx.Err() == nil {
		if err := ep.Send(b, dst, time.Now().Add(100*time.Millisecond)); err != nil && !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
			return err
		}
	}
	return nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// TestPacingAccuracy paces three endpoints of one ring at 10, 100 and 500
// Mbit/s with 1400-byte datagrams, all at once, while a fourth, unpaced
// endpoint sends a burst. Kernel sockets in the peer namespace timestamp
// the arrivals: every paced flow is within ±1% of its rate in each of five
// 1-second windows, and no stretch of arrivals exceeds the burst
// allowance; the unpaced burst is not held back.
func TestPacingAccuracy(t *testing.T) {
	// 16 MiB queues hold 270 ms at 500 Mbit/s: a sender goroutine
	// descheduled on a busy machine does not let its queue run dry.
	l := newLab(t, ring.Config{QueueBytes: 16 << 20, RealtimePriority: 10})
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(16))
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	const size = 1400
	const windows = 5
	flows := []*pacedFlow{{rate: pacing.Rate{Kbps: 10_000}}, {rate: pacing.Rate{Kbps: 100_000}}, {rate: pacing.Rate{Kbps: 500_000}}}
	for _, f := range flows {
		f.ep = l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
		f.ep.SetPacing(&f.rate)
		c := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
		f.dst = c.LocalAddr().(*net.UDPAddr).AddrPort()
		var err error
		if f.rec, err = arrivals.Record(c); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	errs := make(chan error, len(flows))
	for _, f := range flows {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- blast(ctx, f.ep, f.dst, size)
		}()
	}
	// Skip the first 200 ms (the initial burst allowance, threads
	// starting), then five windows.
	time.Sleep(300 * time.Millisecond)

	// Unpaced traffic meanwhile: 2000 datagrams (22 Mbit) arrive in far
	// less than the 2.2 s the slowest paced flow would need.
	up := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	upc := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	uprec, err := arrivals.Record(upc)
	if err != nil {
		t.Fatal(err)
	}
	sentAt := time.Now()
	b := make([]byte, size)
	for i := 0; i < 2000; i++ {
		if err := up.Send(b, upc.LocalAddr().(*net.UDPAddr).AddrPort(), time.Now().Add(5*time.Second)); err != nil {
			t.Fatalf("unpaced send %d: %v", i, err)
		}
	}
	for uprec.Count() < 2000 && time.Since(sentAt) < 5*time.Second {
		time.Sleep(time.Millisecond)
	}
	upArr, _ := uprec.Stop()
	if len(upArr) < 2000 || time.Duration(upArr[len(upArr)-1].T-sentAt.UnixNano()) > time.Second {
		t.Errorf("unpaced: %d of 2000 datagrams arrived, the last after %v; paced traffic held them back", len(upArr), time.Duration(upArr[len(upArr)-1].T-sentAt.UnixNano()))
	}

	time.Sleep(windows*time.Second + 100*time.Millisecond - time.Since(sentAt))
	cancel()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("sender: %v", err)
		}
	}
	for _, f := range flows {
		arr, err := f.rec.Stop()
		if err != nil {
			t.Fatal(err)
		}
		if len(arr) == 0 {
			t.Fatalf("%v: nothing arrived", f.rate)
		}
		want := float64(f.rate.Kbps) * 1000
		acc := arrivals.MeasureAccuracy(arr, arrivals.WireOverhead4, arr[0].T+int64(200*time.Millisecond), time.Second, windows, want)
		for i, e := range acc.Errors {
			if math.Abs(e) > 0.01 {
				t.Errorf("%v: window %d: %.3f Mbit/s (%+.2f%%), want within ±1%%", f.rate, i, acc.Rates[i]/1e6, 100*e)
			}
		}
		burst := float64(f.rate.Burst())
		excess := arrivals.MaxExcess(arr, arrivals.WireOverhead4, want)
		j := arrivals.GapJitter(arr[len(arr)/10:], arrivals.WireOverhead4, want)
		t.Logf("%v: rate error mean %.3f%% worst %+.3f%%, largest burst %.0f bytes (allowance %.0f), gap jitter p50 %v p99 %v max %v",
			f.rate, 100*acc.Mean, 100*acc.Worst, excess, burst, j.P50, j.P99, j.Max)
		// One datagram of slack: a pass charges departures at the time it
		// started, and the frames leave a few microseconds later.
		if excess > burst+size+arrivals.WireOverhead4 {
			t.Errorf("%v: a burst of %.0f bytes beyond the rate, allowance %.0f", f.rate, excess, burst)
		}
	}
	st := l.r.Stats()
	t.Logf("ring stats %+v provider %+v rcvbuf errors %d", st, l.r.ProviderStats(), udpStat(t, l.p.B.NS, false, "RcvbufErrors"))
	if st.TXPaced.Load() == 0 || st.PacedQueues.Load() != uint64(len(flows)) {
		t.Errorf("ring counters: %d paced datagrams, %d paced queues", st.TXPaced.Load(), st.PacedQueues.Load())
	}
}
