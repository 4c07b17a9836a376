//go:build race

package preload

// raceEnabled: the in-process daemon runs under the race detector, several
// times slower; the TCP tests move less data then.
const raceEnabled = true
