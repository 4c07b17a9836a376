package devmem

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// model is a deliberately naive reference: an occupancy map with one owner
// per byte of the region (skipped bytes owned by the allocation that skipped
// them) and the placement rule stated in terms of that map: try right after
// the newest allocation, else at 0 charging the bytes up to the end; a place
// is usable only if every byte it needs is unowned.
type model struct {
	capacity, inline int
	chunk            int   // 0: packets may cross any offset
	owner            []int // 0 = free, else allocation id
	live             []modelAlloc
	nextID           int

	staged, stagedBytes, inlined, oob uint64
}

type modelAlloc struct {
	id, off, n int
	data       []byte
	// done: completed while an older allocation was still out.
	done bool
}

func (md *model) free(from, to int) bool {
	if from < 0 || to > md.capacity || from > to {
		return false
	}
	for _, o := range md.owner[from:to] {
		if o != 0 {
			return false
		}
	}
	return true
}

// stage returns the model's decision for p and records it.
func (md *model) stage(p []byte) (off int, staged bool) {
	n := len(p)
	if md.capacity == 0 {
		return 0, false
	}
	if n <= md.inline {
		md.inlined++
		return 0, false
	}
	size := (n + 7) / 8 * 8
	head := 0
	if len(md.live) > 0 {
		last := md.live[len(md.live)-1]
		head = last.off + (last.n+7)/8*8
	}
	if md.chunk > 0 && n > md.chunk {
		md.oob++
		return 0, false
	}
	// In a chunked region a packet may not straddle a chunk boundary: it
	// starts at the next chunk and the bytes in between are skipped.
	at := head
	if md.chunk > 0 && head/md.chunk != (head+size-1)/md.chunk {
		at = (head/md.chunk + 1) * md.chunk
	}
	from, to, skipFrom, skipTo := -1, -1, -1, -1
	switch {
	case md.free(head, at+size):
		from, to, skipFrom, skipTo = at, at+size, head, at
	case len(md.live) > 0 && md.free(head, md.capacity) && md.free(0, size):
		from, to, skipFrom, skipTo = 0, size, head, md.capacity
	default:
		md.oob++
		return 0, false
	}
	md.nextID++
	id := md.nextID
	for i := from; i < to; i++ {
		md.owner[i] = id
	}
	for i := skipFrom; i < skipTo; i++ {
		md.owner[i] = id
	}
	md.live = append(md.live, modelAlloc{id: id, off: from, n: n, data: append([]byte(nil), p...)})
	md.staged++
	md.stagedBytes += uint64(n)
	return from, true
}

// complete marks live[i] completed; allocations leave from the oldest on,
// as long as they are completed, so space returns in allocation order.
func (md *model) complete(i int) modelAlloc {
	md.live[i].done = true
	a := md.live[i]
	for len(md.live) > 0 && md.live[0].done {
		md.disown(md.live[0].id)
		md.live = md.live[1:]
	}
	return a
}

// pending lists the indexes of live allocations not completed yet.
func (md *model) pending() []int {
	var out []int
	for i, a := range md.live {
		if !a.done {
			out = append(out, i)
		}
	}
	return out
}

// cancel drops the newest allocation (a packet never posted).
func (md *model) cancel() modelAlloc {
	a := md.live[len(md.live)-1]
	md.live = md.live[:len(md.live)-1]
	md.disown(a.id)
	return a
}

func (md *model) disown(id int) {
	for i, o := range md.owner {
		if o == id {
			md.owner[i] = 0
		}
	}
}

func (md *model) used() int {
	u := 0
	for _, o := range md.owner {
		if o != 0 {
			u++
		}
	}
	return u
}

// check compares the Manager with the model and verifies every live packet
// is intact in the region (an overlapping placement would have overwritten
// one) and that live allocations do not overlap.
func (md *model) check(t *testing.T, step int, m *Manager, r *MemRegion) {
	t.Helper()
	if m.Used() != md.used() {
		t.Fatalf("step %d: Used %d, model %d", step, m.Used(), md.used())
	}
	if m.Outstanding() != len(md.live) {
		t.Fatalf("step %d: Outstanding %d, model %d", step, m.Outstanding(), len(md.live))
	}
	seen := make([]bool, md.capacity)
	for _, a := range md.live {
		if a.off%Align != 0 {
			t.Fatalf("step %d: offset %d not %d-aligned", step, a.off, Align)
		}
		for i := a.off; i < a.off+a.n; i++ {
			if seen[i] {
				t.Fatalf("step %d: live allocations overlap at byte %d", step, i)
			}
			seen[i] = true
		}
		got, err := r.Slice(a.off, a.n)
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		if !bytes.Equal(got, a.data) {
			t.Fatalf("step %d: packet at %d (%d bytes) was overwritten", step, a.off, a.n)
		}
	}
	s := m.Stats()
	want := Stats{
		Capacity: md.capacity, InUse: md.used(),
		StagedPackets: md.staged, StagedBytes: md.stagedBytes,
		InlinePackets: md.inlined, OOBPackets: md.oob,
	}
	if s != want {
		t.Fatalf("step %d: Stats %+v, model %+v", step, s, want)
	}
}

func TestPropertyAgainstModel(t *testing.T) {
	for seed := range uint64(24) {
		rng := rand.New(rand.NewPCG(seed, 0xdeb1ce))
		size := 64 + rng.IntN(4096)
		inline := rng.IntN(300)
		if seed%4 == 0 {
			inline = 0
		}
		cfg := Config{InlineThreshold: inline, CompletionThreshold: rng.IntN(size)}
		chunk := 0
		if seed%3 == 1 {
			chunk = 64 << rng.IntN(5) // 64..1024: packets often straddle
		}
		m, r := newChunked(t, size, chunk, cfg)
		md := &model{capacity: m.Capacity(), inline: inline, chunk: chunk, owner: make([]int, m.Capacity())}
		maxPkt := m.Capacity() + 16
		if seed%2 == 0 {
			maxPkt = m.Capacity()/3 + 16 // mostly small packets: many live at once
		}
		for step := range 2500 {
			switch op := rng.IntN(10); {
			case op < 6:
				n := rng.IntN(maxPkt + 1)
				p := make([]byte, n)
				for i := range p {
					p[i] = byte(rng.Uint32())
				}
				wantOff, wantOK := md.stage(p)
				off, ok := m.Stage(p)
				if ok != wantOK || off != wantOff {
					t.Fatalf("seed %d step %d: Stage(%d bytes) = (%d, %v), model (%d, %v); used %d of %d",
						seed, step, n, off, ok, wantOff, wantOK, m.Used(), m.Capacity())
				}
			case op < 9:
				if len(md.live) == 0 {
					if err := m.Release(0); err == nil {
						t.Fatalf("seed %d step %d: Release with nothing live succeeded", seed, step)
					}
					continue
				}
				// Mostly the oldest, sometimes a younger one first (send
				// queues sharing the region complete interleaved).
				for k := 1 + rng.IntN(len(md.live)); k > 0 && len(md.live) > 0; k-- {
					p := md.pending()
					i := p[0]
					if rng.IntN(3) == 0 {
						i = p[rng.IntN(len(p))]
					}
					a := md.complete(i)
					if err := m.Release(a.off); err != nil {
						t.Fatalf("seed %d step %d: %v", seed, step, err)
					}
				}
			case rng.IntN(2) == 0:
				// A staged packet that was never posted goes back; one
				// that completed cannot.
				if n := len(md.live); n > 0 && !md.live[n-1].done {
					a := md.cancel()
					if err := m.Cancel(a.off); err != nil {
						t.Fatalf("seed %d step %d: %v", seed, step, err)
					}
				} else if n > 0 {
					if err := m.Cancel(md.live[n-1].off); err == nil {
						t.Fatalf("seed %d step %d: Cancel of a completed packet accepted", seed, step)
					}
				}
			default:
				// Releasing a completed packet again, or an offset never
				// staged, is refused and changes nothing.
				for _, a := range md.live {
					if a.done {
						if err := m.Release(a.off); err == nil {
							t.Fatalf("seed %d step %d: second release of %d accepted", seed, step, a.off)
						}
						break
					}
				}
				if err := m.Release(1); err == nil {
					t.Fatalf("seed %d step %d: release of an offset never staged accepted", seed, step)
				}
			}
			if m.NeedCompletion() != (m.Used() > 0 && m.Free() < m.complete) {
				t.Fatalf("seed %d step %d: NeedCompletion inconsistent", seed, step)
			}
			md.check(t, step, m, r)
		}
		// Everything completes: all space returns, contiguous from 0.
		for len(md.live) > 0 {
			a := md.complete(md.pending()[0])
			if err := m.Release(a.off); err != nil {
				t.Fatalf("seed %d drain: %v", seed, err)
			}
		}
		md.check(t, -1, m, r)
		if m.Used() != 0 || m.Free() != m.Capacity() {
			t.Fatalf("seed %d: after draining used %d free %d of %d", seed, m.Used(), m.Free(), m.Capacity())
		}
		whole := m.Capacity()
		if chunk > 0 {
			whole = min(whole, chunk)
		}
		if whole > inline {
			p := make([]byte, whole)
			if off, ok := m.Stage(p); !ok || off != 0 {
				t.Fatalf("seed %d: full-capacity packet after draining = (%d, %v), want (0, true)", seed, off, ok)
			}
		}
	}
}
