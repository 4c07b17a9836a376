package ctlproto

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// AdminTimeout bounds one request of an Admin client.
const AdminTimeout = 5 * time.Second

// Admin is a client session of a tool (bypass-stats, bypassctl): HELLO with
// HelloFlagNoStats and HelloFlagNoSockets, then administrative requests one
// at a time.
type Admin struct {
	c     *Conn
	reqID uint32
}

// DialAdmin connects to the daemon's control socket at path and says HELLO
// as program.
func DialAdmin(path, program string) (*Admin, error) {
	c, err := Dial(path)
	if err != nil {
		return nil, err
	}
	a := &Admin{c: c}
	hello := NewHello(program)
	hello.Flags = HelloFlagNoStats | HelloFlagNoSockets
	if _, _, err := a.Call(Header{Code: CodeHello}, hello); err != nil {
		c.Close()
		return nil, fmt.Errorf("bypassd at %s: HELLO: %w", path, err)
	}
	return a, nil
}

// Call sends one request and waits for its reply, returning the reply body
// and the descriptors it carries (the caller closes them). A failed reply
// returns its status as a unix.Errno error.
func (a *Admin) Call(h Header, body Message) (Message, []int, error) {
	a.reqID++
	h.ReqID = a.reqID
	deadline := time.Now().Add(AdminTimeout)
	_ = a.c.SetReadDeadline(deadline)
	_ = a.c.SetWriteDeadline(deadline)
	if err := a.c.Send(h, body); err != nil {
		return nil, nil, err
	}
	for {
		rh, m, fds, err := a.c.Recv()
		if err != nil {
			return nil, nil, err
		}
		if rh.Code == CodeShutdown {
			closeFDs(fds)
			return nil, nil, errors.New("bypassd is shutting down")
		}
		if rh.ReqID != h.ReqID || rh.Code != h.Code|ReplyBit {
			closeFDs(fds)
			continue
		}
		if rh.Status != 0 {
			return nil, nil, rh.Status
		}
		return m, fds, nil
	}
}

// Query asks for topic's document and decodes it into v.
func (a *Admin) Query(topic string, v any) error {
	m, fds, err := a.Call(Header{Code: CodeQuery}, Query{Topic: topic})
	if err != nil {
		return err
	}
	defer closeFDs(fds)
	r, ok := m.(*QueryReply)
	if !ok {
		return fmt.Errorf("ctlproto: QUERY %s: unexpected reply %T", topic, m)
	}
	return ReadDocument(fds[FDQueryDocument], r.Size, v)
}

// Close ends the session.
func (a *Admin) Close() error { return a.c.Close() }

// logLevelNames are the SET_LOG_LEVEL levels by name, as zap numbers them.
var logLevelNames = map[string]int32{"debug": LogLevelDebug, "info": 0, "warn": 1, "error": LogLevelError}

// ParseLogLevel reads a level name (debug, info, warn, error) or its number.
func ParseLogLevel(v string) (int32, error) {
	if n, ok := logLevelNames[strings.ToLower(v)]; ok {
		return n, nil
	}
	if n, err := strconv.Atoi(v); err == nil && n >= LogLevelDebug && n <= LogLevelError {
		return int32(n), nil
	}
	return 0, fmt.Errorf("log level %q: want debug, info, warn or error", v)
}

// LogLevelName names a level ("info"), or gives its number if it has no name.
func LogLevelName(l int32) string {
	for n, v := range logLevelNames {
		if v == l {
			return n
		}
	}
	return strconv.Itoa(int(l))
}

// AdminError explains a refused administrative request to a person; what
// says what was asked ("set bypassd's log level").
func AdminError(what string, err error) error {
	var errno unix.Errno
	if errors.As(err, &errno) {
		switch errno {
		case unix.EPERM:
			return fmt.Errorf("%s: permission denied: it needs root or bypassd's own user (you are uid %d)", what, os.Getuid())
		case unix.ESRCH:
			return fmt.Errorf("%s: bypassd does not know that process (it is not, or no longer, a client)", what)
		case unix.EOPNOTSUPP:
			return fmt.Errorf("%s: bypassd does not support it in its configuration (stats files off, or a fixed log level)", what)
		case unix.ENOSYS:
			return fmt.Errorf("%s: this bypassd is too old for the request (upgrade it)", what)
		}
	}
	return fmt.Errorf("%s: %w", what, err)
}
