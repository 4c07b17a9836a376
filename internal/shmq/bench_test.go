package shmq

import (
	"encoding/binary"
	"sync"
	"testing"
	"time"
)

// BenchmarkPingPong measures one round trip of a 64-byte record between two
// goroutines over two queues, spinning (the VMA_RX_POLL=-1 case) and sleeping
// on the eventfd every time (poll 0).
func BenchmarkPingPong(b *testing.B) {
	for _, bc := range []struct {
		name   string
		policy Policy
	}{
		{"spin", Policy{Spin: SpinForever}},
		{"spin50us", Policy{Spin: 50 * time.Microsecond}},
		{"sleep", Policy{Spin: 0}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ab, ba := newTestQueue(b, 1<<16), newTestQueue(b, 1<<16)
			wa, wb := newTestWaiter(b), newTestWaiter(b)
			payload := make([]byte, 64)
			deadline := time.Now().Add(time.Hour)
			hop := func(in, out *Queue, mine, peer *Waiter) error {
				if err := bc.policy.WaitReadable(in, mine, deadline); err != nil {
					return err
				}
				p, typ, err := in.Peek()
				if err != nil {
					return err
				}
				copy(payload, p)
				in.Advance()
				if in.Release() {
					peer.Wake()
				}
				if err := out.Push(typ, payload); err != nil {
					return err
				}
				if out.Publish() {
					return peer.Wake()
				}
				return nil
			}
			var wg sync.WaitGroup
			wg.Add(1)
			n := b.N
			go func() { // echo side
				defer wg.Done()
				for range n {
					if err := hop(ab, ba, wb, wa); err != nil {
						b.Error(err)
						wa.Close() // unblock the other side
						return
					}
				}
			}()
			b.ResetTimer()
			for i := range n {
				binary.LittleEndian.PutUint64(payload, uint64(i))
				ab.Push(1, payload)
				if ab.Publish() {
					wb.Wake()
				}
				if err := bc.policy.WaitReadable(ba, wa, deadline); err != nil {
					b.Fatal(err)
				}
				ba.Peek()
				ba.Advance()
				ba.Release()
			}
			b.StopTimer()
			wg.Wait()
		})
	}
}

// BenchmarkThroughput64 streams 64-byte records from a producer goroutine to
// the consumer in batches of 32 and reports records per second.
func BenchmarkThroughput64(b *testing.B) {
	q := newTestQueue(b, 1<<18)
	wp, wc := newTestWaiter(b), newTestWaiter(b)
	policy := Policy{Spin: 100 * time.Microsecond}
	deadline := time.Now().Add(time.Hour)
	payload := make([]byte, 64)
	n := b.N
	var wg sync.WaitGroup
	wg.Add(1)
	b.SetBytes(64)
	b.ResetTimer()
	start := time.Now()
	go func() {
		defer wg.Done()
		for i := 0; i < n; {
			for end := min(i+32, n); i < end; i++ {
				buf, err := q.Reserve(64)
				if err == ErrFull {
					if q.Publish() {
						wc.Wake()
					}
					if err := policy.WaitWritable(q, 64, wp, deadline); err != nil {
						b.Error(err)
						wc.Close() // unblock the consumer
						return
					}
					buf, err = q.Reserve(64)
				}
				if err != nil {
					b.Error(err)
					wc.Close()
					return
				}
				copy(buf, payload)
				q.Commit(64, 1)
			}
			if q.Publish() {
				wc.Wake()
			}
		}
	}()
	var sink byte
	for got := 0; got < n; {
		if err := policy.WaitReadable(q, wc, deadline); err != nil {
			b.Fatal(err)
		}
		for k := 0; k < 32; k++ {
			p, _, err := q.Peek()
			if err != nil {
				break
			}
			sink ^= p[0]
			q.Advance()
			got++
		}
		if q.Release() {
			wp.Wake()
		}
	}
	elapsed := time.Since(start)
	b.StopTimer()
	wg.Wait()
	_ = sink
	b.ReportMetric(float64(n)/elapsed.Seconds(), "records/s")
}
