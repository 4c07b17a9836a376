package daemon

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/sched/pacing"
)

func TestPollMicros(t *testing.T) {
	for d, want := range map[time.Duration]int32{0: 0, -1: -1, -time.Second: -1, 50 * time.Microsecond: 50, 1500 * time.Nanosecond: 1} {
		if got := pollMicros(d); got != want {
			t.Errorf("pollMicros(%v) = %d, want %d", d, got, want)
		}
	}
}

func TestInterfaceLock(t *testing.T) {
	dir := t.TempDir()
	l, err := lockInterface(dir, "veth9")
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "veth9.lock"))
	if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Fatalf("lock file holds %q, %v; want our pid", b, err)
	}
	// flock is per open file, so a second attempt in this process is
	// refused like another daemon would be, naming the holder.
	_, err = lockInterface(dir, "veth9")
	if err == nil || !strings.Contains(err.Error(), "in use by another bypassd (pid "+strconv.Itoa(os.Getpid())+")") {
		t.Fatalf("second lock: %v", err)
	}
	other, err := lockInterface(dir, "veth8")
	if err != nil {
		t.Fatalf("other interface: %v", err)
	}
	if err := other.release(); err != nil {
		t.Fatal(err)
	}
	if err := l.release(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "veth9.lock")); !os.IsNotExist(err) {
		t.Fatalf("lock file left behind: %v", err)
	}
	// A stale file (a crashed daemon's, not locked) is simply re-taken.
	if err := os.WriteFile(filepath.Join(dir, "veth9.lock"), []byte("999999999\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	l, err = lockInterface(dir, "veth9")
	if err != nil {
		t.Fatalf("stale lock: %v", err)
	}
	b, _ = os.ReadFile(filepath.Join(dir, "veth9.lock"))
	if strings.TrimSpace(string(b)) != strconv.Itoa(os.Getpid()) {
		t.Errorf("stale lock file now holds %q", b)
	}
	_ = l.release()
}

func TestStatsDirCleanup(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "stats")
	if err := prepareStatsDir(dir, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	files := map[string]bool{ // name: must survive
		"999999999":               false, // above pid_max: never alive
		strconv.Itoa(os.Getpid()): true,
		"1":                       true, // init: alive (EPERM or not)
		"notes":                   true,
	}
	for name := range files {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "999999998"), 0o755); err != nil {
		t.Fatal(err)
	}
	files["999999998"] = true // directories are not ours
	if err := prepareStatsDir(dir, zap.NewNop()); err != nil {
		t.Fatal(err)
	}
	for name, keep := range files {
		_, err := os.Stat(filepath.Join(dir, name))
		if keep != (err == nil) {
			t.Errorf("%s: exists=%v, want %v", name, err == nil, keep)
		}
	}
	// A file in the way of the directory is a clear error.
	f := filepath.Join(t.TempDir(), "file")
	_ = os.WriteFile(f, nil, 0o644)
	if err := prepareStatsDir(f, zap.NewNop()); err == nil || !strings.Contains(err.Error(), "--stats-dir") {
		t.Errorf("stats dir over a file: %v", err)
	}
}

func TestParseCapEff(t *testing.T) {
	caps, err := parseCapEff(strings.NewReader("Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000000400\n"))
	if err != nil || caps != 1<<capNetBindService {
		t.Errorf("parseCapEff = %#x, %v", caps, err)
	}
	if _, err := parseCapEff(strings.NewReader("Name:\tx\n")); err == nil {
		t.Error("no CapEff line: no error")
	}
	if _, err := parseCapEff(strings.NewReader("CapEff:\tzz\n")); err == nil {
		t.Error("bad CapEff: no error")
	}
	if !peerCanBindPrivileged(0, 999999999) {
		t.Error("uid 0 refused")
	}
	if peerCanBindPrivileged(65534, 999999999) {
		t.Error("a vanished process got the privilege")
	}
	if os.Geteuid() == 0 {
		caps, err := effectiveCaps(int32(os.Getpid()))
		if err != nil {
			t.Fatal(err)
		}
		if want := caps&(1<<capNetBindService) != 0; peerCanBindPrivileged(1000, int32(os.Getpid())) != want {
			t.Errorf("CAP_NET_BIND_SERVICE of this process not seen (CapEff %#x)", caps)
		}
	}
}

// testSocket is an unbound socket for option tests.
func testSocket(family uint16) *socket {
	return &socket{family: family, queueBytes: 65536, hdr: ring.DefaultHeaderOptions,
		home: &ringInfo{rates: pacing.NewTable(pacing.TableConfig{Device: "test0"})}}
}

func le32(v int32) []byte { return intBytes(v) }

func TestSocketOptions(t *testing.T) {
	k := testSocket(unix.AF_INET)
	get := func(level, name int32) int32 {
		t.Helper()
		b, err := k.option(level, name)
		if err != nil {
			t.Fatalf("get %s: %v", optName(level, name), err)
		}
		v, _ := intValue(unix.SOL_SOCKET, name, b)
		return v
	}
	set := func(level, name int32, v []byte) error {
		t.Helper()
		return k.setOption(level, name, v)
	}
	// Defaults as in Linux.
	for _, tc := range []struct {
		level, name, want int32
	}{
		{unix.SOL_SOCKET, unix.SO_TYPE, unix.SOCK_DGRAM},
		{unix.SOL_SOCKET, unix.SO_DOMAIN, unix.AF_INET},
		{unix.SOL_SOCKET, unix.SO_PROTOCOL, unix.IPPROTO_UDP},
		{unix.SOL_SOCKET, unix.SO_RCVBUF, 65536},
		{unix.SOL_SOCKET, unix.SO_SNDBUF, 65536},
		{unix.SOL_SOCKET, unix.SO_REUSEADDR, 0},
		{unix.IPPROTO_IP, unix.IP_TTL, 64},
		{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, 1},
		{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, 1},
		{unix.IPPROTO_IP, unix.IP_TOS, 0},
	} {
		if got := get(tc.level, tc.name); got != tc.want {
			t.Errorf("%s = %d, want %d", optName(tc.level, tc.name), got, tc.want)
		}
	}
	// Sets, including Linux's one-byte form at IPPROTO_IP.
	for _, tc := range []struct {
		level, name int32
		val         []byte
		want        int32
	}{
		{unix.SOL_SOCKET, unix.SO_REUSEADDR, le32(7), 1},
		{unix.IPPROTO_IP, unix.IP_TTL, le32(9), 9},
		{unix.IPPROTO_IP, unix.IP_TTL, le32(-1), 64},
		{unix.IPPROTO_IP, unix.IP_TTL, []byte{200}, 200},
		{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, le32(0), 0},
		{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, le32(-1), 1},
		{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP, []byte{0}, 0},
		{unix.IPPROTO_IP, unix.IP_TOS, le32(0x1b8), 0xb8},
	} {
		if err := set(tc.level, tc.name, tc.val); err != nil {
			t.Errorf("set %s %v: %v", optName(tc.level, tc.name), tc.val, err)
			continue
		}
		if got := get(tc.level, tc.name); got != tc.want {
			t.Errorf("after set %s %v: %d, want %d", optName(tc.level, tc.name), tc.val, got, tc.want)
		}
	}
	if !k.reuseAddr || k.hdr.TTL != 200 || k.hdr.TOS != 0xb8 || k.hdr.MulticastLoop || k.hdr.MulticastTTL != 1 {
		t.Errorf("header options not recorded: %+v reuse=%v", k.hdr, k.reuseAddr)
	}
	// Errors.
	for _, tc := range []struct {
		level, name int32
		val         []byte
		errno       unix.Errno
	}{
		{unix.IPPROTO_IP, unix.IP_TTL, le32(0), unix.EINVAL},
		{unix.IPPROTO_IP, unix.IP_TTL, le32(256), unix.EINVAL},
		{unix.IPPROTO_IP, unix.IP_TTL, nil, unix.EINVAL},
		{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL, le32(-2), unix.EINVAL},
		{unix.SOL_SOCKET, unix.SO_REUSEADDR, []byte{1}, unix.EINVAL},
		{unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, le32(1000), unix.ERANGE},
		{unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE, []byte{1, 2, 3}, unix.EINVAL},
		{unix.SOL_SOCKET, unix.SO_RCVBUF, []byte{1, 2}, unix.EINVAL},
		{unix.SOL_SOCKET, unix.SO_TYPE, le32(1), unix.ENOPROTOOPT},
		{unix.SOL_SOCKET, unix.SO_KEEPALIVE, le32(1), unix.ENOPROTOOPT},
		{unix.IPPROTO_IP, unix.IP_HDRINCL, le32(1), unix.ENOPROTOOPT},
		{unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS, le32(5), unix.ENOPROTOOPT}, // AF_INET socket
		{unix.IPPROTO_TCP, 1, le32(1), unix.ENOPROTOOPT},
	} {
		err := set(tc.level, tc.name, tc.val)
		if errnoOf(err) != tc.errno {
			t.Errorf("set %s %v: %v; want %v", optName(tc.level, tc.name), tc.val, err, tc.errno)
		}
	}
	// Buffer sizes are clamped to the queue size, like Linux's rmem_max.
	for _, name := range []int32{unix.SO_RCVBUF, unix.SO_SNDBUF} {
		if err := set(unix.SOL_SOCKET, name, le32(1<<24)); err != nil || get(unix.SOL_SOCKET, name) != 65536 {
			t.Errorf("%s after a set: %v", optName(unix.SOL_SOCKET, name), err)
		}
	}
	if _, err := k.option(unix.SOL_SOCKET, unix.SO_KEEPALIVE); errnoOf(err) != unix.ENOPROTOOPT {
		t.Errorf("get SO_KEEPALIVE: %v", err)
	}

	k6 := testSocket(unix.AF_INET6)
	k = k6
	for _, tc := range []struct {
		name int32
		val  int32
		want int32
	}{
		{unix.IPV6_UNICAST_HOPS, 0, 0},
		{unix.IPV6_UNICAST_HOPS, -1, 64},
		{unix.IPV6_MULTICAST_HOPS, 5, 5},
		{unix.IPV6_MULTICAST_LOOP, 0, 0},
		{unix.IPV6_TCLASS, 0x2e, 0x2e},
		{unix.IPV6_TCLASS, -1, 0},
	} {
		if err := set(unix.IPPROTO_IPV6, tc.name, le32(tc.val)); err != nil {
			t.Errorf("set %s %d: %v", optName(unix.IPPROTO_IPV6, tc.name), tc.val, err)
			continue
		}
		if got := get(unix.IPPROTO_IPV6, tc.name); got != tc.want {
			t.Errorf("%s after %d: %d, want %d", optName(unix.IPPROTO_IPV6, tc.name), tc.val, got, tc.want)
		}
	}
	for _, tc := range []struct {
		name int32
		val  []byte
	}{
		{unix.IPV6_MULTICAST_LOOP, le32(2)},
		{unix.IPV6_TCLASS, le32(256)},
		{unix.IPV6_UNICAST_HOPS, le32(-2)},
		{unix.IPV6_UNICAST_HOPS, []byte{1}}, // IPv6 options are ints only
	} {
		if err := set(unix.IPPROTO_IPV6, tc.name, tc.val); errnoOf(err) != unix.EINVAL {
			t.Errorf("set %s %v: %v; want EINVAL", optName(unix.IPPROTO_IPV6, tc.name), tc.val, err)
		}
	}
	// IP-level options apply to AF_INET6 sockets too (v4-mapped traffic).
	if err := set(unix.IPPROTO_IP, unix.IP_TOS, le32(0x10)); err != nil || get(unix.IPPROTO_IPV6, unix.IPV6_TCLASS) != 0x10 {
		t.Errorf("IP_TOS on AF_INET6: %v", err)
	}
	if get(unix.SOL_SOCKET, unix.SO_DOMAIN) != unix.AF_INET6 {
		t.Error("SO_DOMAIN of an AF_INET6 socket")
	}
}

func TestErrnoOf(t *testing.T) {
	if errnoOf(os.ErrClosed) != unix.EIO {
		t.Error("no errno: want EIO")
	}
	if errnoOf(os.NewSyscallError("x", unix.EADDRINUSE)) != unix.EADDRINUSE {
		t.Error("wrapped errno lost")
	}
	if errnoOf(os.ErrDeadlineExceeded) != unix.ETIMEDOUT {
		t.Error("deadline")
	}
}

// IP_TOS sets the socket priority through the kernel's fixed ToS map (the
// QoS document's 0<->0, 8<->2, 24<->4, 16<->6); SO_PRIORITY sets it
// directly; the last one set wins, as in Linux.
func TestSocketPriority(t *testing.T) {
	k := testSocket(unix.AF_INET6)
	prio := func() int32 {
		t.Helper()
		b, err := k.option(unix.SOL_SOCKET, unix.SO_PRIORITY)
		if err != nil {
			t.Fatal(err)
		}
		v, _ := intValue(unix.SOL_SOCKET, unix.SO_PRIORITY, b)
		return v
	}
	for _, c := range []struct {
		level, name int32
		tos         int32
		want        int32
	}{
		{unix.IPPROTO_IP, unix.IP_TOS, 8, 2}, {unix.IPPROTO_IP, unix.IP_TOS, 24, 4},
		{unix.IPPROTO_IP, unix.IP_TOS, 16, 6}, {unix.IPPROTO_IP, unix.IP_TOS, 0, 0},
		{unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 16, 6}, {unix.IPPROTO_IPV6, unix.IPV6_TCLASS, 0xb8, 4}, // EF: ToS bits 0x18
	} {
		if err := k.setOption(c.level, c.name, le32(c.tos)); err != nil {
			t.Fatal(err)
		}
		if got := prio(); got != c.want {
			t.Errorf("%s %d: SO_PRIORITY %d, want %d", optName(c.level, c.name), c.tos, got, c.want)
		}
	}
	if err := k.setOption(unix.SOL_SOCKET, unix.SO_PRIORITY, le32(5)); err != nil || prio() != 5 || k.hdr.TOS != 0xb8 {
		t.Errorf("SO_PRIORITY 5: %v, priority %d, ToS %#x (kept)", err, prio(), k.hdr.TOS)
	}
	// Above 6 needs CAP_NET_ADMIN: a process that is not there has none.
	m := &ctlproto.SetSockOpt{Level: unix.SOL_SOCKET, Name: unix.SO_PRIORITY, Value: le32(7)}
	if err := priorityAllowed(m, 1000, -1); !errors.Is(err, unix.EPERM) || !strings.Contains(err.Error(), "CAP_NET_ADMIN") {
		t.Errorf("unprivileged SO_PRIORITY 7: %v, want EPERM naming CAP_NET_ADMIN", err)
	}
	if err := priorityAllowed(m, 0, -1); err != nil {
		t.Errorf("root SO_PRIORITY 7: %v", err)
	}
	m.Value = le32(6)
	if err := priorityAllowed(m, 1000, -1); err != nil {
		t.Errorf("unprivileged SO_PRIORITY 6: %v", err)
	}
}
