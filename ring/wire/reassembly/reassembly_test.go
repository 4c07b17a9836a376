package reassembly

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"
)

var (
	t0   = time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	key4 = Key{Src: netip.MustParseAddr("10.0.0.1"), Dst: netip.MustParseAddr("10.0.0.2"), ID: 7, Proto: 17}
	key6 = Key{Src: netip.MustParseAddr("2001:db8::1"), Dst: netip.MustParseAddr("2001:db8::2"), ID: 7, Proto: 17}
)

type frag struct {
	off  int
	more bool
	data []byte
}

func randBytes(rng *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(rng.Uint32())
	}
	return b
}

// split cuts d into fragments of the given size (a multiple of 8).
func split(d []byte, size int) []frag {
	var fs []frag
	for off := 0; off < len(d); off += size {
		end := min(off+size, len(d))
		fs = append(fs, frag{off, end < len(d), d[off:end]})
	}
	return fs
}

// randomSplit cuts d into fragments of random 8-aligned sizes.
func randomSplit(rng *rand.Rand, d []byte) []frag {
	var fs []frag
	for off := 0; off < len(d); {
		size := 8 * (1 + rng.IntN(200))
		end := min(off+size, len(d))
		fs = append(fs, frag{off, end < len(d), d[off:end]})
		off = end
	}
	return fs
}

// feed adds fragments in order; it expects completion exactly at the last one.
func feed(t *testing.T, r *Reassembler, k Key, fs []frag, want []byte, now time.Time) {
	t.Helper()
	for i, f := range fs {
		d, done, err := r.Add(k, f.off, f.more, f.data, now)
		if err != nil {
			t.Fatalf("fragment %d [%d,%d): %v", i, f.off, f.off+len(f.data), err)
		}
		if done != (i == len(fs)-1) {
			t.Fatalf("fragment %d of %d: done=%v", i, len(fs), done)
		}
		if done && !bytes.Equal(d, want) {
			t.Fatalf("reassembled %d bytes differ from the %d sent", len(d), len(want))
		}
	}
}

func checkEmpty(t *testing.T, r *Reassembler) {
	t.Helper()
	if r.Len() != 0 || r.Buffered() != 0 || len(r.flows) != 0 || r.head != nil || r.tail != nil {
		t.Fatalf("state left: Len %d Buffered %d map %d", r.Len(), r.Buffered(), len(r.flows))
	}
}

func TestOrders(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 1))
	for _, n := range []int{1, 8, 9, 1480, 1481, 3000, 8008, 65515} {
		d := randBytes(rng, n)
		for _, order := range []string{"in", "reverse", "random"} {
			t.Run(fmt.Sprintf("%d-%s", n, order), func(t *testing.T) {
				r := New(Config{})
				fs := split(d, 1480)
				switch order {
				case "reverse":
					for i, j := 0, len(fs)-1; i < j; i, j = i+1, j-1 {
						fs[i], fs[j] = fs[j], fs[i]
					}
				case "random":
					fs = randomSplit(rng, d)
					rng.Shuffle(len(fs), func(i, j int) { fs[i], fs[j] = fs[j], fs[i] })
				}
				feed(t, r, key4, fs, d, t0)
				checkEmpty(t, r)
				if s := r.Stats(); s != (Stats{Reassembled: 1}) {
					t.Fatalf("stats %+v", s)
				}
			})
		}
	}
}

func TestDuplicatesIgnored(t *testing.T) {
	t.Parallel()
	d := randBytes(rand.New(rand.NewPCG(2, 2)), 64)
	r := New(Config{})
	steps := []frag{
		{16, true, d[16:32]},
		{16, true, d[16:32]}, // exact duplicate
		{56, false, d[56:64]},
		{56, false, d[56:64]}, // duplicate final fragment
		{0, true, d[0:16]},
		{8, true, d[8:24]}, // identical bytes spanning two earlier fragments
		{32, true, d[32:56]},
	}
	for i, f := range steps {
		got, done, err := r.Add(key4, f.off, f.more, f.data, t0)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if done != (i == len(steps)-1) {
			t.Fatalf("step %d: done=%v", i, done)
		}
		if done && !bytes.Equal(got, d) {
			t.Fatal("wrong datagram")
		}
	}
	if s := r.Stats(); s != (Stats{Reassembled: 1}) {
		t.Fatalf("stats %+v", s)
	}
	checkEmpty(t, r)
}

func TestOverlapDropsDatagram(t *testing.T) {
	t.Parallel()
	d := randBytes(rand.New(rand.NewPCG(3, 3)), 64)
	for _, c := range []struct {
		name string
		f    frag
	}{
		{"same range, different data", frag{0, true, bytes.Repeat([]byte{0xaa}, 16)}},
		{"partial overlap, same data", frag{8, true, d[8:32]}},
		{"covering", frag{0, true, d[0:40]}},
		{"final overlapping", frag{8, false, d[8:64]}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := New(Config{})
			if _, _, err := r.Add(key6, 0, true, d[0:16], t0); err != nil {
				t.Fatal(err)
			}
			if _, _, err := r.Add(key6, c.f.off, c.f.more, c.f.data, t0); !errors.Is(err, ErrOverlap) {
				t.Fatalf("err = %v, want ErrOverlap", err)
			}
			if s := r.Stats(); s.Overlaps != 1 || s.Reassembled != 0 {
				t.Fatalf("stats %+v", s)
			}
			checkEmpty(t, r)
			// Later fragments start a new datagram and cannot complete
			// with the dropped data.
			if _, done, err := r.Add(key6, 16, false, d[16:64], t0); done || err != nil {
				t.Fatalf("rest of the dropped datagram: done=%v err=%v", done, err)
			}
		})
	}
}

func TestInconsistentLengths(t *testing.T) {
	t.Parallel()
	d := make([]byte, 64)
	for _, c := range []struct {
		name  string
		first frag
		next  frag
	}{
		{"two different final fragments", frag{48, false, d[48:64]}, frag{56, false, d[:16]}},
		{"data beyond the final fragment", frag{16, false, d[16:32]}, frag{32, true, d[32:48]}},
		{"final before data already received", frag{32, true, d[32:48]}, frag{0, false, d[:16]}},
	} {
		r := New(Config{})
		if _, _, err := r.Add(key4, c.first.off, c.first.more, c.first.data, t0); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, _, err := r.Add(key4, c.next.off, c.next.more, c.next.data, t0); !errors.Is(err, ErrInvalid) {
			t.Fatalf("%s: err = %v, want ErrInvalid", c.name, err)
		}
		if s := r.Stats(); s.Invalid != 1 {
			t.Fatalf("%s: stats %+v", c.name, s)
		}
		checkEmpty(t, r)
	}
}

func TestMalformedFragmentsRejectedAlone(t *testing.T) {
	t.Parallel()
	d := make([]byte, 64)
	r := New(Config{})
	if _, _, err := r.Add(key4, 0, true, d[:16], t0); err != nil {
		t.Fatal(err)
	}
	for _, f := range []frag{{-8, true, d[:8]}, {4, true, d[:8]}, {16, true, nil}, {16, false, d[:0]}, {16, true, d[:12]}} {
		if _, _, err := r.Add(key4, f.off, f.more, f.data, t0); !errors.Is(err, ErrInvalid) {
			t.Fatalf("fragment off %d len %d more %v: err %v", f.off, len(f.data), f.more, err)
		}
	}
	if s := r.Stats(); s.Invalid != 5 || r.Len() != 1 {
		t.Fatalf("stats %+v, Len %d", s, r.Len())
	}
	// The datagram is intact.
	if _, done, err := r.Add(key4, 16, false, d[16:20], t0); !done || err != nil {
		t.Fatalf("done=%v err=%v", done, err)
	}
}

func TestTimeout(t *testing.T) {
	t.Parallel()
	d := randBytes(rand.New(rand.NewPCG(4, 4)), 3000)
	fs := split(d, 1480)
	r := New(Config{Timeout: 30 * time.Second})
	if _, _, err := r.Add(key4, fs[0].off, fs[0].more, fs[0].data, t0); err != nil {
		t.Fatal(err)
	}
	if n := r.Expire(t0.Add(30*time.Second - 1)); n != 0 {
		t.Fatalf("expired %d before the timeout", n)
	}
	// The timer is not refreshed by later fragments.
	if _, _, err := r.Add(key4, fs[1].off, fs[1].more, fs[1].data, t0.Add(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := r.Expire(t0.Add(30 * time.Second)); n != 1 {
		t.Fatalf("Expire = %d, want 1", n)
	}
	if s := r.Stats(); s.Timeouts != 1 {
		t.Fatalf("stats %+v", s)
	}
	checkEmpty(t, r)

	// Add itself drops a timed-out datagram: the late fragment starts anew.
	if _, _, err := r.Add(key4, fs[0].off, fs[0].more, fs[0].data, t0); err != nil {
		t.Fatal(err)
	}
	late := t0.Add(31 * time.Second)
	for _, f := range fs[1:] {
		if _, done, err := r.Add(key4, f.off, f.more, f.data, late); done || err != nil {
			t.Fatalf("completed with a timed-out fragment: done=%v err=%v", done, err)
		}
	}
	if s := r.Stats(); s.Timeouts != 2 || r.Len() != 1 {
		t.Fatalf("stats %+v, Len %d", s, r.Len())
	}
}

func TestEvictionMaxDatagrams(t *testing.T) {
	t.Parallel()
	r := New(Config{MaxDatagrams: 3})
	d := make([]byte, 16)
	for i := range 5 {
		k := key4
		k.ID = uint32(i)
		if _, _, err := r.Add(k, 0, true, d[:8], t0.Add(time.Duration(i))); err != nil {
			t.Fatal(err)
		}
		if r.Len() > 3 {
			t.Fatalf("Len %d beyond MaxDatagrams", r.Len())
		}
	}
	if s := r.Stats(); s.Evicted != 2 {
		t.Fatalf("stats %+v", s)
	}
	// The oldest two (IDs 0, 1) are gone, 2..4 complete.
	for _, i := range []int{2, 3, 4, 0, 1} {
		k := key4
		k.ID = uint32(i)
		_, done, err := r.Add(k, 8, false, d[8:], t0)
		if err != nil || done != (i >= 2) {
			t.Fatalf("ID %d: done=%v err=%v", i, done, err)
		}
	}
}

func TestEvictionMaxBytes(t *testing.T) {
	t.Parallel()
	const maxBytes = 128 << 10
	r := New(Config{MaxBytes: maxBytes})
	d := make([]byte, 30000) // final fragment first: a 32 KiB buffer at once
	for i := range 6 {
		k := key4
		k.ID = uint32(i)
		if _, _, err := r.Add(k, 29600, false, d[29600:], t0); err != nil {
			t.Fatal(err)
		}
		if r.Buffered() > maxBytes {
			t.Fatalf("Buffered %d beyond MaxBytes", r.Buffered())
		}
	}
	if s := r.Stats(); s.Evicted != 2 || r.Len() != 4 || r.Buffered() != maxBytes {
		t.Fatalf("stats %+v Len %d Buffered %d", s, r.Len(), r.Buffered())
	}
	// The oldest were evicted; the newest still complete.
	k := key4
	k.ID = 0
	if _, done, _ := r.Add(k, 0, true, d[:29600], t0); done {
		t.Fatal("evicted datagram completed")
	}
	k.ID = 5
	if _, done, err := r.Add(k, 0, true, d[:29600], t0); !done || err != nil {
		t.Fatalf("newest datagram: done=%v err=%v", done, err)
	}
	// Growth of an existing datagram evicts others, never itself.
	r2 := New(Config{MaxBytes: 64 << 10})
	k.ID = 1
	if _, _, err := r2.Add(k, 0, true, d[:1480], t0); err != nil {
		t.Fatal(err)
	}
	k.ID = 2
	if _, _, err := r2.Add(k, 0, true, d[:1480], t0); err != nil {
		t.Fatal(err)
	}
	big := make([]byte, 65507+8)
	if _, done, err := r2.Add(k, 1480, false, big[1480:], t0); !done || err != nil {
		t.Fatalf("max datagram with MaxBytes 64 KiB: done=%v err=%v", done, err)
	}
	if s := r2.Stats(); s.Evicted != 1 {
		t.Fatalf("stats %+v", s)
	}
}

func TestTooBig(t *testing.T) {
	t.Parallel()
	d := make([]byte, 65536)
	for _, c := range []struct {
		k     Key
		limit int
	}{{key4, 65515}, {key6, 65535}} {
		r := New(Config{})
		if _, _, err := r.Add(c.k, 0, true, d[:8], t0); err != nil {
			t.Fatal(err)
		}
		off := (c.limit - 100) &^ 7
		if _, _, err := r.Add(c.k, off, false, d[:c.limit-off+1], t0); !errors.Is(err, ErrTooBig) {
			t.Fatalf("%v: err = %v", c.k.Src, err)
		}
		if s := r.Stats(); s.TooBig != 1 {
			t.Fatalf("stats %+v", s)
		}
		checkEmpty(t, r)
		// Exactly at the limit is fine.
		if _, _, err := r.Add(c.k, 0, true, d[:off], t0); err != nil {
			t.Fatal(err)
		}
		if got, done, err := r.Add(c.k, off, false, d[:c.limit-off], t0); !done || err != nil || len(got) != c.limit {
			t.Fatalf("%v at the limit: %d bytes, done=%v err=%v", c.k.Src, len(got), done, err)
		}
	}
}

func TestInterleavedKeys(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(5, 5))
	r := New(Config{})
	type dgram struct {
		k    Key
		data []byte
		fs   []frag
	}
	var ds []*dgram
	for i := range 20 {
		k := key4
		if i%2 == 1 {
			k = key6
		}
		k.ID = uint32(i / 4)      // same ID under different keys
		k.Proto = uint8(17 + i%4) // and different protocols
		d := randBytes(rng, 100+rng.IntN(20000))
		ds = append(ds, &dgram{k, d, randomSplit(rng, d)})
	}
	completed := 0
	for remaining := true; remaining; {
		remaining = false
		for _, i := range rng.Perm(len(ds)) {
			g := ds[i]
			if len(g.fs) == 0 {
				continue
			}
			remaining = true
			j := rng.IntN(len(g.fs))
			f := g.fs[j]
			g.fs = append(g.fs[:j], g.fs[j+1:]...)
			got, done, err := r.Add(g.k, f.off, f.more, f.data, t0)
			if err != nil {
				t.Fatal(err)
			}
			if done != (len(g.fs) == 0) {
				t.Fatalf("datagram %d: done=%v with %d fragments left", i, done, len(g.fs))
			}
			if done {
				completed++
				if !bytes.Equal(got, g.data) {
					t.Fatalf("datagram %d mixed up", i)
				}
			}
		}
	}
	if completed != len(ds) || r.Stats().Reassembled != uint64(len(ds)) {
		t.Fatalf("completed %d of %d", completed, len(ds))
	}
	checkEmpty(t, r)
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	if c := New(Config{}).Config(); c != (Config{MaxBytes: 4 << 20, MaxDatagrams: 1024, Timeout: 30 * time.Second}) {
		t.Fatalf("defaults %+v", c)
	}
	if c := New(Config{MaxBytes: 1000, MaxDatagrams: -1, Timeout: -1}).Config(); c.MaxBytes != 65536 || c.MaxDatagrams != 1024 || c.Timeout != 30*time.Second {
		t.Fatalf("clamped %+v", c)
	}
}

func TestNoAllocationsSteadyState(t *testing.T) {
	// Not parallel: AllocsPerRun measures the whole process.
	r := New(Config{})
	d := make([]byte, 4000)
	fs := split(d, 1480)
	k := key6
	run := func() {
		k.ID++
		for i, f := range fs {
			_, done, err := r.Add(k, f.off, f.more, f.data, t0)
			if err != nil || done != (i == len(fs)-1) {
				t.Fatalf("done=%v err=%v", done, err)
			}
		}
	}
	run()
	if a := testing.AllocsPerRun(200, run); a != 0 {
		t.Fatalf("%v allocations per reassembled datagram", a)
	}
}

func BenchmarkReassemble8000(b *testing.B) {
	r := New(Config{})
	d := make([]byte, 8008)
	fs := split(d, 1480)
	k := key4
	b.SetBytes(int64(len(d)))
	for b.Loop() {
		k.ID++
		for _, f := range fs {
			if _, _, err := r.Add(k, f.off, f.more, f.data, t0); err != nil {
				b.Fatal(err)
			}
		}
	}
}
