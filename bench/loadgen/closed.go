package loadgen

import (
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/warmpath/warmpath/bench/workload"
)

// ClosedConfig drives a closed-loop run: Concurrency workers each send a
// request, wait for its whole response, and send the next, until Requests
// have been sent. It measures a server's maximum throughput and its latency
// at a fixed concurrency (Concurrency 1: unloaded latency). Latencies are
// wall seconds (there is no time scale).
type ClosedConfig struct {
	// URL is the base URL of an OpenAI-compatible server (loopback only).
	URL string
	// Workload supplies the request bodies, used in order and cycled;
	// arrival times are ignored.
	Workload *workload.Workload
	// Concurrency is the number of workers (connections). 0 means 1.
	Concurrency int
	// Requests is how many requests are sent in total. Required (> 0).
	Requests int
	// MaxDuration bounds the run in wall time; 0 means 2 minutes. Requests
	// not yet sent when it passes are not sent; those in flight are cancelled.
	MaxDuration time.Duration
	// RequestTimeout bounds one request; 0 means 60s.
	RequestTimeout time.Duration
	// Stream asks for SSE and measures TTFT at the first content byte.
	Stream bool
	// Header is added to every request.
	Header http.Header
	// Client overrides the HTTP client; nil builds one with Concurrency
	// keep-alive connections.
	Client *http.Client
}

// RunClosed runs a closed loop and waits for every request it sent.
// Result.RPS is completed requests per wall second; Delayed is always 0.
func RunClosed(ctx context.Context, cfg ClosedConfig) (*Result, error) {
	if cfg.URL == "" || cfg.Workload == nil || len(cfg.Workload.Requests) == 0 {
		return nil, errors.New("loadgen: need a URL and a non-empty workload")
	}
	if cfg.Requests <= 0 {
		return nil, errors.New("loadgen: closed loop needs Requests > 0")
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	cfg.Concurrency = min(cfg.Concurrency, cfg.Requests)
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = 2 * time.Minute
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 60 * time.Second
	}
	client := cfg.Client
	if client == nil {
		d := &net.Dialer{Timeout: 5 * time.Second}
		client = &http.Client{Transport: &http.Transport{
			DialContext: d.DialContext, MaxIdleConns: cfg.Concurrency, MaxIdleConnsPerHost: cfg.Concurrency,
			IdleConnTimeout: 30 * time.Second, DisableCompression: true,
		}}
		defer client.CloseIdleConnections()
	}
	// Bodies are built once, so the client's own cost stays out of the loop.
	bodies := make([][]byte, min(len(cfg.Workload.Requests), cfg.Requests))
	for i := range bodies {
		bodies[i] = workload.AppendChatBody(nil, &cfg.Workload.Requests[i], cfg.Stream)
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	defer cancel()
	one1 := Config{RequestTimeout: cfg.RequestTimeout, Stream: cfg.Stream, Header: cfg.Header}
	url := cfg.URL + "/v1/chat/completions"
	outs := make([]outcome, cfg.Requests)
	var next atomic.Int64 // index of the next request to send
	var wg sync.WaitGroup
	start := time.Now()
	for range cfg.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= cfg.Requests {
					return
				}
				outs[i] = one(ctx, client, url, bodies[i%len(bodies)], one1)
			}
		}()
	}
	wg.Wait()
	sent := min(int(next.Load()), cfg.Requests)
	// A worker that saw the deadline before claiming an index did not send;
	// claimed indexes are contiguous from 0, so outs[:sent] are the sent ones.
	return summarize(outs[:sent], time.Since(start), 1), nil
}
