// Package layout holds the tree's import boundaries as tests
// (depguard-style, our own): affinity imports no I/O; bench is imported by
// nothing but cmd and bench; fastpath imports no slowpath; slowpath imports
// no fastpath (the two planes are peers, wired in cmd); and the router binary links no bench package but the
// demo's engines. `make lint` runs them. It has no code of its own.
package layout
