package shmq

import (
	"encoding/binary"
	"errors"
	"testing"
)

const fuzzCapacity = 4096

// fuzzSeedQueue returns the memory of a queue in a legitimate state with
// records, padding and a wrap, for the fuzzer to mutate.
func fuzzSeedQueue(t testing.TB, wrapAt int) []byte {
	mem := heapMem(t, fuzzCapacity)
	q, err := Init(mem, fuzzCapacity)
	if err != nil {
		t.Fatal(err)
	}
	for q.p.idx < uint64(wrapAt) {
		q.Push(1, make([]byte, 500))
		q.Publish()
		q.Peek()
		q.Advance()
		q.Release()
	}
	for i := range 6 {
		if q.Push(uint32(i), recordBytes(uint64(i), 37*i)) != nil {
			break
		}
	}
	q.Publish()
	return mem
}

// FuzzAttachAndDrain feeds arbitrary bytes as a queue's memory (header and
// data) to Attach and, if it is accepted, drains and refills the queue. The
// queue must never panic and every loop must end within the bound a valid
// queue of this size allows.
func FuzzAttachAndDrain(f *testing.F) {
	f.Add([]byte{})
	f.Add(make([]byte, Size(fuzzCapacity)))
	f.Add(fuzzSeedQueue(f, 0))
	f.Add(fuzzSeedQueue(f, 3000))
	f.Add(fuzzSeedQueue(f, 3900))
	f.Fuzz(func(t *testing.T, data []byte) {
		mem := heapMem(t, fuzzCapacity)
		copy(mem, data)
		// Half the inputs get a valid header so the fuzzer spends its time
		// on indexes and records rather than on the magic number.
		if len(data) > 0 && data[0]&1 == 1 {
			le := binary.LittleEndian
			le.PutUint32(mem[offMagic:], Magic)
			le.PutUint32(mem[offVersion:], Version)
			le.PutUint64(mem[offCapacity:], fuzzCapacity)
			le.PutUint32(mem[offHeaderSize:], HeaderSize)
		}
		q, err := Attach(mem)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Attach error %v does not wrap ErrCorrupt", err)
			}
			return
		}
		// Every successful Peek consumes at least 8 bytes of at most
		// Capacity published ones.
		bound := fuzzCapacity/RecordHeaderSize + 2
		drain := func() {
			for i := 0; ; i++ {
				if i > bound {
					t.Fatal("drain did not terminate")
				}
				p, _, err := q.Peek()
				if err == ErrEmpty || err == ErrCorrupt {
					break
				}
				if err != nil {
					t.Fatalf("Peek: unexpected error %v", err)
				}
				if len(p) > q.MaxPayload() {
					t.Fatalf("Peek returned %d bytes, over MaxPayload", len(p))
				}
				q.Advance()
			}
			q.Release()
		}
		drain()
		for i, done := 0, 0; ; i++ {
			if done > bound || i > bound+len(data) {
				t.Fatal("fill did not terminate")
			}
			n := 0
			if i < len(data) {
				n = int(data[i]) * 9
			}
			b, err := q.Reserve(n)
			if err == ErrFull || err == ErrCorrupt {
				break
			}
			if err == ErrTooBig && n > q.MaxPayload() {
				continue
			}
			if err != nil {
				t.Fatalf("Reserve(%d): %v", n, err)
			}
			clear(b)
			if err := q.Commit(n, uint32(i)); err != nil {
				t.Fatal(err)
			}
			done++
		}
		q.Publish()
		drain()
		if l := q.Len(); l < 0 || l > fuzzCapacity {
			t.Fatalf("Len %d out of range", l)
		}
	})
}
