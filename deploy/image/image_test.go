package image

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/netlab"
)

// daemonCaps is the documented least-privilege set (docs/operations.md,
// "Privileges"; deploy/systemd, deploy/helm and deploy/k8s use the same).
var daemonCaps = []string{"NET_ADMIN", "NET_RAW", "BPF", "PERFMON", "IPC_LOCK", "CHOWN", "NET_BIND_SERVICE"}

// namePrefix starts every container and image name the test creates; the
// pid after it lets a later run remove what a killed run left (sweep).
const namePrefix = "bdtest-i19-"

// pongFlags are sockperf's header flags (lab-facts, "sockperf wire
// protocol"): the client sets CLIENT, PONG asks for a reply.
const (
	flagClient = 0x1
	flagPong   = 0x2
)

// TestContainer runs the image built by build.sh (make image): the daemon
// in one container with only daemonCaps, a client in another sharing the
// socket directory, then one daemon per capability left out.
func TestContainer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the OCI image (about a minute)")
	}
	netlab.RequirePriv(t)
	requireTools(t, "podman", "buildah", "runc", "python3")
	sweep(t)

	e := &env{t: t, prefix: fmt.Sprintf("%s%d-", namePrefix, os.Getpid())}
	e.image = "localhost/" + strings.TrimSuffix(e.prefix, "-") + ":test"
	e.build()
	e.seccomp = filepath.Join(t.TempDir(), "seccomp.json")
	prof, err := exec.Command("python3", "seccomp-bpf.py").Output()
	if err != nil {
		t.Fatalf("seccomp-bpf.py: %v", err)
	}
	if err := os.WriteFile(e.seccomp, prof, 0o644); err != nil {
		t.Fatal(err)
	}
	e.lab = netlab.NewPair(t, netlab.Options{StaticNeigh: true})

	t.Run("ServesClientContainer", e.servesClient)
	for _, c := range daemonCaps {
		t.Run("Without"+c, func(t *testing.T) { e.withoutCap(t, c) })
	}
}

type env struct {
	t       *testing.T
	prefix  string // container names: prefix + role
	image   string
	seccomp string
	lab     *netlab.Pair
}

// podman runs podman with the global flags these machines need (crun
// refuses the hybrid cgroup layout; lab-facts, "Containers here").
func podman(ctx context.Context, args ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "podman", append([]string{"--runtime", "runc", "--cgroup-manager", "cgroupfs"}, args...)...)
}

// run runs podman and returns its combined output and error.
func run(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := podman(ctx, args...).CombinedOutput()
	return string(out), err
}

// build builds the image with build.sh under the test's own tag and removes
// the tag at the end.
func (e *env) build() {
	t := e.t
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, "./build.sh", t.TempDir())
	cmd.Env = append(os.Environ(), "IMAGE_TAG="+e.image)
	t.Cleanup(func() {
		if out, err := run(time.Minute, "rmi", "--force", e.image); err != nil {
			t.Errorf("remove image %s: %v\n%s", e.image, err, out)
		}
	})
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("build.sh: %v\n%s", err, out)
	}
	t.Logf("image %s built in %v: %s", e.image, time.Since(start).Round(time.Millisecond), strings.TrimSpace(lastLine(string(out))))
}

// runFlags are the podman run flags of every container: the lab's first
// namespace as its network, read-only root, no privilege escalation, the
// seccomp profile of seccomp-bpf.py, no capabilities (the daemon adds its
// own), the limits this machine allows.
func (e *env) runFlags(name, runDir string) []string {
	nofile, nproc := ulimit(unix.RLIMIT_NOFILE, 20000), ulimit(unix.RLIMIT_NPROC, 32768)
	// 4 MiB of locked memory, half the default UMEM (4096 × 2048): without
	// CAP_IPC_LOCK the daemon must fail (WithoutIPC_LOCK) on any machine.
	// Not 8 MiB: the kernel refuses only a charge above the limit, and the
	// charge is per user, so an exact fit passed when uid 0 had nothing
	// else locked and failed when it had.
	memlock := ulimit(unix.RLIMIT_MEMLOCK, 4<<20)
	return []string{"run", "--name", name, "--pull=never", "--read-only",
		"--network", "ns:" + e.lab.A.NS.Path(),
		"--ulimit", fmt.Sprintf("nofile=%d:%d", nofile, nofile),
		"--ulimit", fmt.Sprintf("nproc=%d:%d", nproc, nproc),
		"--ulimit", fmt.Sprintf("memlock=%d:%d", memlock, memlock),
		"--security-opt", "no-new-privileges",
		"--security-opt", "seccomp=" + e.seccomp,
		"--cap-drop", "all",
		"-v", runDir + ":/run/bypassd"}
}

// ulimit is want, or the hard limit of resource when that is lower: podman's
// defaults exceed the hard limits on these machines, and runc cannot raise
// them (lab-facts, "Containers here").
func ulimit(resource int, want uint64) uint64 {
	var l unix.Rlimit
	if err := unix.Getrlimit(resource, &l); err == nil && l.Max < want {
		return l.Max
	}
	return want
}

// daemonArgs starts the daemon on the lab's first link: no TAP fallback
// (/proc/sys is read-only in the container) and no hardware stamps (veth).
func (e *env) daemonArgs(caps []string) []string {
	var a []string
	if len(caps) > 0 {
		a = append(a, "--cap-add", strings.Join(caps, ","))
	}
	return append(a, e.image, "-i", e.lab.A.Name, "--fallback", "none", "--hw-ts-conversion", "0")
}

// runDir makes a socket directory for one daemon, readable by the client
// user.
func (e *env) runDir(t *testing.T) string {
	d := t.TempDir()
	if err := os.Chmod(d, 0o755); err != nil {
		t.Fatal(err)
	}
	return d
}

// startDaemon starts the daemon container detached and waits until its
// control socket answers; it is removed at the end of t.
func (e *env) startDaemon(t *testing.T, caps []string, runDir string) (name string) {
	name = e.prefix + "daemon"
	t.Cleanup(func() { removeContainer(t, name) })
	args := append(append(e.runFlags(name, runDir), "-d"), e.daemonArgs(caps)...)
	if out, err := run(2*time.Minute, args...); err != nil {
		t.Fatalf("podman run daemon: %v\n%s", err, out)
	}
	sock := filepath.Join(runDir, "bypassd.sock")
	deadline := time.Now().Add(time.Minute)
	for {
		a, err := ctlproto.DialAdmin(sock, "image-test")
		if err == nil {
			a.Close()
			return name
		}
		state, _ := run(time.Minute, "inspect", "--format", "{{.State.Status}}", name)
		if s := strings.TrimSpace(state); s != "running" && s != "created" && s != "configured" || time.Now().After(deadline) {
			logs, _ := run(time.Minute, "logs", name)
			t.Fatalf("daemon container %s is %q, socket: %v\n%s", name, s, err, logs)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// removeContainer stops (SIGTERM, then SIGKILL after 10 s) and removes a
// container; one that does not exist is fine.
func removeContainer(t *testing.T, name string) {
	out, err := run(time.Minute, "rm", "--force", "--ignore", "--time", "10", name)
	if err != nil {
		t.Errorf("remove container %s: %v\n%s", name, err, out)
	}
}

// client runs bypass-perf ping-pong in a second container against the peer
// and returns its output.
func (e *env) client(t *testing.T, runDir, user string, peer netip.AddrPort, localPort int) (string, error) {
	name := e.prefix + "client"
	t.Cleanup(func() { removeContainer(t, name) })
	args := append(e.runFlags(name, runDir), "--rm", "--user", user, "--entrypoint", "/usr/bin/bypass-perf", e.image,
		"ping-pong", "--no-color", "-i", peer.Addr().String(), "-p", strconv.Itoa(int(peer.Port())), "-t", "0.5",
		"--client_ip", e.lab.A.Addr4().String(), "--client_port", strconv.Itoa(localPort))
	return run(2*time.Minute, args...)
}

// servesClient: the daemon with daemonCaps serves bypass-perf in a second
// container as the unprivileged image user; every datagram the peer saw
// left through the ring, every reply came back through it, and the
// namespace's kernel UDP counters did not move.
func (e *env) servesClient(t *testing.T) {
	runDir := e.runDir(t)
	e.startDaemon(t, daemonCaps, runDir)
	peer := startEcho(t, e.lab)

	rx0, tx0 := ringPackets(t, filepath.Join(runDir, "bypassd.sock"))
	in0 := snmp(t, e.lab.A.NS, "InDatagrams")
	out0 := snmp(t, e.lab.A.NS, "OutDatagrams")

	out, err := e.client(t, runDir, "65532:65532", peer.addr, 0)
	if err != nil {
		t.Fatalf("client container: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`ReceivedMessages=(\d+)`).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("client printed no ReceivedMessages:\n%s", out)
	}
	// Replies to the last requests may still be on the way when the
	// client exits: wait until the counters settle.
	var rx, tx uint64
	deadline := time.Now().Add(10 * time.Second)
	for {
		rx, tx = ringPackets(t, filepath.Join(runDir, "bypassd.sock"))
		if tx-tx0 == peer.got.Load() && rx-rx0 == peer.replied.Load() || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	got, replied := peer.got.Load(), peer.replied.Load()
	t.Logf("client: ReceivedMessages=%s; peer got %d, replied %d; ring tx +%d, rx +%d", m[1], got, replied, tx-tx0, rx-rx0)
	// Any number proves the path: how many round trips fit in 0.5 s
	// depends on the machine's load, not on bypassd.
	if got == 0 || m[1] == "0" {
		t.Errorf("the peer got %d datagrams, the client %s replies: want some\n%s", got, m[1], out)
	}
	if tx-tx0 != got || rx-rx0 != replied {
		t.Errorf("ring counters rose by tx %d, rx %d; the peer got %d and replied %d: traffic bypassed the ring", tx-tx0, rx-rx0, got, replied)
	}
	if in, out := snmp(t, e.lab.A.NS, "InDatagrams"), snmp(t, e.lab.A.NS, "OutDatagrams"); in != in0 || out != out0 {
		t.Errorf("kernel UDP counters of the daemon's namespace moved: InDatagrams %d -> %d, OutDatagrams %d -> %d", in0, in, out0, out)
	}

	// A root client may bind a port below 1024: the daemon reserves it
	// with CAP_NET_BIND_SERVICE (WithoutNET_BIND_SERVICE is the converse).
	if out, err := e.client(t, runDir, "0:0", peer.addr, 80); err != nil || !strings.Contains(out, "ReceivedMessages=") {
		t.Errorf("root client on port 80: %v\n%s", err, out)
	}
}

// withoutCap: the daemon given every capability but c fails, naming it.
// Without NET_BIND_SERVICE the daemon starts (only clients binding ports
// below 1024 need it), so there a root client's bind to port 80 must fail.
func (e *env) withoutCap(t *testing.T, c string) {
	var caps []string
	for _, x := range daemonCaps {
		if x != c {
			caps = append(caps, x)
		}
	}
	runDir := e.runDir(t)
	want := "CAP_" + c
	if c == "NET_BIND_SERVICE" {
		e.startDaemon(t, caps, runDir)
		out, _ := e.client(t, runDir, "0:0", netip.AddrPortFrom(e.lab.B.Addr4(), 9), 80)
		if !strings.Contains(out, "permission denied") || !strings.Contains(out, want) {
			t.Errorf("root client binding port 80 without the daemon's %s: want a permission error naming it, got:\n%s", want, out)
		}
		return
	}
	name := e.prefix + "daemon"
	t.Cleanup(func() { removeContainer(t, name) })
	out, err := run(2*time.Minute, append(append(e.runFlags(name, runDir), "--rm"), e.daemonArgs(caps)...)...)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() == 0 {
		t.Fatalf("daemon without %s: want it to exit with an error, got %v\n%s", want, err, out)
	}
	line := ""
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, `"cannot start"`) {
			line = l
		}
	}
	if !strings.Contains(line, want) {
		t.Errorf("daemon without %s: its error does not name it:\n%s", want, out)
	}
	t.Logf("without %s: %s", want, line)
}

// ringPackets sums the daemon's ring counters (bypassctl rings).
func ringPackets(t *testing.T, sock string) (rx, tx uint64) {
	t.Helper()
	a, err := ctlproto.DialAdmin(sock, "image-test")
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	var doc ctldoc.RingsDoc
	if err := a.Query(ctldoc.TopicRings, &doc); err != nil {
		t.Fatal(err)
	}
	for _, r := range doc.Rings {
		rx += r.RXPackets
		tx += r.TXPackets
	}
	return rx, tx
}

func snmp(t *testing.T, ns *netlab.NS, field string) uint64 {
	t.Helper()
	v, err := ns.SNMPCounter("Udp", field)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// echo is a kernel UDP peer in the lab's second namespace answering
// sockperf requests that ask for a reply, counting what it got and sent.
type echo struct {
	addr         netip.AddrPort
	got, replied atomic.Uint64
}

func startEcho(t *testing.T, lab *netlab.Pair) *echo {
	var c *net.UDPConn
	if err := lab.B.NS.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(lab.B.Addr4(), 0)))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	e := &echo{addr: c.LocalAddr().(*net.UDPAddr).AddrPort()}
	done := make(chan struct{})
	t.Cleanup(func() { c.Close(); <-done })
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := c.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			e.got.Add(1)
			if n < 14 {
				continue
			}
			flags := binary.BigEndian.Uint16(buf[8:10])
			if flags&flagPong == 0 {
				continue
			}
			binary.BigEndian.PutUint16(buf[8:10], flags&^flagClient)
			if _, err := c.WriteToUDPAddrPort(buf[:n], from); err == nil {
				e.replied.Add(1)
			}
		}
	}()
	return e
}

// requireTools skips (fails under BYPASSD_REQUIRE_PRIV=1) when a program is
// missing; `make test` installs them (Makefile, APT_PKGS).
func requireTools(t *testing.T, names ...string) {
	for _, n := range names {
		if _, err := exec.LookPath(n); err != nil {
			msg := fmt.Sprintf("%s not found: install it (apt-get install %s, or run `make test`, which does)", n, n)
			if os.Getenv(netlab.RequirePrivEnv) == "1" {
				t.Fatal(msg)
			}
			t.Skip(msg)
		}
	}
}

// sweep removes the containers and images of earlier runs whose process is
// gone (a killed test cannot clean up after itself).
func sweep(t *testing.T) {
	re := regexp.MustCompile(`^(?:localhost/)?` + namePrefix + `(\d+)`)
	dead := func(s string) bool {
		m := re.FindStringSubmatch(s)
		if m == nil {
			return false
		}
		pid, _ := strconv.Atoi(m[1])
		return syscall.Kill(pid, 0) == syscall.ESRCH
	}
	out, err := run(time.Minute, "ps", "--all", "--format", "{{.Names}}")
	if err != nil {
		t.Fatalf("podman ps: %v\n%s", err, out)
	}
	for _, n := range strings.Fields(out) {
		if dead(n) {
			removeContainer(t, n)
		}
	}
	out, err = run(time.Minute, "images", "--format", "{{.Repository}}:{{.Tag}}")
	if err != nil {
		t.Fatalf("podman images: %v\n%s", err, out)
	}
	for _, n := range strings.Fields(out) {
		if dead(n) {
			if o, err := run(time.Minute, "rmi", "--force", n); err != nil {
				t.Errorf("remove image %s: %v\n%s", n, err, o)
			}
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}
