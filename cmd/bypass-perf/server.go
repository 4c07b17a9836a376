package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"sync/atomic"
)

// serverStats are the server's counters; they may be read while it runs.
type serverStats struct {
	// Received counts well-formed requests (WARMUP ones excluded), as
	// sockperf's "messages received and handled".
	Received atomic.Uint64
	// Replied counts replies sent; ReplyErrors replies that could not be.
	Replied, ReplyErrors atomic.Uint64
	// Invalid counts dropped datagrams: runts, and headers whose length is
	// out of range or does not match the datagram.
	Invalid atomic.Uint64
	// Ignored counts well-formed datagrams that are not requests (CLIENT
	// clear, e.g. another server's replies) or are WARMUP messages.
	Ignored atomic.Uint64
}

// serverBatch is how many datagrams one batch read may return.
const serverBatch = 32

// runServer answers sockperf clients on addr until ctx is cancelled, printing
// what sockperf's server prints.
func runServer(ctx context.Context, addr netip.AddrPort, oneWay bool, tr Transport, p *printer) error {
	conn, err := tr.ListenUDP(networkFor(addr.Addr()), addr)
	if err != nil {
		return fmt.Errorf("listen on %v (%s): %w", addr, tr.Name(), err)
	}
	var ow *oneWayStats
	if oneWay {
		if err := enableRXTimestamps(conn); err != nil {
			conn.Close()
			return err
		}
		ow = &oneWayStats{}
	}
	p.linef("[SERVER] listen on:")
	p.raw(fmt.Sprintf("[%2d] IP = %-15s PORT = %5d # UDP\n", 0, addr.Addr(), addr.Port()))
	p.linef("[tid %d] using recvfrom() to block on socket(s)", os.Getpid())
	if p.err != nil {
		conn.Close()
		return p.err
	}
	// Closing the socket is what stops serve: it unblocks the read.
	var stopped atomic.Bool
	watchDone := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
			stopped.Store(true)
			conn.Close()
		case <-watchDone:
		}
	}()
	var st serverStats
	err = serve(conn, &st, ow)
	close(watchDone)
	conn.Close()
	if err != nil && !(stopped.Load() && errors.Is(err, net.ErrClosed)) {
		return err
	}
	p.linef("Test end (interrupted by user)")
	if n := st.Received.Load(); n == 0 {
		p.linef("No messages were received on the server.")
	} else {
		p.linef("Total %d messages received and handled", n)
	}
	if n := st.Invalid.Load(); n > 0 {
		p.linef("%d invalid datagrams dropped (runt, or header length not matching the datagram)", n)
	}
	if n := st.ReplyErrors.Load(); n > 0 {
		p.linef("%d replies could not be sent", n)
	}
	if ow != nil {
		ow.write(p)
	}
	return p.err
}

// serve answers requests on conn until reading from it fails (Close makes it
// return an error matching net.ErrClosed). A request is replied to only when
// it asks for it (PONG): the same bytes with CLIENT cleared, to the sender.
// With ow, every request's one-way latency is recorded (batch reads carry
// the receive stamps).
func serve(conn Conn, st *serverStats, ow *oneWayStats) error {
	if bc, ok := conn.(BatchConn); ok {
		msgs := make([]Datagram, serverBatch)
		for i := range msgs {
			msgs[i].Buf = make([]byte, maxMessage+1)
		}
		for {
			n, err := bc.ReadBatch(msgs)
			for i := range n {
				m := &msgs[i]
				if handle(conn, m.Buf[:m.N], m.Addr, st) && ow != nil {
					ow.add(m.Buf[:m.N], m.RX, m.RXHardware)
				}
			}
			if err != nil && !isTimeout(err) {
				return err
			}
		}
	}
	// One byte more than the largest valid message, so an oversized
	// datagram cannot pass for a valid one by truncation.
	buf := make([]byte, maxMessage+1)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil {
			if isTimeout(err) {
				continue
			}
			return err
		}
		handle(conn, buf[:n], from, st)
	}
}

// handle processes one datagram and reports whether it was a counted
// request; it may rewrite its flags in place.
func handle(conn Conn, b []byte, from netip.AddrPort, st *serverStats) bool {
	h, err := parseHeader(b)
	if err != nil {
		st.Invalid.Add(1)
		return false
	}
	if h.Flags&flagClient == 0 || h.Flags&flagWarmup != 0 {
		st.Ignored.Add(1)
		return false
	}
	st.Received.Add(1)
	if h.Flags&flagPong == 0 {
		return true
	}
	putFlags(b, h.Flags&^flagClient)
	if _, err := conn.WriteToUDPAddrPort(b, from); err != nil {
		st.ReplyErrors.Add(1)
		return true
	}
	st.Replied.Add(1)
	return true
}
