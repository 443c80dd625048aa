//go:build race

package slowpath

// raceEnabled: the race detector allocates on its own, so zero-allocation
// assertions only hold without it.
const raceEnabled = true
