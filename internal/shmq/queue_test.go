package shmq

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"unsafe"
)

func TestSize(t *testing.T) {
	for _, tc := range []struct{ capacity, want int }{
		{4096, 4352}, {1 << 20, 1<<20 + 256}, {MaxCapacity, MaxCapacity + 256},
		{0, 0}, {-4096, 0}, {2048, 0}, {4097, 0}, {6144, 0}, {MaxCapacity * 2, 0},
	} {
		if got := Size(tc.capacity); got != tc.want {
			t.Errorf("Size(%d) = %d, want %d", tc.capacity, got, tc.want)
		}
	}
	if got := MaxPayloadFor(4096); got != 2040 {
		t.Errorf("MaxPayloadFor(4096) = %d, want 2040", got)
	}
}

func TestInitErrors(t *testing.T) {
	mem := heapMem(t, 8192)
	if _, err := Init(mem, 3000); err == nil {
		t.Error("Init accepted a capacity that is not a power of two")
	}
	if _, err := Init(mem[:Size(8192)-1], 8192); err == nil {
		t.Error("Init accepted memory shorter than Size")
	}
	if _, err := Init(mem[1:], 4096); err == nil {
		t.Error("Init accepted misaligned memory")
	}
	if _, err := Init(nil, 4096); err == nil {
		t.Error("Init accepted nil memory")
	}
	q, err := Init(mem, 4096) // longer memory is fine; only the prefix is used
	if err != nil {
		t.Fatal(err)
	}
	if q.MemSize() != Size(4096) || q.Capacity() != 4096 || q.MaxPayload() != 2040 {
		t.Errorf("MemSize/Capacity/MaxPayload = %d/%d/%d", q.MemSize(), q.Capacity(), q.MaxPayload())
	}
}

func TestHeaderBytes(t *testing.T) {
	mem := heapMem(t, 4096)
	if _, err := Init(mem, 4096); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, HeaderSize)
	copy(want, []byte("BPDQ"))
	binary.LittleEndian.PutUint32(want[4:], 1)
	binary.LittleEndian.PutUint64(want[8:], 4096)
	binary.LittleEndian.PutUint32(want[16:], 256)
	if !bytes.Equal(mem[:HeaderSize], want) {
		t.Fatalf("header bytes\n got %x\nwant %x", mem[:HeaderSize], want)
	}
}

func TestAttachErrors(t *testing.T) {
	good := func() []byte {
		mem := heapMem(t, 4096)
		if _, err := Init(mem, 4096); err != nil {
			t.Fatal(err)
		}
		return mem
	}
	le := binary.LittleEndian
	for name, mutate := range map[string]func([]byte) []byte{
		"zero memory":   func(m []byte) []byte { clear(m); return m },
		"short header":  func(m []byte) []byte { return m[:100] },
		"bad magic":     func(m []byte) []byte { m[0] ^= 1; return m },
		"bad version":   func(m []byte) []byte { le.PutUint32(m[4:], 2); return m },
		"bad hdr size":  func(m []byte) []byte { le.PutUint32(m[16:], 128); return m },
		"capacity odd":  func(m []byte) []byte { le.PutUint64(m[8:], 4095); return m },
		"capacity huge": func(m []byte) []byte { le.PutUint64(m[8:], 1<<62); return m },
		"capacity>mem":  func(m []byte) []byte { le.PutUint64(m[8:], 8192); return m },
		"truncated":     func(m []byte) []byte { return m[:len(m)-8] },
		"prod unaligned": func(m []byte) []byte {
			le.PutUint64(m[offProducer:], 4)
			return m
		},
		"prod ahead": func(m []byte) []byte {
			le.PutUint64(m[offProducer:], 4096+8)
			return m
		},
		"cons ahead": func(m []byte) []byte {
			le.PutUint64(m[offConsumer:], 8)
			return m
		},
	} {
		_, err := Attach(mutate(good()))
		if !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: Attach error %v, want ErrCorrupt", name, err)
		}
	}
	if _, err := Attach(good()[1:]); err == nil || errors.Is(err, ErrCorrupt) {
		t.Errorf("misaligned: Attach error %v, want an alignment error", err)
	}
}

func TestPushPeekOrder(t *testing.T) {
	q := newTestQueue(t, 4096)
	if _, _, err := q.Peek(); err != ErrEmpty {
		t.Fatalf("Peek on empty queue: %v", err)
	}
	msgs := []string{"", "a", "hello", "12345678", "123456789"}
	for i, m := range msgs {
		if err := q.Push(uint32(i), []byte(m)); err != nil {
			t.Fatal(err)
		}
	}
	if _, _, err := q.Peek(); err != ErrEmpty {
		t.Fatalf("records visible before Publish: %v", err)
	}
	if q.Pending() != 8+16+16+16+24 {
		t.Fatalf("Pending = %d", q.Pending())
	}
	if q.Publish() {
		t.Fatal("Publish reported a waiting consumer")
	}
	if q.Len() != 80 || q.Free() != 4096-80 {
		t.Fatalf("Len/Free = %d/%d", q.Len(), q.Free())
	}
	for i, m := range msgs {
		p, typ, err := q.Peek()
		if err != nil || string(p) != m || typ != uint32(i) {
			t.Fatalf("record %d: %q %d %v", i, p, typ, err)
		}
		p2, _, _ := q.Peek() // idempotent until Advance
		if string(p2) != m {
			t.Fatalf("second Peek returned %q", p2)
		}
		q.Advance()
	}
	if _, _, err := q.Peek(); err != ErrEmpty {
		t.Fatalf("Peek after draining: %v", err)
	}
	if q.Len() != 80 {
		t.Fatalf("space returned before Release: Len=%d", q.Len())
	}
	q.Advance() // no pending Peek: no-op
	if q.Release() {
		t.Fatal("Release reported a waiting producer")
	}
	if q.Len() != 0 {
		t.Fatalf("Len after Release = %d", q.Len())
	}
}

func TestCommitShorterAndMisuse(t *testing.T) {
	q := newTestQueue(t, 4096)
	if err := q.Commit(0, 1); err == nil {
		t.Error("Commit without Reserve succeeded")
	}
	b, err := q.Reserve(100)
	if err != nil || len(b) != 100 || cap(b) != 100 {
		t.Fatalf("Reserve: len %d cap %d err %v", len(b), cap(b), err)
	}
	copy(b, "short")
	if err := q.Commit(101, 1); err == nil {
		t.Error("Commit beyond the reservation succeeded")
	}
	if err := q.Commit(5, TypePad); err == nil {
		t.Error("Commit with TypePad succeeded")
	}
	if err := q.Commit(-1, 1); err == nil {
		t.Error("Commit with negative length succeeded")
	}
	if err := q.Commit(5, 7); err != nil {
		t.Fatal(err)
	}
	if err := q.Commit(5, 7); err == nil {
		t.Error("second Commit of one reservation succeeded")
	}
	if err := q.Push(TypePad, nil); err == nil {
		t.Error("Push with TypePad succeeded")
	}
	q.Publish()
	p, typ, err := q.Peek()
	if err != nil || string(p) != "short" || typ != 7 {
		t.Fatalf("Peek: %q %d %v", p, typ, err)
	}
	if q.Len() != 16 {
		t.Fatalf("a shortened record occupies %d bytes, want 16", q.Len())
	}
}

func TestMaxRecord(t *testing.T) {
	q := newTestQueue(t, 4096)
	for _, n := range []int{-1, q.MaxPayload() + 1, 1 << 40} {
		if _, err := q.Reserve(n); err != ErrTooBig {
			t.Errorf("Reserve(%d) = %v, want ErrTooBig", n, err)
		}
	}
	// An empty queue takes a maximal record at every possible offset.
	max := bytes.Repeat([]byte{0xAB}, q.MaxPayload())
	for off := 0; off < q.Capacity(); off += 8 {
		q := newTestQueue(t, 4096)
		moveTo(t, q, off)
		if err := q.Push(2, max); err != nil {
			t.Fatalf("offset %d: max record: %v", off, err)
		}
		q.Publish()
		p, typ, err := q.Peek()
		if err != nil || typ != 2 || !bytes.Equal(p, max) {
			t.Fatalf("offset %d: Peek %d bytes type %d err %v", off, len(p), typ, err)
		}
		if off > q.Capacity()/2 && q.Len() != q.Capacity()-off+q.Capacity()/2 {
			t.Fatalf("offset %d: Len %d, expected padding to the end", off, q.Len())
		}
	}
}

func TestExactFill(t *testing.T) {
	q := newTestQueue(t, 4096)
	for round := 0; round < 3; round++ {
		// 64 records of 56 payload bytes = 64 bytes each fill 4096 exactly.
		for i := range 64 {
			if err := q.Push(uint32(i), recordBytes(uint64(i), 56)); err != nil {
				t.Fatalf("round %d record %d: %v", round, i, err)
			}
		}
		if _, err := q.Reserve(0); err != ErrFull {
			t.Fatalf("round %d: Reserve on a full queue: %v", round, err)
		}
		if q.Writable(0) {
			t.Fatal("Writable(0) on a full queue")
		}
		q.Publish()
		if q.Len() != 4096 || q.Free() != 0 {
			t.Fatalf("Len/Free = %d/%d", q.Len(), q.Free())
		}
		for i := range 64 {
			p, typ, err := q.Peek()
			if err != nil || typ != uint32(i) || !bytes.Equal(p, recordBytes(uint64(i), 56)) {
				t.Fatalf("round %d record %d: type %d err %v", round, i, typ, err)
			}
			q.Advance()
		}
		q.Release()
	}
}

func TestWrapAndPadding(t *testing.T) {
	q := newTestQueue(t, 4096)
	moveTo(t, q, 3000)
	// A 1500-byte record (1504 with header) does not fit in the last 1096.
	payload := recordBytes(5, 1500)
	if err := q.Push(9, payload); err != nil {
		t.Fatal(err)
	}
	q.Publish()
	le := binary.LittleEndian
	pad := q.data[3000:]
	if le.Uint32(pad) != 1096-8 || le.Uint32(pad[4:]) != TypePad {
		t.Fatalf("padding record header = %d/%#x, want %d/%#x", le.Uint32(pad), le.Uint32(pad[4:]), 1088, TypePad)
	}
	if le.Uint32(q.data) != 1500 || le.Uint32(q.data[4:]) != 9 {
		t.Fatalf("wrapped record not at offset 0")
	}
	if q.Len() != 1096+1512 {
		t.Fatalf("Len = %d, want %d", q.Len(), 1096+1512)
	}
	p, typ, err := q.Peek()
	if err != nil || typ != 9 || !bytes.Equal(p, payload) {
		t.Fatalf("Peek after padding: type %d err %v", typ, err)
	}
	q.Advance()
	q.Release()
	if q.Len() != 0 {
		t.Fatalf("Len after consuming = %d", q.Len())
	}
}

func TestFullReservationWritesNoPadding(t *testing.T) {
	q := newTestQueue(t, 4096)
	// Producer at offset 3000 with 2000 bytes still unconsumed at 1000..3000:
	// a 1504-byte record needs 1096 padding + 1504 > 2096 free.
	moveTo(t, q, 1000)
	if err := q.Push(1, make([]byte, 1992)); err != nil {
		t.Fatal(err)
	}
	q.Publish()
	before := q.Pending()
	if _, err := q.Reserve(1496); err != ErrFull {
		t.Fatalf("Reserve = %v, want ErrFull", err)
	}
	if q.Pending() != before {
		t.Fatal("a failed Reserve wrote a padding record")
	}
	// A record that fits before the end still goes in.
	if err := q.Push(2, make([]byte, 1000)); err != nil {
		t.Fatal(err)
	}
}

func TestAbandonedReservationAfterPadding(t *testing.T) {
	q := newTestQueue(t, 4096)
	moveTo(t, q, 3000)
	if _, err := q.Reserve(1500); err != nil { // writes padding, then abandoned
		t.Fatal(err)
	}
	q.Publish() // publishes the padding alone
	if _, _, err := q.Peek(); err != ErrEmpty {
		t.Fatalf("Peek over a lone padding record: %v", err)
	}
	q.Release()
	if q.Len() != 0 {
		t.Fatalf("Len = %d after skipping the padding", q.Len())
	}
	q.Push(3, []byte("x"))
	q.Publish()
	if p, typ, err := q.Peek(); err != nil || typ != 3 || string(p) != "x" {
		t.Fatalf("Peek: %q %d %v", p, typ, err)
	}
}

func TestAttachSecondView(t *testing.T) {
	mem := heapMem(t, 4096)
	prod, err := Init(mem, 4096)
	if err != nil {
		t.Fatal(err)
	}
	prod.Push(1, []byte("one"))
	prod.Push(2, []byte("two"))
	prod.Publish()
	cons, err := Attach(mem)
	if err != nil {
		t.Fatal(err)
	}
	p, typ, err := cons.Peek()
	if err != nil || typ != 1 || string(p) != "one" {
		t.Fatalf("Peek via attached view: %q %d %v", p, typ, err)
	}
	cons.Advance()
	cons.Release()
	// A view attached now starts at the released position.
	late, err := Attach(mem)
	if err != nil {
		t.Fatal(err)
	}
	if p, _, err := late.Peek(); err != nil || string(p) != "two" {
		t.Fatalf("late view Peek: %q %v", p, err)
	}
}

func TestWaitFlags(t *testing.T) {
	q := newTestQueue(t, 4096)
	if q.ArmReadWait() {
		t.Fatal("ArmReadWait on an empty queue reported data")
	}
	q.Push(1, nil)
	if !q.Publish() {
		t.Fatal("Publish did not report the waiting consumer")
	}
	q.Push(1, nil)
	if q.Publish() {
		t.Fatal("a second Publish reported the consumer again")
	}
	if !q.ArmReadWait() {
		t.Fatal("ArmReadWait on a non-empty queue reported empty")
	}
	q.DisarmReadWait()
	if q.Publish() {
		t.Fatal("Publish with nothing new reported a wake-up")
	}

	// Fill, then the producer waits for space.
	for q.Push(1, make([]byte, 100)) == nil {
	}
	q.Publish()
	if q.ArmWriteWait(100) {
		t.Fatal("ArmWriteWait on a full queue reported space")
	}
	if q.Release() {
		t.Fatal("Release with nothing consumed reported a wake-up")
	}
	q.Peek()
	q.Advance()
	if !q.Release() {
		t.Fatal("Release did not report the waiting producer")
	}
	if atomic.LoadUint32(q.prodWaiting) != 0 {
		t.Fatal("Release did not clear the producer-waiting flag")
	}
}

func TestDropped(t *testing.T) {
	q := newTestQueue(t, 4096)
	q.AddDropped(3)
	q.AddDropped(1)
	if q.Dropped() != 4 {
		t.Fatalf("Dropped = %d", q.Dropped())
	}
	if binary.LittleEndian.Uint64(q.mem[72:]) != 4 {
		t.Fatal("dropped counter not at offset 72")
	}
}

// TestModel runs random operations against a reference FIFO.
func TestModel(t *testing.T) {
	for _, capacity := range []int{4096, 8192} {
		q := newTestQueue(t, capacity)
		rng := rand.New(rand.NewPCG(1, uint64(capacity)))
		var model [][]byte   // published, not advanced
		var pending [][]byte // committed, not published
		seq := uint64(0)
		for step := 0; step < 200000; step++ {
			switch op := rng.IntN(10); {
			case op < 5:
				n := rng.IntN(q.MaxPayload() + 1)
				if rng.IntN(4) > 0 {
					n = rng.IntN(200)
				}
				b, err := q.Reserve(n)
				if err == ErrFull {
					continue
				}
				if err != nil {
					t.Fatalf("step %d: Reserve(%d): %v", step, n, err)
				}
				m := n
				if rng.IntN(4) == 0 {
					m = rng.IntN(n + 1)
				}
				copy(b, recordBytes(seq, m))
				if err := q.Commit(m, uint32(seq)); err != nil {
					t.Fatal(err)
				}
				pending = append(pending, recordBytes(seq, m))
				seq++
			case op < 6:
				q.Publish()
				model = append(model, pending...)
				pending = nil
			case op < 9:
				p, _, err := q.Peek()
				if len(model) == 0 {
					if err != ErrEmpty {
						t.Fatalf("step %d: Peek on empty model: %v", step, err)
					}
					continue
				}
				if err != nil || !bytes.Equal(p, model[0]) {
					t.Fatalf("step %d: Peek mismatch (err %v)", step, err)
				}
				q.Advance()
				model = model[1:]
			default:
				q.Release()
			}
			if l := q.Len(); l < 0 || l > capacity {
				t.Fatalf("Len %d out of range", l)
			}
		}
	}
}

// moveTo pushes and consumes filler records until the empty queue's next
// record starts at data offset off.
func moveTo(t *testing.T, q *Queue, off int) {
	t.Helper()
	for left := off; left > 0; {
		n := min(left, 2048)
		if err := q.Push(1, make([]byte, n-8)); err != nil {
			t.Fatalf("filler of %d: %v", n, err)
		}
		q.Publish()
		if _, _, err := q.Peek(); err != nil {
			t.Fatal(err)
		}
		q.Advance()
		q.Release()
		left -= n
	}
	if q.Len() != 0 || int(q.p.idx&q.mask) != off {
		t.Fatalf("moveTo(%d) ended at %d", off, q.p.idx&q.mask)
	}
}

// TestQueueLayout: a Queue fills its 256-byte size class exactly (so it is
// 256-byte aligned) with the producer and consumer states on cache lines
// of their own; and Occupancy agrees with Len.
func TestQueueLayout(t *testing.T) {
	var q Queue
	if s, p, c := unsafe.Sizeof(q), unsafe.Offsetof(q.p), unsafe.Offsetof(q.c); s != 256 || p != 128 || c != 192 {
		t.Fatalf("Queue is %d bytes with p at %d and c at %d; want 256, 128, 192 (adjust the padding)", s, p, c)
	}
	mem := make([]byte, Size(MinCapacity))
	w, err := Init(mem, MinCapacity)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Push(1, make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	w.Publish()
	if got, want := Occupancy(mem, MinCapacity), w.Len(); got != want || got == 0 {
		t.Fatalf("Occupancy %d, Len %d", got, want)
	}
}
