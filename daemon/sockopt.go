package daemon

import (
	"encoding/binary"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctlproto"
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/ring/sched/qos"
)

// Socket options the daemon understands (Linux numbers, as the protocol
// carries them). Everything else is ENOPROTOOPT.
//
//	SOL_SOCKET   SO_REUSEADDR            get, set (applies to the next bind)
//	             SO_TYPE, SO_DOMAIN,     get only
//	             SO_PROTOCOL
//	             SO_SNDBUF, SO_RCVBUF    get: the socket's queue bytes; set:
//	                                     accepted and clamped to that size
//	                                     (fixed at OPEN), as Linux clamps to
//	                                     rmem_max
//	             SO_MAX_PACING_RATE      set: u32 bytes/s or the extended
//	                                     struct (pacing.go); get: the
//	                                     extended struct and the range
//	             SO_TIMESTAMPING(_NEW)   get, set: which receive timestamps
//	                                     the shim reports (timestamping.go)
//	             SO_PRIORITY             get, set: the socket priority that
//	                                     picks the traffic class; above 6
//	                                     it needs CAP_NET_ADMIN, as in Linux
//	IPPROTO_IP   IP_TOS, IP_TTL, IP_MULTICAST_TTL, IP_MULTICAST_LOOP
//	             (IP_TOS and IPV6_TCLASS also set SO_PRIORITY through
//	             the kernel's fixed ToS map, qos.TOSToSkPrio)
//	IPPROTO_IPV6 IPV6_UNICAST_HOPS, IPV6_MULTICAST_HOPS,
//	             IPV6_MULTICAST_LOOP, IPV6_TCLASS (AF_INET6 sockets only)
//
// The IP and IPv6 options map onto ring.HeaderOptions; one field serves
// both families (the endpoint sends one family only). Values follow
// Linux's ranges and defaults (-1 restores the default where Linux allows
// it). Values are C ints; at IPPROTO_IP a single byte is accepted too, as
// Linux does.

// headerOptions returns the socket's current header options.
func (k *socket) headerOptions() ring.HeaderOptions {
	if k.ep != nil {
		return k.ep.HeaderOptions()
	}
	return k.hdr
}

func (k *socket) setHeaderOptions(o ring.HeaderOptions) {
	k.hdr = o
	if k.ep != nil {
		k.ep.SetHeaderOptions(o)
	}
}

// optName names an option in errors.
func optName(level, name int32) string {
	names := map[[2]int32]string{
		{unix.SOL_SOCKET, unix.SO_REUSEADDR}:          "SO_REUSEADDR",
		{unix.SOL_SOCKET, unix.SO_TYPE}:               "SO_TYPE",
		{unix.SOL_SOCKET, unix.SO_DOMAIN}:             "SO_DOMAIN",
		{unix.SOL_SOCKET, unix.SO_PROTOCOL}:           "SO_PROTOCOL",
		{unix.SOL_SOCKET, unix.SO_SNDBUF}:             "SO_SNDBUF",
		{unix.SOL_SOCKET, unix.SO_RCVBUF}:             "SO_RCVBUF",
		{unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE}:    "SO_MAX_PACING_RATE",
		{unix.SOL_SOCKET, unix.SO_TIMESTAMPING}:       "SO_TIMESTAMPING",
		{unix.SOL_SOCKET, unix.SO_TIMESTAMPING_NEW}:   "SO_TIMESTAMPING_NEW",
		{unix.SOL_SOCKET, unix.SO_PRIORITY}:           "SO_PRIORITY",
		{unix.IPPROTO_IP, unix.IP_TOS}:                "IP_TOS",
		{unix.IPPROTO_IP, unix.IP_TTL}:                "IP_TTL",
		{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL}:      "IP_MULTICAST_TTL",
		{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP}:     "IP_MULTICAST_LOOP",
		{unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS}:   "IPV6_UNICAST_HOPS",
		{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS}: "IPV6_MULTICAST_HOPS",
		{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP}: "IPV6_MULTICAST_LOOP",
		{unix.IPPROTO_IPV6, unix.IPV6_TCLASS}:         "IPV6_TCLASS",
	}
	if n, ok := names[[2]int32{level, name}]; ok {
		return n
	}
	return fmt.Sprintf("option %d/%d", level, name)
}

// priorityAllowed checks a SETSOCKOPT SO_PRIORITY as Linux does: 0..6
// for anyone, anything else with CAP_NET_ADMIN (a high priority may be a
// strict traffic class that starves the others). Other options pass.
func priorityAllowed(m *ctlproto.SetSockOpt, uid uint32, pid int32) error {
	if m.Level != unix.SOL_SOCKET || m.Name != unix.SO_PRIORITY || len(m.Value) < 4 {
		return nil
	}
	v := int32(binary.LittleEndian.Uint32(m.Value))
	if v >= 0 && v <= 6 || peerHasCap(uid, pid, capNetAdmin) {
		return nil
	}
	return fmt.Errorf("SO_PRIORITY %d: priorities outside 0..6 need CAP_NET_ADMIN: %w", v, unix.EPERM)
}

func noOption(level, name int32) error {
	return fmt.Errorf("%s: not an option bypassd sockets have: %w", optName(level, name), unix.ENOPROTOOPT)
}

// intValue decodes an option value as Linux does: a C int, or at
// IPPROTO_IP a single unsigned byte.
func intValue(level, name int32, v []byte) (int32, error) {
	switch {
	case len(v) >= 4:
		return int32(binary.LittleEndian.Uint32(v)), nil
	case level == unix.IPPROTO_IP && len(v) >= 1:
		return int32(v[0]), nil
	}
	return 0, fmt.Errorf("%s: value of %d bytes, want a 4-byte int: %w", optName(level, name), len(v), unix.EINVAL)
}

func intBytes(v int32) []byte { return binary.LittleEndian.AppendUint32(nil, uint32(v)) }

func boolInt(b bool) int32 {
	if b {
		return 1
	}
	return 0
}

// hopValue checks a TTL / hop limit: def for -1, lo..255 otherwise.
func hopValue(level, name, v, lo int32, def uint8) (uint8, error) {
	switch {
	case v == -1:
		return def, nil
	case v < lo || v > 255:
		return 0, fmt.Errorf("%s: %d out of range (-1 or %d..255): %w", optName(level, name), v, lo, unix.EINVAL)
	}
	return uint8(v), nil
}

// setOption is SETSOCKOPT. The session checks the client's privilege for
// priorities outside 0..6 first (priorityAllowed).
func (k *socket) setOption(level, name int32, value []byte) error {
	if k.stream != nil && streamOptionKnown(level, name) {
		return k.setStreamOption(level, name, value)
	}
	if !k.optionKnown(level, name) {
		return noOption(level, name)
	}
	if level == unix.SOL_SOCKET {
		switch name {
		case unix.SO_MAX_PACING_RATE:
			return k.setPacing(value)
		case unix.SO_SNDBUF, unix.SO_RCVBUF:
			// Accepted and clamped, as Linux clamps to rmem_max/wmem_max:
			// the queues' size was fixed at OPEN and GET reports it.
			if len(value) < 4 {
				return fmt.Errorf("%s: value of %d bytes, want a 4-byte int: %w", optName(level, name), len(value), unix.EINVAL)
			}
			return nil
		case unix.SO_TYPE, unix.SO_DOMAIN, unix.SO_PROTOCOL:
			return fmt.Errorf("%s is read-only: %w", optName(level, name), unix.ENOPROTOOPT)
		case unix.SO_TIMESTAMPING, unix.SO_TIMESTAMPING_NEW:
			f, err := timestampingValue(value)
			if err != nil {
				return err
			}
			k.timestamping = f
			return nil
		}
	}
	v, err := intValue(level, name, value)
	if err != nil {
		return err
	}
	o := k.headerOptions()
	def := ring.DefaultHeaderOptions
	switch [2]int32{level, name} {
	case [2]int32{unix.SOL_SOCKET, unix.SO_REUSEADDR}:
		k.reuseAddr = v != 0
		return nil
	case [2]int32{unix.SOL_SOCKET, unix.SO_PRIORITY}:
		o.Priority = uint32(v)
	case [2]int32{unix.IPPROTO_IP, unix.IP_TOS}:
		o.TOS = uint8(v)
		o.Priority = uint32(qos.TOSToSkPrio(o.TOS))
	case [2]int32{unix.IPPROTO_IP, unix.IP_TTL}:
		if o.TTL, err = hopValue(level, name, v, 1, def.TTL); err != nil {
			return err
		}
	case [2]int32{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL}:
		if o.MulticastTTL, err = hopValue(level, name, v, 0, def.MulticastTTL); err != nil {
			return err
		}
	case [2]int32{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP}:
		o.MulticastLoop = v != 0
	case [2]int32{unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS}:
		if o.TTL, err = hopValue(level, name, v, 0, def.TTL); err != nil {
			return err
		}
	case [2]int32{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS}:
		if o.MulticastTTL, err = hopValue(level, name, v, 0, def.MulticastTTL); err != nil {
			return err
		}
	case [2]int32{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP}:
		if v != 0 && v != 1 {
			return fmt.Errorf("IPV6_MULTICAST_LOOP: %d is not 0 or 1: %w", v, unix.EINVAL)
		}
		o.MulticastLoop = v == 1
	case [2]int32{unix.IPPROTO_IPV6, unix.IPV6_TCLASS}:
		if v == -1 {
			v = 0
		}
		if v < 0 || v > 255 {
			return fmt.Errorf("IPV6_TCLASS: %d out of range (-1..255): %w", v, unix.EINVAL)
		}
		o.TOS = uint8(v)
		o.Priority = uint32(qos.TOSToSkPrio(o.TOS))
	default:
		return noOption(level, name)
	}
	k.setHeaderOptions(o)
	return nil
}

// option is GETSOCKOPT; values are 4-byte ints.
func (k *socket) option(level, name int32) ([]byte, error) {
	if k.stream != nil && streamOptionKnown(level, name) {
		return k.streamOption(level, name), nil
	}
	if !k.optionKnown(level, name) {
		return nil, noOption(level, name)
	}
	o := k.headerOptions()
	var v int32
	switch [2]int32{level, name} {
	case [2]int32{unix.SOL_SOCKET, unix.SO_REUSEADDR}:
		v = boolInt(k.reuseAddr)
	case [2]int32{unix.SOL_SOCKET, unix.SO_TYPE}:
		v = unix.SOCK_DGRAM
	case [2]int32{unix.SOL_SOCKET, unix.SO_DOMAIN}:
		v = int32(k.family)
	case [2]int32{unix.SOL_SOCKET, unix.SO_PROTOCOL}:
		v = unix.IPPROTO_UDP
	case [2]int32{unix.SOL_SOCKET, unix.SO_SNDBUF}, [2]int32{unix.SOL_SOCKET, unix.SO_RCVBUF}:
		v = int32(k.queueBytes)
	case [2]int32{unix.SOL_SOCKET, unix.SO_MAX_PACING_RATE}:
		return k.pacingValue(), nil
	case [2]int32{unix.SOL_SOCKET, unix.SO_TIMESTAMPING}, [2]int32{unix.SOL_SOCKET, unix.SO_TIMESTAMPING_NEW}:
		v = int32(k.timestamping)
	case [2]int32{unix.SOL_SOCKET, unix.SO_PRIORITY}:
		v = int32(o.Priority)
	case [2]int32{unix.IPPROTO_IP, unix.IP_TOS}, [2]int32{unix.IPPROTO_IPV6, unix.IPV6_TCLASS}:
		v = int32(o.TOS)
	case [2]int32{unix.IPPROTO_IP, unix.IP_TTL}, [2]int32{unix.IPPROTO_IPV6, unix.IPV6_UNICAST_HOPS}:
		v = int32(o.TTL)
	case [2]int32{unix.IPPROTO_IP, unix.IP_MULTICAST_TTL}, [2]int32{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_HOPS}:
		v = int32(o.MulticastTTL)
	case [2]int32{unix.IPPROTO_IP, unix.IP_MULTICAST_LOOP}, [2]int32{unix.IPPROTO_IPV6, unix.IPV6_MULTICAST_LOOP}:
		v = boolInt(o.MulticastLoop)
	default:
		return nil, noOption(level, name)
	}
	return intBytes(v), nil
}

// optionKnown reports whether (level, name) is an option of this socket:
// IPv6-level options exist on AF_INET6 sockets only, as in Linux.
func (k *socket) optionKnown(level, name int32) bool {
	switch level {
	case unix.SOL_SOCKET:
		switch name {
		case unix.SO_REUSEADDR, unix.SO_TYPE, unix.SO_DOMAIN, unix.SO_PROTOCOL,
			unix.SO_SNDBUF, unix.SO_RCVBUF, unix.SO_MAX_PACING_RATE, unix.SO_TIMESTAMPING, unix.SO_TIMESTAMPING_NEW,
			unix.SO_PRIORITY:
			return true
		}
	case unix.IPPROTO_IP:
		switch name {
		case unix.IP_TOS, unix.IP_TTL, unix.IP_MULTICAST_TTL, unix.IP_MULTICAST_LOOP:
			return true
		}
	case unix.IPPROTO_IPV6:
		if k.family != unix.AF_INET6 {
			return false
		}
		switch name {
		case unix.IPV6_UNICAST_HOPS, unix.IPV6_MULTICAST_HOPS, unix.IPV6_MULTICAST_LOOP, unix.IPV6_TCLASS:
			return true
		}
	}
	return false
}
