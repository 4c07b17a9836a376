//go:build race

package daemon

// raceEnabled: the race detector makes the 20,000-socket test take more
// than ten minutes; make test runs that one without it.
const raceEnabled = true
