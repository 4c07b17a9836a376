package ring_test

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

// rateLimited is the AF_XDP provider dressed as a device that paces in
// hardware: it records SetRateLimit calls and the send queue of every
// frame posted, and refuses rates while refuse is set. The frames still
// go out through AF_XDP (no device here shapes them).
type rateLimited struct {
	qp.Provider
	mu     sync.Mutex
	calls  []rateCall
	queues map[int]int // frames posted per Frame.SendQueue
	refuse bool
}

type rateCall struct {
	queue int
	rl    qp.RateLimit
}

func (p *rateLimited) SetRateLimit(q int, rl qp.RateLimit) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, rateCall{q, rl})
	if p.refuse && rl.Kbps != 0 {
		return errors.New("no packet pacing on this device")
	}
	return nil
}

func (p *rateLimited) TXBurst(frames []qp.Frame) (int, error) {
	p.mu.Lock()
	for _, f := range frames {
		p.queues[f.SendQueue]++
	}
	p.mu.Unlock()
	return p.Provider.TXBurst(frames)
}

func (p *rateLimited) snapshot() ([]rateCall, map[int]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	q := map[int]int{}
	for k, v := range p.queues {
		q[k] = v
	}
	return append([]rateCall(nil), p.calls...), q
}

// hwProv is the provider the last ring opened with "ratelimit-test" got
// (only TestPacingHardwareSeam opens one, and not in parallel).
var (
	hwProvMu sync.Mutex
	hwProv   *rateLimited
)

func init() {
	qp.Register("ratelimit-test", func(pc qp.PathConfig) (qp.Provider, qp.Steering, error) {
		prov, steer, err := qp.Open(ring.DefaultProvider, pc)
		if err != nil {
			return nil, nil, err
		}
		hwProvMu.Lock()
		defer hwProvMu.Unlock()
		hwProv = &rateLimited{Provider: prov, queues: map[int]int{}}
		return hwProv, steer, nil
	})
}

// TestPacingHardwareSeam: with a provider that implements qp.RateLimiter,
// the engine hands a paced endpoint's rate to the device on a send queue
// of its own, tags its frames with that queue and does not pace them
// itself; removing the rate frees the queue; a refused rate falls back to
// software pacing.
func TestPacingHardwareSeam(t *testing.T) {
	l := newLab(t, ring.Config{Provider: "ratelimit-test"})
	hwProvMu.Lock()
	prov := hwProv
	hwProvMu.Unlock()
	ep := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	other := l.bind(t, netip.AddrPortFrom(l.p.A.Addr4(), 0))
	c := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	dst := c.LocalAddr().(*net.UDPAddr).AddrPort()
	buf := make([]byte, 2048)
	exchange := func(from *ring.Endpoint, n int) {
		t.Helper()
		for i := 0; i < n; i++ {
			if err := from.Send(make([]byte, 1000), dst, time.Now().Add(5*time.Second)); err != nil {
				t.Fatal(err)
			}
		}
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		for i := 0; i < n; i++ {
			if _, _, err := c.ReadFromUDPAddrPort(buf); err != nil {
				t.Fatalf("datagram %d of %d: %v", i, n, err)
			}
		}
	}
	waitCalls := func(n int) []rateCall {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			calls, _ := prov.snapshot()
			if len(calls) >= n || time.Now().After(deadline) {
				return calls
			}
		}
	}

	rate := pacing.Rate{Kbps: 1000} // 20 datagrams of 1042 bytes would take 167 ms in software
	ep.SetPacing(&rate)
	exchange(ep, 20)
	exchange(other, 5)
	calls, queues := prov.snapshot()
	if len(calls) != 1 || calls[0] != (rateCall{1, qp.RateLimit{Kbps: 1000}}) {
		t.Errorf("SetRateLimit calls %+v, want one for send queue 1 at 1000 kbit/s", calls)
	}
	if queues[1] != 20 || queues[0] != 5 {
		t.Errorf("frames per send queue %v, want 20 on queue 1 (paced) and 5 on queue 0", queues)
	}
	if w := l.r.Stats().TXPaceWaits.Load(); w != 0 {
		t.Errorf("the engine held %d datagrams for their departure time: the device paces them", w)
	}

	// No rate: the queue is released.
	ep.SetPacing(nil)
	if calls = waitCalls(2); len(calls) != 2 || calls[1] != (rateCall{1, qp.RateLimit{}}) {
		t.Errorf("after removing the rate: calls %+v, want send queue 1 cleared", calls)
	}

	// A device that refuses: the engine paces in software, on queue 0.
	prov.mu.Lock()
	prov.refuse = true
	prov.mu.Unlock()
	ep.SetPacing(&pacing.Rate{Kbps: 1000, MaxBurst: 1500})
	exchange(ep, 3)
	calls, queues = prov.snapshot()
	if n := len(calls); n < 4 || calls[n-2].rl.Kbps != 1000 || calls[n-1] != (rateCall{calls[n-2].queue, qp.RateLimit{}}) {
		t.Errorf("refused rate: calls %+v, want the refused queue cleared", calls)
	}
	if queues[1] != 20 || queues[0] != 8 {
		t.Errorf("frames per send queue %v, want the refused socket's 3 on queue 0", queues)
	}
	if l.r.Stats().TXPaceWaits.Load() == 0 {
		t.Error("a refused hardware rate must be paced in software: no datagram waited")
	}
}
