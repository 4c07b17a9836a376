//go:build verbs

package ring

import (
	"github.com/bypassd/bypassd/ring/provider/verbs"
	"github.com/bypassd/bypassd/ring/qp"
)

// The verbs path (binaries built with -tags verbs): a raw packet QP on the
// interface's RDMA port, steered by ibv_create_flow rules instead of the
// XDP program. Its device clock feeds the timestamp converter (see
// provclock.go) and its device memory the egress staging.
func init() { RegisterProvider("verbs", openVerbsPath) }

func openVerbsPath(pc PathConfig) (qp.Provider, qp.Steering, error) {
	p, err := verbs.Open(verbs.Config{Interface: pc.Interface, Queue: pc.Queue, Frames: pc.Frames, FrameSize: pc.FrameSize, MTU: pc.MTU,
		NoTimestamps: !pc.HWTimestamps})
	if err != nil {
		return nil, nil, err
	}
	return p, p.Steering(), nil
}
