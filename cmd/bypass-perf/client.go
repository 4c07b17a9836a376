package main

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// mode is a sockperf mode.
type mode int

const (
	modeServer mode = iota
	modePingPong
	modeUnderLoad
	modeThroughput
)

func (m mode) String() string {
	switch m {
	case modeServer:
		return "server"
	case modePingPong:
		return "ping-pong"
	case modeUnderLoad:
		return "under-load"
	case modeThroughput:
		return "throughput"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// clientConfig is one client run.
type clientConfig struct {
	Mode   mode
	Server netip.AddrPort
	// Local is the address the client binds (sockperf's --client_ip and
	// --client_port); the zero address means the wildcard of the server's
	// family.
	Local      netip.AddrPort
	MsgSize    int
	Duration   time.Duration
	MPS        int    // messages per second; 0 is --mps=max
	ReplyEvery uint64 // under-load: every ReplyEvery-th message asks for a reply
	FullRTT    bool
	RateLimit  uint32 // SO_MAX_PACING_RATE in bytes/s; 0: not set
	// Batch is how many messages throughput mode hands to the transport per
	// call when it supports batches; 1 is sockperf's one send per message.
	Batch int
	// ReplyTimeout is how long ping-pong waits for one reply before it
	// counts the message as dropped and sends the next (sockperf would
	// wait until the end of the test).
	ReplyTimeout time.Duration
	// SendTime puts each message's send time in its payload (oneway.go).
	SendTime bool
}

// errPacingUnsupported is what --rate-limit gives with a bypassd that
// cannot pace (EOPNOTSUPP: a version from before packet pacing).
var errPacingUnsupported = errors.New("this bypassd cannot pace (a version without packet pacing): upgrade bypassd or drop --rate-limit")

// clock is a monotonic nanosecond clock private to the run.
type clock struct{ epoch time.Time }

func newClock() clock                { return clock{epoch: time.Now()} }
func (c clock) now() int64           { return int64(time.Since(c.epoch)) }
func (c clock) at(t int64) time.Time { return c.epoch.Add(time.Duration(t)) }

// pacer spaces sends at a fixed rate in software. It spins for short waits
// (a sleep cannot hit microsecond slots) and sleeps for long ones so a low
// rate does not burn a core. The spin does not yield (runtime.Gosched): a
// goroutine that keeps putting itself on the global run queue keeps the
// other Ps finding work there, so none of them blocks in the netpoller, and
// a receiving goroutine's datagram is noticed only by sysmon's 10 ms poll.
// That made under-load report milliseconds where sockperf measured 17 µs.
type pacer struct {
	start  int64
	period float64 // nanoseconds per message
	n      uint64
}

const (
	spinBelow = 2 * time.Millisecond
	sleepSlop = time.Millisecond
)

// wait blocks until the next message is due and reports whether it is due
// before end (and no stop was requested). When it is not, it waits until end,
// so a paced run lasts its full duration like sockperf's. A non-nil poll is
// called on every turn of the wait, which then never sleeps; an error from
// it ends the wait (false) and is returned.
func (p *pacer) wait(c clock, end int64, stop *atomic.Bool, poll func() error) (bool, error) {
	due := p.start + int64(float64(p.n)*p.period)
	p.n++
	last := due >= end
	if last {
		due = end
	}
	for {
		if stop.Load() {
			return false, nil
		}
		if poll != nil {
			if err := poll(); err != nil {
				return false, err
			}
		}
		d := due - c.now()
		if d <= 0 {
			return !last, nil
		}
		if poll == nil && time.Duration(d) > spinBelow {
			time.Sleep(time.Duration(d) - sleepSlop)
		}
	}
}

// skip advances the schedule by n messages without waiting (batches).
func (p *pacer) skip(n int) { p.n += uint64(n) }

// runClient runs one ping-pong, under-load or throughput test against the
// server and prints sockperf's output for it.
func runClient(ctx context.Context, cfg clientConfig, tr Transport, p *printer) error {
	if cfg.Mode != modePingPong && cfg.Mode != modeUnderLoad && cfg.Mode != modeThroughput {
		return fmt.Errorf("%v is not a client mode", cfg.Mode)
	}
	if cfg.MsgSize < headerSize || cfg.MsgSize > maxMessage {
		return fmt.Errorf("message size %d: must be %d..%d", cfg.MsgSize, headerSize, maxMessage)
	}
	if cfg.Duration <= 0 {
		return fmt.Errorf("test duration %v: must be positive", cfg.Duration)
	}
	if cfg.ReplyTimeout <= 0 {
		cfg.ReplyTimeout = 100 * time.Millisecond
	}
	if cfg.ReplyEvery == 0 || cfg.Mode == modePingPong {
		cfg.ReplyEvery = 1
	}
	if cfg.Batch < 1 {
		cfg.Batch = 1
	}
	local := cfg.Local
	if !local.Addr().IsValid() {
		local = netip.AddrPortFrom(wildcard(cfg.Server.Addr()), local.Port())
	}
	conn, err := tr.ListenUDP(networkFor(cfg.Server.Addr()), local)
	if err != nil {
		return fmt.Errorf("open client socket on %v (%s): %w", local, tr.Name(), err)
	}
	defer conn.Close()
	if cfg.RateLimit > 0 {
		if err := setRateLimit(conn, cfg.RateLimit); err != nil {
			return err
		}
		p.linef("succeed to set sock-SO_MAX_PACING_RATE")
	}

	// sockperf's banner, so logs of both tools look alike.
	if cfg.Mode == modeThroughput {
		p.raw("sockperf[CLIENT] send on:\n")
	} else {
		p.raw("sockperf[CLIENT] send on:")
		p.linef("using recvfrom() to block on socket(s)")
		p.raw("\n")
	}
	p.raw(fmt.Sprintf("[%2d] IP = %-15s PORT = %5d # UDP\n", 0, cfg.Server.Addr(), cfg.Server.Port()))
	p.linef("Starting test...")

	// A cancelled ctx (SIGINT, SIGTERM) ends the test early but still
	// prints its statistics, like sockperf; past deadlines unblock a
	// waiting read and a send waiting for queue room.
	var stop atomic.Bool
	watchDone := make(chan struct{})
	defer close(watchDone)
	go func() {
		select {
		case <-ctx.Done():
			stop.Store(true)
			past := time.Unix(1, 0)
			_ = conn.SetReadDeadline(past)
			if wd, ok := conn.(interface{ SetWriteDeadline(time.Time) error }); ok {
				_ = wd.SetWriteDeadline(past)
			}
		case <-watchDone:
		}
	}()

	c := newClock()
	switch cfg.Mode {
	case modePingPong:
		run, err := pingPong(cfg, conn, c, &stop)
		if err != nil {
			return err
		}
		finish(p, &stop)
		writeLatencySummary(p, summarize(run, cfg.FullRTT))
	case modeUnderLoad:
		run, err := underLoad(cfg, conn, c, &stop)
		if err != nil {
			return err
		}
		finish(p, &stop)
		writeLatencySummary(p, summarize(run, cfg.FullRTT))
	case modeThroughput:
		sent, dur, err := throughput(cfg, conn, c, &stop)
		if err != nil {
			return err
		}
		finish(p, &stop)
		if sent == 0 {
			p.linef("No messages were sent")
		} else {
			writeStreamSummary(p, summarizeStream(sent, dur, cfg.MsgSize, cfg.MPS))
		}
	default:
		return fmt.Errorf("%v is not a client mode", cfg.Mode)
	}
	return p.err
}

// finish prints why the test ended.
func finish(p *printer, stop *atomic.Bool) {
	if stop.Load() {
		p.linef("Test end (interrupted by user)")
	} else {
		p.linef("Test end (interrupted by timer)")
	}
	p.linef("Test ended")
}

// setRateLimit applies --rate-limit. Kernel sockets report their own
// errors; the shim's "operation not supported" means the daemon cannot pace
// yet, which is said plainly.
func setRateLimit(conn Conn, rate uint32) error {
	pc, ok := conn.(Pacer)
	if !ok {
		return errPacingUnsupported
	}
	err := pc.SetMaxPacingRate(rate)
	if err == nil {
		return nil
	}
	if _, kernel := conn.(*kernelConn); !kernel && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.ENOPROTOOPT)) {
		return errPacingUnsupported
	}
	return fmt.Errorf("set --rate-limit %d bytes/s (SO_MAX_PACING_RATE): %w", rate, err)
}

// transientSendError reports errors after which a UDP sender simply goes on
// (the datagram is lost, as on a congested NIC). A send timeout comes only
// from the past deadline an interruption sets; the loop then stops.
func transientSendError(err error) bool {
	return errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.EAGAIN) || isTimeout(err)
}

// pingPong sends one message at a time (flags CLIENT|PONG) and waits for its
// reply before sending the next.
func pingPong(cfg clientConfig, conn Conn, c clock, stop *atomic.Bool) (*latencyRun, error) {
	msg := newMessage(cfg.MsgSize, flagClient|flagPong)
	rbuf := make([]byte, maxMessage+1)
	run := &latencyRun{ReplyEvery: 1}
	var pace *pacer
	start := c.now()
	end := start + int64(cfg.Duration)
	if cfg.MPS > 0 {
		pace = &pacer{start: start, period: 1e9 / float64(cfg.MPS)}
	}
	timeout := int64(cfg.ReplyTimeout)
	// The read deadline is refreshed only when less than half the reply
	// timeout is left, so most messages pay no SetReadDeadline.
	var deadline int64
	var seq uint64
	for !stop.Load() {
		if pace != nil {
			if ok, _ := pace.wait(c, end, stop, nil); !ok {
				break
			}
		}
		t0 := c.now()
		if t0 >= end {
			break
		}
		seq++
		putSeq(msg, seq)
		if cfg.SendTime {
			putSendTime(msg)
		}
		if _, err := conn.WriteToUDPAddrPort(msg, cfg.Server); err != nil && !transientSendError(err) {
			return nil, fmt.Errorf("send to %v: %w", cfg.Server, err)
		}
		run.TX = append(run.TX, t0)
		for {
			if deadline-c.now() < timeout/2 {
				deadline = c.now() + timeout
				if err := conn.SetReadDeadline(c.at(deadline)); err != nil {
					return nil, fmt.Errorf("set read deadline: %w", err)
				}
			}
			n, from, err := conn.ReadFromUDPAddrPort(rbuf)
			t1 := c.now()
			if err != nil {
				if !isTimeout(err) {
					return nil, fmt.Errorf("receive from %v: %w", cfg.Server, err)
				}
				if stop.Load() || t1-t0 >= timeout/2 {
					break // lost: counted as dropped if inside the valid window
				}
				continue
			}
			h, ok := checkReply(rbuf[:n], from, cfg.Server)
			if !ok || h.Seq > seq {
				continue
			}
			run.Replies = append(run.Replies, reply{Seq: h.Seq, At: t1})
			if h.Seq == seq {
				break
			}
		}
	}
	run.Start, run.End, run.Sent = start, c.now(), seq
	return run, nil
}

// checkReply reports whether a datagram is a well-formed reply from the
// server (a reply has CLIENT cleared; WARMUP replies are not counted).
func checkReply(b []byte, from, server netip.AddrPort) (header, bool) {
	if from.Port() != server.Port() || from.Addr().Unmap() != server.Addr().Unmap() {
		return header{}, false
	}
	h, err := parseHeader(b)
	if err != nil || h.Flags&(flagClient|flagWarmup) != 0 {
		return h, false
	}
	return h, true
}

// underLoad sends at --mps with every ReplyEvery-th message asking for a
// reply. Replies are collected by the sending goroutine itself while it
// waits for its next send slot when the socket can be read without waiting
// (Poller), else by a second goroutine.
func underLoad(cfg clientConfig, conn Conn, c clock, stop *atomic.Bool) (*latencyRun, error) {
	if p, ok := conn.(Poller); ok {
		return underLoadPolling(cfg, conn, p, c, stop)
	}
	type result struct {
		replies []reply
		err     error
	}
	var receiving atomic.Bool // false once the sender is done
	receiving.Store(true)
	done := make(chan result, 1)
	go func() {
		var r result
		rbuf := make([]byte, maxMessage+1)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(rbuf)
			t := c.now()
			if err != nil {
				if isTimeout(err) && receiving.Load() && !stop.Load() {
					continue
				}
				if !isTimeout(err) {
					r.err = fmt.Errorf("receive from %v: %w", cfg.Server, err)
				}
				done <- r
				return
			}
			if h, ok := checkReply(rbuf[:n], from, cfg.Server); ok && h.Flags&flagPong != 0 {
				r.replies = append(r.replies, reply{Seq: h.Seq, At: t})
			}
		}
	}()
	run, sendErr := underLoadSend(cfg, conn, c, stop, nil)
	// Like sockperf, give the replies to the last requests 100 ms.
	receiving.Store(false)
	if err := conn.SetReadDeadline(time.Now().Add(100 * time.Millisecond)); err != nil && sendErr == nil {
		sendErr = fmt.Errorf("set read deadline: %w", err)
		_ = conn.Close() // unblocks the receiver
	}
	r := <-done
	if sendErr != nil {
		return nil, sendErr
	}
	if r.err != nil {
		return nil, r.err
	}
	run.Replies = r.replies
	return run, nil
}

// underLoadPolling is under-load in one goroutine: between sends it reads
// whatever replies are queued, as a single-threaded C client would. A
// receiving goroutine's wake-up goes through Go's scheduler, which on a
// busy 2-CPU machine added milliseconds to what was measured.
func underLoadPolling(cfg clientConfig, conn Conn, p Poller, c clock, stop *atomic.Bool) (*latencyRun, error) {
	rbuf := make([]byte, maxMessage+1)
	var replies []reply
	poll := func() error {
		for {
			n, from, ok, err := p.TryRead(rbuf)
			if err != nil {
				return fmt.Errorf("receive from %v: %w", cfg.Server, err)
			}
			if !ok {
				return nil
			}
			t := c.now()
			if h, ok := checkReply(rbuf[:n], from, cfg.Server); ok && h.Flags&flagPong != 0 {
				replies = append(replies, reply{Seq: h.Seq, At: t})
			}
		}
	}
	run, err := underLoadSend(cfg, conn, c, stop, poll)
	if err != nil {
		return nil, err
	}
	// Like sockperf, give the replies to the last requests 100 ms.
	for limit := c.now() + int64(100*time.Millisecond); c.now() < limit && !stop.Load(); {
		if err := poll(); err != nil {
			return nil, err
		}
	}
	run.Replies = replies
	return run, nil
}

// underLoadSend is under-load's sender; poll (if not nil) runs while it
// waits for each send slot.
func underLoadSend(cfg clientConfig, conn Conn, c clock, stop *atomic.Bool, poll func() error) (*latencyRun, error) {
	msg := newMessage(cfg.MsgSize, flagClient)
	run := &latencyRun{ReplyEvery: cfg.ReplyEvery}
	start := c.now()
	end := start + int64(cfg.Duration)
	var pace *pacer
	if cfg.MPS > 0 {
		pace = &pacer{start: start, period: 1e9 / float64(cfg.MPS)}
	}
	var seq uint64
	var sendErr error
	for !stop.Load() {
		if pace != nil {
			ok, err := pace.wait(c, end, stop, poll)
			if err != nil {
				return nil, err
			}
			if !ok {
				break
			}
		} else if poll != nil {
			if err := poll(); err != nil {
				return nil, err
			}
		}
		t0 := c.now()
		if t0 >= end {
			break
		}
		seq++
		putSeq(msg, seq)
		pong := seq%cfg.ReplyEvery == 0
		if pong {
			putFlags(msg, flagClient|flagPong)
		}
		if cfg.SendTime {
			putSendTime(msg)
		}
		_, err := conn.WriteToUDPAddrPort(msg, cfg.Server)
		if pong {
			run.TX = append(run.TX, t0)
			putFlags(msg, flagClient)
		}
		if err != nil && !transientSendError(err) {
			sendErr = fmt.Errorf("send to %v: %w", cfg.Server, err)
			break
		}
	}
	run.Start, run.End, run.Sent = start, c.now(), seq
	return run, sendErr
}

// throughput sends messages that ask for no reply (flags CLIENT) as fast as
// --mps allows and reports how many it sent and in how long.
func throughput(cfg clientConfig, conn Conn, c clock, stop *atomic.Bool) (uint64, time.Duration, error) {
	batch := 1
	bc, canBatch := conn.(BatchConn)
	if canBatch && cfg.Batch > 1 {
		batch = cfg.Batch
	}
	msgs := make([][]byte, batch)
	for i := range msgs {
		msgs[i] = newMessage(cfg.MsgSize, flagClient)
	}
	start := c.now()
	end := start + int64(cfg.Duration)
	var pace *pacer
	if cfg.MPS > 0 {
		pace = &pacer{start: start, period: 1e9 / float64(cfg.MPS)}
	}
	var seq uint64
	for !stop.Load() {
		if pace != nil {
			if ok, _ := pace.wait(c, end, stop, nil); !ok {
				break
			}
			pace.skip(batch - 1)
		}
		if c.now() >= end {
			break
		}
		if batch == 1 {
			putSeq(msgs[0], seq+1)
			if cfg.SendTime {
				putSendTime(msgs[0])
			}
			if _, err := conn.WriteToUDPAddrPort(msgs[0], cfg.Server); err != nil && !transientSendError(err) {
				return seq, time.Duration(c.now() - start), fmt.Errorf("send to %v: %w", cfg.Server, err)
			}
			seq++
			continue
		}
		for i, m := range msgs {
			putSeq(m, seq+uint64(i)+1)
			if cfg.SendTime {
				putSendTime(m)
			}
		}
		n, err := bc.WriteBatch(msgs, cfg.Server)
		// The sequence numbers of unsent messages are reused: the server
		// sees no gap for them.
		seq += uint64(n)
		if err != nil && !transientSendError(err) {
			return seq, time.Duration(c.now() - start), fmt.Errorf("send to %v: %w", cfg.Server, err)
		}
	}
	return seq, time.Duration(c.now() - start), nil
}
