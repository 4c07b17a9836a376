package shmq

import (
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// heapMem returns zeroed, 8-byte aligned Go memory for a queue of capacity
// bytes. Go heap memory (unlike an mmap) is tracked by the race detector,
// so concurrent tests over it check the queue's happens-before edges.
func heapMem(t testing.TB, capacity int) []byte {
	t.Helper()
	size := Size(capacity)
	if size == 0 {
		t.Fatalf("invalid test capacity %d", capacity)
	}
	words := make([]uint64, (size+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
}

func newTestQueue(t testing.TB, capacity int) *Queue {
	t.Helper()
	q, err := Init(heapMem(t, capacity), capacity)
	if err != nil {
		t.Fatalf("Init: %v", err)
	}
	return q
}

// waitFlag polls a shared waiting word until it is set; it fails the test
// after a generous bound (a hang, not a performance assertion).
func waitFlag(t testing.TB, p *uint32) {
	t.Helper()
	end := time.Now().Add(20 * time.Second)
	for atomic.LoadUint32(p) == 0 {
		if time.Now().After(end) {
			t.Fatal("waiting flag never set")
		}
		time.Sleep(100 * time.Microsecond)
	}
}

// pattern is the source of record contents: record i of size n carries
// pattern[i%patternMod : i%patternMod+n], cheap to produce and check.
var pattern = func() []byte {
	b := make([]byte, 1<<17)
	x := uint64(0x9E3779B97F4A7C15)
	for i := range b {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		b[i] = byte(x)
	}
	return b
}()

const patternMod = 1 << 16

func recordSize(i uint64, max int) int {
	x := i*0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019
	x ^= x >> 29
	return int(x % uint64(max+1))
}

func recordBytes(i uint64, n int) []byte {
	s := int(i % patternMod)
	return pattern[s : s+n]
}
