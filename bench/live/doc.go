// Package live is warmpath's live bench: real processes on real loopback
// sockets. It builds (or is given) the warmpath and enginesim binaries,
// starts a fleet of engines (Options.Fleets: enginesim variants, or real
// llama.cpp servers from bench/llamacpp) and, for each configuration, a
// router in front of them — warmpath with each policy, nginx round-robin
// (the load balancer a user has today), or nothing (direct to one engine)
// — and drives the same workload through bench/loadgen, measuring TTFT,
// end-to-end latency and the prompt-cache hit rate. A second part measures
// the routers' own overhead against a trivially fast in-process backend:
// unloaded latency added over direct, closed-loop throughput, and router
// CPU per 1,000 requests. A third, the keep-alive check, sends a burst
// after the routers' upstream pools sat idle past the backend's keep-alive
// timeout.
//
// Entry point: Run(ctx, Options) -> *Results, then Results.WriteMarkdown;
// with Options.Out set Run writes live.md and live.json there itself.
//
// Lifecycle hazards: every child (bench/internal/child) runs in its own
// process group with a parent-death signal (SIGKILL) and is stopped
// (SIGTERM, then SIGKILL to the group after a grace period) on every path
// out of Run, so nginx workers go with their master. A free port is found
// by binding :0 and closing it before the child binds it; a child that
// loses that race exits and the start-up check reports its output. Temp
// files (binaries, configs, nginx dirs) live in one directory removed when
// Run returns. The llamacpp fleet runs bench/llamacpp's Setup first (root;
// minutes on a fresh machine) and is left out with a note when it fails.
// Linux only (/proc, process groups); elsewhere Run returns an error.
package live
