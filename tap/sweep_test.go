package tap_test

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/tap"
)

// The test binary doubles as a daemon stand-in that installs fallback
// filters and waits to be killed.
const (
	envChildNS   = "TAP_TEST_CHILD_NS"
	envChildLink = "TAP_TEST_CHILD_LINK"
	envChildAddr = "TAP_TEST_CHILD_ADDR"
	childFlows   = 100
)

func TestMain(m *testing.M) {
	if path := os.Getenv(envChildNS); path != "" {
		if err := child(path); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// child enters the namespace, installs childFlows flows and blocks.
func child(nsPath string) error {
	runtime.LockOSThread()
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return err
	}
	if err := netns.Set(ns); err != nil {
		return err
	}
	ifindex, _ := strconv.Atoi(os.Getenv(envChildLink))
	addr := netip.MustParseAddr(os.Getenv(envChildAddr))
	dev, err := tap.Create(tap.DeviceConfig{Name: tap.DeviceName(ifindex, 0)})
	if err != nil {
		return err
	}
	s, err := tap.NewSteering(netns.None(), ifindex, dev)
	if err != nil {
		return err
	}
	for i := 0; i < childFlows; i++ {
		if err := s.AddFlow(udpFlow(netip.AddrPortFrom(addr, uint16(20000+i)))); err != nil {
			return err
		}
	}
	fmt.Println("ready")
	select {}
}

// TestSweepAfterKill: a process holding 100 flows is killed with SIGKILL.
// Its TAP disappears with it; its filters stay until Sweep, which refuses
// while the process lives, then removes them and the ingress qdisc. A
// filter at our priority that is not ours is never touched.
func TestSweepAfterKill(t *testing.T) {
	netlab.RequirePriv(t)
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), envChildNS+"="+p.A.NS.Path(), envChildLink+"="+strconv.Itoa(p.A.Index),
		envChildAddr+"="+p.A.Addr4().String())
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	// Pdeathsig follows the thread that forked: keep it alive meanwhile.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		t.Fatalf("child: %q, %v", line, err)
	}
	sweep := func() (int, error) {
		var n int
		err := p.A.NS.Do(func() error {
			var err error
			n, err = tap.Sweep(netns.None(), p.A.Index)
			return err
		})
		return n, err
	}
	if n, err := sweep(); err == nil || !strings.Contains(err.Error(), "another bypassd") {
		t.Fatalf("sweep with the owner alive: %d, %v; want a refusal", n, err)
	}
	_ = cmd.Process.Kill()
	_ = cmd.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tc := func(args ...string) string {
		out, err := p.A.NS.Command(ctx, "tc", args...).CombinedOutput()
		if err != nil {
			t.Fatalf("tc %v: %v: %s", args, err, out)
		}
		return string(out)
	}
	if got := strings.Count(tc("filter", "show", "dev", p.A.Name, "ingress"), "mirred"); got != childFlows+1 {
		t.Fatalf("after the kill: %d stale redirects, want %d", got, childFlows+1)
	}
	if out, _ := p.A.NS.Command(ctx, "ip", "link", "show", tap.DeviceName(p.A.Index, 0)).CombinedOutput(); !strings.Contains(string(out), "does not exist") {
		t.Errorf("the dead process's TAP still exists: %s", out)
	}
	if n, err := sweep(); err != nil || n != 1 {
		t.Fatalf("sweep: %d classifiers, %v; want 1", n, err)
	}
	if show := tc("filter", "show", "dev", p.A.Name, "ingress"); strings.TrimSpace(show) != "" {
		t.Errorf("filters left after the sweep:\n%s", show)
	}
	if show := tc("qdisc", "show", "dev", p.A.Name, "ingress"); strings.TrimSpace(show) != "" {
		t.Errorf("ingress qdisc left after the sweep:\n%s", show)
	}

	// Someone else's filter at our priority: refused, and left alone.
	tc("qdisc", "add", "dev", p.A.Name, "ingress")
	tc("filter", "add", "dev", p.A.Name, "parent", "ffff:", "prio", strconv.Itoa(tap.PrioIPv4), "protocol", "ip",
		"u32", "match", "ip", "dst", "192.0.2.1/32")
	if n, err := sweep(); err == nil || !strings.Contains(err.Error(), "not bypassd's") {
		t.Fatalf("sweep over a foreign filter: %d, %v; want a refusal", n, err)
	}
	if show := tc("filter", "show", "dev", p.A.Name, "ingress"); !strings.Contains(show, "c0000201") {
		t.Errorf("the foreign filter was touched:\n%s", show)
	}
}
