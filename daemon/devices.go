package daemon

import (
	"slices"

	"github.com/vishvananda/netlink"
	"go.uber.org/zap"
	"golang.org/x/sys/unix"

	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/ring/clock/phc"
	"github.com/bypassd/bypassd/ring/ntuple"
	"github.com/bypassd/bypassd/ring/provider/verbs"
)

// deviceFacts is what the daemon learned about an interface's NIC at start,
// on the thread that is in the interface's network namespace: the RDMA
// device behind it (for provider selection and the devices topic), its PHC
// and its driver.
type deviceFacts struct {
	name               string
	rdma               verbs.Decision
	phc                int
	driver, bus        string
	rxQueues, txQueues int
	// ntuple is nil when the NIC takes n-tuple flow rules, else why not.
	ntuple error
}

// probeDevice gathers an interface's facts. Nothing here is fatal: a fact
// that cannot be read is left out of the devices topic (and logged at
// debug level).
func probeDevice(ifname string, nl *netlink.Handle, log *zap.Logger) *deviceFacts {
	f := &deviceFacts{name: ifname, rdma: verbs.Decide(ifname), phc: -1}
	if info, err := phc.Discover(ifname); err == nil {
		f.phc = info.Index
	} else {
		log.Debug("no PHC information", zap.String("iface", ifname), zap.Error(err))
	}
	if fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err == nil {
		if di, err := unix.IoctlGetEthtoolDrvinfo(fd, ifname); err == nil {
			f.driver = unix.ByteSliceToString(di.Driver[:])
			f.bus = unix.ByteSliceToString(di.Bus_info[:])
		}
		unix.Close(fd)
	}
	if link, err := nl.LinkByName(ifname); err == nil {
		f.rxQueues, f.txQueues = link.Attrs().NumRxQueues, link.Attrs().NumTxQueues
	}
	if n, err := rxQueueCount(nl, ifname); err == nil {
		f.rxQueues = n
	}
	dev, err := ntuple.Open(ifname)
	if err == nil {
		err = dev.Supported()
		dev.Close()
	}
	f.ntuple = err
	return f
}

// device returns the facts of an interface the daemon serves.
func (d *Daemon) device(ifname string) *deviceFacts {
	for _, f := range d.devices {
		if f.name == ifname {
			return f
		}
	}
	return nil
}

// queryDevices answers the devices topic: per served interface, the NIC's
// facts and how its rings use them.
func (d *Daemon) queryDevices(*session) (any, error) {
	doc := ctldoc.DevicesDoc{Devices: []ctldoc.DeviceDoc{}, Limits: d.limits}
	for _, f := range d.devices {
		dd := ctldoc.DeviceDoc{Interface: f.name, Driver: f.driver, BusInfo: f.bus,
			RXQueues: f.rxQueues, TXQueues: f.txQueues, PHC: f.phc, Queues: []int{},
			Pacing: "software", RDMA: f.rdma.Caps, RDMANote: f.rdma.Reason, Ntuple: f.ntuple == nil}
		if f.ntuple != nil {
			dd.NtupleNote = f.ntuple.Error()
		}
		first := true
		for _, ri := range d.rings {
			if ri.it.Name != f.name {
				continue
			}
			caps := ri.ring().Caps()
			dd.Queues = append(dd.Queues, ri.it.Queue)
			dd.DevMemGranted += ri.ring().DevMemStats().Capacity
			if !first {
				continue
			}
			first = false
			dd.Provider, dd.Mode, dd.ZeroCopy = caps.Provider, caps.Mode, caps.ZeroCopy
			dd.DeviceMemory = caps.DeviceMemory
			dd.MTU, dd.FrameSize, dd.MaxFrame, dd.MultiBuffer = ri.ring().MTU(), caps.FrameSize, caps.MaxFrame, caps.MultiBuffer
			dd.HWTimestamps = ri.ring().HWTimestampMode().String()
			if p := ri.ring().Program(); p != nil {
				dd.XDPMode = p.Mode().String()
			}
			if rl := caps.RateLimit; rl != nil {
				dd.Pacing, dd.PacingMinKbps, dd.PacingMaxKbps = "hardware", rl.MinKbps, rl.MaxKbps
			}
		}
		slices.Sort(dd.Queues)
		switch {
		case len(dd.Queues) > 1:
			dd.RSS = "handoff"
		case f.rxQueues <= 1:
			dd.RSS = "single queue"
		default:
			dd.RSS = "none"
		}
		doc.Devices = append(doc.Devices, dd)
	}
	return doc, nil
}
