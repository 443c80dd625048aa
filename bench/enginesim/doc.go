// Package enginesim simulates a vLLM-like GPU inference engine: the ground
// truth the router's affinity index only guesses at.
//
// It has two layers:
//
//   - Engine, a deterministic virtual-time core (no goroutines, no clock):
//     a paged KV cache with automatic prefix caching (chained block hashes
//     over the engine's own token stream, an LRU of free blocks, eviction at
//     NumGPUBlocks), a continuous-batching scheduler (waiting queue, running
//     set bounded by MaxNumSeqs and free blocks, a per-step token budget
//     shared by chunked prefills and decodes, preemption with recompute) and
//     a step-time model (Timing). The cluster simulator drives it with
//     Submit, NextEventTime and Advance and receives token and finish events
//     through an Observer.
//   - Server, an OpenAI-compatible HTTP server (/v1/chat/completions,
//     /v1/completions, /v1/responses with a response store, /v1/models,
//     /health, /metrics with vLLM's metric names, /admin/faults,
//     /admin/restart, and vLLM's /tokenize, /detokenize, rerank, score,
//     /pooling and audio endpoints) that runs one Engine on the wall clock
//     scaled by Config.TimeScale, with fault injection.
//
// The engine deliberately shares no code with affinity/: its tokenizer
// (4 bytes per token), chat template and block hashing are its own.
//
// Lifecycle hazards:
//   - Engine is not safe for concurrent use; a Request's Prompt must not
//     change while it is in flight, and a Request must not be resubmitted
//     before it finished or was aborted (ErrInFlight).
//   - Engine.Release hands the engine's KV cache to a later NewEngine of the
//     same size: call it only when the engine is done for good.
//   - NewServer starts a scheduler goroutine: always Close the Server (Close
//     also fails in-flight requests and waits for handlers).
//   - Each Server has a private Prometheus registry, so many can run in one
//     process; metrics are in model time, not wall time. Restart resets the
//     engine counters /metrics exposes, as a real process restart would;
//     Stats and Served keep cumulative totals.
package enginesim
