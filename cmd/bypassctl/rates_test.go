package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/sched/pacing"
	"github.com/bypassd/bypassd/socket"
)

// A re-executed test binary plays a client holding paced sockets, so that
// the test can kill -9 it.
const (
	envChild  = "BYPASSCTL_TEST_CHILD"
	envSocket = "BYPASSCTL_TEST_SOCKET"
	envAddr   = "BYPASSCTL_TEST_ADDR"
)

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "paced" {
		os.Exit(pacedChild())
	}
	os.Exit(m.Run())
}

// pacedChild opens two sockets paced at 40 Mbit/s (one shared entry),
// says "ready" and holds them until killed.
func pacedChild() int {
	c, err := socket.Dial(os.Getenv(envSocket))
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	addr := netip.MustParseAddr(os.Getenv(envAddr))
	for i := 0; i < 2; i++ {
		u, err := c.ListenUDP("udp4", netip.AddrPortFrom(addr, 0))
		if err == nil {
			err = u.SetMaxPacingRate(5_000_000)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "paced socket:", err)
			return 1
		}
	}
	fmt.Println("ready")
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

func ratesDoc(t *testing.T, sock string) ctldoc.RateTableDoc {
	t.Helper()
	var doc ctldoc.RatesDoc
	if err := json.Unmarshal([]byte(mustCtl(t, sock, "--json", "rates")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Tables) != 1 {
		t.Fatalf("rates: %d tables, want 1", len(doc.Tables))
	}
	return doc.Tables[0]
}

func users(td ctldoc.RateTableDoc) map[uint32]int {
	m := map[uint32]int{}
	for _, e := range td.Entries {
		m[e.Kbps] = e.Users
	}
	return m
}

// TestRatesRefuse: a 2-entry table with the refuse policy. Identical rates
// share an entry, a third rate is refused with ENOSPC, closing and a killed
// client release entries; bypassctl and the counters show each step.
func TestRatesRefuse(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{Pacing: pacing.TableConfig{Capacity: 2}}, nil)
	sock := srv.SocketPath()
	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	open := func() *socket.UDPConn {
		u, err := c.ListenUDP("udp4", netip.AddrPortFrom(p.A.Addr4(), 0))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = u.Close() })
		return u
	}
	u1, u2, u3, u4 := open(), open(), open(), open()
	for _, s := range []struct {
		u   *socket.UDPConn
		bps uint32
	}{{u1, 1_250_000}, {u2, 1_250_000}, {u3, 2_500_000}} {
		if err := s.u.SetMaxPacingRate(s.bps); err != nil {
			t.Fatal(err)
		}
	}
	err = u4.SetMaxPacingRate(3_750_000)
	if !errors.Is(err, unix.ENOSPC) || !strings.Contains(err.Error(), "rate table") {
		t.Fatalf("a third rate in a full 2-entry table: %v, want ENOSPC explaining the rate table", err)
	}
	out := mustCtl(t, sock, "rates")
	for _, want := range []string{p.A.Name + ": 2 of 2 rates used, 3 of 512 paced sockets", "when full: refuse", "refused: full 1", "10Mbit/s", "20Mbit/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("bypassctl rates lacks %q:\n%s", want, out)
		}
	}
	if td := ratesDoc(t, sock); users(td)[10_000] != 2 || users(td)[20_000] != 1 || td.Shared != 1 || td.RefusedFull != 1 {
		t.Errorf("rates document: %+v", td)
	}
	// Both users of 10 Mbit/s go: the entry is free for the refused rate.
	_ = u1.Close()
	if td := ratesDoc(t, sock); users(td)[10_000] != 1 {
		t.Errorf("after one close: %+v", td.Entries)
	}
	if err := u2.SetMaxPacingRate(0); err != nil {
		t.Fatal(err)
	}
	if td := ratesDoc(t, sock); td.Used != 1 || td.Queues != 1 {
		t.Errorf("after the last 10 Mbit/s user left: %d used, %d queues", td.Used, td.Queues)
	}
	if err := u4.SetMaxPacingRate(3_750_000); err != nil {
		t.Fatalf("the freed entry: %v", err)
	}
	if err := u4.SetMaxPacingRate(0); err != nil {
		t.Fatal(err)
	}

	// A client killed with two paced sockets frees its entry.
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=paced", envSocket+"="+sock, envAddr+"="+p.A.Addr4().String())
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	// Pdeathsig follows the forking thread: keep it until the test ends.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stdin.Close(); _ = cmd.Process.Kill(); _ = cmd.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("child: %q %v (stderr: %s)", line, err, stderr.String())
	}
	if td := ratesDoc(t, sock); users(td)[40_000] != 2 || td.Used != 2 {
		t.Fatalf("with the child's sockets: %+v", td)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	var td ctldoc.RateTableDoc
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if td = ratesDoc(t, sock); td.Used == 1 {
			break
		}
	}
	if td.Used != 1 || td.Queues != 1 || users(td)[20_000] != 1 {
		t.Errorf("one second after kill -9 of the client: %+v", td)
	}
}

// TestRatesNearest: with the nearest policy a full table hands out the
// closest rate in use, and the socket reads back the rate it got.
func TestRatesNearest(t *testing.T) {
	t.Parallel()
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{Pacing: pacing.TableConfig{Capacity: 2, Policy: pacing.Nearest}}, nil)
	sock := srv.SocketPath()
	c, err := socket.Dial(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var us []*socket.UDPConn
	for _, kbps := range []uint32{10_000, 30_000, 19_000, 26_000} {
		u, err := c.ListenUDP("udp4", netip.AddrPortFrom(p.A.Addr4(), 0))
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		if err := u.SetPacing(socket.Pacing{Kbps: kbps}); err != nil {
			t.Fatalf("%d kbit/s: %v", kbps, err)
		}
		us = append(us, u)
	}
	for i, want := range []uint32{10_000, 30_000, 10_000, 30_000} {
		info, err := us[i].PacingInfo()
		if err != nil || info.Kbps != want {
			t.Errorf("socket %d paced at %d kbit/s (%v), want %d", i, info.Kbps, err, want)
		}
		if bps, err := us[i].Option("SO_MAX_PACING_RATE"); err != nil || bps != int(want)*125 {
			t.Errorf("socket %d: SO_MAX_PACING_RATE reads %d (%v), want %d", i, bps, err, want*125)
		}
	}
	td := ratesDoc(t, sock)
	if td.Nearest != 2 || td.Used != 2 || users(td)[10_000] != 2 || users(td)[30_000] != 2 {
		t.Errorf("rates document: %+v", td)
	}
	if out := mustCtl(t, sock, "rates"); !strings.Contains(out, "nearest 2") || !strings.Contains(out, "when full: nearest") {
		t.Errorf("bypassctl rates:\n%s", out)
	}
}
