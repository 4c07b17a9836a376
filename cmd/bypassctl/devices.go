package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/bypassd/bypassd/internal/ctldoc"
)

func init() {
	register(command{
		name: "devices", help: "each served interface's NIC: provider, capabilities, pacing range, device memory, clock, RDMA device",
		topic: ctldoc.TopicDevices, newDoc: func() any { return new(ctldoc.DevicesDoc) },
		print: printDevices,
	})
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func printDevices(w io.Writer, doc any) error {
	dd := doc.(*ctldoc.DevicesDoc)
	if l := dd.Limits; l.NofileHard != 0 {
		fmt.Fprintf(w, "daemon open files: soft limit %d, hard limit %d (one per bound socket, three per client)\n\n", l.NofileSoft, l.NofileHard)
	}
	for i, d := range dd.Devices {
		if i > 0 {
			fmt.Fprintln(w)
		}
		queues := make([]string, len(d.Queues))
		for j, q := range d.Queues {
			queues[j] = strconv.Itoa(q)
		}
		fmt.Fprintf(w, "%s\n", d.Interface)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		row := func(k, format string, a ...any) { fmt.Fprintf(tw, "  %s\t%s\n", k, fmt.Sprintf(format, a...)) }
		if d.Driver != "" {
			row("driver", "%s", strings.TrimSpace(d.Driver+" "+d.BusInfo))
		}
		row("provider", "%s (%s), zero-copy %s", d.Provider, d.Mode, yesNo(d.ZeroCopy))
		row("queues", "%s served of %d rx / %d tx", strings.Join(queues, ","), d.RXQueues, d.TXQueues)
		switch d.RSS {
		case "handoff":
			row("RSS", "handoff: a frame on another queue than its flow's home ring's is passed on by the receiving ring")
		case "none":
			row("RSS", "none: one ring; frames RSS puts on other queues go to the kernel (serve every queue, or narrow RSS with ethtool -X)")
		case "":
		default:
			row("RSS", "%s", d.RSS)
		}
		if d.Ntuple {
			row("flow rules", "n-tuple rules supported (not used by bypassd yet)")
		} else if d.NtupleNote != "" {
			row("flow rules", "none (%s)", d.NtupleNote)
		}
		if d.XDPMode != "" {
			row("XDP", "%s", d.XDPMode)
		}
		if d.Pacing == "hardware" {
			row("pacing", "hardware, %d..%d kbit/s", d.PacingMinKbps, d.PacingMaxKbps)
		} else {
			row("pacing", "%s (the ring engine's scheduler)", d.Pacing)
		}
		row("device memory", "%d bytes per ring available, %d granted", d.DeviceMemory, d.DevMemGranted)
		clock := "no PHC"
		if d.PHC >= 0 {
			clock = fmt.Sprintf("PHC /dev/ptp%d", d.PHC)
		}
		row("clock", "%s, hardware timestamps %s", clock, d.HWTimestamps)
		if c := d.RDMA; c != nil {
			row("RDMA device", "%s port %d of %d: %s, %s, active MTU %d", c.Device, c.Port, c.Ports, c.LinkLayer, c.PortState, c.ActiveMTU)
			row("  firmware", "%s, vendor %#x part %d, node GUID %s", c.Firmware, c.VendorID, c.VendorPartID, c.NodeGUID)
			caps := "none"
			if len(c.RawPacketCaps) > 0 {
				caps = strings.Join(c.RawPacketCaps, ", ")
			}
			row("  raw packet QP", "%s (offloads: %s), max TSO %d", yesNo(c.RawPacket), caps, c.MaxTSO)
			if p := c.Pacing; p != nil {
				row("  packet pacing", "%d..%d kbit/s on %s, burst control %s", p.MinKbps, p.MaxKbps, strings.Join(p.QPTypes, ", "), yesNo(p.Burst))
			} else {
				row("  packet pacing", "none for raw packet QPs")
			}
			row("  device memory", "%d bytes (shared by the whole device)", c.DeviceMemory)
			row("  completion timestamps", "%s, core clock %d kHz, mask %#x", yesNo(c.CompletionTimestamps), c.ClockKHz, c.TimestampMask)
			row("  limits", "%d QPs, %d work requests per queue, %d completions per CQ", c.MaxQP, c.MaxQPWR, c.MaxCQE)
		}
		if d.RDMANote != "" {
			row("RDMA note", "%s", d.RDMANote)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}
