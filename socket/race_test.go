//go:build race

package socket

// raceEnabled: the race detector slows bulk transfers tenfold, so the
// largest ones shrink under it.
const raceEnabled = true
