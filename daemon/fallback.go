package daemon

import (
	"github.com/bypassd/bypassd/ring"
	"github.com/bypassd/bypassd/stats"
)

// fallbackCounters fills a ring block's TAP fallback counters (vma_stats'
// TAP and VF plug-out lines).
func fallbackCounters(r *ring.Ring, c *stats.RingCounters) {
	fs := r.FallbackStats()
	c[stats.RingTAPFallback] = uint64(fs.Mode)
	if fs.OnTAP {
		c[stats.RingTAPActive] = 1
	}
	c[stats.RingVFPlugouts] = fs.Plugouts
	c[stats.RingVFPlugins] = fs.Plugins
	if fs.TAPFD >= 0 {
		c[stats.RingTAPFD] = uint64(fs.TAPFD)
	}
	c[stats.RingTAPIfindex] = uint64(fs.TAPIfindex)
	c[stats.RingTAPRXPackets] = fs.RXPackets
	c[stats.RingTAPRXBytes] = fs.RXBytes
	c[stats.RingTAPTXPackets] = fs.TXPackets
	c[stats.RingTAPTXBytes] = fs.TXBytes
	c[stats.RingTAPTXDropped] = fs.TXDropped
}
