package ring

import "github.com/bypassd/bypassd/ring/provider/afxdp"

// RXMetadataStats reports the AF_XDP provider's count of frames that
// carried the XDP program's metadata, and of those with a hardware stamp.
func RXMetadataStats(r *Ring) (frames, stamped uint64) {
	return r.prov.(*afxdp.Socket).RXMetadataStats()
}
