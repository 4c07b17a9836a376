package devmem

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"
)

// newMem returns a Manager over a fresh MemRegion of size bytes.
func newMem(t testing.TB, size int, cfg Config) (*Manager, *MemRegion) {
	t.Helper()
	r := NewMemRegion(make([]byte, size))
	m, err := New(r, cfg)
	if err != nil {
		t.Fatalf("New(%d bytes): %v", size, err)
	}
	return m, r
}

// chunkedMem is a MemRegion whose device refuses packets that cross a chunk.
type chunkedMem struct {
	*MemRegion
	chunk int
}

func (c chunkedMem) ChunkSize() int { return c.chunk }

// newChunked is newMem over a region with chunk-sized chunks (0: none).
func newChunked(t testing.TB, size, chunk int, cfg Config) (*Manager, *MemRegion) {
	t.Helper()
	if chunk == 0 {
		return newMem(t, size, cfg)
	}
	r := NewMemRegion(make([]byte, size))
	m, err := New(chunkedMem{r, chunk}, cfg)
	if err != nil {
		t.Fatalf("New(%d bytes, chunk %d): %v", size, chunk, err)
	}
	return m, r
}

// pkt returns n bytes of a pattern that differs per seed, so a misplaced or
// overwritten copy is visible.
func pkt(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = seed + byte(i*7)
	}
	return b
}

func mustStage(t *testing.T, m *Manager, p []byte, wantOff int) {
	t.Helper()
	off, ok := m.Stage(p)
	if !ok {
		t.Fatalf("Stage(%d bytes) not staged; want offset %d (used %d of %d)", len(p), wantOff, m.Used(), m.Capacity())
	}
	if off != wantOff {
		t.Fatalf("Stage(%d bytes) at offset %d, want %d", len(p), off, wantOff)
	}
}

func mustNotStage(t *testing.T, m *Manager, p []byte) {
	t.Helper()
	if off, ok := m.Stage(p); ok {
		t.Fatalf("Stage(%d bytes) staged at %d; want not staged (used %d of %d)", len(p), off, m.Used(), m.Capacity())
	}
}

func mustRelease(t *testing.T, m *Manager, off int) {
	t.Helper()
	if err := m.Release(off); err != nil {
		t.Fatalf("Release(%d): %v", off, err)
	}
}

func checkData(t *testing.T, r *MemRegion, off int, want []byte) {
	t.Helper()
	got, err := r.Slice(off, len(want))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("region at %d does not hold the staged packet", off)
	}
}

func TestNewRejectsNegativeConfig(t *testing.T) {
	r := NewMemRegion(make([]byte, 64))
	if _, err := New(r, Config{InlineThreshold: -1}); err == nil {
		t.Error("negative inline threshold accepted")
	}
	if _, err := New(r, Config{CompletionThreshold: -1}); err == nil {
		t.Error("negative completion threshold accepted")
	}
}

type badSize struct{ MemRegion }

func (badSize) Size() int { return -8 }

func TestNewRejectsNegativeSize(t *testing.T) {
	if _, err := New(&badSize{}, DefaultConfig()); err == nil {
		t.Error("region with negative size accepted")
	}
}

func TestDisabled(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Region
	}{
		{"nil", nil},
		{"size0", NewMemRegion(nil)},
		{"below alignment", NewMemRegion(make([]byte, Align-1))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(tc.r, DefaultConfig())
			if err != nil {
				t.Fatal(err)
			}
			if m.Enabled() || m.Capacity() != 0 {
				t.Fatalf("Enabled %v Capacity %d, want disabled", m.Enabled(), m.Capacity())
			}
			for _, n := range []int{0, 64, 204, 205, 1400} {
				mustNotStage(t, m, pkt(n, 1))
			}
			if m.NeedCompletion() {
				t.Error("disabled manager asks for a completion")
			}
			if s := m.Stats(); s != (Stats{}) {
				t.Errorf("disabled manager counted %+v, want nothing", s)
			}
			if err := m.Release(0); !errors.Is(err, ErrReleaseOrder) {
				t.Errorf("Release on a disabled manager: %v, want ErrReleaseOrder", err)
			}
		})
	}
}

func TestCapacityRoundsDownToAlignment(t *testing.T) {
	m, _ := newMem(t, 1021, Config{})
	if m.Capacity() != 1016 {
		t.Fatalf("Capacity %d, want 1016", m.Capacity())
	}
	mustNotStage(t, m, pkt(1017, 1))
	mustStage(t, m, pkt(1016, 1), 0)
}

func TestInlineThresholdBoundary(t *testing.T) {
	m, r := newMem(t, 4096, DefaultConfig())
	mustNotStage(t, m, pkt(DefaultInlineThreshold, 1))
	mustNotStage(t, m, pkt(0, 1))
	p := pkt(DefaultInlineThreshold+1, 2)
	mustStage(t, m, p, 0)
	checkData(t, r, 0, p)
	// 205 bytes are charged as 208 (8-byte aligned), so the next packet is
	// placed at 208.
	if m.Used() != 208 {
		t.Fatalf("Used %d after a 205-byte packet, want 208", m.Used())
	}
	mustStage(t, m, pkt(300, 3), 208)
	s := m.Stats()
	want := Stats{Capacity: 4096, InUse: 208 + 304, StagedPackets: 2, StagedBytes: 505, InlinePackets: 2}
	if s != want {
		t.Fatalf("Stats %+v, want %+v", s, want)
	}

	// A configured threshold moves the boundary; 0 stages everything
	// non-empty.
	m2, _ := newMem(t, 4096, Config{InlineThreshold: 0})
	mustNotStage(t, m2, nil)
	mustStage(t, m2, pkt(1, 1), 0)
	mustStage(t, m2, pkt(1, 1), 8)
	m3, _ := newMem(t, 4096, Config{InlineThreshold: 512})
	mustNotStage(t, m3, pkt(512, 1))
	mustStage(t, m3, pkt(513, 1), 0)
}

func TestExactFill(t *testing.T) {
	m, r := newMem(t, 1024, Config{})
	var ps [][]byte
	for i := range 4 {
		p := pkt(256, byte(i))
		ps = append(ps, p)
		mustStage(t, m, p, i*256)
	}
	if m.Free() != 0 || m.Used() != 1024 {
		t.Fatalf("Free %d Used %d after an exact fill, want 0 and 1024", m.Free(), m.Used())
	}
	for i, p := range ps {
		checkData(t, r, i*256, p)
	}
	mustNotStage(t, m, pkt(1, 9))
	if s := m.Stats(); s.OOBPackets != 1 || s.StagedPackets != 4 {
		t.Fatalf("Stats %+v, want 4 staged, 1 oob", s)
	}
	// Freed space at the start is reused exactly, wrapping with no skip
	// because the head sits at the end of the region.
	mustRelease(t, m, 0)
	mustStage(t, m, pkt(256, 5), 0)
	if m.Free() != 0 {
		t.Fatalf("Free %d after refilling, want 0", m.Free())
	}
	for _, off := range []int{256, 512, 768, 0} {
		mustRelease(t, m, off)
	}
	if m.Used() != 0 || m.Outstanding() != 0 {
		t.Fatalf("Used %d Outstanding %d after releasing everything", m.Used(), m.Outstanding())
	}
	// The whole region is one contiguous run again.
	mustStage(t, m, pkt(1024, 6), 0)
}

func TestOversize(t *testing.T) {
	m, _ := newMem(t, 1024, Config{})
	mustNotStage(t, m, pkt(1025, 1))
	mustNotStage(t, m, pkt(9000, 1))
	if s := m.Stats(); s.OOBPackets != 2 || s.StagedPackets != 0 || s.InUse != 0 {
		t.Fatalf("Stats %+v, want 2 oob and nothing staged", s)
	}
	mustStage(t, m, pkt(1024, 1), 0)
}

func TestWrapChargesSkippedTail(t *testing.T) {
	m, r := newMem(t, 1024, Config{})
	a, b, c := pkt(400, 1), pkt(400, 2), pkt(400, 3)
	mustStage(t, m, a, 0)
	mustStage(t, m, b, 400)
	mustRelease(t, m, 0)
	// 224 bytes remain at the end, too few; the start has 400 free, so c goes
	// to 0 and the 224 skipped bytes are charged to it.
	mustStage(t, m, c, 0)
	if m.Used() != 400+224+400 {
		t.Fatalf("Used %d after wrapping, want %d (skip charged)", m.Used(), 400+224+400)
	}
	checkData(t, r, 400, b)
	checkData(t, r, 0, c)
	mustNotStage(t, m, pkt(8, 4))

	// Releasing b returns only b's bytes; the skip stays charged to c.
	mustRelease(t, m, 400)
	if m.Used() != 224+400 {
		t.Fatalf("Used %d after releasing b, want %d", m.Used(), 224+400)
	}
	// Free run is [400, 800): a packet of 400 fits there, 408 does not.
	mustNotStage(t, m, pkt(408, 5))
	mustStage(t, m, pkt(400, 5), 400)
	mustRelease(t, m, 0)
	if m.Used() != 400 {
		t.Fatalf("Used %d after releasing c, want 400 (skip returned with c)", m.Used())
	}
	mustRelease(t, m, 400)
	if m.Used() != 0 {
		t.Fatalf("Used %d after releasing everything", m.Used())
	}
}

func TestWrapDoesNotFitEitherSide(t *testing.T) {
	m, _ := newMem(t, 1024, Config{})
	mustStage(t, m, pkt(400, 1), 0)
	mustStage(t, m, pkt(400, 2), 400)
	mustRelease(t, m, 0)
	// 224 free at the end and 400 at the start: 624 free in total, but a
	// 500-byte packet fits neither run.
	if m.Free() != 624 {
		t.Fatalf("Free %d, want 624", m.Free())
	}
	mustNotStage(t, m, pkt(500, 3))
	if m.Used() != 400 || m.Stats().OOBPackets != 1 {
		t.Fatalf("a refused packet changed state: used %d, stats %+v", m.Used(), m.Stats())
	}
	// One that fits the end run goes there without wrapping.
	mustStage(t, m, pkt(224, 4), 800)
	mustStage(t, m, pkt(400, 5), 0)
	if m.Free() != 0 {
		t.Fatalf("Free %d, want 0", m.Free())
	}
}

func TestReleaseOrder(t *testing.T) {
	m, _ := newMem(t, 4096, Config{})
	if err := m.Release(0); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("Release with nothing staged: %v, want ErrReleaseOrder", err)
	}
	mustStage(t, m, pkt(300, 1), 0)
	mustStage(t, m, pkt(300, 2), 304)
	mustStage(t, m, pkt(300, 3), 608)
	for _, off := range []int{1, 912} {
		if err := m.Release(off); !errors.Is(err, ErrReleaseOrder) {
			t.Fatalf("Release(%d) of no staged packet: %v, want ErrReleaseOrder", off, err)
		}
	}
	// Completed before the oldest: marked, its space stays taken.
	mustRelease(t, m, 608)
	if err := m.Release(608); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("double Release(608): %v, want ErrReleaseOrder", err)
	}
	if err := m.Cancel(608); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("Cancel of a completed packet: %v, want ErrReleaseOrder", err)
	}
	if m.Used() != 912 || m.Outstanding() != 3 {
		t.Fatalf("an early completion freed space: used %d outstanding %d", m.Used(), m.Outstanding())
	}
	mustRelease(t, m, 0)
	if m.Used() != 608 || m.Outstanding() != 2 {
		t.Fatalf("after the oldest: used %d outstanding %d, want 608 and 2", m.Used(), m.Outstanding())
	}
	if err := m.Release(0); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("double Release(0): %v, want ErrReleaseOrder", err)
	}
	// The middle one completes: it and the one done before it both return.
	mustRelease(t, m, 304)
	if m.Used() != 0 || m.Outstanding() != 0 {
		t.Fatalf("after all completed: used %d outstanding %d", m.Used(), m.Outstanding())
	}
	if err := m.Release(608); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("Release after everything completed: %v, want ErrReleaseOrder", err)
	}
	mustStage(t, m, pkt(4096, 4), 0)
}

func TestThresholdForcedCompletion(t *testing.T) {
	const size = 32 << 10
	m, _ := newMem(t, size, DefaultConfig())
	if m.NeedCompletion() {
		t.Fatal("empty region asks for a completion")
	}
	var offs []int
	firstNeed := 0 // packet count at which the signal first appeared
	for {
		off, ok := m.Stage(pkt(1400, byte(len(offs))))
		if !ok {
			break
		}
		offs = append(offs, off)
		want := m.Free() < DefaultCompletionThreshold
		if m.NeedCompletion() != want {
			t.Fatalf("after %d packets, free %d: NeedCompletion %v, want %v", len(offs), m.Free(), m.NeedCompletion(), want)
		}
		if want && firstNeed == 0 {
			firstNeed = len(offs)
		}
		if !want && firstNeed != 0 {
			t.Fatalf("NeedCompletion dropped while only staging (free %d)", m.Free())
		}
	}
	// 1,400 is already 8-byte aligned: 17 packets leave 8,968 bytes free
	// (no signal), 18 leave 7,568 (signal).
	if firstNeed != 18 {
		t.Fatalf("completion first requested after %d packets, want 18", firstNeed)
	}
	// Completing the oldest packets gives the space back; the signal clears
	// as soon as free space is at or above the threshold again.
	for len(offs) > 0 && m.NeedCompletion() {
		mustRelease(t, m, offs[0])
		offs = offs[1:]
	}
	if m.Free() < DefaultCompletionThreshold {
		t.Fatalf("NeedCompletion false with free %d below threshold", m.Free())
	}
	if m.Free()-1400 >= DefaultCompletionThreshold {
		t.Fatalf("released more than needed: free %d", m.Free())
	}
}

func TestCompletionThresholdAboveCapacity(t *testing.T) {
	// A region smaller than the threshold asks for a completion whenever
	// anything is outstanding, and never when nothing is.
	m, _ := newMem(t, 4096, DefaultConfig())
	mustStage(t, m, pkt(300, 1), 0)
	if !m.NeedCompletion() {
		t.Fatal("NeedCompletion false with 3,792 free of a 4,096-byte region and an 8 KiB threshold")
	}
	mustRelease(t, m, 0)
	if m.NeedCompletion() {
		t.Fatal("NeedCompletion true with nothing outstanding")
	}
	// Threshold 0 never forces.
	m0, _ := newMem(t, 1024, Config{})
	mustStage(t, m0, pkt(1024, 1), 0)
	if m0.NeedCompletion() {
		t.Fatal("NeedCompletion with threshold 0")
	}
}

type failingRegion struct {
	size int
	fail bool
}

var errDevice = errors.New("device copy failed")

func (r *failingRegion) Size() int { return r.size }
func (r *failingRegion) CopyTo(off int, b []byte) error {
	if r.fail {
		return errDevice
	}
	return nil
}

func TestCopyErrorFallsBackToHostMemory(t *testing.T) {
	r := &failingRegion{size: 1024, fail: true}
	m, err := New(r, Config{})
	if err != nil {
		t.Fatal(err)
	}
	mustNotStage(t, m, pkt(300, 1))
	if m.Used() != 0 || m.Outstanding() != 0 {
		t.Fatalf("failed copy left state: used %d outstanding %d", m.Used(), m.Outstanding())
	}
	s := m.Stats()
	if s.CopyErrors != 1 || s.StagedPackets != 0 || s.OOBPackets != 0 {
		t.Fatalf("Stats %+v, want one copy error only", s)
	}
	if !errors.Is(m.LastCopyError(), errDevice) {
		t.Fatalf("LastCopyError %v, want it to wrap the device error", m.LastCopyError())
	}
	r.fail = false
	mustStage(t, m, pkt(300, 1), 0)
}

func TestReleaseAll(t *testing.T) {
	m, _ := newMem(t, 1024, Config{})
	mustStage(t, m, pkt(400, 1), 0)
	mustStage(t, m, pkt(400, 2), 400)
	mustRelease(t, m, 0)
	mustStage(t, m, pkt(400, 3), 0)
	m.ReleaseAll()
	if m.Used() != 0 || m.Outstanding() != 0 || m.Stats().InUse != 0 {
		t.Fatalf("after ReleaseAll: used %d outstanding %d", m.Used(), m.Outstanding())
	}
	mustStage(t, m, pkt(1024, 4), 0)
	if s := m.Stats(); s.StagedPackets != 4 {
		t.Fatalf("ReleaseAll reset counters: %+v", s)
	}
}

func TestMemRegionBounds(t *testing.T) {
	r := NewMemRegion(make([]byte, 64))
	for _, tc := range []struct{ off, n int }{{-1, 1}, {65, 0}, {60, 5}, {0, 65}} {
		if err := r.CopyTo(tc.off, make([]byte, tc.n)); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("CopyTo(%d, %d bytes): %v, want ErrOutOfRange", tc.off, tc.n, err)
		}
		if _, err := r.Slice(tc.off, tc.n); !errors.Is(err, ErrOutOfRange) {
			t.Errorf("Slice(%d, %d): %v, want ErrOutOfRange", tc.off, tc.n, err)
		}
	}
	if _, err := r.Slice(0, -1); !errors.Is(err, ErrOutOfRange) {
		t.Errorf("Slice with negative length: %v", err)
	}
	if err := r.CopyTo(60, []byte{1, 2, 3, 4}); err != nil {
		t.Fatal(err)
	}
	s, err := r.Slice(60, 4)
	if err != nil || !bytes.Equal(s, []byte{1, 2, 3, 4}) {
		t.Fatalf("Slice(60, 4) = %v, %v", s, err)
	}
}

// TestStatsFromOtherGoroutine reads the counters while the owner stages and
// releases; run with -race it proves Stats needs no lock.
func TestStatsFromOtherGoroutine(t *testing.T) {
	m, _ := newMem(t, 16<<10, DefaultConfig())
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		var last uint64
		for {
			select {
			case <-done:
				return
			default:
			}
			s := m.Stats()
			if s.StagedPackets < last {
				t.Errorf("staged counter went backwards: %d after %d", s.StagedPackets, last)
				return
			}
			last = s.StagedPackets
		}
	}()
	p := pkt(1000, 1)
	var offs []int
	for range 5000 {
		if off, ok := m.Stage(p); ok {
			offs = append(offs, off)
		}
		if m.NeedCompletion() {
			for _, off := range offs {
				if err := m.Release(off); err != nil {
					t.Error(err)
					break
				}
			}
			offs = offs[:0]
		}
	}
	close(done)
	wg.Wait()
	if s := m.Stats(); s.StagedPackets+s.OOBPackets != 5000 {
		t.Fatalf("Stats %+v: staged+oob != 5000", s)
	}
}

func BenchmarkStageRelease(b *testing.B) {
	for _, tc := range []struct {
		size    int
		reserve bool // Reserve: the caller builds in place, no copy
	}{{205, false}, {1400, false}, {1400, true}} {
		name := fmt.Sprintf("%dB", tc.size)
		if tc.reserve {
			name = "reserve-" + name
		}
		size := tc.size
		b.Run(name, func(b *testing.B) {
			m, _ := newChunked(b, 256<<10, 2048, DefaultConfig())
			p := pkt(size, 1)
			offs := make([]int, 0, 1024)
			b.SetBytes(int64(size))
			b.ReportAllocs()
			for b.Loop() {
				var off int
				var ok bool
				if tc.reserve {
					off, ok = m.Reserve(size)
				} else {
					off, ok = m.Stage(p)
				}
				if ok {
					offs = append(offs, off)
				}
				// Complete in batches the way a provider does when asked.
				if m.NeedCompletion() || !ok {
					for _, o := range offs {
						if err := m.Release(o); err != nil {
							b.Fatal(err)
						}
					}
					offs = offs[:0]
				}
			}
		})
	}
}

// TestChunkBoundary: in a chunked region a packet never straddles a chunk;
// the bytes skipped to the next chunk are charged to it and come back with
// it, and a packet larger than a chunk is oob.
func TestChunkBoundary(t *testing.T) {
	m, r := newChunked(t, 4096, 2048, Config{})
	a := pkt(1400, 1)
	mustStage(t, m, a, 0)
	// 1400 is charged as 1400 (already aligned); 1000 more would cross 2048.
	b := pkt(1000, 2)
	mustStage(t, m, b, 2048)
	if m.Used() != 2048+1000 {
		t.Fatalf("Used %d, want %d (648 skipped bytes charged to the second packet)", m.Used(), 2048+1000)
	}
	checkData(t, r, 0, a)
	checkData(t, r, 2048, b)
	// 1048 bytes remain in the second chunk: 1000 fits there, no skip.
	mustStage(t, m, pkt(1000, 3), 3048)
	mustNotStage(t, m, pkt(2049, 4))
	if s := m.Stats(); s.OOBPackets != 1 {
		t.Fatalf("a packet larger than a chunk: Stats %+v, want 1 oob", s)
	}
	mustRelease(t, m, 0)
	mustRelease(t, m, 2048)
	if m.Used() != 1000 {
		t.Fatalf("Used %d after releasing the first two, want 1000 (the skip went with its packet)", m.Used())
	}
	// Wrapped: the head is 4048; 1400 goes to 0 charging 48 tail bytes.
	mustStage(t, m, pkt(1400, 5), 0)
	if m.Used() != 1000+48+1400 {
		t.Fatalf("Used %d, want %d", m.Used(), 1000+48+1400)
	}
	// Head at 1400; 700 bytes would cross 2048, so they start there,
	// skipping 648 bytes, and fit before the oldest live packet at 3048.
	mustStage(t, m, pkt(700, 6), 2048)
	if m.Used() != 1000+48+1400+648+704 {
		t.Fatalf("Used %d, want %d", m.Used(), 1000+48+1400+648+704)
	}
	mustNotStage(t, m, pkt(600, 7))

	if _, err := New(chunkedMem{NewMemRegion(make([]byte, 64)), 48}, Config{}); err == nil {
		t.Error("chunk size 48 accepted")
	}
}

// TestCancel: an unposted packet is given back newest first, the head moves
// back with its skipped bytes, and anything but the newest is refused.
func TestCancel(t *testing.T) {
	m, _ := newChunked(t, 4096, 2048, Config{})
	mustStage(t, m, pkt(1400, 1), 0)
	mustStage(t, m, pkt(1000, 2), 2048)
	if err := m.Cancel(0); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("Cancel of the oldest: %v, want ErrReleaseOrder", err)
	}
	if err := m.Cancel(2048); err != nil {
		t.Fatal(err)
	}
	if m.Used() != 1400 || m.Outstanding() != 1 {
		t.Fatalf("Used %d Outstanding %d after Cancel, want 1400 and 1", m.Used(), m.Outstanding())
	}
	mustStage(t, m, pkt(600, 3), 1400)
	if err := m.Cancel(1400); err != nil {
		t.Fatal(err)
	}
	if err := m.Cancel(0); err != nil {
		t.Fatal(err)
	}
	if m.Used() != 0 || m.Outstanding() != 0 {
		t.Fatalf("Used %d Outstanding %d after cancelling everything", m.Used(), m.Outstanding())
	}
	if err := m.Cancel(0); !errors.Is(err, ErrReleaseOrder) {
		t.Fatalf("Cancel with nothing staged: %v, want ErrReleaseOrder", err)
	}
	mustStage(t, m, pkt(2048, 4), 0)
	if s := m.Stats(); s.StagedPackets != 4 {
		t.Fatalf("Stats %+v: cancelled packets still count as staged", s)
	}
}

// TestReserve: Reserve decides and counts like Stage but copies nothing;
// the caller writes at the offset.
func TestReserve(t *testing.T) {
	m, r := newChunked(t, 4096, 2048, DefaultConfig())
	if _, ok := m.Reserve(DefaultInlineThreshold); ok {
		t.Fatal("Reserve staged an inline-sized packet")
	}
	off, ok := m.Reserve(1400)
	if !ok || off != 0 {
		t.Fatalf("Reserve(1400) = %d, %v", off, ok)
	}
	b, _ := r.Slice(0, 1400)
	if !bytes.Equal(b, make([]byte, 1400)) {
		t.Fatal("Reserve wrote into the region")
	}
	if off, ok := m.Reserve(1000); !ok || off != 2048 {
		t.Fatalf("Reserve(1000) = %d, %v, want 2048 (next chunk)", off, ok)
	}
	if _, ok := m.Reserve(2049); ok {
		t.Fatal("Reserve staged a packet larger than a chunk")
	}
	want := Stats{Capacity: 4096, InUse: 2048 + 1000, StagedPackets: 2, StagedBytes: 2400, InlinePackets: 1, OOBPackets: 1}
	if s := m.Stats(); s != want {
		t.Fatalf("Stats %+v, want %+v", s, want)
	}
	mustRelease(t, m, 0)
	mustRelease(t, m, 2048)
}
