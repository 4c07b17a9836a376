package tapfd

import (
	"fmt"

	"github.com/bypassd/bypassd/ring/provider/afxdp"
	"github.com/bypassd/bypassd/ring/qp"
	"github.com/bypassd/bypassd/tap"
)

// The TAP path: a TAP device per ring, fed by tc filters on the NIC (package
// tap), read and written by this package's Provider.
func init() { qp.Register(Name, openTAPPath) }

func openTAPPath(pc qp.PathConfig) (_ qp.Provider, _ qp.Steering, err error) {
	// The TAP queues at least as many frames as the fast path's receive
	// ring holds: what the ring absorbs while its engine is busy.
	adopted := pc.AdoptPath != nil && pc.AdoptPath.TAP >= 0
	var dev *tap.Device
	if adopted {
		// The old daemon's TAP device, with its filters until it removes
		// them: the steering is made at Ring.Activate.
		fd := pc.AdoptPath.TAP
		pc.AdoptPath.TAP = -1
		dev, err = tap.Adopt(fd)
	} else {
		dev, err = tap.Create(tap.DeviceConfig{Name: tap.DeviceName(pc.Ifindex, pc.Queue), MAC: pc.MAC, MTU: pc.MTU,
			TxQueueLen: pc.Frames})
	}
	if err != nil {
		return nil, nil, err
	}
	// TAP buffers are plain memory: one holds a whole frame of the
	// interface's MTU whatever the fast path's frame size.
	prov, err := New(dev, Config{FrameSize: max(pc.FrameSize, pc.MTU+afxdp.FrameOverhead), Frames: pc.Frames})
	if err != nil {
		return nil, nil, err
	}
	if adopted {
		return prov, nil, nil
	}
	// NewSteering also removes what a dead daemon left on the NIC.
	steer, err := tap.NewSteering(pc.NS, pc.Ifindex, dev)
	if err != nil {
		_ = prov.Close()
		return nil, nil, fmt.Errorf("steer to %s: %w", dev.Name(), err)
	}
	return prov, steer, nil
}
