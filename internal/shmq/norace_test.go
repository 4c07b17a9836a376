//go:build !race

package shmq

const raceEnabled = false
