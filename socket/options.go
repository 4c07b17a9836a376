package socket

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// option describes one socket option the shim forwards to the daemon: the
// Linux level and name numbers travel in SETSOCKOPT/GETSOCKOPT, so a C shim
// and this package agree with the kernel's numbering.
type option struct {
	level, name int32
	// unsigned options (SO_MAX_PACING_RATE) are encoded as u32, the others
	// as the C int the kernel's setsockopt takes.
	unsigned bool
}

// options maps the names SetOption and Option accept to their numbers.
var options = map[string]option{
	"SO_REUSEADDR":        {level: unix.SOL_SOCKET, name: unix.SO_REUSEADDR},
	"SO_RCVBUF":           {level: unix.SOL_SOCKET, name: unix.SO_RCVBUF},
	"SO_SNDBUF":           {level: unix.SOL_SOCKET, name: unix.SO_SNDBUF},
	"SO_MAX_PACING_RATE":  {level: unix.SOL_SOCKET, name: unix.SO_MAX_PACING_RATE, unsigned: true},
	"SO_TIMESTAMPING":     {level: unix.SOL_SOCKET, name: unix.SO_TIMESTAMPING},
	"SO_PRIORITY":         {level: unix.SOL_SOCKET, name: unix.SO_PRIORITY},
	"IP_TOS":              {level: unix.IPPROTO_IP, name: unix.IP_TOS},
	"IP_TTL":              {level: unix.IPPROTO_IP, name: unix.IP_TTL},
	"IP_MULTICAST_TTL":    {level: unix.IPPROTO_IP, name: unix.IP_MULTICAST_TTL},
	"IP_MULTICAST_LOOP":   {level: unix.IPPROTO_IP, name: unix.IP_MULTICAST_LOOP},
	"IPV6_UNICAST_HOPS":   {level: unix.IPPROTO_IPV6, name: unix.IPV6_UNICAST_HOPS},
	"IPV6_MULTICAST_HOPS": {level: unix.IPPROTO_IPV6, name: unix.IPV6_MULTICAST_HOPS},
	"IPV6_MULTICAST_LOOP": {level: unix.IPPROTO_IPV6, name: unix.IPV6_MULTICAST_LOOP},
	"IPV6_TCLASS":         {level: unix.IPPROTO_IPV6, name: unix.IPV6_TCLASS},
	// TCP sockets (TCPConn, TCPListener).
	"SO_KEEPALIVE":     {level: unix.SOL_SOCKET, name: unix.SO_KEEPALIVE},
	"TCP_NODELAY":      {level: unix.IPPROTO_TCP, name: unix.TCP_NODELAY},
	"TCP_QUICKACK":     {level: unix.IPPROTO_TCP, name: unix.TCP_QUICKACK},
	"TCP_MAXSEG":       {level: unix.IPPROTO_TCP, name: unix.TCP_MAXSEG},
	"TCP_KEEPIDLE":     {level: unix.IPPROTO_TCP, name: unix.TCP_KEEPIDLE},
	"TCP_KEEPINTVL":    {level: unix.IPPROTO_TCP, name: unix.TCP_KEEPINTVL},
	"TCP_KEEPCNT":      {level: unix.IPPROTO_TCP, name: unix.TCP_KEEPCNT},
	"TCP_USER_TIMEOUT": {level: unix.IPPROTO_TCP, name: unix.TCP_USER_TIMEOUT},
}

// OptionNames returns the option names SetOption and Option accept, sorted.
func OptionNames() []string {
	names := make([]string, 0, len(options))
	for n := range options {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// lookupOption finds name (case-sensitive, as in C) or returns an error
// matching ENOPROTOOPT that lists the names that exist.
func lookupOption(name string) (option, error) {
	o, ok := options[name]
	if !ok {
		return option{}, fmt.Errorf("unknown socket option %q (known: %s): %w",
			name, strings.Join(OptionNames(), ", "), unix.ENOPROTOOPT)
	}
	return o, nil
}

// encode turns value into the option's wire bytes (little-endian, like the
// rest of the control protocol).
func (o option) encode(name string, value int) ([]byte, error) {
	b := make([]byte, 4)
	if o.unsigned {
		if value < 0 || value > math.MaxUint32 {
			return nil, fmt.Errorf("%s value %d is out of range 0..%d: %w", name, value, uint32(math.MaxUint32), unix.EINVAL)
		}
		binary.LittleEndian.PutUint32(b, uint32(value))
		return b, nil
	}
	if value < math.MinInt32 || value > math.MaxInt32 {
		return nil, fmt.Errorf("%s value %d does not fit a C int: %w", name, value, unix.EINVAL)
	}
	binary.LittleEndian.PutUint32(b, uint32(int32(value)))
	return b, nil
}

// decode reads a GETSOCKOPT answer. The kernel answers some options with a
// single byte (IP_MULTICAST_TTL/LOOP when asked with a char buffer) and
// SO_MAX_PACING_RATE with a u64 on newer kernels, so all three widths are
// accepted.
func (o option) decode(name string, v []byte) (int, error) {
	switch len(v) {
	case 1:
		return int(v[0]), nil
	case 4:
		u := binary.LittleEndian.Uint32(v)
		if o.unsigned {
			return int(u), nil
		}
		return int(int32(u)), nil
	case 8:
		u := binary.LittleEndian.Uint64(v)
		if u > math.MaxInt64 {
			return 0, fmt.Errorf("%s: bypassd answered %d, too large for an int: %w", name, u, unix.EOVERFLOW)
		}
		return int(u), nil
	}
	return 0, fmt.Errorf("%s: bypassd answered a %d-byte value (want 1, 4 or 8 bytes): %w", name, len(v), unix.EPROTO)
}
