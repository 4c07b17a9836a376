package socket

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/arrivals"
	"github.com/bypassd/bypassd/internal/netlab"
)

// TestTCPPacing: SO_MAX_PACING_RATE on a TCP connection paces it through
// the ring's pacer. A bulk sender paced at 10 Mbit/s of wire bytes: an
// AF_PACKET capture in the peer namespace (GRO off, kernel receive
// timestamps) sees the connection's frames arrive at that rate, within
// ±1% per 1-second window, and every data frame it saw was paced (the
// ring's paced-frame counter). A fast window always fails; a slow one is
// excused only when the engine reported departures later than the burst
// allowance or the machine was over-committed then (the pattern of the UDP
// pacing tests). Then the rate is removed: no frame is paced any more and
// the connection runs faster; CloseWrite still delivers the FIN after the
// queued bytes.
func TestTCPPacing(t *testing.T) {
	netlab.RequirePriv(t)
	// The engine at real-time priority, as for the UDP pacing tests: a
	// deployment that needs exact pacing on a shared machine runs it so
	// (--engine-priority).
	cfg := daemonConfigForTCP()
	cfg.EnginePriority = 10
	l := newTCPLabConfig(t, cfg)
	// 10 Mbit/s: what the race-instrumented client, pump and stack still
	// supply on a loaded 2-CPU machine (unpaced they did 22 Mbit/s there).
	const kbps = 10_000
	st := l.srv.Rings()[0].Stats()
	late := arrivals.Sample(20*time.Millisecond, st.TXPaceLate.Load)
	defer late.Stop()
	busy := arrivals.MachineBusy()
	defer busy.Stop()
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	var received atomic.Int64
	readDone := make(chan error, 1)
	go func() {
		c, err := kl.Accept()
		if err != nil {
			readDone <- err
			return
		}
		defer c.Close()
		n, err := io.Copy(counter{&received}, c)
		if err == nil && n == 0 {
			err = errors.New("EOF before any byte")
		}
		readDone <- err
	}()
	c, err := l.c.DialTCP("tcp4", netip.AddrPort{}, kl.Addr().(*net.TCPAddr).AddrPort())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.SetMaxPacingRate(kbps * 125); err != nil {
		t.Fatal(err)
	}
	paced0 := st.TXPaced.Load()
	wire := captureTCP(t, l.p.B, l.p.A.Addr4())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	wrote := make(chan error, 1)
	go func() {
		b := make([]byte, 64<<10)
		for ctx.Err() == nil {
			_ = c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
			if _, err := c.Write(b); err != nil && ctx.Err() == nil && !isTimeout(err) {
				wrote <- err
				return
			}
		}
		wrote <- nil
	}()
	// Three 1-s windows from 0.5 s after the first frame; the capture runs
	// on long enough to cover them even when the first frame came late.
	const windows = 3
	time.Sleep(time.Duration(windows)*time.Second + 1500*time.Millisecond)
	stopped := time.Now().UnixNano()
	frames := wire.stop()
	paced := st.TXPaced.Load() - paced0
	if len(frames) == 0 {
		t.Fatal("the capture saw no frame")
	}
	at := func(ts int64) int64 { // wire bytes captured before ts
		var n int64
		for _, f := range frames {
			if f.t >= ts {
				break
			}
			n += int64(f.n)
		}
		return n
	}
	start := frames[0].t + int64(500*time.Millisecond)
	for i := range windows {
		from, to := start+int64(i)*int64(time.Second), start+int64(i+1)*int64(time.Second)
		if to > stopped {
			t.Fatalf("window %d ends after the capture stopped: the first frame came %v after the capture began",
				i, time.Duration(frames[0].t-(stopped-int64(windows)*int64(time.Second)-int64(1500*time.Millisecond))))
		}
		rate := float64(at(to)-at(from)) * 8
		e := rate/(kbps*1000) - 1
		switch {
		case math.Abs(e) <= 0.01:
		case e > 0.01:
			t.Errorf("window %d: %.3f Mbit/s on the wire (%+.2f%%), faster than %d kbit/s +1%%", i, rate/1e6, 100*e, kbps)
		case late.Moved(from, to):
			t.Logf("window %d: %+.2f%%, excused: the engine was late beyond its burst allowance", i, 100*e)
		case busy.Moved(from, to):
			t.Logf("window %d: %+.2f%%, excused: the machine was over-committed", i, 100*e)
		default:
			t.Errorf("window %d: %.3f Mbit/s on the wire (%+.2f%%), want %d kbit/s ±1%%", i, rate/1e6, 100*e, kbps)
		}
		t.Logf("window %d: %.3f Mbit/s (%+.3f%%)", i, rate/1e6, 100*e)
	}
	// Every data frame the capture saw left through the pacer (pure ACKs
	// are not paced).
	data := 0
	for _, f := range frames {
		if f.payload {
			data++
		}
	}
	if data == 0 || paced < uint64(data) {
		t.Errorf("the ring paced %d frames; the capture saw %d data frames", paced, data)
	}
	t.Logf("%d data frames captured, %d paced; stack: %+v", data, paced, l.tcpStats())
	if ts, err := l.srv.Rings()[0].TCPStack(); err == nil {
		t.Logf("connections: %+v", ts.Connections())
	}

	// Unpaced: nothing goes through the pacer any more, and the same
	// connection goes faster than the rate (unless the machine was too
	// busy to run it).
	if err := c.SetMaxPacingRate(0); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	p0, n0, t0 := st.TXPaced.Load(), received.Load(), time.Now()
	time.Sleep(500 * time.Millisecond)
	p1, n1, t1 := st.TXPaced.Load(), received.Load(), time.Now()
	if p1 != p0 {
		t.Errorf("%d frames paced after the rate was removed", p1-p0)
	}
	rate := float64(n1-n0) * 8 / t1.Sub(t0).Seconds()
	t.Logf("unpaced: %.1f Mbit/s", rate/1e6)
	if rate < 1.5*kbps*1000 {
		if busy.Moved(t0.UnixNano(), t1.UnixNano()) {
			t.Logf("unpaced: %.1f Mbit/s, excused: the machine was over-committed", rate/1e6)
		} else {
			t.Errorf("unpaced: %.1f Mbit/s, not above 1.5 times the old rate", rate/1e6)
		}
	}
	cancel()
	if err := <-wrote; err != nil {
		t.Fatalf("write: %v", err)
	}
	// The end marker waits for room in the full send queue: no deadline.
	_ = c.SetWriteDeadline(time.Time{})
	if err := c.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	select {
	case err := <-readDone:
		if err != nil {
			t.Fatalf("read: %v", err)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("the peer saw no FIN 60 s after CloseWrite (%d bytes received); stack: %+v", received.Load(), l.tcpStats())
	}
}

// counter is an io.Writer that only counts.
type counter struct{ n *atomic.Int64 }

func (c counter) Write(b []byte) (int, error) { c.n.Add(int64(len(b))); return len(b), nil }

// tcpArrival is one captured frame: kernel receive time, frame bytes,
// and whether it carried TCP payload.
type tcpArrival struct {
	t       int64
	n       int
	payload bool
}

type tcpCapture struct {
	quit atomic.Bool
	done chan []tcpArrival
}

func (c *tcpCapture) stop() []tcpArrival {
	c.quit.Store(true)
	return <-c.done
}

// captureTCP records the TCP frames from src arriving on link l: an
// AF_PACKET socket in its namespace with kernel timestamps, GRO off so
// that frames are counted as they were on the wire.
func captureTCP(t *testing.T, l *netlab.Link, src netip.Addr) *tcpCapture {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if out, err := l.NS.Command(ctx, "ethtool", "-K", l.Name, "gro", "off").CombinedOutput(); err != nil {
		t.Fatalf("ethtool -K %s gro off: %v: %s", l.Name, err, out)
	}
	var fd int
	err := l.NS.Do(func() error {
		var err error
		fd, err = unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, int(htons(unix.ETH_P_IP)))
		if err != nil {
			return err
		}
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 32<<20)
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TIMESTAMPNS, 1); err != nil {
			return err
		}
		return unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_IP), Ifindex: l.Index})
	})
	if err != nil {
		t.Fatalf("AF_PACKET socket on %s: %v", l.Name, err)
	}
	_ = unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Usec: 100_000})
	c := &tcpCapture{done: make(chan []tcpArrival, 1)}
	want := src.As4()
	go func() {
		defer unix.Close(fd)
		var out []tcpArrival
		buf, oob := make([]byte, 128), make([]byte, 128)
		for !c.quit.Load() {
			// MSG_TRUNC: the frame's length, though only its headers
			// are copied.
			n, oobn, _, _, err := unix.Recvmsg(fd, buf, oob, unix.MSG_TRUNC)
			if err != nil || n < 34 || buf[14+9] != 6 || [4]byte(buf[14+12:14+16]) != want {
				continue
			}
			msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
			if err != nil {
				continue
			}
			for _, m := range msgs {
				if m.Header.Level == unix.SOL_SOCKET && m.Header.Type == unix.SO_TIMESTAMPNS && len(m.Data) >= 16 {
					ts := (*unix.Timespec)(unsafe.Pointer(&m.Data[0]))
					ip := buf[14:]
					ihl := int(ip[0]&0xf) * 4
					payload := false
					if len(ip) >= ihl+13 {
						payload = int(binary.BigEndian.Uint16(ip[2:]))-ihl-int(ip[ihl+12]>>4)*4 > 0
					}
					out = append(out, tcpArrival{t: ts.Nano(), n: n, payload: payload})
				}
			}
		}
		c.done <- out
	}()
	return c
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
