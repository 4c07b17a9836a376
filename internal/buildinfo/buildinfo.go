// Package buildinfo names the version of bypassd's binaries. Release builds
// set it with -ldflags "-X github.com/bypassd/bypassd/internal/buildinfo.version=1.2.0";
// other builds report "dev", with the commit when the Go toolchain recorded one.
package buildinfo

import "runtime/debug"

var version = "dev"

// Version returns the version alone: "1.2.0", "dev-<12-digit commit>" or "dev".
func Version() string {
	if version != "dev" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				return "dev-" + s.Value[:12]
			}
		}
	}
	return version
}
