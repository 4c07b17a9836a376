package socket

import (
	"testing"
	"time"
)

// The benchmarks run against the fake daemon's loopback engine: they
// measure the shim's own cost per datagram (queueing, wake-ups, locking),
// not a ring's. bench/udpbench compares the shim with kernel sockets
// through a real daemon.

func benchSocket(b *testing.B, poll string) *UDPConn {
	b.Helper()
	b.Setenv(EnvRXPoll, poll)
	d := newFakeDaemon(b)
	c, err := dial(d.path, 2*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	u, err := c.ListenUDPConfig("udp4", local4, ListenConfig{QueueBytes: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	return u
}

// BenchmarkEcho: one datagram through the send queue, the loopback engine
// and the receive queue, then read back.
func BenchmarkEcho(b *testing.B) {
	for _, poll := range []string{"0", "-1"} {
		b.Run("poll="+poll, func(b *testing.B) {
			u := benchSocket(b, poll)
			p := make([]byte, 64)
			buf := make([]byte, 2048)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := u.WriteToUDPAddrPort(p, remote4); err != nil {
					b.Fatal(err)
				}
				if _, _, err := u.ReadFromUDPAddrPort(buf); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkWriteBatch: 64-byte datagrams in batches of 32 while a reader
// drains the echoes.
func BenchmarkWriteBatch(b *testing.B) {
	u := benchSocket(b, "-1")
	msgs := make([][]byte, 32)
	for i := range msgs {
		msgs[i] = make([]byte, 64)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		rm := make([]Message, 64)
		for i := range rm {
			rm[i].Buf = make([]byte, 128)
		}
		for {
			if _, err := u.ReadBatch(rm); err != nil {
				return
			}
		}
	}()
	b.SetBytes(int64(64 * len(msgs)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := u.WriteBatch(msgs, remote4); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	_ = u.Close()
	<-done
}
