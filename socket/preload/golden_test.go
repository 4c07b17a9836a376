package preload

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"testing"
	"unsafe"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/internal/dgram"
	"github.com/bypassd/bypassd/internal/shmq"
	"github.com/bypassd/bypassd/internal/shmsess"
)

// Golden vectors: the Go implementation writes control messages and a queue
// image, the C unit test (c/tests/unit.c, under ASan and UBSan) checks that
// its encoders produce the same bytes and its decoders read the same
// values, and writes a queue image of its own that Go then reads. The
// values below are repeated in unit.c; change both together.

// goldenMessages are the control messages C must encode byte for byte
// (requests) or decode (replies).
func goldenMessages(t *testing.T) map[string][]byte {
	t.Helper()
	v4 := netip.MustParseAddr("192.0.2.1")
	v6 := netip.MustParseAddr("2001:db8::7")
	msgs := map[string]struct {
		h ctlproto.Header
		b ctlproto.Message
	}{
		"hello":       {ctlproto.Header{Code: ctlproto.CodeHello, ReqID: 1}, ctlproto.NewHello("golden-prog")},
		"open":        {ctlproto.Header{Code: ctlproto.CodeOpen, ReqID: 7}, ctlproto.Open{Family: ctlproto.FamilyInet6, Type: ctlproto.TypeDgram, QueueBytes: 65536}},
		"bind":        {ctlproto.Header{Code: ctlproto.CodeBind, ReqID: 0x01020304, Socket: 9}, ctlproto.Bind{Addr: netip.AddrPortFrom(v4, 5000), ReuseAddr: true}},
		"connect":     {ctlproto.Header{Code: ctlproto.CodeConnect, ReqID: 3, Socket: 4}, ctlproto.Connect{Addr: netip.AddrPortFrom(v6, 53)}},
		"setsockopt":  {ctlproto.Header{Code: ctlproto.CodeSetSockOpt, ReqID: 5, Socket: 2}, ctlproto.SetSockOpt{Level: 1, Name: 47, Value: []byte{0x40, 0x42, 0x0f, 0x00}}},
		"getsockopt":  {ctlproto.Header{Code: ctlproto.CodeGetSockOpt, ReqID: 6, Socket: 2}, ctlproto.GetSockOpt{Level: 0, Name: 1}},
		"join":        {ctlproto.Header{Code: ctlproto.CodeJoin, ReqID: 8, Socket: 3}, ctlproto.Group{Group: netip.MustParseAddr("239.1.2.3"), Source: netip.MustParseAddr("192.0.2.9"), Ifindex: 5}},
		"leave":       {ctlproto.Header{Code: ctlproto.CodeLeave, ReqID: 9, Socket: 3}, ctlproto.Group{Group: netip.MustParseAddr("ff15::1")}},
		"close":       {ctlproto.Header{Code: ctlproto.CodeClose, ReqID: 10, Socket: 3}, ctlproto.Empty{}},
		"open_stream": {ctlproto.Header{Code: ctlproto.CodeOpen, ReqID: 11}, ctlproto.Open{Family: ctlproto.FamilyInet, Type: ctlproto.TypeStream}},
		"listen":      {ctlproto.Header{Code: ctlproto.CodeListen, ReqID: 12, Socket: 6}, ctlproto.ListenReq{Backlog: 128}},
		"accept":      {ctlproto.Header{Code: ctlproto.CodeAccept, ReqID: 13, Socket: 6}, ctlproto.AcceptReq{QueueBytes: 8192}},
		// Replies C decodes.
		"hello_reply":  {ctlproto.Header{Code: ctlproto.CodeHello | ctlproto.ReplyBit, ReqID: 1}, helloReply()},
		"open_reply":   {ctlproto.Header{Code: ctlproto.CodeOpen | ctlproto.ReplyBit, ReqID: 2, Socket: 5}, openReply()},
		"bind_reply":   {ctlproto.Header{Code: ctlproto.CodeBind | ctlproto.ReplyBit, ReqID: 3, Socket: 5}, ctlproto.BindReply{Addr: netip.AddrPortFrom(v6, 40000)}},
		"sockopt_val":  {ctlproto.Header{Code: ctlproto.CodeGetSockOpt | ctlproto.ReplyBit, ReqID: 4, Socket: 5}, ctlproto.SockOptValue{Value: []byte{0xe8, 0x03, 0, 0, 0, 0, 0, 0, 0xea, 0x05, 0, 0, 1, 0, 0, 0, 0x10, 0x27, 0, 0}}},
		"error_reply":  {ctlproto.ErrorReply(ctlproto.Header{Code: ctlproto.CodeGetSockOpt, ReqID: 6, Socket: 1}, 92), ctlproto.Empty{}},
		"socket_error": {ctlproto.Header{Code: ctlproto.CodeSocketError, Socket: 12}, ctlproto.SocketError{Errno: 100}},
		"accept_reply": {ctlproto.Header{Code: ctlproto.CodeAccept | ctlproto.ReplyBit, ReqID: 13, Socket: 7}, ctlproto.AcceptReply{OpenReply: openReply(), Peer: netip.AddrPortFrom(v4, 40001), Local: netip.AddrPortFrom(netip.MustParseAddr("192.0.2.2"), 80)}},
	}
	out := make(map[string][]byte, len(msgs))
	for name, m := range msgs {
		b, err := ctlproto.Marshal(nil, m.h, m.b)
		if err != nil {
			t.Fatalf("marshal %s: %v", name, err)
		}
		out[name] = b
	}
	return out
}

// helloReply and openReply are the golden replies of the protocol version
// internal/ctlproto speaks: the fields of both versions, plus, set by name,
// those only one of them has (version 1: MemfdSize; version 2: Lanes,
// SessionSize, Slot, Lane), so this test builds against either and C checks
// the version it is told.
func helloReply() ctlproto.HelloReply {
	r := ctlproto.HelloReply{Version: ctlproto.Version, DaemonPID: 4242, MaxSockets: 1024, DefaultQueueBytes: 65536, RXPollMicros: -1}
	setIfPresent(&r, "Lanes", 2)
	setIfPresent(&r, "SessionSize", 1<<20)
	return r
}

func openReply() ctlproto.OpenReply {
	r := ctlproto.OpenReply{QueueBytes: 4096, TXOffset: 12288, RXOffset: 20480}
	setIfPresent(&r, "MemfdSize", 28672)
	setIfPresent(&r, "Slot", 3)
	setIfPresent(&r, "Lane", 1)
	return r
}

func setIfPresent(p any, field string, v uint64) {
	if f := reflect.ValueOf(p).Elem().FieldByName(field); f.IsValid() {
		f.SetUint(v)
	}
}

// goldenRecord is the i-th datagram of the queue images.
func goldenRecord(i int) (dgram.Header, []byte) {
	sizes := []int{1, 100, 1000, 600, 300, 0, 133}
	h := dgram.Header{
		Addr:  netip.AddrPortFrom(netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)}), uint16(1000+i)),
		Flags: dgram.FlagSWTimestamp,
		TSSW:  int64(i)*1000 + 7,
	}
	p := make([]byte, sizes[i])
	for j := range p {
		p[j] = byte(i*7 + j)
	}
	return h, p
}

const goldenRecords = 7

// alignedMem returns n bytes at a page-aligned address (session memory
// must be; queues need 8 bytes).
func alignedMem(n int) []byte {
	w := make([]uint64, (n+4096+7)/8)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), len(w)*8)
	skip := (4096 - int(uintptr(unsafe.Pointer(&b[0]))%4096)) % 4096
	return b[skip : skip+n : skip+n]
}

// goQueueImage builds a 4 KiB queue whose records wrap around the end of
// the data area (record 2 follows a padding record), as the daemon's RX
// queue would look to a client.
func goQueueImage(t *testing.T) []byte {
	t.Helper()
	mem := alignedMem(shmq.Size(4096))
	q, err := shmq.Init(mem, 4096)
	if err != nil {
		t.Fatal(err)
	}
	// Move the indexes near the end of the data area first.
	for range 3 {
		if err := q.Push(dgram.TypeDatagram, make([]byte, 1000)); err != nil {
			t.Fatal(err)
		}
	}
	q.Publish()
	for range 3 {
		if _, _, err := q.Peek(); err != nil {
			t.Fatal(err)
		}
		q.Advance()
	}
	q.Release()
	for i := range goldenRecords {
		h, p := goldenRecord(i)
		rec, err := q.Reserve(dgram.HeaderLen + len(p))
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
		dgram.Put(rec, &h)
		copy(rec[dgram.HeaderLen:], p)
		if err := q.Commit(len(rec), dgram.TypeDatagram); err != nil {
			t.Fatal(err)
		}
		q.Publish()
	}
	return mem
}

// Session memory (protocol version 2) of the golden test: 300 slots, 2
// lanes, a 4-page arena. Go sets events for goldenEvents and arms lane 1's
// engine sleep; C drains the events and announces goldenAnnounce.
const (
	goldenSlots = 300
	goldenLanes = 2
)

var (
	goldenEvents   = []int{0, 63, 64, 299}
	goldenAnnounce = map[int][]int{0: {299}, 1: {7, 8}}
)

func goSessionImage(t *testing.T) []byte {
	t.Helper()
	l, err := shmsess.NewLayout(goldenSlots, goldenLanes, 4*shmsess.PageSize)
	if err != nil {
		t.Fatal(err)
	}
	mem := alignedMem(int(l.Size))
	s, err := shmsess.Init(mem, l)
	if err != nil {
		t.Fatal(err)
	}
	for _, slot := range goldenEvents {
		s.Event(slot)
	}
	s.Lane(1).ArmSleep()
	return mem
}

// checkCSession reads the session memory C wrote back.
func checkCSession(t *testing.T, img []byte) {
	t.Helper()
	mem := alignedMem(len(img))
	copy(mem, img)
	s, err := shmsess.Attach(mem, goldenSlots, goldenLanes)
	if err != nil {
		t.Fatalf("attach the C session memory: %v", err)
	}
	if n := s.Events().Drain(func(int) {}); n != 0 {
		t.Errorf("C left %d events undrained", n)
	}
	for lane, want := range goldenAnnounce {
		var got []int
		s.Lane(lane).Drain(func(slot int) { got = append(got, slot) })
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("lane %d announced %v, want %v", lane, got, want)
		}
	}
	// C armed its sleep and found nothing pending: the daemon's next event
	// must ask for a wake-up.
	if !s.Event(5) {
		t.Error("the client's sleep flag C armed is not set")
	}
}

func TestGoldenAgainstC(t *testing.T) {
	_, unit := built(t)
	dir := t.TempDir()
	for name, b := range goldenMessages(t) {
		if err := os.WriteFile(filepath.Join(dir, "msg_"+name+".bin"), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "go_queue.bin"), goQueueImage(t), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "go_session.bin"), goSessionImage(t), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(unit, dir, strconv.Itoa(ctlproto.Version))
	cmd.Env = append(os.Environ(), "ASAN_OPTIONS=detect_leaks=1", "UBSAN_OPTIONS=print_stacktrace=1")
	out, err := cmd.CombinedOutput()
	t.Logf("unit test output:\n%s", out)
	if err != nil {
		t.Fatalf("C unit test: %v", err)
	}
	if !bytes.Contains(out, []byte("ok ")) {
		t.Fatalf("C unit test printed no result")
	}
	// The C side's queue image: Go must read what C wrote.
	img, err := os.ReadFile(filepath.Join(dir, "c_queue.bin"))
	if err != nil {
		t.Fatal(err)
	}
	mem := alignedMem(len(img))
	copy(mem, img)
	q, err := shmq.Attach(mem)
	if err != nil {
		t.Fatalf("attach the C queue: %v", err)
	}
	// The C producer cannot know the consumer here: it moved its own
	// consumer index as goQueueImage does, so only golden records remain.
	for i := range goldenRecords {
		rec, typ, err := q.Peek()
		if err != nil {
			t.Fatalf("C queue record %d: %v", i, err)
		}
		var h dgram.Header
		p, err := dgram.Parse(rec, &h)
		wh, wp := goldenRecord(i)
		if err != nil || typ != dgram.TypeDatagram || h.Addr != wh.Addr || !bytes.Equal(p, wp) {
			t.Fatalf("C queue record %d: type %d addr %v (want %v) %d bytes (want %d), equal %v, %v",
				i, typ, h.Addr, wh.Addr, len(p), len(wp), bytes.Equal(p, wp), err)
		}
		q.Advance()
	}
	if _, _, err := q.Peek(); err != shmq.ErrEmpty {
		t.Fatalf("C queue: after the golden records: %v", err)
	}
	if got := binary.LittleEndian.Uint32(img[0:]); got != shmq.Magic {
		t.Fatalf("C queue magic %#x", got)
	}
	simg, err := os.ReadFile(filepath.Join(dir, "c_session.bin"))
	if err != nil {
		t.Fatal(err)
	}
	checkCSession(t, simg)
}
