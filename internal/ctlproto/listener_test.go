package ctlproto

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bypassd/bypassd/internal/netlab"
	"golang.org/x/sys/unix"
)

// sockPath returns a socket path in a fresh directory (removed at cleanup).
func sockPath(t *testing.T) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "run", "ctl.sock")
}

func listen(t *testing.T, path string, mode os.FileMode, gid int) *Listener {
	t.Helper()
	l, err := Listen(path, mode, gid)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// staleSocket leaves a socket file at path that nobody listens on, like a
// daemon killed with SIGKILL.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
}

func TestListenDialAccept(t *testing.T) {
	t.Parallel()
	path := sockPath(t)
	l := listen(t, path, 0o660, -1)
	if l.Path() != path {
		t.Fatalf("Path %q", l.Path())
	}
	fi, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSocket == 0 || fi.Mode().Perm() != 0o660 {
		t.Fatalf("socket file mode %v, want socket 0660", fi.Mode())
	}
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cred, err := s.PeerCred()
	if err != nil || int(cred.Pid) != os.Getpid() {
		t.Fatalf("peer %+v %v", cred, err)
	}
	if err := c.Send(Header{Code: CodeHello, ReqID: 1}, NewHello("test")); err != nil {
		t.Fatal(err)
	}
	h, m, _, err := s.Recv()
	if err != nil || h.Code != CodeHello || m.(*Hello).Name != "test" {
		t.Fatalf("%+v %+v %v", h, m, err)
	}
	if err := s.Send(ReplyHeader(h), HelloReply{Version: 1, DaemonPID: uint32(os.Getpid()), MaxSockets: 1024, DefaultQueueBytes: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if h, m, _, err := c.Recv(); err != nil || h.ReqID != 1 || m.(*HelloReply).MaxSockets != 1024 {
		t.Fatalf("%+v %+v %v", h, m, err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket file left after Close: %v", err)
	}
	// Established connections outlive the listener.
	if err := c.Send(Header{Code: CodeClose, Socket: 1}, nil); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := s.Recv(); err != nil {
		t.Fatal(err)
	}
}

func TestListenGroup(t *testing.T) {
	netlab.RequirePriv(t)
	t.Parallel()
	path := sockPath(t)
	const gid = 54321 // chown accepts any number; no group entry is needed
	listen(t, path, 0o660, gid)
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	if st.Gid != gid || st.Mode&0o777 != 0o660 {
		t.Fatalf("gid %d mode %o, want %d 0660", st.Gid, st.Mode&0o777, gid)
	}
}

func TestListenRefusesLiveDaemon(t *testing.T) {
	t.Parallel()
	path := sockPath(t)
	l := listen(t, path, 0o600, -1)
	_, err := Listen(path, 0o600, -1)
	want := fmt.Sprintf("another bypassd is running on %s (pid %d)", path, os.Getpid())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("second Listen: %v, want %q", err, want)
	}
	// The probe connection reaches the first listener and ends at once.
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, _, _, err := s.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("probe connection: %v", err)
	}
	// The first listener still works.
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestListenReplacesStaleSocket(t *testing.T) {
	t.Parallel()
	path := sockPath(t)
	staleSocket(t, path)
	l := listen(t, path, 0o600, -1)
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestListenRefusesNonSocket(t *testing.T) {
	t.Parallel()
	path := sockPath(t)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("precious"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Listen(path, 0o600, -1); err == nil || !strings.Contains(err.Error(), "not a socket") {
		t.Fatalf("Listen over a regular file: %v", err)
	}
	if b, err := os.ReadFile(path); err != nil || string(b) != "precious" {
		t.Fatalf("file changed: %q %v", b, err)
	}
}

func TestListenBadPath(t *testing.T) {
	t.Parallel()
	if _, err := Listen("/tmp/"+strings.Repeat("x", 120), 0o600, -1); err == nil {
		t.Fatal("overlong path accepted")
	}
	if _, err := Listen("", 0o600, -1); err == nil {
		t.Fatal("empty path accepted")
	}
}

func TestListenerCloseUnblocksAccept(t *testing.T) {
	t.Parallel()
	l := listen(t, sockPath(t), 0o600, -1)
	done := make(chan error, 1)
	go func() {
		_, err := l.Accept()
		done <- err
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Close: %v", err)
	}
}

func TestListenerCloseKeepsForeignFile(t *testing.T) {
	t.Parallel()
	path := sockPath(t)
	l := listen(t, path, 0o600, -1)
	// Someone replaced the socket file (e.g. a newer daemon after ours was
	// presumed dead): Close must not remove it.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(path); err != nil {
		t.Fatalf("foreign file removed: %v", err)
	}
}

const notRunning = "start it with `bypassd --interface IFACE` (or set BYPASSD_SOCKET)"

func TestDialErrors(t *testing.T) {
	t.Parallel()
	missing := sockPath(t)
	_, err := Dial(missing)
	if err == nil || !strings.Contains(err.Error(), "bypassd is not running at "+missing+": "+notRunning) || !errors.Is(err, unix.ENOENT) {
		t.Fatalf("missing socket: %v", err)
	}
	stale := sockPath(t)
	staleSocket(t, stale)
	_, err = Dial(stale)
	if err == nil || !strings.Contains(err.Error(), "bypassd is not running at "+stale+": "+notRunning) || !errors.Is(err, unix.ECONNREFUSED) {
		t.Fatalf("stale socket: %v", err)
	}
	if _, err := Dial(strings.Repeat("x", 200)); err == nil || !strings.Contains(err.Error(), "shorter path") {
		t.Fatalf("long path: %v", err)
	}
	// A stream socket at the path is not a bypassd socket.
	streamPath := sockPath(t)
	if err := os.MkdirAll(filepath.Dir(streamPath), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", streamPath)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if _, err := Dial(streamPath); err == nil || !strings.Contains(err.Error(), "not a bypassd control socket") {
		t.Fatalf("stream socket: %v", err)
	}
}

func TestDialEnv(t *testing.T) {
	path := sockPath(t)
	t.Setenv(EnvSocket, path)
	if SocketPath() != path {
		t.Fatalf("SocketPath %q", SocketPath())
	}
	_, err := Dial("")
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Dial(\"\") with %s=%s: %v", EnvSocket, path, err)
	}
	t.Setenv(EnvSocket, "")
	if SocketPath() != DefaultPath {
		t.Fatalf("SocketPath %q", SocketPath())
	}
}

// TestDialPermission connects to a socket file the caller may not write.
// As root, the check runs on a dedicated thread whose filesystem uid is
// dropped (setfsuid also drops the capabilities that bypass permissions);
// that thread is thrown away afterwards.
func TestDialPermission(t *testing.T) {
	t.Parallel()
	path := sockPath(t)
	l := listen(t, path, 0o600, -1)
	// Let anyone traverse the test directories, so that only the socket
	// file's own mode decides.
	for d := filepath.Dir(path); d != os.TempDir() && d != "/"; d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	dial := Dial
	if os.Geteuid() == 0 {
		dial = dialAsNobody
	}
	c, err := dial(path)
	if err == nil {
		c.Close()
		t.Fatal("connected to a 0600 socket of another user")
	}
	want := "no permission to connect to " + path + ": ask for membership in the socket's group"
	if !strings.Contains(err.Error(), want) || !errors.Is(err, unix.EACCES) {
		t.Fatalf("got %v, want %q", err, want)
	}
	// The mode decides: opened to everyone, the same caller gets in.
	if err := os.Chmod(path, 0o666); err != nil {
		t.Fatal(err)
	}
	c, err = dial(path)
	if err != nil {
		t.Fatalf("0666 socket: %v", err)
	}
	c.Close()
	if s, err := l.Accept(); err == nil {
		s.Close()
	}
}

// dialAsNobody dials on a dedicated thread whose filesystem uid is 65534
// (setfsuid also drops the capabilities that bypass file permissions). The
// thread is thrown away afterwards.
func dialAsNobody(path string) (*Conn, error) {
	type result struct {
		c   *Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		// setfsuid returns the previous fsuid, never an error; check it took.
		syscall.RawSyscall(syscall.SYS_SETFSUID, 65534, 0, 0)
		if prev, _, _ := syscall.RawSyscall(syscall.SYS_SETFSUID, 65534, 0, 0); prev != 65534 {
			ch <- result{nil, fmt.Errorf("setfsuid(65534) did not take (fsuid %d)", prev)}
			return
		}
		c, err := Dial(path)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

// TestHandOver: a listener and a connection keep working through
// duplicates after the originals are gone (live upgrade), the socket file
// stays, and the peer notices nothing.
func TestHandOver(t *testing.T) {
	path := sockPath(t)
	l, err := Listen(path, 0o600, -1)
	if err != nil {
		t.Fatal(err)
	}
	client, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	srv, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	if err := l.SetDeadline(time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Accept(); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Accept past the deadline: %v", err)
	}
	lfd, err := l.Dup()
	if err != nil {
		t.Fatal(err)
	}
	l.Abandon()
	if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Accept after Abandon: %v, want net.ErrClosed", err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket file gone after Abandon: %v", err)
	}
	cfd, err := srv.Dup()
	if err != nil {
		t.Fatal(err)
	}
	srv.Close()
	l2, err := ListenerFromFD(lfd, path)
	if err != nil {
		t.Fatal(err)
	}
	srv2, err := NewConn(cfd)
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Close()
	if err := client.Send(Header{Code: CodeHello, ReqID: 3}, NewHello("x")); err != nil {
		t.Fatal(err)
	}
	if h, _, _, err := srv2.Recv(); err != nil || h.ReqID != 3 {
		t.Fatalf("adopted connection: %v %v", h, err)
	}
	c2, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	s3, err := l2.Accept()
	if err != nil {
		t.Fatalf("adopted listener: %v", err)
	}
	s3.Close()
	if err := l2.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("socket file left after Close of the adopted listener: %v", err)
	}
	fd, _ := unix.Eventfd(0, unix.EFD_CLOEXEC)
	if _, err := ListenerFromFD(fd, path); err == nil {
		t.Fatal("ListenerFromFD accepted an eventfd")
	}
}
