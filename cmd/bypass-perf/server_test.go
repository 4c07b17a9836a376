package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"
)

var loopback = netip.MustParseAddrPort("127.0.0.1:0")

// startServer runs serve on a kernel socket on 127.0.0.1 (any port) until the
// test ends.
func startServer(t *testing.T, wrap func(Conn) Conn) (netip.AddrPort, *serverStats) {
	t.Helper()
	conn, err := kernelTransport{}.ListenUDP("udp4", loopback)
	if err != nil {
		t.Fatal(err)
	}
	addr := conn.(*kernelConn).LocalAddr().(*net.UDPAddr).AddrPort()
	var sc Conn = conn
	if wrap != nil {
		sc = wrap(conn)
	}
	st := new(serverStats)
	done := make(chan error, 1)
	go func() { done <- serve(sc, st, nil) }()
	t.Cleanup(func() {
		conn.Close()
		if err := <-done; !errors.Is(err, net.ErrClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return addr, st
}

// peer is a plain kernel socket for poking the server.
func peer(t *testing.T) *net.UDPConn {
	t.Helper()
	c, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(loopback))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func rawMsg(seq uint64, flags uint16, length uint32, size int) []byte {
	b := make([]byte, size)
	if size >= 8 {
		binary.BigEndian.PutUint64(b, seq)
	}
	if size >= 10 {
		binary.BigEndian.PutUint16(b[8:], flags)
	}
	if size >= 14 {
		binary.BigEndian.PutUint32(b[10:], length)
	}
	for i := 14; i < size; i++ {
		b[i] = byte(i * 7)
	}
	return b
}

// TestServerReplies: a request asking for a reply gets the same bytes back
// with CLIENT cleared, to the sender; everything else gets nothing, and bad
// datagrams (runts, wrong or zero length) are counted and dropped.
func TestServerReplies(t *testing.T) {
	t.Parallel()
	srv, st := startServer(t, nil)
	c := peer(t)
	send := func(b []byte) {
		t.Helper()
		if _, err := c.WriteToUDPAddrPort(b, srv); err != nil {
			t.Fatal(err)
		}
	}
	bad := [][]byte{
		{},                             // empty
		{1, 2, 3},                      // runt
		rawMsg(1, 3, 0, 13),            // runt of 13
		rawMsg(2, 3, 0, 14),            // length 0 (can wedge a real sockperf)
		rawMsg(3, 3, 0, 64),            // length 0, longer datagram
		rawMsg(4, 3, 100, 64),          // length above the datagram
		rawMsg(5, 3, 32, 64),           // length below: two messages in one
		rawMsg(6, 3, maxMessage+1, 64), // length out of range
		rawMsg(7, 3, ^uint32(0), 64),   // length max
		rawMsg(8, 0x7, 64, 64),         /*warm*/ // WARMUP: ignored
		rawMsg(9, flagPong, 64, 64),    // not from a client: ignored
	}
	for _, b := range bad {
		send(b)
	}
	send(rawMsg(10, flagClient, 64, 64)) // counted, no reply wanted
	want := rawMsg(11, flagClient|flagPong, 1400, 1400)
	send(want)

	// Loopback keeps order and the server answers in order, so the first
	// reply must be the one to seq 11.
	buf := make([]byte, 70000)
	if err := c.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		t.Fatal(err)
	}
	n, from, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	if from != srv {
		t.Errorf("reply from %v, want %v", from, srv)
	}
	want[9] = flagPong // flags low byte: CLIENT cleared
	if !bytes.Equal(buf[:n], want) {
		h, _ := parseHeader(buf[:n])
		t.Fatalf("reply %d bytes %+v, want the request with CLIENT cleared", n, h)
	}
	// One more round trip proves nothing else was queued before it.
	send(rawMsg(12, flagClient|flagPong, 14, 14))
	n, _, err = c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	if h, err := parseHeader(buf[:n]); err != nil || h.Seq != 12 || h.Flags != flagPong {
		t.Fatalf("second reply %+v (%v), want seq 12 flags PONG", h, err)
	}
	// The server counts a reply after sending it: give it a moment.
	for end := time.Now().Add(2 * time.Second); st.Replied.Load() < 2 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if got := st.Invalid.Load(); got != 9 {
		t.Errorf("invalid %d, want 9", got)
	}
	if got := st.Ignored.Load(); got != 2 {
		t.Errorf("ignored %d, want 2", got)
	}
	if got, rep := st.Received.Load(), st.Replied.Load(); got != 3 || rep != 2 {
		t.Errorf("received %d replied %d, want 3 and 2", got, rep)
	}
}

// TestServerLargest: the largest sockperf message round-trips byte-exact.
func TestServerLargest(t *testing.T) {
	t.Parallel()
	srv, _ := startServer(t, nil)
	c := peer(t)
	msg := rawMsg(1, flagClient|flagPong, maxMessage, maxMessage)
	if _, err := c.WriteToUDPAddrPort(msg, srv); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 70000)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	n, _, err := c.ReadFromUDPAddrPort(buf)
	if err != nil {
		t.Fatal(err)
	}
	msg[9] = flagPong
	if !bytes.Equal(buf[:n], msg) {
		t.Fatalf("reply of %d bytes differs from the request", n)
	}
}

// TestRunServerOutput: runServer prints sockperf's server lines and stops on
// cancellation.
func TestRunServerOutput(t *testing.T) {
	t.Parallel()
	ln, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(loopback))
	if err != nil {
		t.Fatal(err)
	}
	// The port is free again once closed; runServer rebinds it.
	addr := ln.LocalAddr().(*net.UDPAddr).AddrPort()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- runServer(ctx, addr, false, kernelTransport{}, &printer{w: &out}) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	c := peer(t)
	buf := make([]byte, 100)
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	// The server may not be bound yet: retry until the first reply.
	for i := 0; ; i++ {
		if _, err := c.WriteToUDPAddrPort(rawMsg(uint64(i+1), 3, 14, 14), addr); err != nil {
			t.Fatal(err)
		}
		_ = c.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, _, err := c.ReadFromUDPAddrPort(buf); err == nil {
			break
		} else if i > 100 {
			t.Fatalf("server on %v never answered: %v", addr, err)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	done <- nil // for the cleanup
	s := out.String()
	for _, want := range []string{"sockperf: [SERVER] listen on:", "IP = 127.0.0.1", "Test end (interrupted by user)", "messages received and handled"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
