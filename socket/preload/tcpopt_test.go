package preload

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/netlab"
)

// quickAckClient connects to argv[1]:argv[2], turns TCP_QUICKACK on,
// says "ready", and reads only after a line on stdin (so no window update
// of its own can stand in for a delayed ACK), to EOF.
const quickAckClient = `
import socket, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
print("ready", flush=True)
sys.stdin.readline()
n = 0
while True:
    b = s.recv(65536)
    if not b:
        break
    n += len(b)
print("read", n, flush=True)
`

// TestTCPQuickAck: setsockopt(TCP_QUICKACK) in a program under the
// library reaches the daemon's connection. With --tcp-quickack-threshold
// 1000, the kernel peer's 200-byte segments are acknowledged at once and
// each 1400-byte one the delayed way (the ring's tcp_delayed_acks counter,
// and the peer's TCP_INFO: no ACK of a large segment before 40 ms).
func TestTCPQuickAck(t *testing.T) {
	py := needTool(t, "python3", "python3")
	l := newTCPLabConfig(t, func(c *config.Config) { c.TCPQuickAckThreshold = 1000 })
	delayed := func() uint64 { return l.srv.Rings()[0].Stats().TCPDelayedAcks.Load() }
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	port := kl.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := l.preloaded(ctx, nil, py, "-c", quickAckClient, l.p.B.Addr4().String(), strconv.Itoa(port))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out := startIn(t, cmd)
	_ = kl.SetDeadline(time.Now().Add(20 * time.Second))
	kc, err := kl.AcceptTCP()
	if err != nil {
		t.Fatalf("accept: %v\n%s", err, out)
	}
	defer kc.Close()
	for end := time.Now().Add(20 * time.Second); !strings.Contains(out.String(), "ready"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("the program did not set TCP_QUICKACK:\n%s", out)
		}
	}
	before := l.tcpCounters(t)
	send := func(size int) (uint64, []time.Duration) {
		d0 := delayed()
		var ds []time.Duration
		for range 5 {
			d, _, err := netlab.WriteAwaitAck(kc, make([]byte, size), 10*time.Second)
			if err != nil {
				t.Fatalf("%d-byte segment: %v\n%s", size, err, out)
			}
			ds = append(ds, d)
		}
		return delayed() - d0, ds
	}
	small, smallDelays := send(200)
	large, largeDelays := send(1400)
	t.Logf("delayed ACKs: %d for 5 small segments, %d for 5 large; ACKs seen after %v (small), %v (large)",
		small, large, smallDelays, largeDelays)
	if small != 0 || large != 5 {
		t.Errorf("delayed ACKs: %d of 5 small segments (want 0), %d of 5 large (want 5)", small, large)
	}
	for i, d := range largeDelays {
		if d < 40*time.Millisecond {
			t.Errorf("the ACK of large segment %d came after %v, before the delayed-ACK timeout", i, d)
		}
	}
	_ = kc.CloseWrite()
	if _, err := stdin.Write([]byte("\n")); err != nil {
		t.Fatal(err)
	}
	_ = stdin.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("program: %v\n%s", err, out)
	}
	if want := "read 8000"; !strings.Contains(out.String(), want) {
		t.Errorf("the program did not read the 8000 bytes:\n%s", out)
	}
	l.checkTCPPath(t, before, 8000, 0)
}

// pacedClient connects to argv[1]:argv[2], sets SO_MAX_PACING_RATE to
// argv[3] bytes/s (as a u32, the way sockperf --rate-limit does), prints
// what getsockopt reads back, sends argv[4] bytes and shuts down.
const pacedClient = `
import socket, struct, sys
s = socket.create_connection((sys.argv[1], int(sys.argv[2])))
s.setsockopt(socket.SOL_SOCKET, 47, struct.pack("I", int(sys.argv[3])))
print("rate", struct.unpack("I", s.getsockopt(socket.SOL_SOCKET, 47, 4))[0], flush=True)
n, buf = int(sys.argv[4]), b"x" * 65536
while n > 0:
    n -= s.send(buf[:min(n, len(buf))])
s.shutdown(socket.SHUT_WR)
s.recv(1)
s.close()
`

// TestTCPPacingProgram: setsockopt(SO_MAX_PACING_RATE) on a TCP socket in
// a program under the library paces its connection: 2 MB at 10 Mbit/s
// take the kernel peer at least the time the rate allows (payload alone,
// wire headers not even counted; never faster, whatever the load), and
// the ring's pacer sent at least a frame per MSS of it.
func TestTCPPacingProgram(t *testing.T) {
	py := needTool(t, "python3", "python3")
	l := newTCPLab(t)
	const rate, size = 1_250_000, 2_000_000 // bytes/s, bytes
	kl := l.p.B.NS.ListenTCP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	port := kl.Addr().(*net.TCPAddr).Port
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st := l.srv.Rings()[0].Stats()
	paced0, before := st.TXPaced.Load(), l.tcpCounters(t)
	cmd := l.preloaded(ctx, nil, py, "-c", pacedClient, l.p.B.Addr4().String(), strconv.Itoa(port),
		strconv.Itoa(rate), strconv.Itoa(size))
	out := startIn(t, cmd)
	_ = kl.SetDeadline(time.Now().Add(30 * time.Second))
	kc, err := kl.AcceptTCP()
	if err != nil {
		t.Fatalf("accept: %v\n%s", err, out)
	}
	defer kc.Close()
	_ = kc.SetReadDeadline(time.Now().Add(60 * time.Second))
	buf := make([]byte, 64<<10)
	var got int
	var first, last time.Time
	for {
		n, err := kc.Read(buf)
		if n > 0 && got == 0 {
			first = time.Now()
		}
		got += n
		if err == io.EOF {
			last = time.Now()
			break
		}
		if err != nil {
			t.Fatalf("read after %d bytes: %v\n%s", got, err, out)
		}
	}
	_ = kc.Close()
	if err := cmd.Wait(); err != nil {
		t.Fatalf("program: %v\n%s", err, out)
	}
	if got != size {
		t.Fatalf("the peer read %d bytes, want %d", got, size)
	}
	if !strings.Contains(out.String(), "rate 1250000") {
		t.Errorf("getsockopt(SO_MAX_PACING_RATE) in the program did not read back 1250000:\n%s", out)
	}
	took := last.Sub(first)
	// The first frame leaves at once and the pacer's burst allowance is a
	// few frames: 3% covers both.
	least := time.Duration(0.97 * float64(size) / rate * float64(time.Second))
	paced := st.TXPaced.Load() - paced0
	t.Logf("%d bytes in %v (%.2f Mbit/s of payload), %d frames paced", got, took, float64(got)*8/took.Seconds()/1e6, paced)
	if took < least {
		t.Errorf("%d bytes arrived in %v, faster than 10 Mbit/s allows (%v)", got, took, least)
	}
	if paced < size/1448 {
		t.Errorf("the ring paced %d frames, want at least %d (one per MSS of the transfer)", paced, size/1448)
	}
	l.checkTCPPath(t, before, 0, size)
}
