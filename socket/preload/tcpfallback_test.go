package preload

import (
	"context"
	"io"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// listenScript listens on (argv[1], argv[2]) with SO_REUSEADDR and prints
// "listening" (or "listen failed ERRNO"); with argv[3] == "serve" it then
// sends "hi" to one connection and closes it first (its end of the
// connection waits in TIME_WAIT at the daemon).
const listenScript = `
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
    s.listen(4)
except OSError as e:
    print("listen failed", e.errno, flush=True)
    sys.exit(0)
print("listening", flush=True)
if sys.argv[3] == "serve":
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
s.close()
`

// TestTCPListenerRestartAndFallback: a server under the library restarted
// on its port while its last connection waits in TIME_WAIT at the daemon
// listens again (SO_REUSEADDR); a listener on an address bypassd does not
// serve falls back to the kernel, or fails with EADDRNOTAVAIL under
// BYPASSD_REQUIRE=1; one the rules give the kernel is a kernel socket
// even under BYPASSD_REQUIRE=1.
func TestTCPListenerRestartAndFallback(t *testing.T) {
	py := needTool(t, "python3", "python3")
	l := newTCPLab(t)
	run := func(env []string, args ...string) (string, *exec.Cmd, *output) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		cmd := l.preloaded(ctx, env, py, append([]string{"-c", listenScript}, args...)...)
		log := startIn(t, cmd)
		for end := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if s := log.String(); strings.Contains(s, "listening\n") || strings.Contains(s, "listen failed") {
				return s, cmd, log
			}
			if time.Now().After(end) {
				t.Fatalf("python %v did not listen:\n%s", args, log)
			}
		}
	}
	a := l.p.A.Addr4()
	before := l.tcpCounters(t)
	for i := 0; i < 2; i++ {
		out, cmd, log := run(nil, a.String(), "7777", "serve")
		if !strings.Contains(out, "listening on") {
			t.Fatalf("run %d: not listening through bypassd:\n%s", i, out)
		}
		c, err := l.p.B.NS.DialTCP(netip.AddrPortFrom(a, 7777), 5*time.Second)
		if err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		b, err := io.ReadAll(c)
		c.Close()
		if string(b) != "hi" || err != nil {
			t.Fatalf("run %d: read %q, %v\n%s", i, b, err, log)
		}
		_ = cmd.Wait()
	}
	l.checkTCPPath(t, before, 0, 4)

	// An address of A that is not the ring's interface's.
	const other = "192.0.2.77"
	if out, err := exec.Command("timeout", "10", "ip", "-n", l.p.A.NS.Name, "addr", "add", other+"/32", "dev", "lo").CombinedOutput(); err != nil {
		t.Fatalf("ip addr add: %v\n%s", err, out)
	}
	if out, _, _ := run([]string{"BYPASSD_REQUIRE=0"}, other, "7778", "listen"); !strings.Contains(out, "does not serve this address; kernel socket") ||
		!strings.Contains(out, "listening\n") {
		t.Errorf("listener on an address bypassd does not serve, BYPASSD_REQUIRE=0: want a kernel listener and a log line:\n%s", out)
	}
	if out, _, _ := run(nil, other, "7778", "listen"); !strings.Contains(out, "listen failed 99") {
		t.Errorf("listener on an address bypassd does not serve, BYPASSD_REQUIRE=1: want EADDRNOTAVAIL (99):\n%s", out)
	}
	if out, _, _ := run([]string{"BYPASSD_RULES=kernel local=*:7779", "BYPASSD_LOG_LEVEL=debug"}, a.String(), "7779", "listen"); !strings.Contains(out, "kernel socket by rule") ||
		!strings.Contains(out, "listening\n") {
		t.Errorf("listener the rules give the kernel, BYPASSD_REQUIRE=1: want a kernel listener:\n%s", out)
	}
}
