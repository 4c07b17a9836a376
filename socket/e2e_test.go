package socket

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon"
	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
)

// End-to-end tests: a real bypassd (package daemon, in-process) serves the
// A end of a veth pair; kernel sockets in namespace B are the peers. Client
// processes are this test binary re-executed in a child role.

const (
	envChild = "BYPASSD_SOCKET_TEST_CHILD" // the child role
	envPeer  = "BYPASSD_SOCKET_TEST_PEER"  // echo server in B
	envLocal = "BYPASSD_SOCKET_TEST_LOCAL" // A's address
	envSocks = "BYPASSD_SOCKET_TEST_SOCKS"
	envIndex = "BYPASSD_SOCKET_TEST_INDEX"
	envOther = "BYPASSD_SOCKET_TEST_OTHER" // another client's socket id
)

func TestMain(m *testing.M) {
	if role := os.Getenv(envChild); role != "" {
		if err := childMain(role); err != nil {
			fmt.Fprintf(os.Stderr, "child %s: %v\n", role, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// lab is a veth pair with bypassd serving A's end and a kernel UDP echo
// server on B's IPv4 and IPv6 addresses.
type lab struct {
	p     *netlab.Pair
	d     *daemon.Daemon
	dir   string // world-traversable, holds the control socket
	path  string
	echo4 netip.AddrPort
	echo6 netip.AddrPort
}

// paths are the daemon's data paths the end-to-end tests run on: the
// default (AF_XDP, with the TAP fallback standing by) and the TAP path
// forced (--fallback=tap).
var paths = []string{"afxdp", "tap"}

// forEachPath runs test once per path, in parallel.
func forEachPath(t *testing.T, test func(t *testing.T, path string)) {
	t.Parallel()
	for _, path := range paths {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			test(t, path)
		})
	}
}

func newLab(t *testing.T, path string) *lab {
	t.Helper()
	// Static neighbours: what is tested here is the shim, not ARP.
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	cfg := config.Config{
		RXPoll:     20 * time.Microsecond,
		EnginePoll: 20 * time.Microsecond,
		Frames:     4096,
	}
	if path == "tap" {
		cfg.Fallback = "tap"
	}
	srv := daemontest.Start(t, p, cfg, nil)
	l := &lab{p: p, d: srv.Daemon, dir: srv.Dir, path: srv.SocketPath()}
	l.echo4 = l.echoServer(t, netip.AddrPortFrom(p.B.Addr4(), 0))
	l.echo6 = l.echoServer(t, netip.AddrPortFrom(p.B.Addr6(), 0))
	return l
}

// echoServer answers every datagram with the same bytes, from B.
func (l *lab) echoServer(t *testing.T, addr netip.AddrPort) netip.AddrPort {
	t.Helper()
	c := l.p.B.NS.ListenUDP(t, addr)
	// Room for bursts from many sockets (root may exceed rmem_max).
	if rc, err := c.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
		})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	t.Cleanup(func() { c.Close(); <-done })
	return c.LocalAddr().(*net.UDPAddr).AddrPort()
}

func (l *lab) client(t *testing.T) *Client {
	t.Helper()
	c, err := Dial(l.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// echoRound sends p to peer through u and checks the echo is byte-exact.
func echoRound(u *UDPConn, peer netip.AddrPort, p, buf []byte) error {
	if _, err := u.WriteToUDPAddrPort(p, peer); err != nil {
		return err
	}
	if err := u.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return err
	}
	n, from, err := u.ReadFromUDPAddrPort(buf)
	if err != nil {
		return fmt.Errorf("waiting for the echo of %d bytes: %w", len(p), err)
	}
	if from != peer || !bytes.Equal(buf[:n], p) {
		return fmt.Errorf("echo of %d bytes: got %d bytes from %v (equal %v)", len(p), n, from, bytes.Equal(buf[:n], p))
	}
	return nil
}

func TestE2EUnicast(t *testing.T) { forEachPath(t, testE2EUnicast) }

func testE2EUnicast(t *testing.T, path string) {
	l := newLab(t, path)
	c := l.client(t)
	for _, fam := range []struct {
		network string
		local   netip.Addr
		echo    netip.AddrPort
	}{
		{"udp4", l.p.A.Addr4(), l.echo4},
		{"udp6", l.p.A.Addr6(), l.echo6},
	} {
		t.Run(fam.network, func(t *testing.T) {
			u, err := c.ListenUDP(fam.network, netip.AddrPortFrom(fam.local, 0))
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			la := u.LocalAddr().(*net.UDPAddr).AddrPort()
			if la.Addr() != fam.local || la.Port() == 0 {
				t.Fatalf("LocalAddr %v, want %v:N", la, fam.local)
			}
			buf := make([]byte, 65536)
			// Shim -> kernel -> shim, byte-exact.
			for i, size := range []int{18, 1400, 8000} {
				if err := echoRound(u, fam.echo, payload(size, uint64(i)), buf); err != nil {
					t.Fatal(err)
				}
			}
			// Kernel-initiated: a socket in B sends first, the shim answers.
			k := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(fam.echo.Addr(), 0))
			kaddr := k.LocalAddr().(*net.UDPAddr).AddrPort()
			for i, size := range []int{18, 1400, 8000} {
				p := payload(size, uint64(100+i))
				if _, err := k.WriteToUDPAddrPort(p, la); err != nil {
					t.Fatal(err)
				}
				_ = u.SetReadDeadline(time.Now().Add(10 * time.Second))
				n, from, err := u.ReadFromUDPAddrPort(buf)
				if err != nil || from != kaddr || !bytes.Equal(buf[:n], p) {
					t.Fatalf("%d bytes from the kernel: got %d from %v, %v", size, n, from, err)
				}
				if _, err := u.WriteToUDPAddrPort(buf[:n], from); err != nil {
					t.Fatal(err)
				}
				_ = k.SetReadDeadline(time.Now().Add(10 * time.Second))
				kb := make([]byte, 65536)
				kn, kfrom, err := k.ReadFromUDPAddrPort(kb)
				if err != nil || kfrom.Port() != la.Port() || !bytes.Equal(kb[:kn], p) {
					t.Fatalf("%d bytes back to the kernel: got %d from %v, %v", size, kn, kfrom, err)
				}
			}
		})
	}
	t.Run("connected", func(t *testing.T) {
		u, err := c.DialUDP("udp4", netip.AddrPort{}, l.echo4)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		p := payload(1400, 7)
		if _, err := u.Write(p); err != nil {
			t.Fatal(err)
		}
		_ = u.SetReadDeadline(time.Now().Add(10 * time.Second))
		buf := make([]byte, 2000)
		n, err := u.Read(buf)
		if err != nil || !bytes.Equal(buf[:n], p) {
			t.Fatalf("connected echo: %d, %v", n, err)
		}
		// Options reach the daemon and come back.
		if err := u.SetOption("IP_TOS", 0x10); err != nil {
			t.Fatal(err)
		}
		if v, err := u.Option("IP_TOS"); err != nil || v != 0x10 {
			t.Errorf("IP_TOS = %#x, %v", v, err)
		}
		if err := u.SetMaxPacingRate(1 << 20); err != nil {
			t.Errorf("SetMaxPacingRate: %v", err)
		}
		if v, err := u.Option("SO_MAX_PACING_RATE"); err != nil || v != (1<<20)/125*125 {
			t.Errorf("SO_MAX_PACING_RATE = %d, %v; want %d (kbit/s × 125)", v, err, (1<<20)/125*125)
		}
		if err := u.SetOption("SO_NOPE", 1); !errors.Is(err, unix.ENOPROTOOPT) {
			t.Errorf("unknown option: %v", err)
		}
	})
	t.Run("port conflict", func(t *testing.T) {
		a, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		_, err = c.ListenUDP("udp4", a.LocalAddr().(*net.UDPAddr).AddrPort())
		if !errors.Is(err, unix.EADDRINUSE) {
			t.Errorf("second bind of %v: %v, want EADDRINUSE", a.LocalAddr(), err)
		}
	})
}

func TestE2EDeadlinesAndClose(t *testing.T) { forEachPath(t, testE2EDeadlinesAndClose) }

func testE2EDeadlinesAndClose(t *testing.T, path string) {
	l := newLab(t, path)
	c := l.client(t)
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	_ = u.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, _, err := u.ReadFrom(make([]byte, 10)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("read with nothing sent: %v, want deadline exceeded", err)
	}
	_ = u.SetReadDeadline(time.Time{})
	got := make(chan error, 1)
	go func() {
		_, _, err := u.ReadFrom(make([]byte, 10))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := u.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, net.ErrClosed) {
			t.Errorf("read pending at Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not unblock the reader")
	}
	// The port is free again once closed.
	v, err := c.ListenUDP("udp4", u.LocalAddr().(*net.UDPAddr).AddrPort())
	if err != nil {
		t.Fatalf("rebind after Close: %v", err)
	}
	v.Close()
}

// TestE2EDaemonStops: a read blocked when the daemon shuts down fails
// promptly with ErrDaemonGone.
func TestE2EDaemonStops(t *testing.T) { forEachPath(t, testE2EDaemonStops) }

func testE2EDaemonStops(t *testing.T, path string) {
	l := newLab(t, path)
	c := l.client(t)
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	got := make(chan error, 1)
	go func() {
		_, _, err := u.ReadFrom(make([]byte, 10))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond)
	if err := l.d.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if !errors.Is(err, ErrDaemonGone) || !errors.Is(err, net.ErrClosed) {
			t.Errorf("read pending when bypassd stopped: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the reader hangs after bypassd stopped")
	}
	if _, err := u.WriteToUDPAddrPort([]byte("x"), l.echo4); !errors.Is(err, ErrDaemonGone) {
		t.Errorf("write after bypassd stopped: %v", err)
	}
}

// TestE2EThousandSockets runs on the default path only: it is the
// package's longest test, and the TAP path's per-socket filters at this
// scale are covered by daemon's TestManySocketsReleasedOnKill (auto
// fallback) and TestTAPFiltersFollowSockets.
func TestE2EThousandSockets(t *testing.T) {
	t.Parallel()
	l := newLab(t, "afxdp")
	c := l.client(t)
	const n = 1000
	socks := make([]*UDPConn, 0, n)
	for i := 0; i < n; i++ {
		u, err := c.ListenUDPConfig("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0), ListenConfig{QueueBytes: 4096})
		if err != nil {
			t.Fatalf("socket %d: %v", i, err)
		}
		socks = append(socks, u)
	}
	// Waves of 100 in flight: well below every queue and ring limit.
	buf := make([]byte, 100)
	for w := 0; w < n; w += 100 {
		for i := w; i < w+100; i++ {
			if _, err := socks[i].WriteToUDPAddrPort(payload(64, uint64(i)), l.echo4); err != nil {
				t.Fatalf("socket %d: %v", i, err)
			}
		}
		for i := w; i < w+100; i++ {
			_ = socks[i].SetReadDeadline(time.Now().Add(10 * time.Second))
			k, _, err := socks[i].ReadFromUDPAddrPort(buf)
			if err != nil || !bytes.Equal(buf[:k], payload(64, uint64(i))) {
				t.Fatalf("socket %d: echo %d bytes, %v", i, k, err)
			}
		}
	}
	for _, u := range socks {
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestE2EManyClients: 4 client processes with 50 sockets each exchange
// datagrams with B concurrently, byte-exact and without loss.
func TestE2EManyClients(t *testing.T) { forEachPath(t, testE2EManyClients) }

func testE2EManyClients(t *testing.T, path string) {
	l := newLab(t, path)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := 0; i < 4; i++ {
		cmd := l.child(t, "echo", envSocks+"=50", envIndex+"="+strconv.Itoa(i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			if out, err := cmd.CombinedOutput(); err != nil {
				errs <- fmt.Errorf("client process %d: %v\n%s", i, err, out)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestE2EUnprivileged: a client running as nobody is accelerated, may not
// bind port 80 and cannot touch another client's socket.
func TestE2EUnprivileged(t *testing.T) { forEachPath(t, testE2EUnprivileged) }

func testE2EUnprivileged(t *testing.T, path string) {
	l := newLab(t, path)
	c := l.client(t)
	mine, err := c.ListenUDP("udp4", netip.AddrPortFrom(l.p.A.Addr4(), 0))
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	// The test binary may sit in a directory only root can read.
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	copyPath := filepath.Join(l.dir, "socket.test")
	if err := copyFile(exe, copyPath); err != nil {
		t.Fatal(err)
	}
	cmd := l.child(t, "unpriv", envOther+"="+strconv.FormatUint(uint64(mine.ID()), 10))
	cmd.Path = copyPath
	cmd.Args[0] = copyPath
	cmd.Dir = l.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("unprivileged client: %v\n%s", err, out)
	}
	// The other client's attempts left this socket working.
	if err := echoRound(mine, l.echo4, payload(100, 1), make([]byte, 200)); err != nil {
		t.Fatalf("socket after the other client's attempts: %v", err)
	}
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// child returns a command re-running this test binary as a client process.
func (l *lab) child(t *testing.T, role string, env ...string) *exec.Cmd {
	t.Helper()
	return childCommand(t, role, l.path, l.echo4, l.p.A.Addr4(), env...)
}

// childCommand re-runs this test binary as a client process of the daemon
// at path in role, with peer and local in its environment.
func childCommand(t *testing.T, role, path string, peer netip.AddrPort, local netip.Addr, env ...string) *exec.Cmd {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		envChild+"="+role,
		"BYPASSD_SOCKET="+path,
		envPeer+"="+peer.String(),
		envLocal+"="+local.String(),
	)
	cmd.Env = append(cmd.Env, env...)
	return cmd
}

// childMain runs a client process's role; its error makes the exit status 1.
func childMain(role string) error {
	peer, err := netip.ParseAddrPort(os.Getenv(envPeer))
	if err != nil {
		return err
	}
	local, err := netip.ParseAddr(os.Getenv(envLocal))
	if err != nil {
		return err
	}
	c, err := Dial("") // BYPASSD_SOCKET
	if err != nil {
		return err
	}
	defer c.Close()
	switch role {
	case "echo":
		return childEcho(c, local, peer)
	case "unpriv":
		return childUnpriv(c, local, peer)
	case "tcp-hold":
		return childTCPHold(c, peer)
	}
	return fmt.Errorf("unknown role %q", role)
}

func childEcho(c *Client, local netip.Addr, peer netip.AddrPort) error {
	nsocks, _ := strconv.Atoi(os.Getenv(envSocks))
	idx, _ := strconv.Atoi(os.Getenv(envIndex))
	socks := make([]*UDPConn, nsocks)
	for i := range socks {
		u, err := c.ListenUDPConfig("udp4", netip.AddrPortFrom(local, 0), ListenConfig{QueueBytes: 32 << 10})
		if err != nil {
			return fmt.Errorf("socket %d: %w", i, err)
		}
		defer u.Close()
		socks[i] = u
	}
	var wg sync.WaitGroup
	errs := make(chan error, nsocks)
	for i, u := range socks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65536)
			for r := 0; r < 12; r++ {
				size := []int{18, 1400, 8000}[r%3]
				p := payload(size, uint64(idx<<20|i<<8|r))
				if err := echoRound(u, peer, p, buf); err != nil {
					errs <- fmt.Errorf("socket %d round %d: %w", i, r, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		return err
	}
	return nil
}

func childUnpriv(c *Client, local netip.Addr, peer netip.AddrPort) error {
	if os.Getuid() == 0 {
		return errors.New("the unprivileged child runs as root")
	}
	u, err := c.ListenUDP("udp4", netip.AddrPortFrom(local, 0))
	if err != nil {
		return fmt.Errorf("accelerated socket as uid %d: %w", os.Getuid(), err)
	}
	defer u.Close()
	if err := echoRound(u, peer, payload(1400, 5), make([]byte, 2000)); err != nil {
		return fmt.Errorf("echo as uid %d: %w", os.Getuid(), err)
	}
	if _, err := c.ListenUDP("udp4", netip.AddrPortFrom(local, 80)); !errors.Is(err, unix.EACCES) {
		return fmt.Errorf("bind port 80 as uid %d: %v, want EACCES", os.Getuid(), err)
	}
	// Acting on another client's socket id: this session does not own it.
	other, err := strconv.ParseUint(os.Getenv(envOther), 10, 32)
	if err != nil {
		return err
	}
	foreign := &UDPConn{c: c, id: uint32(other), network: "udp4"}
	if err := foreign.SetOption("IP_TTL", 1); !errors.Is(err, unix.EBADF) {
		return fmt.Errorf("SETSOCKOPT on another client's socket: %v, want EBADF", err)
	}
	if _, err := foreign.request(ctlproto.CodeClose, ctlproto.Empty{}); !errors.Is(err, unix.EBADF) {
		return fmt.Errorf("CLOSE of another client's socket: %v, want EBADF", err)
	}
	return nil
}

// TestE2EMulticast: two sockets of one client joined to a group each get
// every datagram a kernel sender in B sends; leaving stops delivery;
// source-specific membership filters by sender.
func TestE2EMulticast(t *testing.T) { forEachPath(t, testE2EMulticast) }

func testE2EMulticast(t *testing.T, path string) {
	l := newLab(t, path)
	c := l.client(t)
	group := netip.MustParseAddr("239.1.2.3")
	// B routes multicast out of its veth; a second address in B is the
	// source the source-specific member does not want.
	nl := l.p.B.NS.Netlink()
	link, err := nl.LinkByIndex(l.p.B.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := nl.RouteAdd(&netlink.Route{LinkIndex: l.p.B.Index, Dst: &net.IPNet{IP: net.IPv4(239, 0, 0, 0), Mask: net.CIDRMask(8, 32)}}); err != nil {
		t.Fatalf("multicast route in B: %v", err)
	}
	src2 := l.p.B.Addr4().Next().Next().Next()
	if err := nl.AddrAdd(link, &netlink.Addr{IPNet: &net.IPNet{IP: src2.AsSlice(), Mask: net.CIDRMask(32, 32)}}); err != nil {
		t.Fatalf("second address %v in B: %v", src2, err)
	}
	send1 := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(l.p.B.Addr4(), 0))
	send2 := l.p.B.NS.ListenUDP(t, netip.AddrPortFrom(src2, 0))

	port := uint16(20000 + os.Getpid()%10000)
	dst := netip.AddrPortFrom(group, port)
	var socks [3]*UDPConn
	for i := range socks {
		u, err := c.ListenUDPConfig("udp4", netip.AddrPortFrom(netip.IPv4Unspecified(), port), ListenConfig{ReuseAddr: true})
		if err != nil {
			t.Fatalf("socket %d on :%d: %v", i, port, err)
		}
		defer u.Close()
		socks[i] = u
	}
	// 0 and 1 any-source; 2 only from B's first address.
	for _, u := range socks[:2] {
		if err := u.JoinGroup(group); err != nil {
			t.Fatal(err)
		}
	}
	if err := socks[2].JoinSourceGroup(group, l.p.B.Addr4()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2000)
	expect := func(u *UDPConn, p []byte, from netip.Addr) {
		t.Helper()
		_ = u.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, f, err := u.ReadFromUDPAddrPort(buf)
		if err != nil || f.Addr() != from || !bytes.Equal(buf[:n], p) {
			t.Fatalf("socket %d: got %d bytes from %v, %v; want %q from %v", u.ID(), n, f, err, p, from)
		}
	}
	// Nothing arrives within a generous wait (a negative check needs one).
	expectNone := func(u *UDPConn) {
		t.Helper()
		_ = u.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		if n, f, err := u.ReadFromUDPAddrPort(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("socket %d: got %q from %v (%v), want nothing", u.ID(), buf[:n], f, err)
		}
	}
	for i := 0; i < 5; i++ {
		p := []byte(fmt.Sprintf("from B #%d", i))
		if _, err := send1.WriteToUDPAddrPort(p, dst); err != nil {
			t.Fatal(err)
		}
		for _, u := range socks {
			expect(u, p, l.p.B.Addr4())
		}
	}
	p := []byte("from the second source")
	if _, err := send2.WriteToUDPAddrPort(p, dst); err != nil {
		t.Fatal(err)
	}
	expect(socks[0], p, src2)
	expect(socks[1], p, src2)
	expectNone(socks[2])

	// Leaving stops delivery to that socket only.
	if err := socks[0].LeaveGroup(group); err != nil {
		t.Fatal(err)
	}
	if err := socks[2].LeaveSourceGroup(group, l.p.B.Addr4()); err != nil {
		t.Fatal(err)
	}
	p = []byte("after leaving")
	if _, err := send1.WriteToUDPAddrPort(p, dst); err != nil {
		t.Fatal(err)
	}
	expect(socks[1], p, l.p.B.Addr4())
	expectNone(socks[0])
	expectNone(socks[2])
}
