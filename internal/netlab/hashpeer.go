package netlab

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"net"
	"time"
)

// HashPeer serves one TCP connection as the stream tests' kernel peer:
// it reads to EOF, answers with the SHA-256 of what it read followed by
// reply, and closes. Everything must happen within timeout.
func HashPeer(c net.Conn, reply []byte, timeout time.Duration) error {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	h := sha256.New()
	if _, err := io.Copy(h, c); err != nil {
		return err
	}
	if _, err := c.Write(h.Sum(nil)); err != nil {
		return err
	}
	_, err := c.Write(reply)
	return err
}

// CheckHashReply checks what a HashPeer sent back (got) for the bytes
// sent to it and the reply it was given.
func CheckHashReply(sent, got, reply []byte) error {
	sum := sha256.Sum256(sent)
	if len(got) < len(sum) || !bytes.Equal(got[:len(sum)], sum[:]) {
		return fmt.Errorf("the peer's hash of the %d bytes sent does not match (%d bytes back)", len(sent), len(got))
	}
	if !bytes.Equal(got[len(sum):], reply) {
		return fmt.Errorf("reply: %d bytes, want %d byte-exact", len(got)-len(sum), len(reply))
	}
	return nil
}
