package socket

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/shmq"
)

var (
	local4  = netip.MustParseAddrPort("10.9.0.1:0")
	remote4 = netip.MustParseAddrPort("10.9.0.2:7000")
	remote6 = netip.MustParseAddrPort("[fd00:9::2]:7000")
)

func TestDialHandshake(t *testing.T) {
	t.Setenv(EnvRXPoll, "")
	d := newFakeDaemon(t, func(d *fakeDaemon) { d.helloReply.RXPollMicros = 25 })
	c := d.dial(t)
	if c.DaemonPID() != 4242 {
		t.Errorf("DaemonPID = %d, want 4242", c.DaemonPID())
	}
	if c.Path() != d.path {
		t.Errorf("Path = %q, want %q", c.Path(), d.path)
	}
	if c.policy.Spin != 25*time.Microsecond {
		t.Errorf("policy spin = %v, want 25µs from HELLO", c.policy.Spin)
	}

	t.Setenv(EnvRXPoll, "-1")
	c2 := d.dial(t)
	if c2.policy.Spin != shmq.SpinForever {
		t.Errorf("policy spin with %s=-1: %v, want spin forever", EnvRXPoll, c2.policy.Spin)
	}
	t.Setenv(EnvRXPoll, "soon")
	if _, err := Dial(d.path); err == nil || !strings.Contains(err.Error(), EnvRXPoll) {
		t.Errorf("Dial with %s=soon: %v, want an error naming the variable", EnvRXPoll, err)
	}
}

func TestDialNoDaemon(t *testing.T) {
	dir := t.TempDir()
	_, err := Dial(dir + "/none.sock")
	if err == nil {
		t.Fatal("Dial without a daemon succeeded")
	}
	if !errors.Is(err, unix.ENOENT) || !strings.Contains(err.Error(), "bypassd is not running") || !strings.Contains(err.Error(), "start it") {
		t.Errorf("error %q should match ENOENT and say how to start bypassd", err)
	}
}

func TestDialEnvPath(t *testing.T) {
	d := newFakeDaemon(t)
	t.Setenv(ctlproto.EnvSocket, d.path)
	c, err := Dial("")
	if err != nil {
		t.Fatalf("Dial(\"\") with %s: %v", ctlproto.EnvSocket, err)
	}
	defer c.Close()
	if c.Path() != d.path {
		t.Errorf("Path = %q, want %q", c.Path(), d.path)
	}
}

func TestVersionMismatch(t *testing.T) {
	t.Run("newer daemon", func(t *testing.T) {
		// ctlproto refuses to encode another version, so this daemon
		// patches the version bytes of a valid reply.
		path := rawDaemon(t, func(req []byte) []byte {
			h, _, err := ctlproto.Unmarshal(req)
			if err != nil {
				t.Errorf("raw daemon: %v", err)
			}
			b, err := ctlproto.Marshal(nil, ctlproto.ReplyHeader(h), ctlproto.HelloReply{Version: 2, DaemonPID: 1})
			if err != nil {
				t.Error(err)
			}
			binary.LittleEndian.PutUint16(b[2:], 3)
			return b
		})
		_, err := Dial(path)
		if err == nil {
			t.Fatal("Dial succeeded against a version-3 daemon")
		}
		msg := err.Error()
		if !errors.Is(err, unix.EPROTONOSUPPORT) || !strings.Contains(msg, "version 3") || !strings.Contains(msg, "version 2") || !strings.Contains(msg, "upgrade this program") {
			t.Errorf("error %q should name both versions and say to upgrade this program", msg)
		}
	})
	t.Run("version 1 daemon", func(t *testing.T) {
		// A version 1 daemon refuses our HELLO in a version 1 header.
		path := rawDaemon(t, func(req []byte) []byte {
			h, _, _ := ctlproto.Unmarshal(req)
			b, err := ctlproto.Marshal(nil, ctlproto.ErrorReply(h, unix.EPROTONOSUPPORT), nil)
			if err != nil {
				t.Error(err)
			}
			binary.LittleEndian.PutUint16(b[2:], 1)
			return b
		})
		_, err := Dial(path)
		if err == nil || !errors.Is(err, unix.EPROTONOSUPPORT) || !strings.Contains(err.Error(), "version 1") || !strings.Contains(err.Error(), "upgrade bypassd") {
			t.Errorf("error %v should name version 1 and say to upgrade bypassd", err)
		}
	})
	t.Run("reply body version", func(t *testing.T) {
		d := newFakeDaemon(t, func(d *fakeDaemon) { d.helloReply.Version = 3 })
		_, err := Dial(d.path)
		if err == nil || !strings.Contains(err.Error(), "version 3") || !strings.Contains(err.Error(), "version 2") {
			t.Errorf("error %v should name versions 3 and 2", err)
		}
	})
	t.Run("daemon refuses", func(t *testing.T) {
		d := newFakeDaemon(t)
		d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
			if h.Code == ctlproto.CodeHello {
				s.fail(h, unix.EPROTONOSUPPORT)
				return true
			}
			return false
		})
		_, err := Dial(d.path)
		if err == nil || !errors.Is(err, unix.EPROTONOSUPPORT) || !strings.Contains(err.Error(), "upgrade bypassd") || !strings.Contains(err.Error(), "version 2") {
			t.Errorf("error %v should match EPROTONOSUPPORT, name version 2 and say to upgrade bypassd", err)
		}
	})
	t.Run("silent daemon", func(t *testing.T) {
		d := newFakeDaemon(t)
		d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool { return true })
		_, err := dial(d.path, 100*time.Millisecond)
		if err == nil || !errors.Is(err, unix.ETIMEDOUT) || !strings.Contains(err.Error(), "HELLO") {
			t.Errorf("error %v should be a HELLO timeout", err)
		}
	})
	t.Run("daemon hangs up", func(t *testing.T) {
		d := newFakeDaemon(t)
		d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
			_ = s.conn.Close()
			return true
		})
		_, err := Dial(d.path)
		if err == nil || !strings.Contains(err.Error(), "closed the connection during HELLO") {
			t.Errorf("error %v should say the daemon hung up during HELLO", err)
		}
	})
}

// rawDaemon listens on a fresh SOCK_SEQPACKET socket and answers the first
// packet of each connection with respond's bytes, then keeps the connection
// open until the test ends.
func rawDaemon(t *testing.T, respond func(req []byte) []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "raw.sock")
	ln, err := net.ListenUnix("unixpacket", &net.UnixAddr{Name: path, Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			buf := make([]byte, 1024)
			n, err := c.Read(buf)
			if err != nil {
				continue
			}
			if _, err := c.Write(respond(buf[:n])); err != nil {
				t.Errorf("raw daemon: %v", err)
			}
		}
	}()
	return path
}

func TestErrnoPropagation(t *testing.T) {
	d := newFakeDaemon(t)
	d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
		if h.Code == ctlproto.CodeBind && m.(*ctlproto.Bind).Addr.Port() == 80 {
			s.fail(h, unix.EACCES)
			return true
		}
		if h.Code == ctlproto.CodeBind && m.(*ctlproto.Bind).Addr.Port() == 5000 {
			s.fail(h, unix.EADDRINUSE)
			return true
		}
		if h.Code == ctlproto.CodeJoin {
			s.fail(h, unix.EADDRNOTAVAIL)
			return true
		}
		return false
	})
	c := d.dial(t)
	g0 := d.closes.Load()
	_, err := c.ListenUDP("udp4", netip.AddrPortFrom(local4.Addr(), 5000))
	var oe *net.OpError
	if !errors.As(err, &oe) || oe.Op != "listen" || oe.Net != "udp4" || !errors.Is(err, unix.EADDRINUSE) {
		t.Fatalf("ListenUDP on a taken port: %v, want *net.OpError listen udp4 matching EADDRINUSE", err)
	}
	var de *DaemonError
	if !errors.As(err, &de) || de.Request != "BIND" || !strings.Contains(err.Error(), "ReuseAddr") {
		t.Errorf("error %q should be a DaemonError for BIND with advice", err)
	}
	_, err = c.ListenUDP("udp4", netip.AddrPortFrom(local4.Addr(), 80))
	if !errors.Is(err, unix.EACCES) || !strings.Contains(err.Error(), "CAP_NET_BIND_SERVICE") {
		t.Errorf("ListenUDP on port 80: %v, want EACCES mentioning CAP_NET_BIND_SERVICE", err)
	}
	// Both failed sockets were closed at the daemon again.
	if got := d.closes.Load() - g0; got != 2 {
		t.Errorf("daemon saw %d CLOSE after failed binds, want 2", got)
	}

	u, err := c.ListenUDP("udp4", local4)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	err = u.JoinGroup(netip.MustParseAddr("239.1.2.3"))
	if !errors.Is(err, unix.EADDRNOTAVAIL) || !errors.As(err, &oe) || oe.Op != "set" {
		t.Errorf("JoinGroup refused: %v, want set error matching EADDRNOTAVAIL", err)
	}
	err = u.SetMaxPacingRate(125000)
	if !errors.Is(err, unix.EOPNOTSUPP) || !strings.Contains(err.Error(), "this bypassd cannot pace") {
		t.Errorf("SetMaxPacingRate to a daemon without pacing: %v, want EOPNOTSUPP saying it cannot pace", err)
	}
	// A request for a socket the daemon does not know.
	u.id = 999
	if err := u.SetOption("IP_TOS", 16); !errors.Is(err, unix.EBADF) {
		t.Errorf("SetOption on unknown id: %v, want EBADF", err)
	}
}

func TestListenDialAddresses(t *testing.T) {
	d := newFakeDaemon(t)
	c := d.dial(t)
	u, err := c.ListenUDP("udp", netip.AddrPort{})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	la := u.LocalAddr().(*net.UDPAddr)
	if !la.AddrPort().Addr().Unmap().IsUnspecified() || !la.AddrPort().Addr().Unmap().Is4() || la.Port == 0 || u.RemoteAddr() != nil {
		t.Errorf("udp wildcard listen: local %v remote %v, want 0.0.0.0:N and no remote", la, u.RemoteAddr())
	}
	v6, err := c.DialUDP("udp", netip.AddrPort{}, remote6)
	if err != nil {
		t.Fatal(err)
	}
	defer v6.Close()
	if !v6.v6 || v6.RemoteAddr().String() != remote6.String() {
		t.Errorf("DialUDP udp to v6: v6=%v remote=%v", v6.v6, v6.RemoteAddr())
	}
	for _, tc := range []struct {
		network string
		laddr   netip.AddrPort
		want    error
	}{
		{"udp4", netip.MustParseAddrPort("[fd00::1]:0"), unix.EAFNOSUPPORT},
		{"udp6", local4, unix.EAFNOSUPPORT},
		{"tcp", local4, net.UnknownNetworkError("tcp")},
	} {
		_, err := c.ListenUDP(tc.network, tc.laddr)
		if !errors.Is(err, tc.want) {
			t.Errorf("ListenUDP(%s, %v): %v, want %v", tc.network, tc.laddr, err, tc.want)
		}
	}
	if _, err := c.DialUDP("udp4", netip.AddrPort{}, netip.AddrPort{}); !errors.Is(err, unix.EDESTADDRREQ) {
		t.Errorf("DialUDP without remote: %v, want EDESTADDRREQ", err)
	}
	if _, err := c.ListenUDPConfig("udp4", local4, ListenConfig{QueueBytes: 5000}); !errors.Is(err, unix.EINVAL) {
		t.Errorf("QueueBytes 5000: %v, want EINVAL", err)
	}
}

func TestListenConfigReuseAddr(t *testing.T) {
	d := newFakeDaemon(t)
	var mu sync.Mutex
	var bindReuse []bool
	d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
		if h.Code == ctlproto.CodeBind {
			fs := s.sock(h.Socket)
			s.mu.Lock()
			_, opt := fs.opts[[2]int32{unix.SOL_SOCKET, unix.SO_REUSEADDR}]
			s.mu.Unlock()
			mu.Lock()
			bindReuse = append(bindReuse, m.(*ctlproto.Bind).ReuseAddr && opt)
			mu.Unlock()
		}
		return false
	})
	c := d.dial(t)
	u, err := c.ListenUDPConfig("udp4", local4, ListenConfig{ReuseAddr: true, QueueBytes: 16 << 10})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if v, err := u.Option("SO_REUSEADDR"); err != nil || v != 1 {
		t.Errorf("SO_REUSEADDR = %d, %v; want 1", v, err)
	}
	if u.maxQueued != 8<<10-8-48 {
		t.Errorf("max queued payload %d with 16 KiB queues, want %d", u.maxQueued, 8<<10-8-48)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(bindReuse) != 1 || !bindReuse[0] {
		t.Errorf("BIND saw reuse %v, want SO_REUSEADDR set before a BIND with the flag", bindReuse)
	}
}

func TestOptionNames(t *testing.T) {
	d := newFakeDaemon(t)
	c := d.dial(t)
	u, err := c.ListenUDP("udp4", local4)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	err = u.SetOption("SO_FROBNICATE", 1)
	if !errors.Is(err, unix.ENOPROTOOPT) || !strings.Contains(err.Error(), "IP_TOS") || !strings.Contains(err.Error(), "SO_MAX_PACING_RATE") {
		t.Errorf("unknown option: %v, want ENOPROTOOPT listing the known names", err)
	}
	if _, err := u.Option("ip_tos"); !errors.Is(err, unix.ENOPROTOOPT) {
		t.Errorf("Option(ip_tos): %v, want ENOPROTOOPT (names are case-sensitive)", err)
	}
	names := OptionNames()
	if len(names) != 22 {
		t.Errorf("OptionNames() = %v, want the 22 documented names (14 of UDP and TCP sockets, 8 of TCP sockets)", names)
	}
	for i, name := range names {
		if name == "SO_MAX_PACING_RATE" {
			continue // the fake refuses it like today's daemon
		}
		v := 3 + i
		if err := u.SetOption(name, v); err != nil {
			t.Errorf("SetOption(%s, %d): %v", name, v, err)
			continue
		}
		got, err := u.Option(name)
		if err != nil || got != v {
			t.Errorf("Option(%s) = %d, %v; want %d", name, got, err, v)
		}
	}
	fs := d.session(0).sock(u.id)
	d.session(0).mu.Lock()
	tos := fs.opts[[2]int32{0, 1}]
	d.session(0).mu.Unlock()
	if !bytes.Equal(tos, []byte{byte(3 + indexOf(names, "IP_TOS")), 0, 0, 0}) {
		t.Errorf("IP_TOS on the wire = %x, want level 0 name 1 as a little-endian int", tos)
	}
	if err := u.SetOption("IP_TTL", 1<<40); !errors.Is(err, unix.EINVAL) {
		t.Errorf("IP_TTL 2^40: %v, want EINVAL", err)
	}
	if err := u.SetOption("SO_MAX_PACING_RATE", -1); !errors.Is(err, unix.EINVAL) {
		t.Errorf("SO_MAX_PACING_RATE -1: %v, want EINVAL", err)
	}
	if err := u.SetReadBuffer(1 << 20); err != nil {
		t.Errorf("SetReadBuffer: %v", err)
	}
	if v, _ := u.Option("SO_RCVBUF"); v != 1<<20 {
		t.Errorf("SO_RCVBUF = %d after SetReadBuffer(1 MiB)", v)
	}
}

func indexOf(s []string, v string) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}

func TestOptionDecode(t *testing.T) {
	o := options["SO_MAX_PACING_RATE"]
	if v, err := o.decode("x", []byte{0xff, 0xff, 0xff, 0xff}); err != nil || v != 0xffffffff {
		t.Errorf("u32 decode = %d, %v", v, err)
	}
	if v, err := o.decode("x", []byte{1, 0, 0, 0, 1, 0, 0, 0}); err != nil || v != 1<<32+1 {
		t.Errorf("u64 decode = %d, %v", v, err)
	}
	i := options["IP_TTL"]
	if v, err := i.decode("x", []byte{0xff, 0xff, 0xff, 0xff}); err != nil || v != -1 {
		t.Errorf("int decode = %d, %v", v, err)
	}
	if v, err := i.decode("x", []byte{7}); err != nil || v != 7 {
		t.Errorf("byte decode = %d, %v", v, err)
	}
	if _, err := i.decode("x", []byte{1, 2}); !errors.Is(err, unix.EPROTO) {
		t.Errorf("2-byte decode: %v, want EPROTO", err)
	}
}

func TestMulticastRequests(t *testing.T) {
	d := newFakeDaemon(t)
	c := d.dial(t)
	u, err := c.ListenUDP("udp4", netip.MustParseAddrPort("0.0.0.0:5353"))
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	g := netip.MustParseAddr("239.1.2.3")
	src := netip.MustParseAddr("10.9.0.2")
	for _, step := range []func() error{
		func() error { return u.JoinGroup(g) },
		func() error { return u.JoinSourceGroup(g, src) },
		func() error { return u.LeaveSourceGroup(g, src) },
		func() error { return u.LeaveGroup(g) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	s := d.session(0)
	fs := s.sock(u.id)
	s.mu.Lock()
	groups := fs.groups
	s.mu.Unlock()
	if len(groups) != 4 || groups[0].Group != g || groups[0].Source.IsValid() || groups[1].Source != src || groups[0].Ifindex != 0 {
		t.Errorf("daemon saw %+v", groups)
	}
	for _, bad := range []func() error{
		func() error { return u.JoinGroup(netip.MustParseAddr("10.1.1.1")) },
		func() error { return u.JoinGroup(netip.MustParseAddr("ff02::1")) },
		func() error { return u.JoinSourceGroup(g, netip.Addr{}) },
		func() error { return u.JoinSourceGroup(g, netip.MustParseAddr("239.0.0.1")) },
		func() error { return u.LeaveSourceGroup(g, netip.Addr{}) },
	} {
		if err := bad(); !errors.Is(err, unix.EINVAL) {
			t.Errorf("invalid membership request: %v, want EINVAL", err)
		}
	}
}

// TestShutdownBreaksSockets: SHUTDOWN from the daemon fails a blocked read
// promptly with a clear error, and every later call too.
func TestShutdownBreaksSockets(t *testing.T) {
	for _, how := range []string{"shutdown", "eof"} {
		t.Run(how, func(t *testing.T) {
			d := newFakeDaemon(t)
			c := d.dial(t)
			u, err := c.DialUDP("udp4", local4, remote4)
			if err != nil {
				t.Fatal(err)
			}
			defer u.Close()
			got := make(chan error, 1)
			go func() {
				_, err := u.Read(make([]byte, 100))
				got <- err
			}()
			time.Sleep(20 * time.Millisecond) // let the read block
			s := d.session(0)
			start := time.Now()
			if how == "shutdown" {
				s.send(ctlproto.Header{Code: ctlproto.CodeShutdown}, ctlproto.Shutdown{Reason: ctlproto.ShutdownDaemonStopping})
			} else {
				s.close()
			}
			var rerr error
			select {
			case rerr = <-got:
			case <-time.After(5 * time.Second):
				t.Fatal("blocked Read did not return after the daemon went away")
			}
			// Generous on a loaded CI machine; the spec'd budget is 100 ms.
			if el := time.Since(start); el > time.Second {
				t.Errorf("Read took %v to notice", el)
			}
			if !errors.Is(rerr, ErrDaemonGone) || !errors.Is(rerr, net.ErrClosed) || !strings.Contains(rerr.Error(), "restart it") {
				t.Errorf("Read error %q should match ErrDaemonGone and net.ErrClosed and say to restart", rerr)
			}
			if how == "shutdown" && !strings.Contains(rerr.Error(), "shutting down") {
				t.Errorf("Read error %q should say the daemon is shutting down", rerr)
			}
			if _, err := u.Write([]byte("x")); !errors.Is(err, ErrDaemonGone) {
				t.Errorf("Write after the daemon left: %v", err)
			}
			if err := u.SetOption("IP_TOS", 1); !errors.Is(err, ErrDaemonGone) {
				t.Errorf("SetOption after the daemon left: %v", err)
			}
			if _, err := c.ListenUDP("udp4", local4); !errors.Is(err, ErrDaemonGone) {
				t.Errorf("ListenUDP after the daemon left: %v", err)
			}
			if err := u.Close(); err != nil {
				t.Errorf("Close after the daemon left: %v", err)
			}
		})
	}
}

// TestSocketErrorBreaksOneSocket: SOCKET_ERROR (the daemon dropped a
// socket whose interface vanished) fails that socket's calls, also a
// blocked Read, with an error matching ENETDOWN and net.ErrClosed that says
// what to do; other sockets and the session go on, and closing the dead
// socket still sends CLOSE (the daemon frees what it held) without failing.
func TestSocketErrorBreaksOneSocket(t *testing.T) {
	d := newFakeDaemon(t)
	c := d.dial(t)
	dead, err := c.DialUDP("udp4", local4, remote4)
	if err != nil {
		t.Fatal(err)
	}
	alive, err := c.DialUDP("udp4", local4, remote4)
	if err != nil {
		t.Fatal(err)
	}
	defer alive.Close()
	got := make(chan error, 1)
	go func() {
		_, err := dead.Read(make([]byte, 100))
		got <- err
	}()
	time.Sleep(20 * time.Millisecond) // let the read block
	d.session(0).send(ctlproto.Header{Code: ctlproto.CodeSocketError, Socket: dead.id}, ctlproto.SocketError{Errno: uint32(unix.ENETDOWN)})
	var rerr error
	select {
	case rerr = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("blocked Read did not return after SOCKET_ERROR")
	}
	if !errors.Is(rerr, unix.ENETDOWN) || !errors.Is(rerr, net.ErrClosed) || !strings.Contains(rerr.Error(), "interface went away") {
		t.Errorf("Read error %q should match ENETDOWN and net.ErrClosed and say the interface went away", rerr)
	}
	if _, err := dead.Write([]byte("x")); !errors.Is(err, unix.ENETDOWN) {
		t.Errorf("Write on the dropped socket: %v", err)
	}
	// The other socket and the session are fine.
	if _, err := alive.Write([]byte("still here")); err != nil {
		t.Fatalf("Write on another socket: %v", err)
	}
	buf := make([]byte, 100)
	_ = alive.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := alive.Read(buf); err != nil || string(buf[:n]) != "still here" {
		t.Fatalf("Read on another socket: %q, %v", buf[:n], err)
	}
	closes := d.closes.Load()
	if err := dead.Close(); err != nil {
		t.Errorf("Close of the dropped socket: %v", err)
	}
	if d.closes.Load() != closes+1 {
		t.Error("closing a dropped socket did not send CLOSE (the daemon frees the rest then)")
	}
	if _, err := c.ListenUDP("udp4", local4); err != nil {
		t.Errorf("a new socket after SOCKET_ERROR: %v", err)
	}
}

func TestRequestTimeout(t *testing.T) {
	d := newFakeDaemon(t)
	var mu sync.Mutex
	var held []ctlproto.Header
	d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
		if h.Code == ctlproto.CodeSetSockOpt || h.Code == ctlproto.CodeOpen && m.(*ctlproto.Open).QueueBytes == 8192 {
			mu.Lock()
			held = append(held, h)
			mu.Unlock()
			return true // never answered... until released below
		}
		return false
	})
	c, err := dial(d.path, 150*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	u, err := c.ListenUDP("udp4", local4)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	err = u.SetOption("IP_TOS", 8)
	if !errors.Is(err, unix.ETIMEDOUT) || !strings.Contains(err.Error(), "did not answer SETSOCKOPT") {
		t.Errorf("unanswered SETSOCKOPT: %v, want ETIMEDOUT naming the request", err)
	}
	g0, f0 := resources(t)
	_, err = c.ListenUDPConfig("udp4", local4, ListenConfig{QueueBytes: 8192})
	if !errors.Is(err, unix.ETIMEDOUT) {
		t.Errorf("unanswered OPEN: %v, want ETIMEDOUT", err)
	}
	// Late answers: the SETSOCKOPT one is dropped, the OPEN one's fds are
	// closed and its socket closed at the daemon.
	closes := d.closes.Load()
	d.setHook(nil)
	mu.Lock()
	for _, h := range held {
		d.session(0).handle(h, map[ctlproto.Code]ctlproto.Message{
			ctlproto.CodeSetSockOpt: &ctlproto.SetSockOpt{Level: 0, Name: 1, Value: []byte{8, 0, 0, 0}},
			ctlproto.CodeOpen:       &ctlproto.Open{Family: ctlproto.FamilyInet, Type: ctlproto.TypeDgram, QueueBytes: 8192},
		}[h.Code])
	}
	mu.Unlock()
	for start := time.Now(); d.closes.Load() == closes; time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("the orphaned OPEN's socket was never closed")
		}
	}
	settle(t, g0, f0)
	// The session still works.
	if err := u.SetOption("IP_TTL", 9); err != nil {
		t.Errorf("SetOption after a timeout: %v", err)
	}
}

// TestConcurrentRequests: many goroutines' requests answered out of order
// each get their own reply.
func TestConcurrentRequests(t *testing.T) {
	d := newFakeDaemon(t)
	var n int
	var mu sync.Mutex
	d.setHook(func(s *fakeSession, h ctlproto.Header, m ctlproto.Message) bool {
		if h.Code != ctlproto.CodeGetSockOpt {
			return false
		}
		mu.Lock()
		n++
		delay := time.Duration(n%5) * time.Millisecond
		mu.Unlock()
		go func() {
			time.Sleep(delay) // replies overtake each other
			s.handle(h, m)
		}()
		return true
	})
	c := d.dial(t)
	var socks []*UDPConn
	for i := 0; i < 8; i++ {
		u, err := c.ListenUDP("udp4", local4)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		if err := u.SetOption("IP_TTL", 10+i); err != nil {
			t.Fatal(err)
		}
		socks = append(socks, u)
	}
	var wg sync.WaitGroup
	for i, u := range socks {
		for j := 0; j < 20; j++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if v, err := u.Option("IP_TTL"); err != nil || v != 10+i {
					t.Errorf("socket %d: IP_TTL = %d, %v; want %d", i, v, err, 10+i)
				}
			}()
		}
	}
	wg.Wait()
}

func TestClientCloseAndLeaks(t *testing.T) {
	d := newFakeDaemon(t)
	g0, f0 := resources(t)
	for round := 0; round < 3; round++ {
		c, err := dial(d.path, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var socks []*UDPConn
		for i := 0; i < 10; i++ {
			u, err := c.DialUDP("udp4", local4, remote4)
			if err != nil {
				t.Fatal(err)
			}
			socks = append(socks, u)
		}
		// Half are closed one by one, the rest by the Client.
		for _, u := range socks[:5] {
			if err := u.Close(); err != nil {
				t.Fatal(err)
			}
			if err := u.Close(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("second Close: %v, want net.ErrClosed", err)
			}
		}
		blocked := make(chan error, 1)
		go func() {
			_, err := socks[7].Read(make([]byte, 10))
			blocked <- err
		}()
		time.Sleep(10 * time.Millisecond)
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-blocked; !errors.Is(err, net.ErrClosed) || errors.Is(err, ErrDaemonGone) {
			t.Errorf("Read during Client.Close: %v, want net.ErrClosed only", err)
		}
		if _, err := socks[6].Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Write after Client.Close: %v", err)
		}
		if _, err := c.ListenUDP("udp4", local4); !errors.Is(err, net.ErrClosed) {
			t.Errorf("ListenUDP after Client.Close: %v", err)
		}
		if err := c.Close(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("second Client.Close: %v", err)
		}
		for _, u := range socks[5:] {
			if err := u.Close(); !errors.Is(err, net.ErrClosed) {
				t.Errorf("Close of a socket its Client closed: %v", err)
			}
		}
	}
	settle(t, g0, f0)
}

func TestDefault(t *testing.T) {
	d := newFakeDaemon(t)
	t.Setenv(ctlproto.EnvSocket, d.path)
	defer func() {
		defaultMu.Lock()
		if defaultClient != nil {
			_ = defaultClient.Close()
			defaultClient = nil
		}
		defaultMu.Unlock()
	}()
	u, err := ListenUDP("udp4", local4)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	c1, _ := Default()
	if u.c != c1 {
		t.Error("ListenUDP did not use the default client")
	}
	v, err := DialUDP("udp4", netip.AddrPort{}, remote4)
	if err != nil {
		t.Fatal(err)
	}
	defer v.Close()
	if v.c != c1 {
		t.Error("DialUDP did not use the default client")
	}
	// After the daemon goes away, Default dials again.
	d.session(0).close()
	for start := time.Now(); c1.alive(); time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("client did not notice the daemon leaving")
		}
	}
	c2, err := Default()
	if err != nil || c2 == c1 {
		t.Fatalf("Default after the daemon left: %v (same client: %v)", err, c2 == c1)
	}
	_ = c1.Close()

	t.Setenv(ctlproto.EnvSocket, d.path+".none")
	defaultMu.Lock()
	_ = defaultClient.Close()
	defaultClient = nil
	defaultMu.Unlock()
	if _, err := ListenUDP("udp4", local4); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("ListenUDP without a daemon: %v", err)
	}
	if _, err := os.Stat(d.path); err != nil {
		t.Fatal(err)
	}
}
