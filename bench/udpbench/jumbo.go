package main

import (
	"fmt"
	"slices"
	"strings"
)

// framesPerDatagram is how many IPv4 frames a UDP datagram of size payload
// bytes takes at mtu: fragments carry multiples of 8 bytes.
func framesPerDatagram(size, mtu int) int {
	if size+28 <= mtu {
		return 1
	}
	per := (mtu - 20) &^ 7
	return (size + 8 + per - 1) / per
}

// reportBulk prints the bulk comparison (-bulk): delivered throughput in
// Gbit/s of payload, and for TX the process CPU per GB sent, kernel vs
// ring vs shim.
func reportBulk(o options, res map[string][]sample) {
	mtu := o.mtu
	if mtu == 0 {
		mtu = 1500
	}
	gbps := func(s sample) float64 { return s.delivered * float64(o.size) * 8 / 1e9 }
	// CPU seconds per GB of payload: ns per datagram / bytes per datagram.
	cpuGB := func(s sample) float64 { return s.cpuPerPkt / float64(o.size) }
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d-byte UDP at MTU %d (%d frame(s) per datagram), %d runs of %v\n\n", o.size, mtu, framesPerDatagram(o.size, mtu), o.runs, o.duration)
	sb.WriteString("| path | median Gbit/s | spread | sender CPU s/GB |\n|---|---|---|---|\n")
	for _, c := range []string{"tx-kernel", "tx-ring", "tx-shim", "rx-kernel", "rx-ring", "rx-shim"} {
		if len(res[c]) == 0 {
			continue
		}
		xs := col(res[c], gbps)
		cpu := "-"
		if strings.HasPrefix(c, "tx-") {
			cpu = fmt.Sprintf("%.2f", median(col(res[c], cpuGB)))
		}
		fmt.Fprintf(&sb, "| %s | %.2f | %.2f–%.2f | %s |\n", c, median(xs), slices.Min(xs), slices.Max(xs), cpu)
	}
	ratio := func(a, b string, f func(sample) float64) float64 {
		return median(col(res[a], f)) / median(col(res[b], f))
	}
	sb.WriteString("\n")
	for _, d := range []string{"tx", "rx"} {
		if len(res[d+"-shim"]) > 0 && len(res[d+"-kernel"]) > 0 {
			fmt.Fprintf(&sb, "%s shim/kernel at MTU %d: %.2fx throughput (target >= 1.0x)", strings.ToUpper(d), mtu, ratio(d+"-shim", d+"-kernel", gbps))
			if d == "tx" {
				fmt.Fprintf(&sb, ", %.2fx CPU per GB (target <= 1.0x)", ratio("tx-shim", "tx-kernel", cpuGB))
			}
			sb.WriteString("\n")
		}
	}
	fmt.Print(sb.String())
}
