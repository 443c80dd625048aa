// Package analyze answers "should this workload use prefix-aware routing at
// all?": from a Mooncake trace, a JSONL of OpenAI request bodies, or any
// bench/workload, it measures the share of prompt tokens an unbounded cache
// could reuse, how that share falls with the KV cache per replica, which
// prefix groups carry the reuse, and (with the cluster simulator) the TTFT
// gain of warmpath's cost policy over least-request at the user's replica
// count and rate, and ends in a plain recommendation. Prompt text is never
// kept: JSONL bodies are reduced to block hashes on reading.
package analyze
