package verbs

import (
	"errors"
	"fmt"
)

// ErrNotBuilt reports a binary built without the verbs provider.
var ErrNotBuilt = errors.New("this binary was built without the verbs provider: rebuild with `go build -tags verbs ./cmd/bypassd` (needs cgo and libibverbs-dev; `make build-verbs` does it)")

// Decision is whether an interface should run on the verbs provider.
type Decision struct {
	// Use is true when the verbs provider can serve the interface.
	Use bool
	// Reason says why (or why not), for the daemon's log.
	Reason string
	// Binding and Caps are set as far as discovery got.
	Binding *Binding
	Caps    *DeviceCaps
}

// Decide looks at ifname for provider selection ("auto"): verbs when this
// binary has the provider and the interface has an RDMA device whose port
// can carry raw packet QPs.
func Decide(ifname string) Decision {
	return decideIn("/sys", ifname, ethtoolBusInfo)
}

func decideIn(root, ifname string, busInfo func(string) (string, error)) Decision {
	b, err := lookupIn(root, ifname, busInfo)
	if err != nil {
		return Decision{Reason: err.Error()}
	}
	d := Decision{Binding: &b}
	if !Built {
		d.Reason = fmt.Sprintf("interface %s has RDMA device %s port %d, but %v", ifname, b.Device, b.Port, ErrNotBuilt)
		return d
	}
	c, err := Query(b)
	if err != nil {
		d.Reason = fmt.Sprintf("interface %s: RDMA device %s port %d: %v", ifname, b.Device, b.Port, err)
		return d
	}
	d.Caps = &c
	if !c.RawPacket {
		d.Reason = fmt.Sprintf("interface %s: RDMA device %s port %d has link layer %q: raw Ethernet QPs need an Ethernet port", ifname, b.Device, b.Port, c.LinkLayer)
		return d
	}
	d.Use = true
	d.Reason = fmt.Sprintf("interface %s: RDMA device %s port %d supports raw packet QPs", ifname, b.Device, b.Port)
	return d
}
