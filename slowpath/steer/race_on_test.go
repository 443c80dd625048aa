//go:build race

package steer

// raceEnabled: the race detector allocates on its own.
const raceEnabled = true
