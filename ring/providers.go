package ring

// The providers a ring can open by name (qp.Register in each package's
// init). verbs registers only in binaries built with -tags verbs; without
// the tag the package is its device lookup and Decide.
import (
	_ "github.com/bypassd/bypassd/ring/provider/afxdp"
	_ "github.com/bypassd/bypassd/ring/provider/tapfd"
	_ "github.com/bypassd/bypassd/ring/provider/verbs"
)
