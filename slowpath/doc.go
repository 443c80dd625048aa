// Package slowpath is warmpath's L7 router: a fasthttp reverse proxy for the
// OpenAI-compatible API (/v1/chat/completions, /v1/completions,
// /v1/responses, /v1/embeddings, /v1/models) that asks affinity/ which
// replica answers a request fastest and proxies it there, body byte for
// byte, streaming SSE back event by event; vLLM's other endpoints
// (/tokenize, /v1/rerank, /v1/score, /pooling, /v1/audio/*, /version) are
// passed through to a replica serving the model (passthrough.go).
//
// It owns: the config file (strict YAML, Validate naming the field), the
// replica set (static list reloaded on SIGHUP or file change), active health
// checks, passive ejection with doubling eject time, scraping of engine
// /metrics (vLLM, SGLang, llama.cpp names) into affinity's load state,
// reading usage.prompt_tokens_details.cached_tokens back into the index,
// limits (body size, timeouts, per-replica and total concurrency: 429 or
// queue), OpenAI-style error bodies, Prometheus metrics and /debug/replicas
// on the admin address, and graceful shutdown.
//
// Lifecycle hazards:
//   - New starts one control goroutine per replica (health + scrape);
//     Shutdown stops them. A Server is not restartable.
//   - A streamed response outlives its handler: the pooled exchange is the
//     fasthttp body stream and is released in CloseWithError, after the last
//     byte. Nothing from the RequestCtx may be kept past the handler, so the
//     model name is copied into the exchange.
//   - Retries happen only where the engine cannot have begun the work
//     (connect error, reset before any response byte, a retryable status);
//     a response timeout is a 504, never retried nor held against the
//     replica; once an upstream answered with headers the response is
//     committed, and a failure after that is a broken stream (counted,
//     logged, never retried).
//   - Attempts go over each replica's HostClient pool directly
//     (upstream.go: AcquireConn/ReleaseConn, not HostClient.Do), so the
//     wait for the first byte can watch the client socket and cancel the
//     upstream request when the client leaves; a stream's connection is held
//     by its exchange and pooled again only when read to its end. Every
//     path that ends an exchange must release it (upConn.release).
//   - An HTTP/1.0 client's stream is relayed on the hijacked connection by
//     one goroutine (fasthttp would chunk it); Shutdown waits for it too.
//   - The API listener (accept.go) survives EMFILE and friends by backing
//     off, and caps connections in total and per client address.
//   - Upstream connections are wrapped (idle.go) so that, once a response
//     has begun, each read waits at most upstream.idle_timeout; the wrapper
//     relies on fasthttp setting the read deadline once per request, from
//     the goroutine that then reads the response.
//   - A removed replica stops receiving requests at once; its in-flight
//     requests finish on their pooled connections. affinity may reuse its
//     ReplicaID, and its Flights are generation-checked.
//   - Observer runs on the request goroutine after the response completed:
//     it must not block or keep the event.
//   - A Responses API response is engine state (responses.go): the router
//     remembers response id -> replica name in a bounded LRU with a TTL and
//     pins previous_response_id requests to it; the name is resolved against
//     the serving table at each use, so a removed replica is seen as gone.
//   - CORS (cors.go) decorates the response after the handler chose it;
//     an HTTP/1.0 stream's header is written before that and carries none.
package slowpath
