//go:build !race

package preload

const raceEnabled = false
