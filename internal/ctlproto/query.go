package ctlproto

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// TopicMax is the size of QUERY's topic field.
const TopicMax = 32

// FDQueryDocument is the index of the document memfd in a successful QUERY
// reply (its only descriptor).
const FDQueryDocument = 0

// MaxDocument bounds a QUERY document, so that a client never maps or reads
// an unbounded amount on the daemon's word.
const MaxDocument = 64 << 20

// CheckTopic reports whether t is a well-formed topic name.
func CheckTopic(t string) error {
	if t == "" {
		return errors.New("empty topic")
	}
	if len(t) > TopicMax {
		return fmt.Errorf("topic of %d bytes exceeds %d", len(t), TopicMax)
	}
	for _, c := range []byte(t) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return fmt.Errorf("topic %q: only lowercase letters, digits and '-'", t)
		}
	}
	return nil
}

// WriteDocument encodes v as JSON into a new sealed memfd (read-only for
// the receiver: no write, grow or shrink) and returns the fd, which the
// caller sends with a QueryReply of the returned size and then closes.
func WriteDocument(v any) (fd int, size uint64, err error) {
	b, err := json.Marshal(v)
	if err != nil {
		return -1, 0, fmt.Errorf("ctlproto: encode query document: %w", err)
	}
	if len(b) > MaxDocument {
		return -1, 0, fmt.Errorf("ctlproto: query document of %d bytes exceeds %d", len(b), MaxDocument)
	}
	fd, err = unix.MemfdCreate("bypassd-query", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, 0, fmt.Errorf("ctlproto: query document: memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), "bypassd-query")
	if _, err := f.Write(b); err != nil {
		f.Close()
		return -1, 0, fmt.Errorf("ctlproto: query document: write: %w", err)
	}
	seals := unix.F_SEAL_SEAL | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_WRITE
	// Dup so the returned fd outlives f, whose finalizer would close it.
	out, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err == nil {
		_, err = unix.FcntlInt(uintptr(out), unix.F_ADD_SEALS, seals)
		if err != nil {
			unix.Close(out)
		}
	}
	f.Close()
	if err != nil {
		return -1, 0, fmt.Errorf("ctlproto: query document: seal: %w", err)
	}
	return out, uint64(len(b)), nil
}

// ReadDocument decodes the JSON document of a QUERY reply into v. It reads
// at most size bytes from the start of fd (it does not close fd) and
// refuses documents over MaxDocument or shorter than announced.
func ReadDocument(fd int, size uint64, v any) error {
	if size > MaxDocument {
		return fmt.Errorf("ctlproto: query document of %d bytes exceeds %d", size, MaxDocument)
	}
	b := make([]byte, size)
	n := 0
	for n < len(b) {
		m, err := unix.Pread(fd, b[n:], int64(n))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return fmt.Errorf("ctlproto: read query document: %w", err)
		}
		if m == 0 {
			return fmt.Errorf("ctlproto: read query document: %w (%d of %d bytes)", io.ErrUnexpectedEOF, n, size)
		}
		n += m
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("ctlproto: decode query document: %w", err)
	}
	return nil
}
