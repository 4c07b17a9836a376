//go:build verbs

package verbs

import (
	"github.com/bypassd/bypassd/ring/qp"
)

// The verbs path (binaries built with -tags verbs): a raw packet QP on the
// interface's RDMA port, steered by ibv_create_flow rules instead of the
// XDP program. Its device clock (qp.DeviceClock) feeds the ring's timestamp
// converter and its device memory the egress staging.
func init() { qp.Register("verbs", openVerbsPath) }

func openVerbsPath(pc qp.PathConfig) (qp.Provider, qp.Steering, error) {
	p, err := Open(Config{Interface: pc.Interface, Queue: pc.Queue, Frames: pc.Frames, FrameSize: pc.FrameSize, MTU: pc.MTU,
		NoTimestamps: !pc.HWTimestamps})
	if err != nil {
		return nil, nil, err
	}
	return p, p.Steering(), nil
}
