// Package sim is warmpath's cluster simulator: N virtual-time engines
// (bench/enginesim's Engine: paged KV cache with prefix caching, continuous
// batching, step-time model) behind a router model that runs the real
// affinity code: the same Parser, prefix index, load accounting and policies
// the proxy runs, so what the simulator measures is what production decides.
//
// The router model sees the cluster the way the proxy does and nothing
// more: replicas added by name and models only (no prefill rate, KV
// capacity or batch size), its own speculative index (never the engines'
// caches), its own in-flight counts, first-token and finish events as the
// proxy sees them with usage in real tokens (a per-request tokenizer
// density against its bytes/4 estimate), and engine signals (waiting,
// running, KV usage; vLLM's capacity, llama.cpp's slots) scraped once
// before the first request and then every Config.ScrapeInterval, each
// replica on its own phase. Fleets
// (FleetEngines, Config.Engines) give replicas their own engine configs:
// small batches, mixed speeds, no prefix cache, llama.cpp slots.
//
// Result.HitRate is per request (cached tokens at first scheduling, once
// per request); Result.AdmissionHitRate is the engines' own counter, which
// counts a preempted request's re-admission again.
//
// The anchors' policies (SGLang cache-aware, llm-d's default scorers, Dynamo's
// KV cost, KubeAI's CHWBL, production-stack's prefixaware) run on the same
// View: see baselines.go for each formula and its source.
//
// Scale-out (Config.Routers, Sync, SyncDelay; peer.go): several router
// instances over the same engines, each request to one at random, each with
// its own affinity.Router; with Sync their affinity.PeerSink updates reach
// the other routers through a virtual-time delay queue, delivered before
// any later event. Hazard: Routers=1 must stay exactly the single-router
// simulator (same router seed, no extra random draws, no sink), which
// TestOneRouterUnchanged guards.
//
// Everything is deterministic for a seed; a run is single-threaded, so
// sweeps parallelise across runs.
package sim
