// Package suite runs warmpath's simulator bench: every workload of
// bench/workload through bench/sim at a ladder of load levels with every
// policy (warmpath's and the anchors'), plus replica-count and KV-cache-size
// sweeps and the scale-out section (several routers over the same engines,
// synced or not: scaleout.go; its anchor rows run after the ladder, which
// picks the anchor), and writes a Markdown report with SVG plots and a results.json.
// Runs fan out over GOMAXPROCS goroutines; each run is deterministic for its
// seed, so reports differ between machines only in the elapsed time and the
// router-CPU table.
package suite
