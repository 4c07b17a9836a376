package daemon

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
	"github.com/bypassd/bypassd/internal/sockq"
)

// Test binaries re-executed as client processes get these variables.
const (
	envChild  = "BYPASSD_DAEMON_TEST_CHILD" // which child role to play
	envSocket = "BYPASSD_DAEMON_TEST_SOCKET"
	envAddr   = "BYPASSD_DAEMON_TEST_ADDR"
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envChild); role != "" {
		os.Exit(childMain(role))
	}
	os.Exit(m.Run())
}

// lab is a veth pair with a daemon serving A's end.
type lab struct {
	p      *netlab.Pair
	d      *Daemon
	cfg    config.Config
	served chan error
	cancel context.CancelFunc
}

// newLab starts a daemon on a new pair's A end with cfg (Interfaces,
// paths and small sizes filled in when zero), serving in the background.
// Cleanup stops it and checks it shut down cleanly.
func newLab(t *testing.T, cfg config.Config) *lab {
	t.Helper()
	return newLabQueues(t, cfg, 1)
}

// newLabQueues is newLab on a pair whose ends have queues receive and
// transmit queues (the daemon serves every one of A's by default).
func newLabQueues(t *testing.T, cfg config.Config, queues int) *lab {
	t.Helper()
	p := netlab.NewPair(t, netlab.Options{RxQueues: queues, TxQueues: queues})
	dir := t.TempDir()
	if cfg.Interfaces == nil {
		cfg.Interfaces = []config.Interface{{Name: p.A.Name, Count: config.AllQueues}}
	}
	if cfg.SocketPath == "" {
		cfg.SocketPath = filepath.Join(dir, "ctl.sock")
	}
	if cfg.RunDir == "" {
		cfg.RunDir = dir
	}
	if cfg.StatsDir == "" {
		cfg.StatsDir = filepath.Join(dir, "stats")
	}
	if cfg.QueueBytes == 0 {
		cfg.QueueBytes = 64 << 10
	}
	if cfg.Frames == 0 {
		cfg.Frames = 256
	}
	l := &lab{p: p, cfg: cfg, served: make(chan error, 1)}
	log := zaptest.NewLogger(t, zaptest.Level(zap.InfoLevel))
	err := p.A.NS.Do(func() error {
		var err error
		l.d, err = New(cfg, log)
		return err
	})
	if err != nil {
		t.Fatalf("start daemon: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	go func() { l.served <- l.d.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-l.served; err != nil {
			t.Errorf("Serve: %v", err)
		}
		if err := l.d.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if _, err := os.Stat(cfg.SocketPath); !os.IsNotExist(err) {
			t.Errorf("socket file left behind: %v", err)
		}
	})
	return l
}

// stop ends Serve and returns its error.
func (l *lab) stop() error {
	l.cancel()
	err := <-l.served
	l.served <- err // for the cleanup
	return err
}

// flows returns the steering entries of the daemon's rings.
func (l *lab) flows(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, r := range l.d.Rings() {
		fl, err := r.Flows()
		if err != nil {
			t.Fatalf("flows: %v", err)
		}
		for _, f := range fl {
			out[f.Dst.String()] = true
		}
	}
	return out
}

// client is a raw control-protocol client (no shim).
type client struct {
	c   *ctlproto.Conn
	req uint32
	// cs is the session memory, after hello.
	cs *shmsess.ClientSession
}

func dialClient(path string) (*client, error) {
	c, err := ctlproto.Dial(path)
	if err != nil {
		return nil, err
	}
	return &client{c: c}, nil
}

func newClient(t *testing.T, path string) *client {
	t.Helper()
	c, err := dialClient(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	return c
}

// close ends the session (the sockets' user sides must be closed first).
func (c *client) close() {
	_ = c.c.Close()
	if c.cs != nil {
		_ = c.cs.Close()
		c.cs = nil
	}
}

// helloClient connects a raw client to l's daemon and says HELLO.
func helloClient(t *testing.T, l *lab) *client {
	t.Helper()
	c := newClient(t, l.cfg.SocketPath)
	if _, err := c.hello(); err != nil {
		t.Fatal(err)
	}
	return c
}

// openSocket opens a socket of family with the default queue size; it is
// closed when the test ends.
func openSocket(t *testing.T, c *client, family uint16) *clientSocket {
	t.Helper()
	s, err := c.open(family, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.close)
	return s
}

// reply is one reply with its descriptors.
type reply struct {
	h   ctlproto.Header
	m   ctlproto.Message
	fds []int
}

// call sends a request and waits for its reply.
func (c *client) call(code ctlproto.Code, sock uint32, body ctlproto.Message) (reply, error) {
	c.req++
	h := ctlproto.Header{Code: code, ReqID: c.req, Socket: sock}
	if err := c.c.Send(h, body); err != nil {
		return reply{}, err
	}
	return c.recv(h)
}

// recv reads the reply to h.
func (c *client) recv(h ctlproto.Header) (reply, error) {
	_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	rh, m, fds, err := c.c.Recv()
	if err != nil {
		return reply{}, err
	}
	r := reply{h: rh, m: m, fds: fds}
	if rh.Code != h.Code|ctlproto.ReplyBit || rh.ReqID != h.ReqID {
		closeAll(fds)
		return r, fmt.Errorf("reply %v req %d to %v req %d", rh.Code, rh.ReqID, h.Code, h.ReqID)
	}
	return r, nil
}

// ok calls and requires success.
func (c *client) ok(code ctlproto.Code, sock uint32, body ctlproto.Message) (reply, error) {
	r, err := c.call(code, sock, body)
	if err == nil && r.h.Status != 0 {
		err = fmt.Errorf("%v: %w", code, r.h.Status)
	}
	return r, err
}

// hello says HELLO and maps the session memory.
func (c *client) hello() (*ctlproto.HelloReply, error) {
	r, err := c.ok(ctlproto.CodeHello, 0, ctlproto.NewHello("daemon-test"))
	if err != nil {
		return nil, err
	}
	hr := r.m.(*ctlproto.HelloReply)
	if c.cs, err = shmsess.OpenClientSession(int(hr.MaxSockets), int(hr.Lanes), hr.SessionSize, r.fds); err != nil {
		return nil, err
	}
	return hr, nil
}

// clientSocket is an opened socket as a client sees it.
type clientSocket struct {
	id    uint32
	reply *ctlproto.OpenReply
	c     *client
	conn  *sockq.Conn
}

func (s *clientSocket) close() {
	if s.conn != nil {
		s.conn.Close()
		s.c.cs.Forget(int(s.reply.Slot))
		s.conn = nil
	}
}

// open opens a socket and attaches its queues in the session memory.
func (c *client) open(family uint16, queueBytes uint32) (*clientSocket, error) {
	r, err := c.ok(ctlproto.CodeOpen, 0, ctlproto.Open{Family: family, Type: unix.SOCK_DGRAM, QueueBytes: queueBytes})
	if err != nil {
		return nil, err
	}
	or := r.m.(*ctlproto.OpenReply)
	if len(r.fds) != 0 {
		closeAll(r.fds)
		return nil, fmt.Errorf("OPEN reply carries %d fds", len(r.fds))
	}
	q, err := c.cs.Socket(shmsess.QueueOffsets{Slot: int(or.Slot), Lane: int(or.Lane), TXOffset: or.TXOffset, RXOffset: or.RXOffset,
		QueueBytes: int(or.QueueBytes)})
	if err != nil {
		return nil, err
	}
	return &clientSocket{id: r.h.Socket, reply: or, c: c, conn: q.Conn(shmq.Policy{})}, nil
}

func (c *client) bind(s *clientSocket, addr netip.AddrPort, reuse bool) (netip.AddrPort, error) {
	r, err := c.ok(ctlproto.CodeBind, s.id, ctlproto.Bind{Addr: addr, ReuseAddr: reuse})
	if err != nil {
		return netip.AddrPort{}, err
	}
	return r.m.(*ctlproto.BindReply).Addr, nil
}

func closeAll(fds []int) {
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// rawConn sends hand-made packets, for what ctlproto.Conn refuses to send.
type rawConn struct{ fd int }

func dialRaw(t *testing.T, path string) *rawConn {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: path}); err != nil {
		t.Fatal(err)
	}
	tv := unix.NsecToTimeval((10 * time.Second).Nanoseconds())
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		t.Fatal(err)
	}
	return &rawConn{fd: fd}
}

func (r *rawConn) send(t *testing.T, b []byte) {
	t.Helper()
	if _, err := unix.Write(r.fd, b); err != nil {
		t.Fatalf("send: %v", err)
	}
}

// recv returns the next packet decoded, or io.EOF when the daemon closed
// the connection.
func (r *rawConn) recv(t *testing.T) (ctlproto.Header, ctlproto.Message, error) {
	t.Helper()
	b := make([]byte, ctlproto.MaxMessage)
	n, err := unix.Read(r.fd, b)
	if err != nil {
		t.Fatalf("receive: %v", err)
	}
	if n == 0 {
		return ctlproto.Header{}, nil, io.EOF
	}
	h, m, err := ctlproto.Unmarshal(b[:n])
	if err != nil {
		t.Fatalf("undecodable reply % x: %v", b[:n], err)
	}
	return h, m, nil
}

func marshal(t *testing.T, h ctlproto.Header, body ctlproto.Message) []byte {
	t.Helper()
	b, err := ctlproto.Marshal(nil, h, body)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// child runs this test binary as a client process playing role.
type child struct {
	cmd *exec.Cmd
	out *bufio.Reader
	err *strings.Builder
}

// startChild starts role with the given environment and credentials (nil:
// ours). bin is the binary to run (the test binary or a copy of it).
func startChild(t *testing.T, bin, role string, env []string, cred *syscall.Credential) *child {
	t.Helper()
	cmd := exec.Command(bin, "-test.run=^$")
	cmd.Env = append(os.Environ(), append(env, envChild+"="+role)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, out: bufio.NewReader(stdout), err: &strings.Builder{}}
	cmd.Stderr = c.err
	// Pdeathsig fires when the forking OS thread exits, not the process:
	// Go ends threads whose goroutine exits locked (netlab's namespace
	// switches do), so keep the forking thread ours until the test ends.
	runtime.LockOSThread()
	t.Cleanup(runtime.UnlockOSThread)
	if err := cmd.Start(); err != nil {
		t.Fatalf("start child %s: %v", role, err)
	}
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return c
}

// line reads the child's next output line.
func (c *child) line(t *testing.T) string {
	t.Helper()
	s, err := c.out.ReadString('\n')
	if err != nil {
		_ = c.cmd.Process.Kill()
		_ = c.cmd.Wait()
		t.Fatalf("child output: %v (stderr: %s)", err, c.err.String())
	}
	return strings.TrimSpace(s)
}

// childMain runs a client role in a re-executed test binary; its exit code
// and stdout lines are what the parent test checks.
func childMain(role string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "child %s: %s\n", role, fmt.Sprintf(format, args...))
		return 1
	}
	c, err := dialClient(os.Getenv(envSocket))
	if err != nil {
		return fail("dial: %v", err)
	}
	if _, err := c.hello(); err != nil {
		return fail("hello: %v", err)
	}
	addr, err := netip.ParseAddr(os.Getenv(envAddr))
	if err != nil {
		return fail("address: %v", err)
	}
	s, err := c.open(unix.AF_INET, 0)
	if err != nil {
		return fail("open: %v", err)
	}
	switch role {
	case "privport":
		// An unprivileged client cannot bind port 80 ...
		r, err := c.call(ctlproto.CodeBind, s.id, ctlproto.Bind{Addr: netip.AddrPortFrom(addr, 80)})
		if err != nil || r.h.Status != unix.EACCES {
			return fail("bind port 80: status %v, %v; want EACCES", r.h.Status, err)
		}
		// ... but gets acceleration on an ordinary port.
		got, err := c.bind(s, netip.AddrPortFrom(addr, 0), false)
		if err != nil || got.Port() < privilegedPortLimit {
			return fail("bind port 0: %v, %v", got, err)
		}
		fmt.Println("ok")
		return 0
	case "hold":
		// Bind, say where, then hold everything until killed.
		got, err := c.bind(s, netip.AddrPortFrom(addr, 0), false)
		if err != nil {
			return fail("bind: %v", err)
		}
		fmt.Println(got.Port())
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case "echo-many":
		// scaleSockets sockets with 4 KiB queues, all bound, each
		// echoing the datagrams it receives. Prints the bound ports,
		// then "ready", and holds until killed.
		socks := make([]*clientSocket, 0, scaleSockets)
		for i := 0; i < scaleSockets; i++ {
			if i > 0 {
				if s, err = c.open(unix.AF_INET, 4096); err != nil {
					return fail("open %d: %v", i, err)
				}
			}
			got, err := c.bind(s, netip.AddrPortFrom(addr, 0), false)
			if err != nil {
				return fail("bind %d: %v", i, err)
			}
			fmt.Println(got.Port())
			socks = append(socks, s)
		}
		for _, s := range socks {
			go func() {
				msgs := []sockq.Message{{Buf: make([]byte, 2048)}}
				for {
					if n, err := s.conn.RecvBatch(msgs, time.Time{}); err != nil || n != 1 {
						return
					}
					m := msgs[0]
					_, _ = s.conn.SendBatch([][]byte{m.Buf[:m.N]}, m.Addr, time.Time{})
				}
			}()
		}
		fmt.Println("ready")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	case "hold-many":
		// manySockets bound sockets (the first one opened above), then
		// hold them until killed.
		for i := 0; i < manySockets; i++ {
			if i > 0 {
				if s, err = c.open(unix.AF_INET, 4096); err != nil {
					return fail("open %d: %v", i, err)
				}
			}
			if _, err := c.bind(s, netip.AddrPortFrom(addr, 0), false); err != nil {
				return fail("bind %d: %v", i, err)
			}
		}
		fmt.Println("bound")
		_, _ = io.Copy(io.Discard, os.Stdin)
		return 0
	}
	return fail("unknown role")
}
