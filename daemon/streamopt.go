package daemon

// Socket options of stream (TCP) sockets. They are kept on the socket and
// applied to its stack endpoint when it has one (connecting, connected),
// else when it gets one; an accepted socket starts with its listener's,
// as on Linux.
//
//	SOL_SOCKET   SO_KEEPALIVE            get, set
//	             SO_LINGER               get, set (struct linger, 8 bytes);
//	                                     {1, 0}: CLOSE resets the connection
//	             SO_SNDBUF, SO_RCVBUF    get, set: the stack's send and
//	                                     receive buffers (bytes; 0: default)
//	             SO_TYPE, SO_PROTOCOL    get: SOCK_STREAM, IPPROTO_TCP
//	IPPROTO_TCP  TCP_NODELAY, TCP_QUICKACK, TCP_MAXSEG (before connect),
//	             TCP_KEEPIDLE, TCP_KEEPINTVL (s), TCP_KEEPCNT,
//	             TCP_USER_TIMEOUT (ms): get, set

import (
	"encoding/binary"
	"fmt"
	"time"

	"golang.org/x/sys/unix"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
)

// streamOpts are a stream socket's options, Linux's defaults when zero
// where that fits.
type streamOpts struct {
	noDelay, quickAck, keepAlive bool
	maxSeg                       int32
	keepIdle, keepIntvl          int32 // seconds; 0: Linux's 7200 and 75
	keepCnt                      int32 // 0: Linux's 9
	userTimeout                  int32 // ms; 0: none
	lingerOn                     bool
	lingerSecs                   int32
	sndBuf, rcvBuf               int32 // 0: the stack's default
	// sndBufCap bounds the send buffer while the socket is paced
	// (ring.PacedSendBuffer; 0: not paced). capped: a bound was applied,
	// so the stack's send buffer tuning is off for good.
	sndBufCap int32
	capped    bool
}

const (
	defaultKeepIdle  = 7200
	defaultKeepIntvl = 75
	defaultKeepCnt   = 9
)

func or32(v, def int32) int32 {
	if v == 0 {
		return def
	}
	return v
}

// resetOnClose reports SO_LINGER {1, 0}: CLOSE sends RST.
func (o *streamOpts) resetOnClose() bool { return o.lingerOn && o.lingerSecs == 0 }

// apply sets the options on a connection's endpoint.
func (o *streamOpts) apply(ep tcpip.Endpoint) {
	so := ep.SocketOptions()
	so.SetDelayOption(!o.noDelay)
	so.SetQuickAck(o.quickAck)
	so.SetKeepAlive(o.keepAlive)
	idle := tcpip.KeepaliveIdleOption(time.Duration(or32(o.keepIdle, defaultKeepIdle)) * time.Second)
	_ = ep.SetSockOpt(&idle)
	intvl := tcpip.KeepaliveIntervalOption(time.Duration(or32(o.keepIntvl, defaultKeepIntvl)) * time.Second)
	_ = ep.SetSockOpt(&intvl)
	_ = ep.SetSockOptInt(tcpip.KeepaliveCountOption, int(or32(o.keepCnt, defaultKeepCnt)))
	ut := tcpip.TCPUserTimeoutOption(time.Duration(o.userTimeout) * time.Millisecond)
	_ = ep.SetSockOpt(&ut)
	if o.maxSeg > 0 {
		_ = ep.SetSockOptInt(tcpip.MaxSegOption, int(o.maxSeg))
	}
	so.SetLinger(tcpip.LingerOption{Enabled: o.lingerOn, Timeout: time.Duration(o.lingerSecs) * time.Second})
	switch sb := o.sndBuf; {
	case o.sndBufCap > 0:
		if sb == 0 || sb > o.sndBufCap {
			sb = o.sndBufCap
		}
		so.SetSendBufferSize(int64(sb), true)
		o.capped = true
	case sb > 0:
		so.SetSendBufferSize(int64(sb), true)
	case o.capped:
		// Paced before: setting the bound turned gVisor's tuning off,
		// so the default comes back explicitly.
		so.SetSendBufferSize(tcp.DefaultSendBufferSize, true)
	}
	if o.rcvBuf > 0 {
		so.SetReceiveBufferSize(int64(o.rcvBuf), true)
	}
}

// streamOptionKnown reports whether (level, name) is a stream socket
// option handled here.
func streamOptionKnown(level, name int32) bool {
	switch level {
	case unix.SOL_SOCKET:
		switch name {
		case unix.SO_KEEPALIVE, unix.SO_LINGER, unix.SO_SNDBUF, unix.SO_RCVBUF, unix.SO_TYPE, unix.SO_PROTOCOL:
			return true
		}
	case unix.IPPROTO_TCP:
		switch name {
		case unix.TCP_NODELAY, unix.TCP_QUICKACK, unix.TCP_MAXSEG, unix.TCP_KEEPIDLE, unix.TCP_KEEPINTVL,
			unix.TCP_KEEPCNT, unix.TCP_USER_TIMEOUT:
			return true
		}
	}
	return false
}

// setStreamOption is SETSOCKOPT of a stream socket's own options.
func (k *socket) setStreamOption(level, name int32, value []byte) error {
	st := k.stream
	o := st.opts
	if level == unix.SOL_SOCKET && name == unix.SO_LINGER {
		if len(value) != 8 {
			return fmt.Errorf("SO_LINGER: value of %d bytes, want struct linger (8): %w", len(value), unix.EINVAL)
		}
		o.lingerOn = binary.LittleEndian.Uint32(value) != 0
		o.lingerSecs = max(int32(binary.LittleEndian.Uint32(value[4:])), 0)
	} else {
		if len(value) < 4 {
			return fmt.Errorf("%s: value of %d bytes, want a 4-byte int: %w", optName(level, name), len(value), unix.EINVAL)
		}
		v := int32(binary.LittleEndian.Uint32(value))
		positive := func(what string, max int32) error {
			if v < 1 || v > max {
				return fmt.Errorf("%s: %d out of range (1..%d): %w", what, v, max, unix.EINVAL)
			}
			return nil
		}
		var err error
		switch [2]int32{level, name} {
		case [2]int32{unix.SOL_SOCKET, unix.SO_TYPE}, [2]int32{unix.SOL_SOCKET, unix.SO_PROTOCOL}:
			return fmt.Errorf("%s is read-only: %w", optName(level, name), unix.ENOPROTOOPT)
		case [2]int32{unix.SOL_SOCKET, unix.SO_KEEPALIVE}:
			o.keepAlive = v != 0
		case [2]int32{unix.SOL_SOCKET, unix.SO_SNDBUF}:
			o.sndBuf = max(v, 0)
		case [2]int32{unix.SOL_SOCKET, unix.SO_RCVBUF}:
			o.rcvBuf = max(v, 0)
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_NODELAY}:
			o.noDelay = v != 0
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_QUICKACK}:
			o.quickAck = v != 0
			defer k.applyQuickAck()
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_MAXSEG}:
			if st.conn != nil {
				return fmt.Errorf("TCP_MAXSEG: set it before connecting: %w", unix.EINVAL)
			}
			if v != 0 && (v < 88 || v > 65535) {
				return fmt.Errorf("TCP_MAXSEG: %d out of range (88..65535): %w", v, unix.EINVAL)
			}
			o.maxSeg = v
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE}:
			err = positive("TCP_KEEPIDLE", 32767)
			o.keepIdle = v
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}:
			err = positive("TCP_KEEPINTVL", 32767)
			o.keepIntvl = v
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_KEEPCNT}:
			err = positive("TCP_KEEPCNT", 127)
			o.keepCnt = v
		case [2]int32{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT}:
			if v < 0 {
				err = fmt.Errorf("TCP_USER_TIMEOUT: %d is negative: %w", v, unix.EINVAL)
			}
			o.userTimeout = v
		}
		if err != nil {
			return err
		}
	}
	st.opts = o
	if st.conn != nil {
		o.apply(st.conn.Endpoint().EP)
	}
	return nil
}

// streamOption is GETSOCKOPT of a stream socket's own options.
func (k *socket) streamOption(level, name int32) []byte {
	o := &k.stream.opts
	var v int32
	switch [2]int32{level, name} {
	case [2]int32{unix.SOL_SOCKET, unix.SO_LINGER}:
		b := binary.LittleEndian.AppendUint32(nil, uint32(boolInt(o.lingerOn)))
		return binary.LittleEndian.AppendUint32(b, uint32(o.lingerSecs))
	case [2]int32{unix.SOL_SOCKET, unix.SO_TYPE}:
		v = unix.SOCK_STREAM
	case [2]int32{unix.SOL_SOCKET, unix.SO_PROTOCOL}:
		v = unix.IPPROTO_TCP
	case [2]int32{unix.SOL_SOCKET, unix.SO_KEEPALIVE}:
		v = boolInt(o.keepAlive)
	case [2]int32{unix.SOL_SOCKET, unix.SO_SNDBUF}:
		v = o.sndBuf
		if k.stream.conn != nil {
			v = int32(k.stream.conn.Endpoint().EP.SocketOptions().GetSendBufferSize())
		}
	case [2]int32{unix.SOL_SOCKET, unix.SO_RCVBUF}:
		v = o.rcvBuf
		if k.stream.conn != nil {
			v = int32(k.stream.conn.Endpoint().EP.SocketOptions().GetReceiveBufferSize())
		}
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_NODELAY}:
		v = boolInt(o.noDelay)
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_QUICKACK}:
		v = boolInt(o.quickAck)
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_MAXSEG}:
		v = o.maxSeg
		if k.stream.conn != nil {
			if n, err := k.stream.conn.Endpoint().EP.GetSockOptInt(tcpip.MaxSegOption); err == nil {
				v = int32(n)
			}
		}
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_KEEPIDLE}:
		v = or32(o.keepIdle, defaultKeepIdle)
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_KEEPINTVL}:
		v = or32(o.keepIntvl, defaultKeepIntvl)
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_KEEPCNT}:
		v = or32(o.keepCnt, defaultKeepCnt)
	case [2]int32{unix.IPPROTO_TCP, unix.TCP_USER_TIMEOUT}:
		v = o.userTimeout
	}
	return intBytes(v)
}

// applyQuickAck gives a connected socket's connection the TCP_QUICKACK
// threshold when TCP_QUICKACK is on (--tcp-quickack-threshold).
func (k *socket) applyQuickAck() {
	st := k.stream
	if st == nil || st.conn == nil {
		return
	}
	n := 0
	if st.opts.quickAck {
		n = st.quickAckThreshold
	}
	st.conn.SetQuickAckThreshold(n)
}
