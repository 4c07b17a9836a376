package takeover

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func pair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	a, err := NewConn(fds[0])
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewConn(fds[1])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	deadline := time.Now().Add(20 * time.Second)
	_ = a.SetDeadline(deadline)
	_ = b.SetDeadline(deadline)
	return a, b
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// sampleState is a document of one session with n sockets (its memory
// and wake-up are eventfds here: only descriptors matter).
func sampleState(t *testing.T, nsock int) (*State, *Table) {
	t.Helper()
	var tab Table
	newFD := func() int {
		fd, err := unix.Eventfd(0, unix.EFD_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { unix.Close(fd) })
		return tab.Add(fd)
	}
	s := &State{Version: Version, PID: 42, Listener: newFD(), Path: "/run/bypassd/bypassd.sock", Metrics: NoFD,
		Rings: []Ring{{Interface: "eth0", Queue: 0, Doorbell: newFD(), Counters: map[string]uint64{"rx_packets": 7}}}}
	sess := Session{Conn: newFD(), PID: 100, Program: "app", Hello: true, Stats: true,
		Memory: newFD(), MemSize: 1 << 20, MaxSlots: 64, Lanes: 1, ClientWake: newFD()}
	for i := range nsock {
		k := Socket{ID: uint32(i + 1), Family: unix.AF_INET, QueueBytes: 4096, Slot: i, TXOffset: int64(16384 + 16384*i), RXOffset: int64(16384 + 16384*i + 8192),
			Options: Options{TTL: 64, MulticastTTL: 1, MulticastLoop: true}, Rate: &Rate{Kbps: 1000}}
		if i%2 == 0 {
			k.Endpoint = &Endpoint{Local: "10.0.0.1:5000", Reservation: newFD(), Groups: []Group{{Group: "239.1.1.1"}}}
		}
		sess.Sockets = append(sess.Sockets, k)
	}
	s.Sessions = []Session{sess}
	return s, &tab
}

func TestOfferReceiveRoundTrip(t *testing.T) {
	before := openFDs(t)
	off, take := pair(t)
	// 150 sockets: 1 + 1 + 1 + 150*3 + 75 = 528 descriptors, three batches.
	st, tab := sampleState(t, 150)
	doc, err := st.Encode()
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- off.Offer(Version, doc, tab.FDs()) }()
	v, got, files, err := take.Receive(MinVersion, Version)
	if err != nil {
		t.Fatal(err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if v != Version || files.Len() != len(tab.FDs()) {
		t.Fatalf("version %d, %d descriptors; want %d, %d", v, files.Len(), Version, len(tab.FDs()))
	}
	back, err := Decode(got, files.Len())
	if err != nil {
		t.Fatal(err)
	}
	k := back.Sessions[0].Sockets[10]
	if k.ID != 11 || k.Rate == nil || k.Rate.Kbps != 1000 || k.Endpoint == nil || k.Endpoint.Groups[0].Group != "239.1.1.1" {
		t.Fatalf("socket 11 came back as %+v", k)
	}
	// The received descriptor is the same eventfd as the sent one.
	wake := back.Sessions[0].ClientWake
	fd, err := files.Take(wake)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.Write(tab.FDs()[wake], []byte{1, 0, 0, 0, 0, 0, 0, 0}); err != nil {
		t.Fatal(err)
	}
	var b [8]byte
	if _, err := unix.Read(fd, b[:]); err != nil || b[0] != 1 {
		t.Fatalf("read the handed-over eventfd: %v %v", b, err)
	}
	unix.Close(fd)
	if _, err := files.Take(wake); err == nil {
		t.Fatal("a descriptor was taken twice")
	}
	if n := files.Close(); n != len(tab.FDs())-1 {
		t.Fatalf("Close closed %d, want %d", n, len(tab.FDs())-1)
	}
	// The sender's copies close in t.Cleanup; everything received is gone.
	if now := openFDs(t); now != before+len(tab.FDs())+2 {
		t.Fatalf("%d descriptors open, want %d (leak)", now, before+len(tab.FDs())+2)
	}

	// Commit, then RELEASED with the counters.
	go func() { errc <- take.Commit() }()
	if err := off.Verdict(); err != nil {
		t.Fatalf("verdict: %v", err)
	}
	<-errc
	// Counters of 5,000 endpoints take several packets.
	// A head (the engines' state) longer than a packet is chunked too.
	final := &Final{Rings: []map[string]uint64{{"rx_packets": 9}}, Endpoints: map[uint32]map[string]uint64{},
		Paths: []json.RawMessage{json.RawMessage(`"` + strings.Repeat("x", 3*chunkBytes) + `"`)}}
	for i := range uint32(5000) {
		final.Endpoints[i] = map[string]uint64{"rx_packets": uint64(i)}
	}
	go func() { errc <- off.Released(final, Version) }()
	f, err := take.AwaitReleased()
	if err != nil || f.Rings[0]["rx_packets"] != 9 || len(f.Endpoints) != 0 || len(f.Paths) != 1 || len(f.Paths[0]) != 3*chunkBytes+2 {
		t.Fatalf("released head: %d rings, %d endpoints, %v", len(f.Rings), len(f.Endpoints), err)
	}
	eps, err := take.AwaitCounters()
	if err != nil || len(eps) != 5000 || eps[4999]["rx_packets"] != 4999 {
		t.Fatalf("released counters: %d endpoints, %v", len(eps), err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}

func TestVersionMismatchRefused(t *testing.T) {
	before := openFDs(t)
	off, take := pair(t)
	st, tab := sampleState(t, 3)
	st.Version = Version + 1
	doc, _ := st.Encode()
	errc := make(chan error, 1)
	go func() {
		if err := off.Offer(st.Version, doc, tab.FDs()); err != nil {
			errc <- err
			return
		}
		errc <- off.Verdict()
	}()
	_, _, _, err := take.Receive(MinVersion, Version)
	if err == nil || !strings.Contains(err.Error(), "state version "+strconv.Itoa(Version+1)) {
		t.Fatalf("Receive of a newer document: %v", err)
	}
	var ref *RefusedError
	if oerr := <-errc; !errors.As(oerr, &ref) || !strings.Contains(ref.Reason, fmt.Sprintf("reads %d..%d", MinVersion, Version)) {
		t.Fatalf("offerer saw %v, want the taker's REFUSE with its reason", oerr)
	}
	if now := openFDs(t); now != before+len(tab.FDs())+2 {
		t.Fatalf("%d descriptors open, want %d", now, before+len(tab.FDs())+2)
	}
}

func TestOffererGoneMidwayLeaksNothing(t *testing.T) {
	before := openFDs(t)
	off, take := pair(t)
	st, tab := sampleState(t, 500) // more descriptors than one batch
	doc, _ := st.Encode()
	m := `{"version":` + strconv.Itoa(Version) + `,"doc_bytes":` + strconv.Itoa(len(doc)) + `,"fds":` + strconv.Itoa(len(tab.FDs())) + `}`
	// Half the descriptors, then the offerer dies.
	if err := off.send(kindManifest, []byte(m), nil); err != nil {
		t.Fatal(err)
	}
	if err := off.send(kindDoc, doc, nil); err != nil {
		t.Fatal(err)
	}
	if err := off.send(kindFDs, nil, tab.FDs()[:batchFDs]); err != nil {
		t.Fatal(err)
	}
	off.Close()
	if _, _, _, err := take.Receive(MinVersion, Version); err == nil {
		t.Fatal("Receive succeeded on a truncated offer")
	}
	if now := openFDs(t); now != before+len(tab.FDs())+1 {
		t.Fatalf("%d descriptors open, want %d: received descriptors leaked", now, before+len(tab.FDs())+1)
	}
}

func TestVerdictEndOfStream(t *testing.T) {
	off, take := pair(t)
	take.Close()
	if err := off.Verdict(); err == nil {
		t.Fatal("Verdict succeeded after the taker went away")
	}
}

func TestChoose(t *testing.T) {
	for _, c := range []struct {
		min, max, want int
		ok             bool
	}{
		{1, 1, 0, false},
		{1, Version, Version, true},
		{1, 5, Version, true},
		{Version + 1, Version + 2, 0, false},
		{0, 1, 0, false},
		{2, 1, 0, false},
	} {
		v, err := Choose(c.min, c.max)
		if (err == nil) != c.ok || v != c.want {
			t.Errorf("Choose(%d, %d) = %d, %v; want %d ok=%v", c.min, c.max, v, err, c.want, c.ok)
		}
	}
}

func TestDecodeChecksReferences(t *testing.T) {
	st, tab := sampleState(t, 2)
	doc, _ := st.Encode()
	if _, err := Decode(doc, len(tab.FDs())-1); err == nil || !strings.Contains(err.Error(), "refers to descriptor") {
		t.Fatalf("Decode with a missing descriptor: %v", err)
	}
	st.Sessions[0].Sockets[0].Ring = 3
	doc, _ = st.Encode()
	if _, err := Decode(doc, len(tab.FDs())); err == nil {
		t.Fatal("Decode accepted a socket on a ring that does not exist")
	}
	if _, err := Decode([]byte(`{"version":99}`), 0); err == nil {
		t.Fatal("Decode accepted version 99")
	}
	// A field this version does not know is ignored (a newer writer's
	// addition within the same version).
	if _, err := Decode([]byte(`{"version":`+strconv.Itoa(Version)+`,"listener":0,"metrics":-1,"future":{"x":1}}`), 1); err != nil {
		t.Fatalf("unknown field: %v", err)
	}
}
