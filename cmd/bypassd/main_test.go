package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
)

// envExec makes the test binary run bypassd's main instead of the tests.
const envExec = "BYPASSD_MAIN_TEST_EXEC"

func TestMain(m *testing.M) {
	if os.Getenv(envExec) == "1" {
		os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
	}
	if path := os.Getenv(envVictim); path != "" {
		os.Exit(victim(path))
	}
	os.Exit(m.Run())
}

// proc is a bypassd process started by a test.
type proc struct {
	cmd  *exec.Cmd
	mu   sync.Mutex
	logs strings.Builder
	// ready is closed when the daemon logged that it is serving; done when
	// its log ends.
	ready, done chan struct{}
	exit        chan *os.ProcessState
}

// startDaemon runs bypassd with args inside ns.
func startDaemon(t *testing.T, ns *netlab.NS, args ...string) *proc {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{ready: make(chan struct{}), done: make(chan struct{}), exit: make(chan *os.ProcessState, 1)}
	p.cmd = ns.Command(nil, self, args...)
	p.cmd.Env = append(os.Environ(), envExec+"=1")
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stderr, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Pdeathsig fires when the forking OS thread exits, not the process:
	// keep the forking thread ours until the test ends.
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go p.read(stderr)
	go func() {
		// Not cmd.Wait: that waits for the log's end too, which a
		// successor started by SIGHUP (holding the same stderr) delays.
		st, _ := p.cmd.Process.Wait()
		p.exit <- st
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

func (p *proc) read(r io.Reader) {
	defer close(p.done)
	sc := bufio.NewScanner(r)
	once := sync.Once{}
	for sc.Scan() {
		p.mu.Lock()
		p.logs.WriteString(sc.Text() + "\n")
		p.mu.Unlock()
		var entry struct{ Msg string }
		if json.Unmarshal(sc.Bytes(), &entry) == nil && entry.Msg == "bypassd ready" {
			once.Do(func() { close(p.ready) })
		}
	}
}

func (p *proc) log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logs.String()
}

// logged waits up to d for a log line containing s: the daemon logs some
// lines (a takeover's "took over") after "bypassd ready", and the log's
// reader can still be behind when the process has exited.
func (p *proc) logged(s string, d time.Duration) bool {
	for end := time.Now().Add(d); ; time.Sleep(10 * time.Millisecond) {
		if strings.Contains(p.log(), s) {
			return true
		}
		if time.Now().After(end) {
			return false
		}
	}
}

func (p *proc) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-p.ready:
	case <-p.done:
		t.Fatalf("bypassd exited before it was ready:\n%s", p.log())
	case <-time.After(30 * time.Second):
		t.Fatalf("bypassd not ready:\n%s", p.log())
	}
}

// wait returns the exit status.
func (p *proc) wait(t *testing.T) int {
	t.Helper()
	select {
	case st := <-p.exit:
		if st == nil {
			t.Fatal("wait: no process state")
		}
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return st.ExitCode()
	case <-time.After(30 * time.Second):
		t.Fatalf("bypassd did not exit:\n%s", p.log())
	}
	return -1
}

// hello connects a raw client.
func hello(t *testing.T, path string) *ctlproto.Conn {
	t.Helper()
	c, err := ctlproto.Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	if err := c.Send(ctlproto.Header{Code: ctlproto.CodeHello, ReqID: 1}, ctlproto.NewHello("main-test")); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	h, m, fds, err := c.Recv()
	if err != nil || h.Status != 0 {
		t.Fatalf("HELLO: %+v %v", h, err)
	}
	for _, fd := range fds { // the session memory and eventfds: unused here
		unix.Close(fd)
	}
	if r := m.(*ctlproto.HelloReply); r.DefaultQueueBytes != 64<<10 || r.RXPollMicros != 5 {
		t.Errorf("HELLO reply does not reflect the options: %+v", r)
	}
	return c
}

func xdpAttached(t *testing.T, ns *netlab.NS, name string) bool {
	t.Helper()
	link, err := ns.Netlink().LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return link.Attrs().Xdp != nil && link.Attrs().Xdp.Attached
}

func TestDaemonProcess(t *testing.T) {
	netlab.RequirePriv(t)
	lab := netlab.NewPair(t, netlab.Options{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	common := []string{"-i", lab.A.Name, "--run-dir", dir, "--stats-dir", filepath.Join(dir, "stats"),
		"--frames", "256", "--queue-bytes", "64K", "--rx-poll", "5", "--log-level", "debug"}
	d := startDaemon(t, lab.A.NS, append([]string{"--socket", sock}, common...)...)
	d.waitReady(t)
	if !xdpAttached(t, lab.A.NS, lab.A.Name) {
		t.Error("no XDP program on the interface")
	}
	c := hello(t, sock)
	if err := c.Send(ctlproto.Header{Code: ctlproto.CodeOpen, ReqID: 2}, ctlproto.Open{Family: unix.AF_INET, Type: unix.SOCK_DGRAM}); err != nil {
		t.Fatal(err)
	}
	h, _, fds, err := c.Recv()
	if err != nil || h.Status != 0 || len(fds) != 0 {
		t.Fatalf("OPEN: %+v %v", h, err)
	}
	for _, fd := range fds {
		unix.Close(fd)
	}
	if err := c.Send(ctlproto.Header{Code: ctlproto.CodeBind, ReqID: 3, Socket: h.Socket}, ctlproto.Bind{Addr: netip.AddrPortFrom(lab.A.Addr4(), 0)}); err != nil {
		t.Fatal(err)
	}
	if h, _, _, err := c.Recv(); err != nil || h.Status != 0 {
		t.Fatalf("BIND: %+v %v", h, err)
	}

	// A second daemon on the same interface is refused, naming the first.
	d2 := startDaemon(t, lab.A.NS, append([]string{"--socket", filepath.Join(dir, "other.sock")}, common...)...)
	if rc := d2.wait(t); rc != 1 {
		t.Errorf("second daemon exit status %d, want 1", rc)
	}
	if want := fmt.Sprintf("in use by another bypassd (pid %d)", d.cmd.Process.Pid); !d2.logged(want, 10*time.Second) {
		t.Errorf("second daemon's log lacks %q:\n%s", want, d2.log())
	}

	// SIGTERM: the client is told, everything is removed, exit 0.
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	h, _, _, err = c.Recv()
	if err != nil || h.Code != ctlproto.CodeShutdown {
		t.Errorf("after SIGTERM the client got %+v %v; want SHUTDOWN", h, err)
	}
	if rc := d.wait(t); rc != 0 {
		t.Errorf("exit status %d after SIGTERM:\n%s", rc, d.log())
	}
	for _, f := range []string{sock, filepath.Join(dir, lab.A.Name+".lock")} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("%s left behind: %v", f, err)
		}
	}
	if xdpAttached(t, lab.A.NS, lab.A.Name) {
		t.Error("XDP program left attached")
	}
	for _, want := range []string{`"msg":"signal received`, `"msg":"all clients disconnected"`, `"msg":"bypassd stopped"`, `"pid":`, `"iface":"` + lab.A.Name} {
		if !d.logged(want, 10*time.Second) {
			t.Errorf("log lacks %s:\n%s", want, d.log())
		}
	}
}

func TestDaemonRestartAfterCrash(t *testing.T) {
	netlab.RequirePriv(t)
	lab := netlab.NewPair(t, netlab.Options{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "ctl.sock")
	args := []string{"-i", lab.A.Name, "--socket", sock, "--run-dir", dir, "--stats-dir", filepath.Join(dir, "stats"),
		"--frames", "256", "--queue-bytes", "64K", "--rx-poll", "5"}
	d := startDaemon(t, lab.A.NS, args...)
	d.waitReady(t)
	c := hello(t, sock)
	if err := d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	d.wait(t)
	// The client learns promptly.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, _, err := c.Recv(); err != io.EOF {
		t.Errorf("client after the daemon died: %v; want EOF", err)
	}
	// What the crash left (socket file, lock file, a dead client's stats
	// file) does not stop a new daemon.
	if _, err := os.Stat(sock); err != nil {
		t.Fatalf("expected the crashed daemon's socket file: %v", err)
	}
	stale := filepath.Join(dir, "stats", "999999999")
	if err := os.WriteFile(stale, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	d = startDaemon(t, lab.A.NS, args...)
	d.waitReady(t)
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("stale stats file kept: %v", err)
	}
	hello(t, sock)
	// Two signals: the second one exits at once if the first has not
	// finished; either way the process ends and nothing blocks a restart.
	_ = d.cmd.Process.Signal(syscall.SIGINT)
	_ = d.cmd.Process.Signal(syscall.SIGINT)
	if rc := d.wait(t); rc != 0 && rc != 1 {
		t.Errorf("exit status %d after two SIGINTs:\n%s", rc, d.log())
	}
	d = startDaemon(t, lab.A.NS, args...)
	d.waitReady(t)
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	if rc := d.wait(t); rc != 0 {
		t.Errorf("exit status %d:\n%s", rc, d.log())
	}
}
