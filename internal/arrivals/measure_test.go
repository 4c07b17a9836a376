package arrivals

import (
	"math"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"
)

func paced(n, size int, gap, start int64) []Arrival {
	out := make([]Arrival, n)
	for i := range out {
		out[i] = Arrival{T: start + int64(i)*gap, Len: size}
	}
	return out
}

func TestWindowRates(t *testing.T) {
	// 1000-byte payloads + 42 = 1042 wire bytes every 83.36 µs: 100 Mbit/s.
	arr := paced(30000, 1000, 83360, 5e9)
	rates := WindowRates(arr, WireOverhead4, 5e9, time.Second, 2)
	for i, r := range rates {
		if math.Abs(r-100e6)/100e6 > 0.001 {
			t.Errorf("window %d: %.0f bit/s, want 100 Mbit/s", i, r)
		}
	}
}

func TestMaxExcessAndJitter(t *testing.T) {
	arr := paced(100, 958, 80000, 0) // 1000 wire bytes per 80 µs: 100 Mbit/s
	if e := MaxExcess(arr, WireOverhead4, 100e6); math.Abs(e-1000) > 1e-6 {
		t.Errorf("evenly paced: excess %.1f, want one datagram (1000)", e)
	}
	// Five datagrams at once in the middle: 4 more datagrams of excess.
	for i := 50; i < 55; i++ {
		arr[i].T = arr[50].T
	}
	if e := MaxExcess(arr, WireOverhead4, 100e6); math.Abs(e-5000) > 1e-6 {
		t.Errorf("burst of 5: excess %.1f, want 5000", e)
	}
	j := GapJitter(paced(100, 958, 80000, 0), WireOverhead4, 100e6)
	if j.P99 != 0 || j.Gaps != 99 {
		t.Errorf("ideal gaps: %+v", j)
	}
}

func TestRecordLoopback(t *testing.T) {
	// Loopback of the test's own process: no lab needed for the recorder.
	rx, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Skipf("no loopback UDP: %v", err)
	}
	defer rx.Close()
	rec, err := Record(rx, 10)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := net.DialUDP("udp4", nil, rx.LocalAddr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Close()
	before := time.Now().UnixNano()
	for i := 0; i < 10; i++ {
		if _, err := tx.Write(make([]byte, 100+i)); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for rec.Count() < 10 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	got, err := rec.Stop()
	if err != nil || len(got) != 10 {
		t.Fatalf("recorded %d datagrams (%v), want 10", len(got), err)
	}
	from := tx.LocalAddr().(*net.UDPAddr).AddrPort()
	from = netip.AddrPortFrom(from.Addr().Unmap(), from.Port())
	for i, a := range got {
		if a.Len != 100+i || a.From != from || a.T < before || a.T > time.Now().UnixNano() {
			t.Errorf("arrival %d: %+v (sender %v)", i, a, from)
		}
	}
	if n := len(From(got, from)); n != 10 {
		t.Errorf("From selected %d", n)
	}
}

func TestSampler(t *testing.T) {
	var v uint64
	var mu sync.Mutex
	read := func() uint64 { mu.Lock(); defer mu.Unlock(); return v }
	s := Sample(time.Millisecond, read)
	t0 := time.Now().UnixNano()
	time.Sleep(20 * time.Millisecond)
	t1 := time.Now().UnixNano()
	// The change comes only after the sampler read the counter at or after
	// t1: on a loaded machine a tick can come late, and a first sample
	// after the window taken after the change would see it move.
	for sampled := false; !sampled; time.Sleep(time.Millisecond) {
		s.mu.Lock()
		sampled = len(s.ts) > 0 && s.ts[len(s.ts)-1] >= t1
		s.mu.Unlock()
	}
	mu.Lock()
	v++
	mu.Unlock()
	time.Sleep(20 * time.Millisecond)
	t2 := time.Now().UnixNano()
	time.Sleep(5 * time.Millisecond)
	s.Stop()
	if s.Moved(t0+int64(time.Millisecond), t1) {
		t.Error("moved in a quiet window")
	}
	if !s.Moved(t0+int64(time.Millisecond), t2) {
		t.Error("did not move across the change")
	}
	if !s.Moved(t2+int64(time.Hour), t2+int64(2*time.Hour)) {
		t.Error("a window after the samples must count as moved")
	}
}
