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
	"github.com/bypassd/bypassd/internal/shmq"
)

// Failure modes with a scripted daemon on a Unix socket (no privileges
// needed): it speaks the real protocol through internal/ctlproto and hands
// out real queues, then misbehaves as the test says.

// fakeDaemon serves one session at path: HELLO (or a version refusal),
// then OPEN and BIND, then whatever misbehave does with the connection.
func fakeDaemon(t *testing.T, path string, refuseVersion bool, misbehave func(c *ctlproto.Conn)) {
	t.Helper()
	l, err := ctlproto.Listen(path, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { l.Close(); <-done })
	go func() {
		defer close(done)
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		h, _, _, err := c.Recv()
		if err != nil {
			return
		}
		if refuseVersion {
			_ = c.Send(ctlproto.ErrorReply(h, unix.EPROTONOSUPPORT), ctlproto.Empty{})
			_, _, _, _ = c.Recv() // until the client gives up
			return
		}
		_ = c.Send(ctlproto.ReplyHeader(h), ctlproto.HelloReply{Version: ctlproto.Version, DaemonPID: 1, MaxSockets: 8, DefaultQueueBytes: 4096})
		var mem []byte
		for {
			h, body, _, err := c.Recv()
			if err != nil {
				return
			}
			switch h.Code {
			case ctlproto.CodeOpen:
				size := 2 * shmq.Size(4096)
				fd, m, err := shmq.CreateMemfd("fake", size)
				if err != nil {
					t.Error(err)
					return
				}
				mem = m
				defer shmq.Unmap(mem)
				if _, err := shmq.Init(mem[:shmq.Size(4096)], 4096); err != nil {
					t.Error(err)
				}
				if _, err := shmq.Init(mem[shmq.Size(4096):], 4096); err != nil {
					t.Error(err)
				}
				fds := []int{fd}
				for range 3 {
					efd, _ := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
					fds = append(fds, efd)
				}
				r := ctlproto.ReplyHeader(h)
				r.Socket = 1
				_ = c.Send(r, ctlproto.OpenReply{QueueBytes: 4096, MemfdSize: uint64(size), TXOffset: 0, RXOffset: uint64(shmq.Size(4096))}, fds...)
				for _, fd := range fds {
					unix.Close(fd)
				}
			case ctlproto.CodeBind:
				b := body.(*ctlproto.Bind)
				_ = c.Send(ctlproto.ReplyHeader(h), ctlproto.BindReply{Addr: b.Addr})
				misbehave(c)
				return
			default:
				_ = c.Send(ctlproto.ReplyHeader(h), ctlproto.Empty{})
			}
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

// TestDaemonGoneMidRun: the daemon goes away while a thread blocks in
// recv on an offloaded socket: the call fails with ECONNRESET (never
// hangs), later calls too, and one line says why.
func TestDaemonGoneMidRun(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "fake.sock")
	fakeDaemon(t, sock, false, func(c *ctlproto.Conn) {
		time.Sleep(300 * time.Millisecond) // the client is in recv by now
	})
	out, log := runPy(t, sock, `
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 0))
for i in range(2):
    try:
        s.recv(100)
    except OSError as e:
        print("recv failed:", e.errno)
`, "BYPASSD_REQUIRE=1")
	if out != "recv failed: 104\nrecv failed: 104\n" || !strings.Contains(log, "bypassd session ended") {
		t.Errorf("stdout %q, log %q; want two ECONNRESET (104) and the session's end logged", out, log)
	}
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
		fakeDaemon(t, sock, true, nil)
		out, log := runPy(t, sock, script, "BYPASSD_REQUIRE="+require)
		want := "bound\n"
		if require == "1" {
			want = "bind failed: 93\n" // EPROTONOSUPPORT
		}
		if out != want || !strings.Contains(log, "does not speak control protocol version") {
			t.Errorf("BYPASSD_REQUIRE=%s: stdout %q, log %q; want %q and the versions named", require, out, log, want)
		}
	}
}
