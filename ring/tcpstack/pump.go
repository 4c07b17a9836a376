package tcpstack

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/waiter"

	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/stream"
)

// maxChunk bounds one data record the pump writes into an RX queue.
const maxChunk = 64 << 10

// finishTimeout bounds how long a closed socket's pump keeps writing the
// data the client queued before its close into a peer that does not take
// it; then the connection is reset.
const finishTimeout = time.Minute

// PumpConfig is the daemon's side of a client's stream socket.
type PumpConfig struct {
	// TX and RX are the socket's queues: the pump consumes TX (stream
	// records from the client) and produces RX (to the client).
	TX, RX *shmq.Queue
	// RXWait and TXWait wake the client: RX has records, TX has room
	// (the daemon gives the socket's event in the session memory for
	// both).
	RXWait, TXWait interface{ Wake() error }
	// Bell wakes the pump: the client rings it after publishing TX or
	// releasing RX room (it is the socket's doorbell), the stack's
	// events too.
	Bell *Bell
	// Connecting: the endpoint's handshake is going on; the pump reports
	// its end as a Connected or Error event before any data.
	Connecting bool
	// Done is called once the pump stopped touching the queues, with
	// abort true when the connection must be reset rather than closed.
	Done func(abort bool)
}

// PumpStats count one pump's traffic.
type PumpStats struct {
	// RXBytes went to the client, TXBytes came from it.
	RXBytes, TXBytes atomic.Uint64
	// RXRecords and TXRecords count data records.
	RXRecords, TXRecords atomic.Uint64
	// Wakeups counts the pump's sleeps on its doorbell: what it costs
	// while a connection waits (a closed window either way, an idle
	// peer) stays bounded by the events that come, it never spins.
	Wakeups atomic.Uint64
}

// Pump moves one connection's byte stream between its stack endpoint and a
// client socket's queues, in a goroutine of its own, until Finish or
// Abort: client TX data records are written into the endpoint, its EOF
// event becomes a FIN; what the endpoint receives becomes RX data records,
// the peer's FIN an EOF event and a failure an Error event.
type Pump struct {
	ep  *Endpoint
	cfg PumpConfig

	finish, abort atomic.Bool
	// sleeping: the pump is about to wait on Bell, so the stack's events
	// must ring it (otherwise they need not: the pump looks anyway).
	sleeping atomic.Bool
	done     chan struct{}
	stats    PumpStats

	// mu serializes the work on the queues and the endpoint: the pump
	// goroutine's and the engine's (Wake). It guards the fields below.
	mu sync.Mutex
	// stopped: the pump gave its queues back; Wake must not touch them.
	stopped    bool
	connecting bool
	txOff      int  // bytes of the current TX data record already written
	txBlocked  bool // the endpoint's send buffer is full
	wrFailed   bool // writes failed: queued data is dropped (the read side reports why)
	txFailed   bool // failTX told the client
	// connErr is the connection's error a failed write or the end of
	// the handshake took: gVisor hands a connection's error (a timeout,
	// a reset) to the first call that asks, so a Read after it sees only
	// the end of the stream.
	connErr error
	rxWant  int  // RX room the pump waits for (0: none)
	rxDone  bool // EOF or Error reported: nothing more to the client
	pending *stream.Event
	rdr     bytes.Reader
}

// StartPump starts pumping between ep and the queues of cfg.
func StartPump(ep *Endpoint, cfg PumpConfig) *Pump {
	p := &Pump{ep: ep, cfg: cfg, done: make(chan struct{}), connecting: cfg.Connecting}
	go p.run()
	return p
}

// Stats returns the pump's counters.
func (p *Pump) Stats() *PumpStats { return &p.stats }

// Finish makes the pump write what the client queued, then close the
// connection the orderly way and stop (the client closed its socket).
func (p *Pump) Finish() {
	p.finish.Store(true)
	_ = p.cfg.Bell.Wake()
}

// Abort makes the pump stop at once and the connection be reset (the
// client is gone, or set SO_LINGER 0).
func (p *Pump) Abort() {
	p.abort.Store(true)
	_ = p.cfg.Bell.Wake()
}

// Wake does the pump's work now, on the caller's goroutine, unless the
// pump's goroutine is doing it: the engine calls it when the client
// announces the socket (TX records queued, RX room freed), so the
// client's bytes go into the stack, and its segments are queued for the
// engine, within the engine's pass, without waking the pump's goroutine
// and waiting for it (two goroutine hand-offs per request otherwise).
// What the pump's goroutine has to watch afterwards (a full RX queue or
// send buffer, a broken queue, a close) wakes it.
func (p *Pump) Wake() error {
	if p.finish.Load() || p.abort.Load() || !p.mu.TryLock() {
		return p.cfg.Bell.Wake()
	}
	if p.stopped {
		p.mu.Unlock()
		return nil
	}
	_, corrupt := p.step()
	watch := corrupt || p.rxWant > 0 || p.txBlocked
	// The client's announcement consumed the TX queue's waiting flag; a
	// sleeping pump goroutine relies on it for the next one, so arm it
	// again (records that came in between are the goroutine's).
	if p.sleeping.Load() && p.cfg.TX.ArmReadWait() && !p.connecting {
		watch = true
	}
	p.mu.Unlock()
	if watch {
		return p.cfg.Bell.Wake()
	}
	return nil
}

// Wait waits until the pump stopped.
func (p *Pump) Wait() { <-p.done }

func (p *Pump) run() {
	abort := true
	defer func() {
		p.mu.Lock()
		p.stopped = true
		p.mu.Unlock()
		close(p.done)
		p.cfg.Done(abort)
	}()
	e := waiter.NewFunctionEntry(waiter.ReadableEvents|waiter.WritableEvents|waiter.EventErr|waiter.EventHUp, func(waiter.EventMask) {
		if p.sleeping.Load() {
			_ = p.cfg.Bell.Wake()
		}
	})
	p.ep.WQ.EventRegister(&e)
	defer p.ep.WQ.EventUnregister(&e)
	var finishBy time.Time
	for {
		if p.abort.Load() {
			return
		}
		p.mu.Lock()
		work, corrupt := p.step()
		drained := !p.cfg.TX.Readable() || p.wrFailed
		p.mu.Unlock()
		if corrupt {
			return
		}
		if p.finish.Load() {
			if finishBy.IsZero() {
				finishBy = time.Now().Add(finishTimeout)
			}
			if drained {
				abort = false
				return
			}
			if time.Now().After(finishBy) {
				return
			}
		}
		if work {
			continue
		}
		p.sleep(!finishBy.IsZero())
	}
}

// sleep waits on the bell after announcing it to the client (both queues)
// and to the stack, re-checking everything it announced. A finishing pump
// wakes every 100 ms to check its deadline.
func (p *Pump) sleep(finishing bool) {
	tx, rx := p.cfg.TX, p.cfg.RX
	p.sleeping.Store(true)
	defer p.sleeping.Store(false)
	p.mu.Lock()
	ready := tx.ArmReadWait() && !p.txBlocked && !p.connecting
	if p.rxWant > 0 && rx.ArmWriteWait(p.rxWant) {
		ready = true
	}
	if p.readable() || p.txBlocked && p.ep.EP.Readiness(waiter.WritableEvents) != 0 ||
		p.connecting && !p.ep.Connecting() || p.finish.Load() && !finishing || p.abort.Load() {
		ready = true
	}
	p.mu.Unlock()
	if !ready {
		var deadline time.Time
		if finishing {
			deadline = time.Now().Add(100 * time.Millisecond)
		}
		_ = p.cfg.Bell.Wait(deadline)
		p.stats.Wakeups.Add(1)
	}
	p.mu.Lock()
	tx.DisarmReadWait()
	rx.DisarmWriteWait()
	p.mu.Unlock()
}

// readable reports whether the endpoint has something for the client
// that the pump can take now.
func (p *Pump) readable() bool {
	if p.rxDone || p.connecting || p.rxWant > 0 {
		return p.pending != nil && p.rxWant == 0
	}
	return p.pending != nil || p.ep.EP.Readiness(waiter.ReadableEvents) != 0
}

// step does one round of work both ways; corrupt reports a client queue
// that cannot be trusted any more.
func (p *Pump) step() (work, corrupt bool) {
	if p.connecting {
		if p.ep.Connecting() {
			return false, false
		}
		p.connecting = false
		work = true
		err := p.ep.Err()
		if errors.Is(err, unix.ECONNRESET) {
			// Established, then reset before the pump looked (a
			// reset in SYN-SENT is ECONNREFUSED): the connect
			// succeeded, as Linux's does, and a read reports the
			// reset.
			p.connErr, err = err, nil
		}
		if err != nil {
			p.pending = &stream.Event{Kind: stream.Error, Errno: uint32(errnoOf(err))}
		} else {
			local, _ := p.ep.Addrs()
			p.pending = &stream.Event{Kind: stream.Connected, Addr: local}
		}
	}
	w, corrupt := p.fromClient()
	if corrupt {
		return false, true
	}
	if p.wrFailed {
		e := unix.EPIPE
		if p.connErr != nil {
			e = errnoOf(p.connErr)
		}
		p.failTX(e)
	}
	work = w || work
	w, corrupt = p.toClient()
	return w || work, corrupt
}

// failTX tells the client, once, that its writes go nowhere any more (the
// connection failed): its TX queue's consumer error, and a wake-up for a
// writer waiting for room. A client that only writes learns of a reset
// at its next write, as from a kernel socket, not at its next read.
func (p *Pump) failTX(e unix.Errno) {
	if p.txFailed || e == 0 {
		return
	}
	p.txFailed = true
	p.cfg.TX.SetConsumerError(uint32(e))
	_ = p.cfg.TXWait.Wake()
}

func errnoOf(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return unix.EIO
}

// fromClient writes the client's TX records into the endpoint.
func (p *Pump) fromClient() (work, corrupt bool) {
	tx := p.cfg.TX
	p.txBlocked = false
	for {
		rec, typ, err := tx.Peek()
		if err != nil {
			if errors.Is(err, shmq.ErrEmpty) {
				break
			}
			return work, true
		}
		switch typ {
		case stream.TypeData:
			if p.wrFailed || p.txOff >= len(rec) {
				break
			}
			p.rdr.Reset(rec[p.txOff:])
			n, terr := p.ep.EP.Write(&p.rdr, tcpip.WriteOptions{})
			p.txOff += int(n)
			p.stats.TXBytes.Add(uint64(n))
			if n > 0 {
				work = true
			}
			if p.txOff < len(rec) {
				if _, block := terr.(*tcpip.ErrWouldBlock); block || terr == nil {
					p.txBlocked = block
					if block {
						return work, false
					}
					continue
				}
				p.wrFailed = true
				if _, shut := terr.(*tcpip.ErrClosedForSend); !shut {
					p.connErr = Errno(terr)
				}
			}
			p.stats.TXRecords.Add(1)
		case stream.TypeEvent:
			if ev, err := stream.Parse(rec); err == nil && ev.Kind == stream.EOF {
				p.ep.EP.Shutdown(tcpip.ShutdownWrite)
			}
		}
		tx.Advance()
		p.txOff = 0
		work = true
	}
	if tx.Release() {
		_ = p.cfg.TXWait.Wake()
	}
	return work, false
}

// toClient moves what the endpoint received into RX records.
func (p *Pump) toClient() (work, corrupt bool) {
	rx := p.cfg.RX
	defer func() {
		if rx.Publish() {
			_ = p.cfg.RXWait.Wake()
		}
	}()
	p.rxWant = 0
	for {
		if p.pending != nil {
			buf, err := rx.Reserve(stream.EventLen)
			if err != nil {
				if errors.Is(err, shmq.ErrFull) {
					p.rxWant = stream.EventLen
					return work, false
				}
				return work, true
			}
			stream.Put(buf, *p.pending)
			_ = rx.Commit(stream.EventLen, stream.TypeEvent)
			if p.pending.Kind == stream.EOF || p.pending.Kind == stream.Error {
				p.rxDone = true
			}
			if p.pending.Kind == stream.Error {
				p.failTX(unix.Errno(p.pending.Errno))
			}
			p.pending = nil
			work = true
		}
		if p.rxDone || p.connecting || p.ep.EP.Readiness(waiter.ReadableEvents) == 0 {
			return work, false
		}
		avail, _ := p.ep.EP.GetSockOptInt(tcpip.ReceiveQueueSizeOption)
		if avail <= 0 {
			// Readable without data: the end of the stream or an error.
			var none tcpip.SliceWriter
			_, terr := p.ep.EP.Read(&none, tcpip.ReadOptions{})
			switch terr.(type) {
			case nil, *tcpip.ErrWouldBlock:
				return work, false
			case *tcpip.ErrClosedForReceive:
				p.pending = &stream.Event{Kind: stream.EOF}
				if p.connErr != nil {
					p.pending = &stream.Event{Kind: stream.Error, Errno: uint32(errnoOf(p.connErr))}
				}
			default:
				p.pending = &stream.Event{Kind: stream.Error, Errno: uint32(Errno(terr))}
			}
			continue
		}
		size := min(avail, maxChunk, rx.MaxPayload())
		buf, err := rx.Reserve(size)
		if errors.Is(err, shmq.ErrFull) && size > 2048 {
			size = 2048
			buf, err = rx.Reserve(size)
		}
		if err != nil {
			if errors.Is(err, shmq.ErrFull) {
				p.rxWant = size
				return work, false
			}
			return work, true
		}
		w := tcpip.SliceWriter(buf)
		res, terr := p.ep.EP.Read(&w, tcpip.ReadOptions{})
		if res.Count > 0 {
			_ = rx.Commit(res.Count, stream.TypeData)
			p.stats.RXBytes.Add(uint64(res.Count))
			p.stats.RXRecords.Add(1)
			work = true
			continue
		}
		if terr != nil {
			if _, block := terr.(*tcpip.ErrWouldBlock); !block {
				p.pending = &stream.Event{Kind: stream.Error, Errno: uint32(Errno(terr))}
				continue
			}
		}
		return work, false
	}
}
