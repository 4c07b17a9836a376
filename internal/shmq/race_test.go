//go:build race

package shmq

const raceEnabled = true
