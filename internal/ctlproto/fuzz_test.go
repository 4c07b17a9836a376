package ctlproto

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzUnmarshal checks that no packet makes Unmarshal panic, that refused
// packets map to one of the protocol's errnos, and that every accepted
// packet re-encodes to exactly the same bytes (the codec has one encoding
// per message, so the daemon and a C shim cannot disagree on what a packet
// means). The seed corpus in testdata/fuzz/FuzzUnmarshal runs with go test.
func FuzzUnmarshal(f *testing.F) {
	for _, s := range samples() {
		b, err := Marshal(nil, s.h, s.body)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		h, m, err := Unmarshal(b)
		if err != nil {
			if m != nil {
				t.Fatalf("body returned with error %v", err)
			}
			switch Errno(err) {
			case unix.EINVAL, unix.ENOSYS, unix.EPROTONOSUPPORT:
			default:
				t.Fatalf("error %v maps to errno %v", err, Errno(err))
			}
			return
		}
		out, err := Marshal(nil, h, m)
		if err != nil {
			t.Fatalf("accepted packet % x does not re-encode: %v", b, err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoding differs:\n in % x\nout % x", b, out)
		}
	})
}

// TestWriteFuzzCorpus regenerates the committed seed corpus from samples()
// plus a few refused packets. It only runs when asked:
//
//	CTLPROTO_WRITE_CORPUS=1 go test -run TestWriteFuzzCorpus ./internal/ctlproto
func TestWriteFuzzCorpus(t *testing.T) {
	if os.Getenv("CTLPROTO_WRITE_CORPUS") != "1" {
		t.Skip("set CTLPROTO_WRITE_CORPUS=1 to regenerate testdata/fuzz/FuzzUnmarshal")
	}
	dir := filepath.Join("testdata", "fuzz", "FuzzUnmarshal")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	var seeds [][]byte
	for _, s := range samples() {
		b, err := Marshal(nil, s.h, s.body)
		if err != nil {
			t.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	bad := valid(t, "open-reply")
	bad[HeaderLen+28] = 1 // non-zero reserved
	seeds = append(seeds,
		valid(t, "hello")[:HeaderLen-1],                     // short
		append(valid(t, "close"), 0),                        // body on CLOSE
		append(valid(t, "error-reply"), make([]byte, 4)...), // body on an error reply
		bad,
	)
	for _, b := range seeds {
		sum := sha256.Sum256(b)
		name := filepath.Join(dir, hex.EncodeToString(sum[:8]))
		content := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", b)
		if err := os.WriteFile(name, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
