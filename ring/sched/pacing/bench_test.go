package pacing

import (
	"fmt"
	"testing"
)

// BenchmarkScheduler measures the scheduler's cost per paced datagram with
// every flow backlogged: fire the due flows, charge the departure, file
// the flow at its next departure. Rates are spread so that departures
// interleave, as with real flows.
func BenchmarkScheduler(b *testing.B) {
	for _, flows := range []int{1, 1000, 10000} {
		b.Run(fmt.Sprintf("flows=%d", flows), func(b *testing.B) {
			type flow struct{ p Pacer }
			w := NewWheel[*flow](0)
			items := make([]*Item[*flow], flows)
			for i := range items {
				f := &flow{}
				f.p.Set(Rate{Kbps: uint32(1000 + i%20_000*50)}, 0)
				items[i] = NewItem(f)
				w.Insert(items[i], f.p.Due(1442))
			}
			var due []*Item[*flow]
			now := int64(0)
			b.ResetTimer()
			for sent := 0; sent < b.N; {
				// The engine advances to its clock, which has moved on
				// by the time it looks: everything in the slot is due.
				next, _ := w.Next()
				now = max(now, next|(1<<slotShift-1))
				due = due[:0]
				w.Advance(now, func(it *Item[*flow]) { due = append(due, it) })
				for _, it := range due {
					it.Value.p.Charge(now, 1442)
					w.Insert(it, it.Value.p.Due(1442))
				}
				sent += len(due)
			}
		})
	}
}
