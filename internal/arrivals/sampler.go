package arrivals

import (
	"sync"
	"time"
)

// Sampler records a counter over time (wall clock, like the receive
// timestamps), so that measurement windows in which it moved can be told
// apart: a pacing test uses the engine's late-departure counter to tell a
// window the machine starved the engine in from one where the pacer had
// the CPU it needs.
type Sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	ts   []int64
	vals []uint64
}

// Sample reads read every period until Stop.
func Sample(period time.Duration, read func() uint64) *Sampler {
	s := &Sampler{stop: make(chan struct{}), done: make(chan struct{})}
	s.add(read())
	go func() {
		defer close(s.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				s.add(read())
				return
			case <-t.C:
				s.add(read())
			}
		}
	}()
	return s
}

func (s *Sampler) add(v uint64) {
	s.mu.Lock()
	s.ts = append(s.ts, time.Now().UnixNano())
	s.vals = append(s.vals, v)
	s.mu.Unlock()
}

// Stop ends sampling (after one last sample).
func (s *Sampler) Stop() {
	close(s.stop)
	<-s.done
}

// Moved reports whether the counter may have changed during [from, to]
// (ns since the epoch): it compares the last sample at or before from with
// the first at or after to, so it errs towards true; a window the samples
// do not cover counts as moved.
func (s *Sampler) Moved(from, to int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	before, after := -1, -1
	for i, t := range s.ts {
		if t <= from {
			before = i
		}
		if t >= to && after < 0 {
			after = i
		}
	}
	if before < 0 || after < 0 {
		return true
	}
	return s.vals[after] != s.vals[before]
}
