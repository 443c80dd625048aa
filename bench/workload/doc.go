// Package workload generates the request workloads of warmpath's bench,
// deterministically from a seed: shared-prefix groups (SGLang's shape and a
// b2b-saas shape), multi-turn chat, Mooncake trace replay, no sharing, and a
// mixed two-model workload with bursts.
//
// Requests are kept compact: a prompt is a list of messages made of Segments
// (an id and a token count), and text is produced on demand by AppendSegment,
// so a million-request simulation does not hold a million prompts in memory.
// Equal segment ids give equal bytes, which is what makes prefixes shared.
//
// The package is pure (no I/O beyond reading a trace file) so the virtual-time
// cluster simulator and the live load generator consume the same workloads.
package workload
