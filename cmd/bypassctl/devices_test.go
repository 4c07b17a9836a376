package main

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/bypassd/bypassd/daemon/config"
	"github.com/bypassd/bypassd/daemon/daemontest"
	"github.com/bypassd/bypassd/internal/ctldoc"
	"github.com/bypassd/bypassd/internal/netlab"
	"github.com/bypassd/bypassd/ring/provider/verbs"
)

// The table of a ConnectX port as the daemon would describe it (values as
// ibv_devinfo -v prints them for a ConnectX-5).
func TestPrintDevicesRDMA(t *testing.T) {
	doc := &ctldoc.DevicesDoc{Devices: []ctldoc.DeviceDoc{{
		Interface: "ens1f0", Driver: "mlx5_core", BusInfo: "0000:03:00.0", RXQueues: 8, TXQueues: 8,
		Provider: "verbs", Mode: "raw-packet mlx5_0:1", ZeroCopy: true, Queues: []int{0, 1}, RSS: "handoff", Ntuple: true,
		Pacing: "hardware", PacingMinKbps: 1000, PacingMaxKbps: 100000000, DeviceMemory: 131072, DevMemGranted: 65536,
		PHC: 1, HWTimestamps: "sync",
		RDMA: &verbs.DeviceCaps{Device: "mlx5_0", Port: 1, Ports: 1, LinkLayer: "ethernet", PortState: "active", ActiveMTU: 1024,
			Firmware: "16.35.2000", VendorID: 0x2c9, VendorPartID: 4119, NodeGUID: "248a:0703:00b1:c2d3",
			RawPacket: true, RawPacketCaps: []string{"cvlan_stripping", "ip_csum"}, MaxTSO: 262144,
			Pacing:       &verbs.PacingCaps{MinKbps: 1000, MaxKbps: 100000000, QPTypes: []string{"raw_packet"}},
			DeviceMemory: 131072, CompletionTimestamps: true, ClockKHz: 156250, TimestampMask: 0x7fffffffffffffff},
		RDMANote: "interface ens1f0: RDMA device mlx5_0 port 1 supports raw packet QPs",
	}}}
	var b bytes.Buffer
	if err := printDevices(&b, doc); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"ens1f0\n", "mlx5_core 0000:03:00.0", "RSS    ", "handoff: a frame on another queue", "n-tuple rules supported", "verbs (raw-packet mlx5_0:1), zero-copy yes", "0,1 served of 8 rx / 8 tx",
		"hardware, 1000..100000000 kbit/s", "131072 bytes per ring available, 65536 granted", "PHC /dev/ptp1, hardware timestamps sync",
		"mlx5_0 port 1 of 1: ethernet, active, active MTU 1024", "16.35.2000", "yes (offloads: cvlan_stripping, ip_csum), max TSO 262144",
		"1000..100000000 kbit/s on raw_packet, burst control no", "core clock 156250 kHz", "supports raw packet QPs",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
}

func TestDevicesAgainstDaemon(t *testing.T) {
	p := netlab.NewPair(t, netlab.Options{StaticNeigh: true})
	srv := daemontest.Start(t, p, config.Config{}, nil)
	out := mustCtl(t, srv.SocketPath(), "devices")
	t.Logf("bypassctl devices:\n%s", out)
	for _, want := range []string{p.A.Name, "afxdp", "software (the ring engine's scheduler)", "veth", "no PHC", "no RDMA device"} {
		if !strings.Contains(out, want) {
			t.Errorf("devices: no %q in:\n%s", want, out)
		}
	}
	var doc ctldoc.DevicesDoc
	if err := json.Unmarshal([]byte(mustCtl(t, srv.SocketPath(), "--json", "devices")), &doc); err != nil {
		t.Fatal(err)
	}
	if len(doc.Devices) != 1 || doc.Devices[0].Interface != p.A.Name || doc.Devices[0].RDMA != nil || doc.Devices[0].PHC != -1 {
		t.Fatalf("devices document: %+v", doc)
	}
}
