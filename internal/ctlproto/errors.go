package ctlproto

import (
	"errors"

	"golang.org/x/sys/unix"
)

// protoError is a sentinel that also matches the errno a daemon replies with.
type protoError struct {
	msg   string
	errno unix.Errno
}

func (e *protoError) Error() string { return e.msg }
func (e *protoError) Unwrap() error { return e.errno }

// Errors of Unmarshal and Conn.Recv. Each matches (errors.Is) the errno
// that answers it; Errno extracts that errno.
var (
	// ErrShort: the packet is shorter than the header; there is no request
	// id to answer, so the daemon counts it as malformed without replying.
	ErrShort error = &protoError{"ctlproto: packet shorter than the 16-byte header", unix.EINVAL}
	// ErrVersion: the header's version is not Version (EPROTONOSUPPORT).
	ErrVersion error = &protoError{"ctlproto: unsupported protocol version", unix.EPROTONOSUPPORT}
	// ErrUnknownCode: the code is not one of this version (ENOSYS).
	ErrUnknownCode error = &protoError{"ctlproto: unknown message code", unix.ENOSYS}
	// ErrMalformed: wrong body length for the code, bad enum value,
	// non-zero reserved field, wrong number of file descriptors, truncated
	// packet (EINVAL).
	ErrMalformed error = &protoError{"ctlproto: malformed message", unix.EINVAL}
)

// Errno returns the errno err carries (the status to reply with), or EIO
// when it carries none. It returns 0 for a nil error.
func Errno(err error) unix.Errno {
	if err == nil {
		return 0
	}
	var e unix.Errno
	if errors.As(err, &e) && e != 0 {
		return e
	}
	var pe *protoError
	if errors.As(err, &pe) {
		return pe.errno
	}
	return unix.EIO
}
