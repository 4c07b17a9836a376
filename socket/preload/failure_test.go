package preload

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
)

// A daemon of another protocol version, scripted on a Unix socket (no
// privileges needed): every HELLO is refused with EPROTONOSUPPORT in the
// version internal/ctlproto speaks, as a daemon of another version does.
func refusingDaemon(t *testing.T, path string) {
	t.Helper()
	l, err := ctlproto.Listen(path, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			h, _, _, err := c.Recv()
			if h.Code == ctlproto.CodeHello || err != nil {
				h.Code, h.Socket = ctlproto.CodeHello, 0
				_ = c.Send(ctlproto.ErrorReply(h, unix.EPROTONOSUPPORT), ctlproto.Empty{})
			}
			_, _, _, _ = c.Recv() // until the client gives up
			c.Close()
		}
	}()
}

// runPy runs a Python script under the library with the given daemon
// path and extra environment, and returns its stdout and stderr.
func runPy(t *testing.T, sock, script string, env ...string) (string, string) {
	t.Helper()
	py := needTool(t, "python3", "python3")
	lib, _ := built(t)
	cmd := exec.Command(py, "-c", script)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), append([]string{"LD_PRELOAD=" + lib, "BYPASSD_SOCKET=" + sock}, env...)...)
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("python: %v\n%s%s", err, stdout.String(), stderr.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("python hung (a blocked call was never released):\n%s%s", stdout.String(), stderr.String())
	}
	return stdout.String(), stderr.String()
}

// TestDaemonOtherVersion: a daemon that does not speak the library's
// protocol version: a clear line, the kernel socket without
// BYPASSD_REQUIRE, an error with it.
func TestDaemonOtherVersion(t *testing.T) {
	const script = `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:
    s.bind(("0.0.0.0", 0))
    print("bound")
except OSError as e:
    print("bind failed:", e.errno)
`
	for _, require := range []string{"0", "1"} {
		sock := filepath.Join(t.TempDir(), "fake.sock")
		refusingDaemon(t, sock)
		out, log := runPy(t, sock, script, "BYPASSD_REQUIRE="+require)
		want := "bound\n"
		if require == "1" {
			want = "bind failed: 93\n" // EPROTONOSUPPORT
		}
		if out != want || !strings.Contains(log, "does not speak control protocol version 1..2") {
			t.Errorf("BYPASSD_REQUIRE=%s: stdout %q, log %q; want %q and the versions named", require, out, log, want)
		}
	}
}
