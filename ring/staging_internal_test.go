package ring

import (
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/bypassd/bypassd/ring/devmem"
	"github.com/bypassd/bypassd/ring/qp"
)

// fakeQP is a provider with a TX pool of numbered buffers that records what
// comes back through FreeTX; it completes nothing by itself.
type fakeQP struct {
	freed []uint64
	caps  qp.Caps
}

func (f *fakeQP) Caps() qp.Caps                      { return f.caps }
func (f *fakeQP) RXBurst([]qp.Frame) int             { return 0 }
func (f *fakeQP) ReleaseRX([]qp.Frame)               {}
func (f *fakeQP) AllocTX([]qp.Frame) int             { return 0 }
func (f *fakeQP) TXBurst(fr []qp.Frame) (int, error) { return len(fr), nil }
func (f *fakeQP) Complete() int                      { return 0 }
func (f *fakeQP) TXPending() int                     { return 0 }
func (f *fakeQP) FD() int                            { return -1 }
func (f *fakeQP) Stats() qp.Stats                    { return qp.Stats{} }
func (f *fakeQP) Close() error                       { return nil }
func (f *fakeQP) Wait(time.Duration, int) (bool, error) {
	return false, nil
}
func (f *fakeQP) FreeTX(fr []qp.Frame) {
	for _, x := range fr {
		f.freed = append(f.freed, x.Handle)
	}
}

// fakeDM is fakeQP with device memory: a plain-memory region whose frames
// have handles from 1<<32 up.
type fakeDM struct {
	fakeQP
	mapped   bool
	region   *fakeRegion
	released func(int)
}

type fakeRegion struct {
	*devmem.MemRegion
	mapped bool
}

func (r fakeRegion) Mapped() bool { return r.mapped }

const fakeBase = 1 << 32

func (r fakeRegion) TXFrame(off, n int) qp.Frame {
	b, _ := r.Slice(off, n)
	return qp.Frame{Buf: b, Handle: fakeBase + uint64(off)}
}

func (r fakeRegion) Offset(f qp.Frame) (int, bool) {
	if f.Handle < fakeBase {
		return 0, false
	}
	return int(f.Handle - fakeBase), true
}

func (f *fakeDM) AllocDeviceMemory(size int, released func(int)) (qp.DeviceRegion, error) {
	f.region = &fakeRegion{devmem.NewMemRegion(make([]byte, size)), f.mapped}
	f.released = released
	return f.region, nil
}

func stagingEngine(t *testing.T, prov qp.Provider, devMem int) *engine {
	t.Helper()
	r := &Ring{cfg: Config{DevMemTX: devMem}, prov: prov, log: zap.NewNop()}
	e := &r.eng
	e.r = r
	if err := e.initStaging(); err != nil {
		t.Fatal(err)
	}
	return e
}

// frames returns TX frames of the given lengths with handles 0, 1, ...
func frames(lens ...int) []qp.Frame {
	out := make([]qp.Frame, len(lens))
	for i, n := range lens {
		out[i] = qp.Frame{Buf: make([]byte, n), Handle: uint64(i)}
	}
	return out
}

// TestStagingWithoutDeviceMemory: a provider that does not implement
// qp.DeviceMemory (tap) gets a zero-capacity allocator, whatever DevMemTX
// says: nothing is staged, nothing counted, no buffer changes hands.
func TestStagingWithoutDeviceMemory(t *testing.T) {
	p := &fakeQP{}
	e := stagingEngine(t, p, 64<<10)
	fr := frames(1000, 100)
	e.stage(fr)
	if fr[0].Handle != 0 || fr[1].Handle != 1 || len(p.freed) != 0 {
		t.Fatalf("frames changed: %+v, freed %v", fr, p.freed)
	}
	if s := e.r.DevMemStats(); s != (DevMemStats{}) {
		t.Fatalf("stats %+v, want zero capacity and no counts", s)
	}
}

// TestStagingSwapAndDrop: frames over the inline threshold move into the
// region and their TX buffers go back; frames that are never posted go
// back too, staged ones to the allocator (newest first), the rest to the
// provider; a completion out of order is counted.
func TestStagingSwapAndDrop(t *testing.T) {
	p := &fakeDM{fakeQP: fakeQP{caps: qp.Caps{DeviceMemory: 1 << 20}}}
	e := stagingEngine(t, p, 8192)
	fr := frames(1000, 100, 1500)
	fr[2].SendQueue = 3
	e.stage(fr)
	if fr[2].SendQueue != 3 {
		t.Fatal("staging lost the frame's send queue (pacing)")
	}
	if fr[1].Handle != 1 || fr[0].Handle != fakeBase || fr[2].Handle != fakeBase+1000 {
		t.Fatalf("handles after staging: %d %d %d", fr[0].Handle, fr[1].Handle, fr[2].Handle)
	}
	if len(p.freed) != 2 || p.freed[0] != 0 || p.freed[1] != 2 {
		t.Fatalf("TX buffers given back %v, want [0 2]", p.freed)
	}
	s := e.r.DevMemStats()
	if s.Capacity != 8192 || s.StagedPackets != 2 || s.InlinePackets != 1 || s.InUse != 1000+1504 {
		t.Fatalf("stats %+v", s)
	}
	// Dropped before posting (link down).
	p.freed = nil
	e.dropFrames(fr)
	if len(p.freed) != 1 || p.freed[0] != 1 {
		t.Fatalf("dropped frames given to FreeTX: %v, want only the inline one", p.freed)
	}
	if s := e.r.DevMemStats(); s.InUse != 0 || s.ReleaseErrors != 0 {
		t.Fatalf("after the drop %+v", s)
	}
	// Posted and completed: released through the provider's callback, in
	// order; a completion out of order is counted, not fatal.
	fr = frames(1000, 1000)
	e.stage(fr)
	p.released(1000)
	p.released(0)
	p.released(1000)
	if s := e.r.DevMemStats(); s.InUse != 0 || s.ReleaseErrors != 1 {
		t.Fatalf("after completions %+v, want empty with one release error", s)
	}
}

// TestStagingInPlace: with a mapped region a single-frame datagram over the
// threshold gets its buffer in the region (built there, no TX buffer, no
// copy); inline ones and fragments take TX buffers, and fragments are
// copied in after they are built.
func TestStagingInPlace(t *testing.T) {
	p := &fakeDM{fakeQP: fakeQP{caps: qp.Caps{DeviceMemory: 1 << 20}}, mapped: true}
	e := stagingEngine(t, p, 8192)
	dst := make([]qp.Frame, 2)
	if n := e.allocTX(dst[:1], 1000); n != 1 || dst[0].Handle != fakeBase || len(dst[0].Buf) != 1000 {
		t.Fatalf("allocTX of a 1000-byte frame: %d, handle %#x, %d bytes", n, dst[0].Handle, len(dst[0].Buf))
	}
	if n := e.allocTX(dst[:1], 100); n != 0 {
		t.Fatalf("an inline frame did not go to the provider's AllocTX (got %d)", n)
	}
	e.stage(dst[:1]) // decided by allocTX: not counted again
	fr := frames(1500, 600)
	e.allocTX(dst[:2], 0) // fragments: the provider's buffers
	e.stage(fr)
	if fr[0].Handle != fakeBase+1000 || fr[1].Handle != fakeBase+2504 {
		t.Fatalf("fragments not copied in: handles %#x %#x", fr[0].Handle, fr[1].Handle)
	}
	if s := e.r.DevMemStats(); s.StagedPackets != 3 || s.InlinePackets != 1 || s.OOBPackets != 0 {
		t.Fatalf("stats %+v, want 3 staged, 1 inline", s)
	}
	// A frame that failed to build is given back, the in-place one too.
	e.dropFrames(fr)
	e.dropFrames(dst[:1])
	if s := e.r.DevMemStats(); s.InUse != 0 || s.ReleaseErrors != 0 {
		t.Fatalf("after dropping everything %+v", s)
	}
}
