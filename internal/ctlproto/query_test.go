package ctlproto

import (
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// testDoc stands for a topic's document (package ctldoc has the real ones).
type testDoc struct {
	Name  string   `json:"name"`
	Items []uint64 `json:"items"`
}

func TestDocumentRoundTrip(t *testing.T) {
	in := testDoc{Name: "veth0", Items: []uint64{7, 1 << 60}}
	fd, size, err := WriteDocument(in)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var out testDoc
	if err := ReadDocument(fd, size, &out); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("got %+v, want %+v", out, in)
	}
	// The receiver cannot change what the daemon wrote.
	if _, err := unix.Pwrite(fd, []byte("x"), 0); !errors.Is(err, unix.EPERM) {
		t.Errorf("write to the document: %v, want EPERM (sealed)", err)
	}
	if err := unix.Ftruncate(fd, 1); !errors.Is(err, unix.EPERM) {
		t.Errorf("truncate the document: %v, want EPERM (sealed)", err)
	}
}

func TestReadDocumentRefuses(t *testing.T) {
	fd, size, err := WriteDocument(testDoc{Name: "rings"})
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	var doc testDoc
	if err := ReadDocument(fd, size+10, &doc); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("size beyond the file: %v, want ErrUnexpectedEOF", err)
	}
	if err := ReadDocument(fd, MaxDocument+1, &doc); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("oversize document: %v", err)
	}
	if err := ReadDocument(fd, size-1, &doc); err == nil {
		t.Error("truncated JSON accepted")
	}
	if err := ReadDocument(-1, 1, &doc); !errors.Is(err, unix.EBADF) {
		t.Errorf("bad fd: %v, want EBADF", err)
	}
	if _, _, err := WriteDocument(make(chan int)); err == nil {
		t.Error("unencodable document accepted")
	}
}

func TestExpectFDs(t *testing.T) {
	cases := []struct {
		h    Header
		body Message
		want int
	}{
		{Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2, Lanes: 3, SessionSize: 1 << 20}, 5},
		{Header{Code: CodeHello | ReplyBit}, &HelloReply{Version: 2, Lanes: 1, SessionSize: 1 << 20}, 3},
		{Header{Code: CodeHello | ReplyBit}, HelloReply{Version: 2}, 0},
		{Header{Code: CodeHello | ReplyBit, Status: unix.EPROTONOSUPPORT}, nil, 0},
		{Header{Code: CodeOpen | ReplyBit, Socket: 1}, OpenReply{}, 0},
		{Header{Code: CodeQuery | ReplyBit}, QueryReply{}, 1},
		{Header{Code: CodeQuery | ReplyBit, Status: unix.ENOENT}, nil, 0},
		{Header{Code: CodeQuery}, Query{}, 0},
		{Header{Code: CodeBind | ReplyBit}, BindReply{}, 0},
	}
	for _, c := range cases {
		if got := ExpectFDs(c.h, c.body); got != c.want {
			t.Errorf("ExpectFDs(%v status %d) = %d, want %d", c.h.Code, c.h.Status, got, c.want)
		}
	}
}

func TestLogLevelNames(t *testing.T) {
	for _, name := range []string{"debug", "info", "warn", "error"} {
		l, err := ParseLogLevel(strings.ToUpper(name))
		if err != nil || LogLevelName(l) != name {
			t.Errorf("%s: %d %v -> %q", name, l, err, LogLevelName(l))
		}
	}
	if l, err := ParseLogLevel("-1"); err != nil || l != LogLevelDebug {
		t.Errorf("-1: %d %v", l, err)
	}
	for _, bad := range []string{"", "trace", "3", "-2"} {
		if _, err := ParseLogLevel(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	if LogLevelName(7) != "7" {
		t.Errorf("unnamed level: %q", LogLevelName(7))
	}
}
