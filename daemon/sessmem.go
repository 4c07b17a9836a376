package daemon

import (
	"fmt"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/tcpstack"
)

// sessionMemory is a client session's shared memory (control protocol
// version 2, docs/shm-queue.md "Session memory"): one sparse memfd holding
// every queue of the session, the events and announce bitmaps, and the
// client eventfd the daemon writes when the client sleeps. It costs the
// daemon two descriptors (the memfd, kept to format queue headers and free
// pages without touching its own mapping, and the eventfd) whatever the
// number of sockets. Only the session's goroutine uses it, apart from the
// engines, which reach it through the lanes and endpoints.
type sessionMemory struct {
	memfd int
	mem   []byte
	sess  *shmsess.Session
	arena *shmsess.Arena
	// wake is only written here (the client sleeps on it): a Bell, kept
	// out of the daemon's netpoller, which every write and every read of
	// the client would otherwise wake.
	wake *shmq.Bell
	// bells are the session's lane doorbells, one per ring in the daemon's
	// ring order (lane index): the client writes one when it finds that
	// lane armed. nil for a session adopted from a daemon without lane
	// doorbells: its client rings the rings' shared doorbells.
	bells []*shmq.Bell
	// lanes are the session's lane registrations by ring (made when the
	// first socket binds there; a ring opened again gets a new one).
	lanes map[*ring.Ring]*ring.Lane

	// Stream sockets' pumps keep using their queues after CLOSE (they
	// send what the client queued, then FIN): the queues return to the
	// arena (reap) when a pump ends, and close stops the pumps still
	// running before it unmaps. pmu guards pumps and reap.
	pmu    sync.Mutex
	pumps  map[*pumpRef]struct{}
	reap   []queuePair
	pumpWG sync.WaitGroup
}

// pumpRef is a running pump of the session, set once started.
type pumpRef struct{ p *tcpstack.Pump }

// lendToPump registers a pump about to use the queues of q; the returned
// function is the pump's last act (it gives q back).
func (m *sessionMemory) lendToPump() (*pumpRef, func(q queuePair)) {
	ref := &pumpRef{}
	m.pmu.Lock()
	if m.pumps == nil {
		m.pumps = map[*pumpRef]struct{}{}
	}
	m.pumps[ref] = struct{}{}
	m.pmu.Unlock()
	m.pumpWG.Add(1)
	return ref, func(q queuePair) {
		m.pmu.Lock()
		delete(m.pumps, ref)
		m.reap = append(m.reap, q)
		m.pmu.Unlock()
		m.pumpWG.Done()
	}
}

// reapPumped returns to the arena the queues of pumps that ended.
func (m *sessionMemory) reapPumped() {
	m.pmu.Lock()
	done := m.reap
	m.reap = nil
	m.pmu.Unlock()
	for _, q := range done {
		m.free(q)
	}
}

// stopPumps resets the connections of pumps still running (closed sockets
// finishing their sends) and waits until no pump touches the memory.
func (m *sessionMemory) stopPumps() {
	m.pmu.Lock()
	for ref := range m.pumps {
		if ref.p != nil {
			ref.p.Abort()
		}
	}
	m.pmu.Unlock()
	m.pumpWG.Wait()
}

// newSessionMemory creates the memory of a session allowed maxSockets
// sockets, lanes rings and budget bytes of queues, with a doorbell per
// lane (laneBells) or none (its client rings the rings' doorbells).
func newSessionMemory(pid int32, maxSockets, lanes int, budget int64, laneBells bool) (_ *sessionMemory, err error) {
	l, err := shmsess.NewLayout(maxSockets, lanes, budget)
	if err != nil {
		return nil, err
	}
	m := &sessionMemory{lanes: map[*ring.Ring]*ring.Lane{}}
	m.memfd, m.mem, err = shmq.CreateMemfd(fmt.Sprintf("bypassd-session-%d", pid), int(l.Size))
	if err != nil {
		return nil, fmt.Errorf("session memory of %d bytes (sparse; lower --max-queue-memory if the address space is limited): %w", l.Size, err)
	}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	if m.sess, err = shmsess.Init(m.mem, l); err != nil {
		return nil, err
	}
	m.arena = shmsess.NewArena(l)
	if m.wake, err = shmq.NewBell(); err != nil {
		return nil, fmt.Errorf("client eventfd: %w", err)
	}
	for i := 0; laneBells && i < lanes; i++ {
		b, err := shmq.NewBell()
		if err != nil {
			return nil, fmt.Errorf("lane doorbell: %w", err)
		}
		m.bells = append(m.bells, b)
	}
	return m, nil
}

// adoptSessionMemory takes over the session memory a previous daemon
// handed over (memfd, client eventfd and lane doorbells owned from the
// call on, also on error), with the queue ranges of its live sockets.
// bellfds is empty when the previous daemon had no lane doorbells.
func adoptSessionMemory(memfd, wakefd int, bellfds []int, size int64, maxSlots, lanes int, live []shmsess.Range) (_ *sessionMemory, err error) {
	m := &sessionMemory{memfd: memfd, lanes: map[*ring.Ring]*ring.Lane{}}
	defer func() {
		if err != nil {
			m.close()
		}
	}()
	if m.wake, err = shmq.NewBellFD(wakefd); err != nil { // closes wakefd on error
		for _, fd := range bellfds {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("client eventfd: %w", err)
	}
	// takeover.State's check made sure there is one per lane, or none.
	for i, fd := range bellfds {
		b, err := shmq.NewBellFD(fd) // closes fd on error
		if err != nil {
			for _, fd := range bellfds[i+1:] {
				unix.Close(fd)
			}
			return nil, fmt.Errorf("lane doorbell %d: %w", i, err)
		}
		m.bells = append(m.bells, b)
	}
	var st unix.Stat_t
	if err := unix.Fstat(memfd, &st); err != nil || st.Size != size {
		return nil, fmt.Errorf("session memory: %d bytes, the state says %d (%v)", st.Size, size, err)
	}
	if m.mem, err = shmq.MapMemfd(memfd, int(size)); err != nil {
		return nil, fmt.Errorf("map the session memory: %w", err)
	}
	if m.sess, err = shmsess.Attach(m.mem, maxSlots, lanes); err != nil {
		return nil, err
	}
	if m.arena, err = shmsess.RestoreArena(m.sess.Layout(), live); err != nil {
		return nil, fmt.Errorf("session memory: %w", err)
	}
	return m, nil
}

// lane returns the session's lane on r, registering it on first use.
func (m *sessionMemory) lane(r *ring.Ring, index int) (*ring.Lane, error) {
	if l := m.lanes[r]; l != nil {
		return l, nil
	}
	var bell *shmq.Bell
	if m.bells != nil {
		bell = m.bells[index]
	}
	l, err := r.AddLane(m.sess.Lane(index), m.sess.Layout().MaxSlots, bell)
	if err != nil {
		return nil, err
	}
	m.lanes[r] = l
	return l, nil
}

// queuePair is one socket's place in the session memory.
type queuePair struct {
	slot         int
	txOff, rxOff int64
	queueBytes   int
}

// alloc carves a socket's queues out of the arena and formats their
// headers through the memfd (pwrite), so the daemon's own mapping does not
// fault the pages in: an idle socket costs the daemon no resident memory.
// The TX queue's consumer (the engine) starts armed.
func (m *sessionMemory) alloc(queueBytes int) (queuePair, error) {
	m.reapPumped()
	slot, off, ok := m.arena.Alloc(shmsess.SocketSpan(queueBytes))
	if !ok {
		return queuePair{}, fmt.Errorf("no room in the session memory for another socket with %d-byte queues (%d bytes in use): %w",
			queueBytes, m.arena.Used(), unix.ENOMEM)
	}
	p := queuePair{slot: slot, txOff: off, rxOff: off + shmsess.QueueSpan(queueBytes), queueBytes: queueBytes}
	for _, q := range []struct {
		off   int64
		armed bool
	}{{p.txOff, true}, {p.rxOff, false}} {
		img, err := shmq.HeaderImage(queueBytes, q.armed)
		if err == nil {
			_, err = unix.Pwrite(m.memfd, img, q.off)
		}
		if err != nil {
			m.free(p)
			return queuePair{}, fmt.Errorf("format queue at %d: %w", q.off, err)
		}
	}
	return p, nil
}

// queue returns the memory of the queue at off.
func (m *sessionMemory) queue(off int64, queueBytes int) []byte {
	n := int64(shmq.Size(queueBytes))
	return m.mem[off : off+n : off+n]
}

// free gives a closed socket's pages back to the kernel and its slot and
// range to the arena. No engine may touch them any more.
func (m *sessionMemory) free(p queuePair) {
	span := shmsess.SocketSpan(p.queueBytes)
	_ = unix.Fallocate(m.memfd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, p.txOff, span)
	m.arena.Free(p.slot, p.txOff, span)
}

// close releases the lanes (waiting for their engines), then the memory
// and descriptors. The session's endpoints must be closed already.
func (m *sessionMemory) close() {
	m.stopPumps()
	for _, l := range m.lanes {
		l.Close()
	}
	m.lanes = nil
	for _, b := range m.bells {
		_ = b.Close()
	}
	m.bells = nil
	if m.wake != nil {
		_ = m.wake.Close()
	}
	if m.mem != nil {
		_ = shmq.Unmap(m.mem)
		m.mem = nil
	}
	if m.memfd >= 0 {
		unix.Close(m.memfd)
		m.memfd = -1
	}
}
