package shmq

import (
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"
)

// TestConsumerRejectsGarbage writes each kind of invalid producer state
// and checks the consumer reports ErrCorrupt, stickily, without panicking.
func TestConsumerRejectsGarbage(t *testing.T) {
	le := binary.LittleEndian
	setProd := func(q *Queue, v uint64) { atomic.StoreUint64(q.prodIdx, v) }
	rec := func(q *Queue, off int, n, typ uint32) {
		le.PutUint32(q.data[off:], n)
		le.PutUint32(q.data[off+4:], typ)
	}
	for name, corrupt := range map[string]func(q *Queue){
		"prod unaligned":    func(q *Queue) { setProd(q, 12) },
		"prod beyond cap":   func(q *Queue) { setProd(q, 4096+8) },
		"prod behind cons":  func(q *Queue) { setProd(q, ^uint64(7)) },
		"length over max":   func(q *Queue) { rec(q, 0, 2041, 1); setProd(q, 4096) },
		"length huge":       func(q *Queue) { rec(q, 0, 0xFFFFFFF0, 1); setProd(q, 4096) },
		"record beyond idx": func(q *Queue) { rec(q, 0, 100, 1); setProd(q, 64) },
		"pad at offset 0":   func(q *Queue) { rec(q, 0, 4096-8, TypePad); setProd(q, 4096) },
		"pad wrong length": func(q *Queue) {
			rec(q, 0, 8, 1)
			rec(q, 16, 100, TypePad)
			setProd(q, 4096)
		},
		"pad beyond idx": func(q *Queue) {
			rec(q, 0, 8, 1)
			rec(q, 16, 4096-16-8, TypePad)
			setProd(q, 64)
		},
	} {
		q := newTestQueue(t, 4096)
		corrupt(q)
		var err error
		for range 3 { // a valid record may precede the corruption
			if _, _, err = q.Peek(); err != nil {
				break
			}
			q.Advance()
		}
		if err != ErrCorrupt {
			t.Errorf("%s: Peek = %v, want ErrCorrupt", name, err)
			continue
		}
		if !q.Readable() {
			t.Errorf("%s: Readable false on a corrupt queue (a waiter would sleep forever)", name)
		}
		// Sticky, even if the peer repairs the memory.
		atomic.StoreUint64(q.prodIdx, q.c.idx)
		if _, _, err := q.Peek(); err != ErrCorrupt {
			t.Errorf("%s: second Peek = %v, want ErrCorrupt", name, err)
		}
	}
}

func TestConsumerRejectsBackwardProducer(t *testing.T) {
	q := newTestQueue(t, 4096)
	for range 4 {
		q.Push(1, make([]byte, 8))
	}
	q.Publish()
	if _, _, err := q.Peek(); err != nil {
		t.Fatal(err)
	}
	q.Advance()
	q.Peek()
	q.Advance()
	q.Peek()
	q.Advance()
	q.Peek()
	q.Advance()
	// Published 64, consumed all; now the peer moves the index back.
	atomic.StoreUint64(q.prodIdx, 32)
	if _, _, err := q.Peek(); err != ErrCorrupt {
		t.Fatalf("Peek after the producer index went backwards: %v", err)
	}
}

func TestProducerRejectsGarbage(t *testing.T) {
	for name, v := range map[string]uint64{
		"cons unaligned":       4,
		"cons beyond produced": 4096 + 8,
		"cons backwards":       ^uint64(7),
	} {
		q := newTestQueue(t, 4096)
		for q.Push(1, make([]byte, 100)) == nil {
		}
		q.Publish()
		atomic.StoreUint64(q.consIdx, v)
		if _, err := q.Reserve(100); err != ErrCorrupt {
			t.Errorf("%s: Reserve = %v, want ErrCorrupt", name, err)
		}
		if !q.Writable(100) {
			t.Errorf("%s: Writable false on a corrupt queue", name)
		}
		atomic.StoreUint64(q.consIdx, 0)
		if _, err := q.Reserve(0); err != ErrCorrupt {
			t.Errorf("%s: corruption not sticky: %v", name, err)
		}
	}
}

// TestHostilePeer lets a goroutine scribble random bytes over the whole
// queue through a second mapping of the same memfd (as a hostile peer process
// would) while this side keeps producing and consuming. Nothing may panic or
// hang; corruption must come back as ErrCorrupt.
func TestHostilePeer(t *testing.T) {
	const capacity = 4096
	fd, mem, err := CreateMemfd("shmq-hostile", Size(capacity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmap(mem); closeFD(fd) })
	peer, err := MapMemfd(fd, Size(capacity))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { Unmap(peer) })

	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(7, 7))
		words := unsafe.Slice((*uint64)(unsafe.Pointer(&peer[0])), len(peer)/8)
		for !stop.Load() {
			i := rng.IntN(len(words))
			switch rng.IntN(4) {
			case 0: // plausible index values are the nastiest
				words[i] = uint64(rng.IntN(2*capacity)) &^ 7
			case 1:
				words[i] = rng.Uint64()
			default: // header region, where the indexes live
				words[rng.IntN(HeaderSize/8)] = uint64(rng.IntN(3 * capacity))
			}
		}
	}()
	t.Cleanup(func() { stop.Store(true); wg.Wait() })

	iterations := 300000
	if raceEnabled {
		iterations = 30000
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var q *Queue
	corrupt, attachFail := 0, 0
	for i := 0; i < iterations; i++ {
		if q == nil {
			if i%2 == 0 {
				q, err = Attach(mem)
			} else {
				q, err = Init(mem, capacity)
			}
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Attach: unexpected error %v", err)
				}
				attachFail++
				continue
			}
		}
		var perr, cerr error
		if b, err := q.Reserve(rng.IntN(q.MaxPayload() + 1)); err == nil {
			clear(b)
			perr = q.Commit(len(b), 1)
			q.Publish()
		} else if err != ErrFull {
			perr = err
		}
		for range 4 {
			p, _, err := q.Peek()
			if err != nil {
				if err != ErrEmpty {
					cerr = err
				}
				break
			}
			_ = append([]byte(nil), p...) // touch every payload byte
			q.Advance()
		}
		q.Release()
		_ = q.Len() + q.Free()
		for _, err := range []error{perr, cerr} {
			if err != nil && err != ErrCorrupt {
				t.Fatalf("unexpected error %v", err)
			}
		}
		if perr != nil || cerr != nil {
			corrupt++
			q = nil
		}
	}
	t.Logf("%d iterations: %d corruptions detected, %d attaches refused", iterations, corrupt, attachFail)
}
