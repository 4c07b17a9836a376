package ring

import (
	"encoding/binary"
	"sync"
	"testing"
)

func TestInboxFIFOAndFull(t *testing.T) {
	ib := newInbox(4, 64)
	if ib.pending() {
		t.Fatal("new inbox has a frame")
	}
	for i := range 4 {
		if !ib.push([]byte{byte(i), 1, 2}, uint64(i)) {
			t.Fatalf("push %d refused", i)
		}
	}
	if ib.push([]byte{9}, 0) {
		t.Fatal("push into a full inbox accepted")
	}
	if ib.push(make([]byte, 65), 0) {
		t.Fatal("frame larger than a slot accepted")
	}
	for i := range 4 {
		f, ts, ok := ib.peek()
		if !ok || len(f) != 3 || f[0] != byte(i) || ts != uint64(i) {
			t.Fatalf("frame %d: %v %d %v", i, f, ts, ok)
		}
		ib.pop()
	}
	if _, _, ok := ib.peek(); ok || ib.pending() {
		t.Fatal("drained inbox still has a frame")
	}
	// Wrapped around: the slots are reusable.
	if !ib.push([]byte{7}, 0) || !ib.pending() {
		t.Fatal("push after wrap-around refused")
	}
}

// TestInboxProducers: several producers at once (the receiving rings), one
// consumer (the home engine): every frame arrives once, each producer's in
// its order, and a full inbox only refuses, never corrupts.
func TestInboxProducers(t *testing.T) {
	const producers, each = 4, 5000
	ib := newInbox(64, 16)
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var b [8]byte
			for i := 0; i < each; {
				binary.LittleEndian.PutUint32(b[:], uint32(p))
				binary.LittleEndian.PutUint32(b[4:], uint32(i))
				if ib.push(b[:], 0) {
					i++
				}
			}
		}()
	}
	next := make([]uint32, producers)
	for got := 0; got < producers*each; {
		f, _, ok := ib.peek()
		if !ok {
			continue
		}
		p, i := binary.LittleEndian.Uint32(f), binary.LittleEndian.Uint32(f[4:])
		if int(p) >= producers || i != next[p] {
			t.Fatalf("producer %d: frame %d, want %d", p, i, next[p])
		}
		next[p]++
		ib.pop()
		got++
	}
	wg.Wait()
}

// BenchmarkInbox is the handoff's own cost per frame: a push by the
// receiving engine and a peek and pop by the home engine, 64-byte frames
// (the copy into the home ring's endpoint queue is the same as without a
// handoff).
func BenchmarkInbox(b *testing.B) {
	ib := newInbox(handoffSlots, 2048)
	frame := make([]byte, 64+42)
	for range b.N {
		ib.push(frame, 0)
		if _, _, ok := ib.peek(); ok {
			ib.pop()
		}
	}
}
