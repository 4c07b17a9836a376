package shmq

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
)

// TestConcurrentTransfer moves many records of random sizes from a producer
// goroutine to a consumer goroutine, both batching and both alternating
// between spinning and sleeping, and checks every byte. Over Go heap memory
// the race detector checks the publish/consume happens-before edges.
func TestConcurrentTransfer(t *testing.T) {
	records := uint64(10_000_000)
	if raceEnabled {
		records = 2_000_000
	}
	if testing.Short() {
		records /= 10
	}
	const capacity = 1 << 16
	const maxSize = 300
	q := newTestQueue(t, capacity)
	wp, wc := newTestWaiter(t), newTestWaiter(t) // producer sleeps on wp, consumer on wc
	policy := Policy{Spin: 20 * time.Microsecond}
	deadline := func() time.Time { return time.Now().Add(30 * time.Second) }

	var wg sync.WaitGroup
	errc := make(chan error, 2)
	wg.Add(2)
	go func() { // producer
		defer wg.Done()
		rng := rand.New(rand.NewPCG(3, 4))
		for i := uint64(0); i < records; {
			batch := uint64(1 + rng.IntN(32))
			for end := min(i+batch, records); i < end; i++ {
				n := recordSize(i, maxSize)
				b, err := q.Reserve(n)
				if err == ErrFull {
					if q.Publish() {
						wc.Wake()
					}
					if err := policy.WaitWritable(q, n, wp, deadline()); err != nil {
						errc <- fmt.Errorf("producer at %d: %w", i, err)
						return
					}
					b, err = q.Reserve(n)
				}
				if err != nil {
					errc <- fmt.Errorf("producer at %d: %w", i, err)
					return
				}
				copy(b, recordBytes(i, n))
				if err := q.Commit(n, uint32(i)); err != nil {
					errc <- err
					return
				}
			}
			if q.Publish() {
				wc.Wake()
			}
		}
		errc <- nil
	}()
	go func() { // consumer
		defer wg.Done()
		rng := rand.New(rand.NewPCG(5, 6))
		for i := uint64(0); i < records; {
			if err := policy.WaitReadable(q, wc, deadline()); err != nil {
				errc <- fmt.Errorf("consumer at %d: %w", i, err)
				return
			}
			batch := 1 + rng.IntN(64)
			for ; batch > 0; batch-- {
				p, typ, err := q.Peek()
				if err == ErrEmpty {
					break
				}
				if err != nil {
					errc <- fmt.Errorf("consumer at %d: %w", i, err)
					return
				}
				n := recordSize(i, maxSize)
				if typ != uint32(i) || !bytes.Equal(p, recordBytes(i, n)) {
					errc <- fmt.Errorf("record %d: type %d, %d bytes, content mismatch", i, typ, len(p))
					return
				}
				q.Advance()
				i++
			}
			if q.Release() {
				wp.Wake()
			}
		}
		errc <- nil
	}()
	wg.Wait()
	for range 2 {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if q.Len() != 0 {
		t.Fatalf("queue not empty at the end: %d bytes", q.Len())
	}
}
