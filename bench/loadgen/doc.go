// Package loadgen is the live bench's load generator: it replays a
// bench/workload against an OpenAI-compatible server over real sockets,
// open loop (each request leaves at its arrival time, scaled to the engines'
// time scale), streaming, and measures TTFT at the client on the first
// content byte, end-to-end latency, and the usage the server reports
// (prompt, cached and completion tokens). Every run is bounded in request
// count and wall time and stops by itself.
package loadgen
