//go:build race

package affinity

// raceEnabled: the race detector slows single-goroutine tests tenfold;
// long randomized ones run fewer rounds under it.
const raceEnabled = true
