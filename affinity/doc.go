// Package affinity is warmpath's routing brain: it turns an OpenAI request
// body into chained prefix-block hashes (Parser), remembers which replica
// probably holds which prefix in its KV cache (a bounded prefix index), keeps
// each replica's load (router-local in-flight and pending prefill, plus
// engine signals fed from outside), and ranks replicas for a request with a
// pluggable Policy (Router.Decide). Promoter is the fast-path promotion
// rule: which clients get an in-kernel affinity entry, and which entries the
// rebalancer drops (the caller writes the BPF map).
//
// The package is pure: no sockets, no clocks. Every time is a caller-supplied
// `now` in nanoseconds, so the proxy passes time.Now().UnixNano() and the
// simulator passes virtual time.
//
// Lifecycle and hazards:
//   - A Parser is not goroutine-safe; its Prompt's slices alias its scratch
//     buffers and are valid until its next Parse call. Copy Hashes into the
//     Request (or keep the Parser) until Begin returns.
//   - Parser and Router must share one HashConfig (Router.HashConfig).
//   - Router is safe for concurrent use. Decide changes nothing but
//     tie-breaking randomness; the caller must call Begin for the replica it
//     actually uses, FirstToken when the first token arrives, and End exactly
//     once (End is idempotent). A Flight whose replica was removed, or whose
//     ID was reused, Ends harmlessly.
//   - A Decision carries per-caller scratch: use one per goroutine.
//   - A CacheOracle (Router.SetCacheOracle) is called under the Router's
//     read lock: it must not call back into the Router.
//   - Promoter forgets the oldest clients past MaxClients, promoted ones
//     included: their entries must age out through Rebalance (idle rule).
package affinity
