package stats

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

func clientSpec(slots int) FileSpec {
	return FileSpec{Kind: KindClient, PID: os.Getpid(), UID: 1000, Command: "stats.test", Program: "unit-test",
		Started: time.Unix(1700000000, 5), SocketSlots: slots, GID: -1}
}

func newWriter(t *testing.T, path string, spec FileSpec) *Writer {
	t.Helper()
	w, err := Create(path, spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close() })
	return w
}

func sampleSocket(id uint32) Socket {
	s := Socket{
		ID: id, Flags: SocketBound | SocketConnected | SocketMulticastLoop, Family: 2, Ring: 0,
		TTL: 64, MulticastTTL: 1, TOS: 0x10,
		Local:      netip.MustParseAddrPort("10.1.2.3:5000"),
		Peer:       netip.MustParseAddrPort("10.1.2.4:6000"),
		QueueBytes: 65536,
		Groups: []Membership{{Group: netip.MustParseAddr("239.1.1.1")},
			{Group: netip.MustParseAddr("232.1.1.1"), Source: netip.MustParseAddr("10.9.9.9")}},
		GroupCount: 2,
	}
	for i := range s.Counters {
		s.Counters[i] = uint64(id)<<40 | uint64(i)<<33 | 1<<32 | 7 // above 32 bits on purpose
	}
	return s
}

func TestRoundTripClient(t *testing.T) {
	path := filepath.Join(t.TempDir(), "1234")
	w := newWriter(t, path, clientSpec(4))
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if g := r.Generation(); g != 0 {
		t.Errorf("generation before any publication = %d", g)
	}
	empty, err := r.Read()
	if err != nil || len(empty.Sockets) != 0 || empty.Client == nil {
		t.Fatalf("empty read: %+v %v", empty, err)
	}

	socks := []Socket{sampleSocket(3), sampleSocket(9), sampleSocket(11)}
	v6 := sampleSocket(12)
	v6.Family = 10
	v6.Local = netip.MustParseAddrPort("[::]:7000") // the IPv6 wildcard is 16 zero bytes
	v6.Flags = SocketBound
	v6.Peer = netip.AddrPort{}
	v6.Ring = -1
	v6.Groups = []Membership{{Group: netip.MustParseAddr("ff02::1:3")}}
	v6.GroupCount = 20 // more than MaxGroups: only the count tells
	socks = append(socks, v6, sampleSocket(13))
	in := &Snapshot{
		Header: Header{Interval: 100 * time.Millisecond, Resets: 2, ResetTime: time.Unix(1700000100, 0), SocketsTotal: 5},
		Client: &Client{Sockets: 5, MaxSockets: 1024, SocketsOpened: 1 << 33, QueueMemory: 1 << 34, QueueMemoryLimit: 1 << 35},
	}
	in.Client.Totals[SockTXBytes] = 1 << 40
	in.Sockets = socks
	before := time.Now()
	if err := w.Publish(in); err != nil {
		t.Fatal(err)
	}
	got, err := r.Read()
	if err != nil {
		t.Fatal(err)
	}
	h := got.Header
	if h.Kind != KindClient || h.PID != os.Getpid() || h.WriterPID != os.Getpid() || h.UID != 1000 ||
		h.Command != "stats.test" || h.Program != "unit-test" || !h.Started.Equal(time.Unix(1700000000, 5)) ||
		h.Generation != 1 || h.Interval != 100*time.Millisecond || h.Resets != 2 ||
		!h.ResetTime.Equal(time.Unix(1700000100, 0)) || h.SocketSlots != 4 || h.RingSlots != 0 || h.SocketsTotal != 5 ||
		h.Updated.Before(before.Add(-time.Second)) {
		t.Errorf("header %+v", h)
	}
	if !reflect.DeepEqual(got.Client, in.Client) {
		t.Errorf("client block %+v, want %+v", got.Client, in.Client)
	}
	if len(got.Sockets) != 4 {
		t.Fatalf("%d sockets, want the 4 that fit", len(got.Sockets))
	}
	for i := 0; i < 3; i++ {
		if !reflect.DeepEqual(got.Sockets[i], socks[i]) {
			t.Errorf("socket %d:\n got %+v\nwant %+v", i, got.Sockets[i], socks[i])
		}
	}
	g := got.Sockets[3]
	if g.Local != v6.Local || g.Peer.IsValid() || g.Ring != -1 || g.GroupCount != 20 || len(g.Groups) != 1 ||
		g.Groups[0].Group != v6.Groups[0].Group || g.Groups[0].Source.IsValid() {
		t.Errorf("IPv6 socket %+v", g)
	}
	// Fewer sockets later: the reader sees only those.
	in.Sockets = socks[:1]
	if err := w.Publish(in); err != nil {
		t.Fatal(err)
	}
	if got, err = r.Read(); err != nil || len(got.Sockets) != 1 || got.Header.Generation != 2 {
		t.Fatalf("after shrinking: %+v %v", got, err)
	}
	// Touch: the same snapshot, taken later.
	time.Sleep(2 * time.Millisecond)
	if err := w.Touch(); err != nil {
		t.Fatal(err)
	}
	touched, err := r.Read()
	if err != nil || touched.Header.Generation != 3 || !touched.Header.Updated.After(got.Header.Updated) {
		t.Fatalf("after Touch: %+v %v (before: %+v)", touched.Header, err, got.Header)
	}
	touched.Header.Updated, touched.Header.Generation = got.Header.Updated, got.Header.Generation
	if !reflect.DeepEqual(touched, got) {
		t.Errorf("Touch changed more than Updated:\n got %+v\nwant %+v", touched, got)
	}
}

func TestRoundTripDaemon(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bypassd.1")
	w := newWriter(t, path, FileSpec{Kind: KindDaemon, PID: 77, Command: "bypassd", RingSlots: 2, GID: -1, Mode: 0o640})
	in := &Snapshot{
		Daemon: &Daemon{LogLevel: -1, MaxSockets: 1024, QueueBytes: 1 << 20, Version: "bypassd v1.2.3 (control protocol v1)",
			SocketPath: "/run/bypassd/bypassd.sock"},
		Rings: []Ring{{Index: 0, Interface: "veth-a", Queue: 0, Ifindex: 7, Flags: RingZeroCopy, Provider: "afxdp",
			Mode: "native/copy", RXFrames: 2048, TXFrames: 2048, FrameSize: 2048, Sockets: 3, DevMemAlloc: 1 << 40},
			{Index: 1, Interface: "a-very-long-interface-name", Queue: 3, Flags: RingStopped}},
	}
	for i := range in.Daemon.Counters {
		in.Daemon.Counters[i] = uint64(i) + 1<<36
	}
	for i := range in.Rings[0].Counters {
		in.Rings[0].Counters[i] = uint64(i) + 1<<35
	}
	if err := w.Publish(in); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("file mode: %v %v", st, err)
	}
	got, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Header.Kind != KindDaemon || got.Header.PID != 77 || got.Client != nil || !reflect.DeepEqual(got.Daemon, in.Daemon) {
		t.Errorf("daemon file %+v %+v", got.Header, got.Daemon)
	}
	if len(got.Rings) != 2 || !reflect.DeepEqual(got.Rings[0], in.Rings[0]) {
		t.Fatalf("rings %+v", got.Rings)
	}
	if r1 := got.Rings[1]; r1.Interface != "a-very-long-int" || r1.Queue != 3 || r1.Flags != RingStopped {
		t.Errorf("second ring %+v (names are cut to 15 bytes)", r1)
	}
	if u := in.Rings[0].UMEMBytes(); u != 8<<20 {
		t.Errorf("UMEM bytes %d", u)
	}
	// A client summary in a daemon file is refused.
	if err := w.Publish(&Snapshot{Client: &Client{}}); err == nil {
		t.Error("publish without the daemon block succeeded")
	}
}

func TestStringsCutAtRuneBoundary(t *testing.T) {
	b := make([]byte, 8)
	putString(b, "abcdéfgh") // é is 2 bytes at 4..5; 7 bytes fit
	if s := getString(b); s != "abcdéf" {
		t.Errorf("got %q", s)
	}
	putString(b, "aaaaaaé") // é would straddle the cut
	if s := getString(b); s != "aaaaaa" {
		t.Errorf("got %q", s)
	}
	full := []byte("12345678")
	if s := getString(full); s != "12345678" {
		t.Errorf("unterminated: %q", s)
	}
}

func TestOpenRefusesBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	w := newWriter(t, good, clientSpec(2))
	_ = w.Publish(&Snapshot{Client: &Client{}})
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name string, mutate func(b []byte) []byte) string {
		b := mutate(append([]byte(nil), data...))
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name   string
		mutate func([]byte) []byte
		want   error
		text   string
	}{
		{"version", func(b []byte) []byte { le.PutUint32(b[offVersion:], Version+1); return b }, ErrVersion,
			fmt.Sprintf("the file has layout version %d, this program reads version %d", Version+1, Version)},
		{"magic", func(b []byte) []byte { b[0] = 'X'; return b }, ErrFormat, "magic"},
		{"short", func(b []byte) []byte { return b[:100] }, ErrFormat, "100 bytes"},
		{"truncated", func(b []byte) []byte { return b[:HeaderSize+10] }, ErrFormat, "the file has"},
		{"kind", func(b []byte) []byte { le.PutUint32(b[offKind:], 9); return b }, ErrFormat, "kind 9"},
		{"offsets", func(b []byte) []byte { le.PutUint32(b[offSocketOff:], 8); return b }, ErrFormat, "offsets"},
		{"slots", func(b []byte) []byte { le.PutUint32(b[offSocketSlots:], MaxSocketSlots+1); return b }, ErrFormat, "socket slots"},
	}
	for _, c := range cases {
		_, err := Open(write(c.name, c.mutate))
		if !errors.Is(err, c.want) || !contains(err.Error(), c.text) || !contains(err.Error(), c.name) {
			t.Errorf("%s: %v; want %v mentioning %q and the path", c.name, err, c.want, c.text)
		}
	}
	if _, err := Open(filepath.Join(dir, "missing")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: %v", err)
	}
}

func TestPermissionError(t *testing.T) {
	if os.Geteuid() == 0 {
		// Root reads anything; check the advice on a simulated error.
		err := permissionAdvice(filepath.Join(t.TempDir(), "x"))
		if !contains(err.Error(), "run as root or join that group") {
			t.Errorf("advice: %v", err)
		}
		return
	}
	p := filepath.Join(t.TempDir(), "1")
	newWriter(t, p, FileSpec{Kind: KindClient, Mode: 0o600, GID: -1})
	_ = os.Chmod(p, 0)
	if _, err := Open(p); err == nil || !contains(err.Error(), "run as root or join that group") {
		t.Errorf("unreadable file: %v", err)
	}
}

// permissionAdvice is the error Open returns for an unreadable file (root
// reads everything, so a root test checks the wrapping directly).
func permissionAdvice(path string) error {
	return wrapOpenError(&os.PathError{Op: "open", Path: path, Err: os.ErrPermission})
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && indexOf(s, sub) >= 0)
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestSeqlockNoTornReads publishes snapshots in which every counter of
// every socket equals the generation, while readers check that each read
// is uniform (not torn) and never goes backwards.
func TestSeqlockNoTornReads(t *testing.T) {
	path := filepath.Join(t.TempDir(), "5")
	w := newWriter(t, path, clientSpec(64))
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		snap := &Snapshot{Client: &Client{}, Sockets: make([]Socket, 64)}
		for n := uint64(1); !stop.Load(); n++ {
			for i := range snap.Sockets {
				s := &snap.Sockets[i]
				s.ID = uint32(i + 1)
				for j := range s.Counters {
					s.Counters[j] = n<<32 | n // both halves: a torn word shows
				}
			}
			snap.Client.Totals[SockRXPackets] = n<<32 | n
			if err := w.Publish(snap); err != nil {
				t.Error(err)
				return
			}
			time.Sleep(20 * time.Microsecond)
		}
	}()
	const readers = 2
	deadline := time.Now().Add(300 * time.Millisecond)
	for i := 0; i < readers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := Open(path)
			if err != nil {
				t.Error(err)
				return
			}
			defer r.Close()
			var last uint64
			for reads := 0; time.Now().Before(deadline) || reads < 100; reads++ {
				s, err := r.Read()
				if err != nil {
					t.Error(err)
					return
				}
				if len(s.Sockets) == 0 {
					continue
				}
				v := s.Client.Totals[SockRXPackets]
				if v>>32 != v&0xFFFFFFFF {
					t.Errorf("torn word %#x", v)
					return
				}
				for _, sk := range s.Sockets {
					for j, c := range sk.Counters {
						if c != v {
							t.Errorf("socket %d counter %d = %#x in a snapshot of %#x: torn", sk.ID, j, c, v)
							return
						}
					}
				}
				if v < last {
					t.Errorf("counter went back from %#x to %#x", last, v)
					return
				}
				last = v
			}
		}()
	}
	time.Sleep(time.Until(deadline))
	stop.Store(true)
	wg.Wait()
}

// TestAttachDetach opens and closes a reader many times while the writer
// publishes, as `bypass-stats` started repeatedly does.
func TestAttachDetach(t *testing.T) {
	path := filepath.Join(t.TempDir(), "6")
	w := newWriter(t, path, clientSpec(8))
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		snap := &Snapshot{Client: &Client{}, Sockets: []Socket{{ID: 1}}}
		for n := uint64(1); !stop.Load(); n++ {
			snap.Sockets[0].Counters[SockRXPackets] = n
			snap.Sockets[0].Counters[SockRXBytes] = 100 * n
			_ = w.Publish(snap)
			// A real writer publishes every interval, not back to back.
			time.Sleep(20 * time.Microsecond)
		}
	}()
	var last uint64
	for i := 0; i < 1000; i++ {
		s, err := ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Sockets) == 0 {
			continue
		}
		c := s.Sockets[0].Counters
		if c[SockRXBytes] != 100*c[SockRXPackets] || c[SockRXPackets] < last {
			t.Fatalf("attach %d: packets %d bytes %d (last %d)", i, c[SockRXPackets], c[SockRXBytes], last)
		}
		last = c[SockRXPackets]
	}
	stop.Store(true)
	<-done
}

func TestReadTimesOutOnStuckWriter(t *testing.T) {
	path := filepath.Join(t.TempDir(), "7")
	w := newWriter(t, path, clientSpec(1))
	atomic.StoreUint64(&w.words[offSeq/8], 3) // as if the writer died mid-update
	r, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	r.Timeout = 20 * time.Millisecond
	if _, err := r.Read(); !errors.Is(err, ErrBusy) || !contains(err.Error(), "pid "+strconv.Itoa(os.Getpid())) {
		t.Errorf("stuck writer: %v", err)
	}
}

func TestWriterClose(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "8")
	w := newWriter(t, path, clientSpec(1))
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("file kept after Close: %v", err)
	}
	if err := w.Publish(&Snapshot{Client: &Client{}}); !errors.Is(err, ErrWriterClosed) {
		t.Errorf("publish after close: %v", err)
	}
	if err := w.Close(); err != nil {
		t.Errorf("second close: %v", err)
	}
	// A replaced file is not the writer's to remove.
	w1 := newWriter(t, path, clientSpec(1))
	w2 := newWriter(t, path, clientSpec(1))
	_ = w1.Close()
	if _, err := os.Stat(path); err != nil {
		t.Errorf("closing the replaced writer removed the new file: %v", err)
	}
	_ = w2.Close()
	des, _ := os.ReadDir(dir)
	if len(des) != 0 {
		t.Errorf("left in the directory: %v", des)
	}
	if _, err := Create(filepath.Join(dir, "no", "such", "dir"), clientSpec(1)); err == nil || !contains(err.Error(), "stats directory") {
		t.Errorf("create in a missing directory: %v", err)
	}
	if _, err := Create(filepath.Join(dir, "x"), FileSpec{Kind: 5}); err == nil {
		t.Error("bad kind accepted")
	}
}

func TestListAndClean(t *testing.T) {
	dir := t.TempDir()
	self := os.Getpid()
	// A live client, a dead client, the daemon (us), a dead daemon, a
	// live pid whose writer died, junk, and an old half-created file.
	live := newWriter(t, ClientPath(dir, self), clientSpec(1))
	_ = live.Publish(&Snapshot{Client: &Client{}})
	newWriter(t, DaemonPath(dir, self), FileSpec{Kind: KindDaemon, GID: -1})
	for _, name := range []string{"999999999", "bypassd.999999998", "notes", "0123", "-5"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	orphan := ClientPath(dir, 1) // pid 1 lives; its writer is dead
	ow, err := Create(orphan, clientSpec(1))
	if err != nil {
		t.Fatal(err)
	}
	_ = ow.Publish(&Snapshot{Client: &Client{}})
	setWriterPID(t, ow, 999999997)
	ow.path = filepath.Join(dir, "detached") // so its Close leaves the orphan alone
	_ = ow.Close()
	old := filepath.Join(dir, ".7.tmp123")
	recent := filepath.Join(dir, ".8.tmp456")
	for _, p := range []string{old, recent} {
		_ = os.WriteFile(p, nil, 0o644)
	}
	past := time.Now().Add(-2 * time.Hour)
	_ = os.Chtimes(old, past, past)

	entries, err := List(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, filepath.Base(e.Path))
	}
	want := []string{"bypassd." + strconv.Itoa(self), "bypassd.999999998", "1", strconv.Itoa(self), "999999999"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("List = %v, want %v", names, want)
	}

	removed, err := Clean(dir)
	if err != nil {
		t.Fatal(err)
	}
	gone := map[string]bool{}
	for _, r := range removed {
		gone[filepath.Base(r.Path)] = true
	}
	for name, wantGone := range map[string]bool{
		"999999999": true, "bypassd.999999998": true, "1": true, ".7.tmp123": true,
		strconv.Itoa(self): false, "bypassd." + strconv.Itoa(self): false, "notes": false, "0123": false,
		"-5": false, ".8.tmp456": false,
	} {
		_, statErr := os.Stat(filepath.Join(dir, name))
		if gone[name] != wantGone || (statErr == nil) == wantGone {
			t.Errorf("%s: removed=%v exists=%v, want removed=%v", name, gone[name], statErr == nil, wantGone)
		}
	}
}

// setWriterPID rewrites a file's writer pid (as if another process wrote it).
func setWriterPID(t *testing.T, w *Writer, pid uint32) {
	t.Helper()
	p := (*uint32)(unsafe.Pointer(&w.mem[offWriterPID]))
	atomic.StoreUint32(p, pid)
}
