//go:build verbs

package verbs

import (
	"strings"
	"testing"

	"github.com/bypassd/bypassd/ring/qp"
)

// The send and receive bookkeeping is plain Go over the buffer pool; these
// tests drive it with completions as rdma-core's poll loop reports them
// (wr_id, status, byte_len, timestamp), no device involved.

func bookkeepingProvider(paced int) *Provider {
	cfg := Config{Frames: 64, FrameSize: 2048, Inline: 204}
	p := &Provider{cfg: cfg, sizes: queueSizes{RXFrames: 32, TXFrames: 32, SendWR: 32, RecvWR: 32}, inline: 204, base: 0x10000}
	p.pool = make([]byte, 64*2048)
	p.free = qp.NewTXPool(p.pool, cfg.FrameSize, 32)
	for i := 0; i <= paced; i++ {
		p.sq = append(p.sq, &sendQueue{depth: 32})
	}
	return p
}

func TestBuildSends(t *testing.T) {
	p := bookkeepingProvider(1)
	p.lkey = 7
	p.dm = &DeviceRegion{lkey: 9, size: 4096, zeros: make([]byte, 2048)}
	frames := make([]qp.Frame, 20)
	for i := range frames {
		off := uint64(32+i) * 2048
		frames[i] = qp.Frame{Buf: p.pool[off : off+1000], Handle: off}
	}
	frames[0].Buf = frames[0].Buf[:100] // small enough to go inline
	frames[1] = p.dm.TXFrame(512, 300)
	if off, ok := p.dm.Offset(frames[1]); !ok || off != 512 {
		t.Fatalf("Offset of a staged frame: %d, %v", off, ok)
	}
	if _, ok := p.dm.Offset(frames[0]); ok {
		t.Fatal("a pool frame reported as staged")
	}
	p.sq[1].seq = 41
	wrs := p.buildSends(1, frames)
	if len(wrs) != 20 {
		t.Fatalf("%d work requests for 20 frames", len(wrs))
	}
	if wrs[0].Flags != sendInline || wrs[0].Len != 100 || wrs[0].Addr != 0x10000+32*2048 || wrs[0].LKey != 7 {
		t.Errorf("inline host frame: %+v", wrs[0])
	}
	if wrs[1].Addr != 512 || wrs[1].LKey != 9 || wrs[1].Len != 300 || wrs[1].Flags&sendInline != 0 {
		t.Errorf("device-memory frame (zero-based address, DM key, never inline): %+v", wrs[1])
	}
	for i, w := range wrs {
		signaled := w.Flags&sendSignaled != 0
		if want := i == signalEvery-1 || i == len(wrs)-1; signaled != want {
			t.Errorf("request %d signaled %v, want %v", i, signaled, want)
		}
		if q, seq := w.WRID>>wrSeqBits, w.WRID&(1<<wrSeqBits-1); q != 1 || seq != uint64(41+i) {
			t.Errorf("request %d wr_id names queue %d seq %d", i, q, seq)
		}
	}
}

func TestTakeTXRetiresUpToTheSignaledRequest(t *testing.T) {
	p := bookkeepingProvider(1)
	for q := 0; q < 2; q++ {
		for i := 0; i < 5; i++ {
			p.sq[q].inflight = append(p.sq[q].inflight, postedFrame{seq: uint64(i), handle: uint64(40+5*q+i) * 2048})
		}
	}
	var released []int
	p.dm = &DeviceRegion{size: 4096, released: func(off int) { released = append(released, off) }}
	p.sq[0].inflight[3].handle = dmHandle | 64 // staged: not pool buffers
	p.sq[0].inflight[4].handle = dmHandle | 256
	p.pending = 10
	// Queue 1 completes its third request: the first three retire.
	if n := p.takeTX([]completion{{WRID: 1<<wrSeqBits | 2}}); n != 3 || len(p.sq[1].inflight) != 2 || p.pending != 7 || p.free.Len() != 3 {
		t.Fatalf("after queue 1 seq 2: done %d, inflight %d, pending %d, free %d", n, len(p.sq[1].inflight), p.pending, p.free.Len())
	}
	// Queue 0 completes everything; its device-memory frames go back to
	// the staging allocator in order, not to the free list.
	if n := p.takeTX([]completion{{WRID: 4}}); n != 5 || p.free.Len() != 6 || p.pending != 2 {
		t.Fatalf("after queue 0 seq 4: done %d, free %d, pending %d", n, p.free.Len(), p.pending)
	}
	if len(released) != 2 || released[0] != 64 || released[1] != 256 {
		t.Fatalf("staged frames released %v, want [64 256]", released)
	}
	// Every buffer on the free list is a pool buffer (a device-memory
	// handle would be far beyond the pool).
	free := make([]qp.Frame, p.free.Len())
	for _, f := range free[:p.free.Take(free)] {
		if f.Handle&dmHandle != 0 || f.Handle >= uint64(len(p.pool)) {
			t.Fatalf("handle %#x on the free list is not a pool buffer", f.Handle)
		}
	}
	// A stale completion (older than what is in flight) retires nothing.
	if n := p.takeTX([]completion{{WRID: 1<<wrSeqBits | 1}}); n != 0 {
		t.Fatalf("stale completion retired %d", n)
	}
	// An error completion (not a flush) retires its frames and fails the queue.
	if n := p.takeTX([]completion{{WRID: 1<<wrSeqBits | 4, Status: 4}}); n != 2 || p.fatal == nil || p.txErrors.Load() != 1 {
		t.Fatalf("error completion: done %d, fatal %v, errors %d", n, p.fatal, p.txErrors.Load())
	}
	if !strings.Contains(p.fatal.Error(), "error state") {
		t.Fatalf("fatal error %q", p.fatal)
	}
	// A completion naming a queue that does not exist is counted, not trusted.
	if n := p.takeTX([]completion{{WRID: 7 << wrSeqBits}}); n != 0 || p.txErrors.Load() != 2 {
		t.Fatalf("unknown queue: done %d, errors %d", n, p.txErrors.Load())
	}
}

func TestTakeTXSequenceWrap(t *testing.T) {
	p := bookkeepingProvider(0)
	top := uint64(1<<wrSeqBits - 2)
	for i := uint64(0); i < 4; i++ {
		p.sq[0].inflight = append(p.sq[0].inflight, postedFrame{seq: (top + i) & (1<<wrSeqBits - 1), handle: (40 + i) * 2048})
	}
	p.pending = 4
	if n := p.takeTX([]completion{{WRID: 1}}); n != 4 {
		t.Fatalf("completion after the sequence wrapped retired %d of 4", n)
	}
}

func TestTicksToNs(t *testing.T) {
	for _, tc := range []struct{ ticks, khz, want uint64 }{
		{156_250_000, 156_250, 1_000_000_000}, // one second at 156.25 MHz
		{1, 1_000_000, 1},                     // a 1 GHz clock counts ns
		{3, 1_000_000_000, 0},                 // sub-ns ticks round down
		{1 << 62, 156_250, 1<<64 - 1},         // 2^62 × 6.4 ns: saturates, never wraps
		{5, 0, 0},                             // unknown rate: no time
	} {
		if got := ticksToNs(tc.ticks, tc.khz); got != tc.want {
			t.Errorf("ticksToNs(%d, %d kHz) = %d, want %d", tc.ticks, tc.khz, got, tc.want)
		}
	}
}

func TestTakeRX(t *testing.T) {
	p := bookkeepingProvider(0)
	p.rxPosted = 5
	p.caps.ClockKHz = 156250 // 6.4 ns per tick
	frames := make([]qp.Frame, 5)
	n := p.takeRX([]completion{
		{WRID: 0, Len: 60, TS: 10000},
		{WRID: 2048, Status: wcFlushError},
		{WRID: 4096, Len: 3000}, // longer than a buffer: refused
		{WRID: 100},             // not a buffer address
		{WRID: 40 * 2048},       // a TX buffer: not ours to receive into
	}, frames)
	if n != 1 || len(frames[0].Buf) != 60 || frames[0].HWTimestamp != 64000 || frames[0].Handle != 0 || cap(frames[0].Buf) != 2048 {
		t.Fatalf("good completion: n %d, frame %+v", n, frames[0])
	}
	if p.rxErrors.Load() != 4 || p.rxPosted != 0 {
		t.Fatalf("rx errors %d, posted %d", p.rxErrors.Load(), p.rxPosted)
	}
	if len(p.repost) != 2 || p.repost[0] != 2048 || p.repost[1] != 4096 {
		t.Fatalf("buffers of failed completions are reposted: %v", p.repost)
	}
	if p.fatal == nil || !strings.Contains(p.fatal.Error(), "flushed") {
		t.Fatalf("a flushed receive queue must stop the ring: %v", p.fatal)
	}
}

// Completions Wait found before sleeping are handed out first, no more than
// the caller has room for, and the rest wait for the next call.
func TestRXBurstFromStash(t *testing.T) {
	p := bookkeepingProvider(0)
	for i := 0; i < 5; i++ {
		p.rxStash = append(p.rxStash, completion{WRID: uint64(i) * 2048, Len: uint32(100 + i)})
	}
	p.rxPosted = 5
	frames := make([]qp.Frame, 2)
	var lens []int
	for _, want := range []int{2, 2, 1} {
		n := p.RXBurst(frames)
		if n != want {
			t.Fatalf("RXBurst gave %d frames, want %d (stash left %d)", n, want, len(p.rxStash))
		}
		for _, f := range frames[:n] {
			lens = append(lens, len(f.Buf))
		}
	}
	for i, l := range lens {
		if l != 100+i {
			t.Fatalf("frames out of order: lengths %v", lens)
		}
	}
	if p.rxPackets.Load() != 5 || len(p.rxStash) != 0 {
		t.Fatalf("rx packets %d, stash %d", p.rxPackets.Load(), len(p.rxStash))
	}
}

func TestNextRun(t *testing.T) {
	p := bookkeepingProvider(2) // queues 0, 1, 2
	frames := []qp.Frame{{SendQueue: 1}, {SendQueue: 1}, {}, {SendQueue: 7}, {SendQueue: 2}, {SendQueue: 2}, {SendQueue: 2}}
	var runs [][2]int
	for done := 0; done < len(frames); {
		q, n := p.nextRun(frames[done:])
		runs = append(runs, [2]int{q, n})
		done += n
	}
	// Queue 7 was never opened: its frame joins the main queue's run.
	want := [][2]int{{1, 2}, {0, 2}, {2, 3}}
	if len(runs) != len(want) {
		t.Fatalf("runs %v, want %v", runs, want)
	}
	for i := range want {
		if runs[i] != want[i] {
			t.Fatalf("runs %v, want %v", runs, want)
		}
	}
}

// Staged frames on a paced QP and on the main QP: each completion hands its
// frames' offsets to the allocator at once, in each queue's posting order.
func TestStagedReleaseOnCompletion(t *testing.T) {
	p := bookkeepingProvider(1)
	var released []int
	p.dm = &DeviceRegion{size: 4096, released: func(off int) { released = append(released, off) }}
	post := func(q int, seq uint64, off int) {
		p.sq[q].inflight = append(p.sq[q].inflight, postedFrame{seq: seq, handle: dmHandle | uint64(off)})
		p.pending++
	}
	post(1, 0, 0)                                    // paced, slow
	post(0, 0, 256)                                  // main
	post(0, 1, 512)                                  // main
	post(1, 1, 768)                                  // paced
	p.takeTX([]completion{{WRID: 1}})                // the main queue's two
	p.takeTX([]completion{{WRID: 1<<wrSeqBits | 1}}) // the paced queue's two
	want := []int{256, 512, 0, 768}
	if len(released) != len(want) || p.pending != 0 {
		t.Fatalf("released %v, pending %d; want %v", released, p.pending, want)
	}
	for i := range want {
		if released[i] != want[i] {
			t.Fatalf("released %v, want %v", released, want)
		}
	}
}
