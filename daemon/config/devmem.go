package config

import (
	"fmt"
	"math"

	"github.com/bypassd/bypassd/ring"
)

// maxDevMemInline bounds the inline threshold: no frame is larger.
const maxDevMemInline = math.MaxUint16

// CheckDevMem refuses a staging configuration the devices cannot hold: the
// rings of one interface share its device memory, so their DevMemTX must
// add up to at most DevMemMax. c has its defaults applied.
func CheckDevMem(c Config) error {
	switch {
	case c.DevMemTX < 0:
		return fmt.Errorf("dev mem tx %d bytes: must be 0 (off) or positive", c.DevMemTX)
	case c.DevMemMax < 0:
		return fmt.Errorf("dev mem max %d bytes: must be positive", c.DevMemMax)
	case c.DevMemInline > maxDevMemInline:
		return fmt.Errorf("dev mem inline %d bytes: at most %d (0 stages every frame)", c.DevMemInline, maxDevMemInline)
	}
	if c.DevMemTX == 0 {
		return nil
	}
	// A ring with a TAP path changes provider at run time, and staged
	// frames live in the fast path's memory: the ring would stage nothing.
	if f, err := ring.ParseFallback(c.Fallback); err == nil && f != ring.FallbackNone {
		return fmt.Errorf("device memory: --dev-mem-tx needs a ring without a TAP path, but --fallback is %s: use --fallback none (the default when --dev-mem-tx is set), or --dev-mem-tx 0 to keep the TAP fallback", f)
	}
	rings := map[string]int{}
	for _, it := range c.Interfaces {
		rings[it.Name]++
	}
	for _, it := range c.Interfaces {
		n := rings[it.Name]
		if total := int64(n) * int64(c.DevMemTX); total > int64(c.DevMemMax) {
			return fmt.Errorf("device memory: %d bytes per ring (--dev-mem-tx, BYPASSD_RING_DEV_MEM_TX) × %d ring(s) of %s = %d bytes, more than the %d bytes one device has (--dev-mem-max): lower --dev-mem-tx to at most %d, or raise --dev-mem-max if the device really has more",
				c.DevMemTX, n, it.Name, total, c.DevMemMax, c.DevMemMax/n&^63)
		}
	}
	return nil
}
