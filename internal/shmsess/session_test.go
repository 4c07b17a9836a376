package shmsess

import (
	"encoding/binary"
	"errors"
	"sync"
	"testing"

	"golang.org/x/sys/unix"
)

// TestLayoutExample checks the worked example of docs/shm-queue.md.
func TestLayoutExample(t *testing.T) {
	l, err := NewLayout(16384, 2, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	want := Layout{MaxSlots: 16384, Lanes: 2, Words: 256, Mids: 4, BitmapSize: 2176, EventsOffset: 4096,
		LanesOffset: 8192, LaneStride: 2240, ArenaOffset: 16384, ArenaSize: 1 << 30, Size: 1073758208}
	if l != want {
		t.Fatalf("layout %+v, want %+v", l, want)
	}
	// Slot 5000 on lane 1: leaf word 78 bit 8 at byte 11248.
	mem := mapAnon(t, int(l.Size))
	s, err := Init(mem, l)
	if err != nil {
		t.Fatal(err)
	}
	s.Announce(1, 5000)
	if got := binary.LittleEndian.Uint64(mem[11248:]); got != 1<<8 {
		t.Fatalf("leaf word at 11248 = %#x, want bit 8", got)
	}
	laneBM := int(l.LanesOffset + l.LaneStride + LaneHeaderSize)
	if got := binary.LittleEndian.Uint64(mem[laneBM+64+8:]); got != 1<<14 {
		t.Fatalf("mid word 1 = %#x, want bit 14", got)
	}
	if got := binary.LittleEndian.Uint64(mem[laneBM:]); got != 1<<1 {
		t.Fatalf("summary = %#x, want bit 1", got)
	}
	// The one-lane session of protocol.md's HELLO reply example.
	l1, _ := NewLayout(16384, 1, 1<<30)
	if l1.Size != 1073754112 || l1.ArenaOffset != 0x3000 {
		t.Fatalf("one-lane layout: size %d arena at %#x", l1.Size, l1.ArenaOffset)
	}
	if QueueSpan(4096) != 0x2000 || SocketSpan(4096) != 0x4000 {
		t.Fatalf("spans %d %d", QueueSpan(4096), SocketSpan(4096))
	}
}

func TestHeaderBytes(t *testing.T) {
	l, _ := NewLayout(100, 1, 8192)
	mem := mapAnon(t, int(l.Size))
	if _, err := Init(mem, l); err != nil {
		t.Fatal(err)
	}
	le := binary.LittleEndian
	checks := []struct {
		off  int
		want uint64
		n    int
	}{{0, 0x53445042, 4}, {4, 2, 4}, {8, uint64(l.Size), 8}, {16, 4096, 4}, {20, 100, 4}, {24, 1, 4},
		{32, 4096, 8}, {40, 8192, 8}, {48, uint64(l.LaneStride), 8}, {56, uint64(l.ArenaOffset), 8}, {64, 8192, 8}}
	for _, c := range checks {
		var got uint64
		if c.n == 4 {
			got = uint64(le.Uint32(mem[c.off:]))
		} else {
			got = le.Uint64(mem[c.off:])
		}
		if got != c.want {
			t.Errorf("header offset %d = %d, want %d", c.off, got, c.want)
		}
	}
	if string(mem[0:4]) != "BPDS" {
		t.Errorf("magic bytes %q", mem[0:4])
	}
	if _, err := Attach(mem, 100, 1); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		name  string
		slots int
		lanes int
		mut   func([]byte)
	}{
		{"slots differ", 101, 1, nil},
		{"lanes differ", 100, 2, nil},
		{"magic", 100, 1, func(m []byte) { m[0] ^= 1 }},
		{"version", 100, 1, func(m []byte) { m[4] = 1 }},
		{"lanes offset", 100, 1, func(m []byte) { m[40] += 8 }},
		{"arena size", 100, 1, func(m []byte) { m[65] += 0x10 }},
	} {
		c := append([]byte(nil), mem...)
		cm := mapAnon(t, len(c))
		copy(cm, c)
		if bad.mut != nil {
			bad.mut(cm)
		}
		if _, err := Attach(cm, bad.slots, bad.lanes); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Attach = %v, want ErrCorrupt", bad.name, err)
		}
	}
}

func TestBitmapDrain(t *testing.T) {
	l, _ := NewLayout(MaxSlots, 1, PageSize)
	s, err := Init(mapAnon(t, int(l.Size)), l)
	if err != nil {
		t.Fatal(err)
	}
	bm := s.Events()
	slots := []int{0, 1, 63, 64, 4095, 4096, 200000, MaxSlots - 1}
	for _, x := range slots {
		bm.Set(x)
		bm.Set(x) // idempotent
	}
	bm.Set(-1)
	bm.Set(MaxSlots)
	var got []int
	if n := bm.Drain(func(x int) { got = append(got, x) }); n != len(slots) {
		t.Fatalf("drained %d: %v", n, got)
	}
	for i := range slots {
		if got[i] != slots[i] {
			t.Fatalf("drained %v, want %v", got, slots)
		}
	}
	if bm.Pending() || bm.Drain(func(int) { t.Fatal("visit after drain") }) != 0 {
		t.Fatal("bitmap not empty after drain")
	}
}

// TestBitmapConcurrent: setters and a drainer race; every set is drained
// at least once after its Set returned.
func TestBitmapConcurrent(t *testing.T) {
	l, _ := NewLayout(20000, 1, PageSize)
	s, err := Init(mapAnon(t, int(l.Size)), l)
	if err != nil {
		t.Fatal(err)
	}
	bm := &s.Lane(0).Bitmap
	const setters, per = 4, 20000
	seen := make([]int, l.MaxSlots)
	var wg sync.WaitGroup
	for g := range setters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				bm.Set((g*7919 + i*31) % l.MaxSlots)
			}
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
		}
		bm.Drain(func(x int) { seen[x]++ })
	}
	bm.Drain(func(x int) { seen[x]++ })
	for g := range setters {
		for i := range per {
			if x := (g*7919 + i*31) % l.MaxSlots; seen[x] == 0 {
				t.Fatalf("slot %d set but never drained", x)
			}
		}
	}
}

func TestSleepFlags(t *testing.T) {
	l, _ := NewLayout(64, 2, PageSize)
	s, _ := Init(mapAnon(t, int(l.Size)), l)
	ln := s.Lane(1)
	if s.Announce(1, 3) {
		t.Fatal("announce rang a doorbell of an engine that is awake")
	}
	if !ln.ArmSleep() {
		t.Fatal("ArmSleep missed a pending announcement")
	}
	ln.Drain(func(int) {})
	if ln.ArmSleep() {
		t.Fatal("ArmSleep saw work after the drain")
	}
	if !s.Announce(1, 4) {
		t.Fatal("announce to a sleeping engine did not ask for the doorbell")
	}
	if s.Announce(1, 5) {
		t.Fatal("second announce rang again")
	}
	if s.Announce(0, 5) || s.Announce(9, 5) {
		t.Fatal("announce on another or a bad lane rang")
	}
	if s.Event(7) {
		t.Fatal("event woke a client that is awake")
	}
	if !s.ArmClientSleep() {
		t.Fatal("ArmClientSleep missed a pending event")
	}
	s.Events().Drain(func(int) {})
	if s.ArmClientSleep() {
		t.Fatal("events pending after drain")
	}
	if !s.Event(8) || s.Event(9) {
		t.Fatal("event to a sleeping client: wake once")
	}
	s.DisarmClientSleep()
	ln.DisarmSleep()
}

func TestArena(t *testing.T) {
	l, _ := NewLayout(3, 1, 4*PageSize)
	a := NewArena(l)
	s0, o0, ok0 := a.Alloc(2 * PageSize)
	s1, o1, ok1 := a.Alloc(2 * PageSize)
	if !ok0 || !ok1 || s0 == s1 || o0 != l.ArenaOffset || o1 != l.ArenaOffset+2*PageSize {
		t.Fatalf("allocs %d@%d %v, %d@%d %v", s0, o0, ok0, s1, o1, ok1)
	}
	if _, _, ok := a.Alloc(PageSize); ok {
		t.Fatal("alloc beyond the arena succeeded")
	}
	a.Free(s0, o0, 2*PageSize)
	if a.Used() != 2*PageSize {
		t.Fatalf("used %d", a.Used())
	}
	s2, o2, ok := a.Alloc(2 * PageSize)
	if !ok || s2 != s0 || o2 != o0 {
		t.Fatalf("freed range not reused: %d@%d %v", s2, o2, ok)
	}
	if _, _, ok := a.Alloc(3 * PageSize); ok {
		t.Fatal("span that fits nowhere succeeded")
	}
}

func TestRestoreArena(t *testing.T) {
	l, _ := NewLayout(8, 1, 16*PageSize)
	// Slots 1 and 4 live, with a two-page hole before the second range.
	live := []Range{{Slot: 4, Off: l.ArenaOffset + 4*PageSize, Span: 2 * PageSize}, {Slot: 1, Off: l.ArenaOffset, Span: 2 * PageSize}}
	a, err := RestoreArena(l, live)
	if err != nil {
		t.Fatal(err)
	}
	if a.Used() != 4*PageSize {
		t.Fatalf("used %d", a.Used())
	}
	s, off, ok := a.Alloc(2 * PageSize)
	if !ok || s == 1 || s == 4 || off != l.ArenaOffset+2*PageSize {
		t.Fatalf("first alloc %d@%d %v: want a free slot in the hole", s, off, ok)
	}
	s, off, ok = a.Alloc(2 * PageSize)
	if !ok || s == 1 || s == 4 || off != l.ArenaOffset+6*PageSize {
		t.Fatalf("second alloc %d@%d %v: want the bump pointer past the last live range", s, off, ok)
	}
	for _, bad := range [][]Range{
		{{Slot: 1, Off: l.ArenaOffset, Span: 2 * PageSize}, {Slot: 1, Off: l.ArenaOffset + 2*PageSize, Span: 2 * PageSize}},
		{{Slot: 1, Off: l.ArenaOffset, Span: 2 * PageSize}, {Slot: 2, Off: l.ArenaOffset + PageSize, Span: 2 * PageSize}},
		{{Slot: 9, Off: l.ArenaOffset, Span: 2 * PageSize}},
		{{Slot: 0, Off: l.ArenaOffset + 15*PageSize, Span: 2 * PageSize}},
	} {
		if _, err := RestoreArena(l, bad); err == nil {
			t.Errorf("RestoreArena(%v) accepted", bad)
		}
	}
}

func mapAnon(t *testing.T, n int) []byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
	return m
}
