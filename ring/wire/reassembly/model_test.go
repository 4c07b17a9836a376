package reassembly

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
	"time"
)

// model is a deliberately naive reassembler with the same policy: byte-level
// coverage maps instead of spans, a slice instead of a linked list.
type model struct {
	cfg     Config
	entries map[Key]*mEntry
	order   []Key // creation order, oldest first
	stats   Stats
}

type mEntry struct {
	data    []byte
	have    []bool
	total   int
	maxEnd  int
	created time.Time
}

func newModel(cfg Config) *model { return &model{cfg: cfg, entries: map[Key]*mEntry{}} }

func (m *model) drop(k Key) {
	delete(m.entries, k)
	for i, o := range m.order {
		if o == k {
			m.order = append(m.order[:i], m.order[i+1:]...)
			return
		}
	}
}

func (m *model) expire(now time.Time) int {
	n := 0
	for _, k := range append([]Key(nil), m.order...) {
		if now.Sub(m.entries[k].created) >= m.cfg.Timeout {
			m.drop(k)
			m.stats.Timeouts++
			n++
		}
	}
	return n
}

func (m *model) add(k Key, off int, more bool, data []byte, now time.Time) ([]byte, bool, error) {
	m.expire(now)
	if off < 0 || off%8 != 0 || len(data) == 0 || (more && len(data)%8 != 0) {
		m.stats.Invalid++
		return nil, false, ErrInvalid
	}
	end := off + len(data)
	limit := 65535
	if k.Src.Is4() {
		limit = 65515
	}
	if end > limit {
		m.stats.TooBig++
		m.drop(k)
		return nil, false, ErrTooBig
	}
	e := m.entries[k]
	if e == nil {
		for len(m.order) >= m.cfg.MaxDatagrams {
			m.stats.Evicted++
			m.drop(m.order[0])
		}
		e = &mEntry{data: make([]byte, 65536), have: make([]bool, 65536), total: -1, created: now}
		m.entries[k] = e
		m.order = append(m.order, k)
	}
	if (!more && ((e.total >= 0 && end != e.total) || end < e.maxEnd)) || (more && e.total >= 0 && end > e.total) {
		m.stats.Invalid++
		m.drop(k)
		return nil, false, ErrInvalid
	}
	covered := 0
	for i := off; i < end; i++ {
		if e.have[i] {
			covered++
		}
	}
	if covered > 0 && (covered < len(data) || !bytes.Equal(e.data[off:end], data)) {
		m.stats.Overlaps++
		m.drop(k)
		return nil, false, ErrOverlap
	}
	copy(e.data[off:], data)
	for i := off; i < end; i++ {
		e.have[i] = true
	}
	e.maxEnd = max(e.maxEnd, end)
	if !more {
		e.total = end
	}
	if e.total < 0 {
		return nil, false, nil
	}
	for i := 0; i < e.total; i++ {
		if !e.have[i] {
			return nil, false, nil
		}
	}
	m.stats.Reassembled++
	m.drop(k)
	return e.data[:e.total], true, nil
}

func errClass(err error) string {
	switch {
	case err == nil:
		return "nil"
	case errors.Is(err, ErrInvalid):
		return "invalid"
	case errors.Is(err, ErrOverlap):
		return "overlap"
	case errors.Is(err, ErrTooBig):
		return "toobig"
	}
	return err.Error()
}

// checkInvariants looks inside the Reassembler.
func checkInvariants(t *testing.T, r *Reassembler) {
	t.Helper()
	n, held := 0, 0
	var prev *entry
	for e := r.head; e != nil; e = e.next {
		if e.prev != prev || r.flows[e.key] != e {
			t.Fatalf("list or map corrupt at %+v", e.key)
		}
		got := 0
		for i, s := range e.spans {
			if s.start >= s.end || (i > 0 && e.spans[i-1].end >= s.start) {
				t.Fatalf("spans not sorted, disjoint and merged: %v", e.spans)
			}
			got += s.end - s.start
		}
		if got != e.got || e.maxEnd > len(e.buf) || (e.total >= 0 && e.maxEnd > e.total) {
			t.Fatalf("entry accounting: got %d spans %v maxEnd %d total %d buf %d", e.got, e.spans, e.maxEnd, e.total, len(e.buf))
		}
		held += len(e.buf)
		prev = e
		n++
	}
	if prev != r.tail || n != r.n || n != len(r.flows) || held != r.buffered || r.buffered > r.cfg.MaxBytes {
		t.Fatalf("n %d/%d/%d, held %d buffered %d", n, r.n, len(r.flows), held, r.buffered)
	}
}

// TestAgainstModel drives the Reassembler and the model with the same random
// mix of genuine, duplicated, corrupted, overlapping, malformed and oversized
// fragments of interleaved datagrams, with time running and eviction by
// MaxDatagrams, and compares every result and counter.
func TestAgainstModel(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 8; seed++ {
		rng := rand.New(rand.NewPCG(seed, 99))
		cfg := Config{MaxDatagrams: 4, Timeout: 30 * time.Second}
		r, m := New(cfg), newModel(New(cfg).Config())
		type source struct {
			k    Key
			data []byte
			fs   []frag
			sent []frag
		}
		var srcs []*source
		for i := range 6 {
			k := key4
			if i%3 == 0 {
				k = key6
			}
			k.ID = uint32(i)
			srcs = append(srcs, &source{k: k})
		}
		now := t0
		for step := 0; step < 4000; step++ {
			now = now.Add(time.Duration(rng.IntN(2000)) * time.Millisecond)
			if rng.IntN(200) == 0 {
				now = now.Add(25 * time.Second)
			}
			if rng.IntN(50) == 0 {
				if got, want := r.Expire(now), m.expire(now); got != want {
					t.Fatalf("seed %d step %d: Expire = %d, model %d", seed, step, got, want)
				}
				continue
			}
			s := srcs[rng.IntN(len(srcs))]
			if len(s.fs) == 0 {
				s.data = randBytes(rng, 1+rng.IntN(12000))
				s.fs = randomSplit(rng, s.data)
				rng.Shuffle(len(s.fs), func(i, j int) { s.fs[i], s.fs[j] = s.fs[j], s.fs[i] })
				s.sent = nil
			}
			var f frag
			switch p := rng.IntN(100); {
			case p < 70 || len(s.sent) == 0:
				f = s.fs[0]
				s.fs = s.fs[1:]
				s.sent = append(s.sent, f)
			case p < 80:
				f = s.sent[rng.IntN(len(s.sent))]
			case p < 85:
				f = s.sent[rng.IntN(len(s.sent))]
				f.data = append([]byte(nil), f.data...)
				f.data[rng.IntN(len(f.data))] ^= 1
			case p < 93: // arbitrary range of the genuine bytes, often overlapping
				off := 8 * rng.IntN(len(s.data)/8+1)
				end := min(off+8*(1+rng.IntN(40)), len(s.data))
				if end <= off {
					continue
				}
				f = frag{off, end < len(s.data) || rng.IntN(4) == 0, s.data[off:end]}
				if f.more && len(f.data)%8 != 0 {
					f.data = f.data[:len(f.data)&^7]
				}
			case p < 97:
				f = frag{rng.IntN(100) - 10, rng.IntN(2) == 0, make([]byte, rng.IntN(20))}
			default:
				f = frag{65528 - 8*rng.IntN(3), false, make([]byte, 1+rng.IntN(16))}
			}
			got, done, err := r.Add(s.k, f.off, f.more, f.data, now)
			want, wdone, werr := m.add(s.k, f.off, f.more, f.data, now)
			if done != wdone || errClass(err) != errClass(werr) || !bytes.Equal(got, want) {
				t.Fatalf("seed %d step %d: Add(%v id %d, off %d, len %d, more %v) = %d bytes, %v, %v; model %d bytes, %v, %v",
					seed, step, s.k.Src, s.k.ID, f.off, len(f.data), f.more, len(got), done, err, len(want), wdone, werr)
			}
			if done {
				s.fs = nil // start a new datagram for this key next time
			}
			if r.Stats() != m.stats || r.Len() != len(m.entries) {
				t.Fatalf("seed %d step %d: stats %+v Len %d; model %+v Len %d", seed, step, r.Stats(), r.Len(), m.stats, len(m.entries))
			}
			checkInvariants(t, r)
		}
		st := r.Stats()
		if st.Reassembled == 0 || st.Overlaps == 0 || st.Invalid == 0 || st.TooBig == 0 || st.Evicted == 0 || st.Timeouts == 0 {
			t.Fatalf("seed %d: the random mix did not exercise every path: %+v", seed, st)
		}
	}
}
