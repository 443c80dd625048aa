package loadgen

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/bench/workload"
)

func engine(t *testing.T) *enginesim.Server {
	t.Helper()
	cfg := enginesim.DefaultConfig()
	cfg.ServedModelNames = []string{workload.DefaultModel}
	cfg.TimeScale = 0.02
	s, err := enginesim.Start(cfg, "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestAgainstEngine(t *testing.T) {
	s := engine(t)
	c := workload.DefaultSharedPrefix()
	c.Groups, c.PromptsPerGroup, c.OutputTokens, c.RPS = 2, 6, 16, 20
	w, err := workload.SharedPrefix(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, stream := range []bool{true, false} {
		res, err := Run(context.Background(), Config{URL: "http://" + s.Addr(), Workload: w, TimeScale: 0.02, Stream: stream, MaxDuration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if res.Sent != len(w.Requests) || res.OK != res.Sent || res.Failed != 0 {
			t.Fatalf("stream=%v: sent %d ok %d failed %d errors %v", stream, res.Sent, res.OK, res.Failed, res.Errors)
		}
		if res.Cached == 0 || res.PromptTokens == 0 || res.OutputTokens != int64(16*len(w.Requests)) {
			t.Fatalf("stream=%v: usage prompt %d cached %d output %d", stream, res.PromptTokens, res.Cached, res.OutputTokens)
		}
		if res.TTFT.P50 <= 0 || res.E2E.P50 < res.TTFT.P50 {
			t.Fatalf("stream=%v: latencies %+v %+v", stream, res.TTFT, res.E2E)
		}
		if stream && res.TTFT.Mean >= res.E2E.Mean {
			t.Fatalf("streaming TTFT %.4f not before the end %.4f", res.TTFT.Mean, res.E2E.Mean)
		}
	}
}

func TestBoundedAndCountsFailures(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%2 == 0 {
			http.Error(w, `{"error":{"message":"boom"}}`, http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n"))
	}))
	t.Cleanup(srv.Close)
	ns := workload.DefaultNoSharing()
	ns.Requests, ns.RPS = 50, 1e6
	w, _ := workload.NoSharing(ns)
	res, err := Run(context.Background(), Config{URL: srv.URL, Workload: w, Stream: true, MaxRequests: 10, MaxInFlight: 1})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 10 || res.OK != 5 || res.Failed != 5 || res.StatusCounts[503] != 5 || res.Cached != 20 {
		t.Fatalf("sent %d ok %d failed %d statuses %v cached %d", res.Sent, res.OK, res.Failed, res.StatusCounts, res.Cached)
	}
	if !strings.Contains(strings.Join(res.Errors, ","), "503") {
		t.Fatalf("errors %v", res.Errors)
	}
	if _, err := Run(context.Background(), Config{}); err == nil {
		t.Fatal("empty config accepted")
	}
}

func TestClosedLoop(t *testing.T) {
	tests := []struct {
		name        string
		concurrency int
		requests    int
		stream      bool
	}{
		{name: "one worker", concurrency: 1, requests: 7, stream: true},
		{name: "four workers streaming", concurrency: 4, requests: 40, stream: true},
		{name: "four workers buffered", concurrency: 4, requests: 40, stream: false},
		{name: "more workers than requests", concurrency: 16, requests: 3, stream: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var calls, inflight, peak atomic.Int64
			want := int64(min(tc.concurrency, tc.requests))
			full := make(chan struct{})
			var once sync.Once
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				n := inflight.Add(1)
				defer inflight.Add(-1)
				for {
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				if n == want {
					once.Do(func() { close(full) })
				}
				select { // the first wave waits until every worker is in flight
				case <-full:
				case <-time.After(5 * time.Second):
				}
				if strings.Contains(readAll(r), `"stream":true`) {
					w.Header().Set("Content-Type", "text/event-stream")
					w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\n\ndata: [DONE]\n\n"))
					return
				}
				w.Write([]byte(`{"choices":[{"message":{"content":"hi"}}],"usage":{"prompt_tokens":10,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":4}}}`))
			}))
			t.Cleanup(srv.Close)
			ns := workload.DefaultNoSharing()
			ns.Requests, ns.MinTokens, ns.MaxTokens = 5, 8, 16
			w, _ := workload.NoSharing(ns)
			res, err := RunClosed(context.Background(), ClosedConfig{URL: srv.URL, Workload: w, Concurrency: tc.concurrency, Requests: tc.requests, Stream: tc.stream, MaxDuration: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			if res.Sent != tc.requests || res.OK != tc.requests || calls.Load() != int64(tc.requests) {
				t.Fatalf("sent %d ok %d calls %d, want %d; errors %v", res.Sent, res.OK, calls.Load(), tc.requests, res.Errors)
			}
			if peak.Load() != want {
				t.Fatalf("peak concurrency %d, want %d", peak.Load(), want)
			}
			if res.Cached != int64(4*tc.requests) || res.PromptTokens != int64(10*tc.requests) || res.RPS <= 0 || res.E2E.P50 <= 0 {
				t.Fatalf("usage %d/%d rps %g e2e %+v", res.Cached, res.PromptTokens, res.RPS, res.E2E)
			}
		})
	}
}

func TestClosedLoopBounded(t *testing.T) {
	stop := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		readAll(r) // after the body, the server notices the client going away
		select {   // hangs until the client gives up
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })
	ns := workload.DefaultNoSharing()
	ns.Requests, ns.MinTokens, ns.MaxTokens = 2, 8, 16
	w, _ := workload.NoSharing(ns)
	res, err := RunClosed(context.Background(), ClosedConfig{URL: srv.URL, Workload: w, Concurrency: 2, Requests: 1000, MaxDuration: 200 * time.Millisecond, Stream: true})
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 2 || res.Failed != 2 || res.OK != 0 {
		t.Fatalf("sent %d failed %d ok %d, want 2 sent and failed at the deadline", res.Sent, res.Failed, res.OK)
	}
	for _, c := range []ClosedConfig{{}, {URL: srv.URL, Workload: w}} {
		if _, err := RunClosed(context.Background(), c); err == nil {
			t.Fatalf("config %+v accepted", c)
		}
	}
}

func readAll(r *http.Request) string {
	b, _ := io.ReadAll(r.Body)
	return string(b)
}

// Merge pools the runs' samples: the pooled median and tail are those of
// every request together, not an average of the runs' summaries.
func TestMergePoolsSamples(t *testing.T) {
	run := func(ttfts ...float64) *Result {
		outs := make([]outcome, len(ttfts))
		for i, s := range ttfts {
			d := time.Duration(s * float64(time.Second))
			outs[i] = outcome{status: http.StatusOK, ttft: d, e2e: 2 * d, prompt: 100, hit: 50}
		}
		return summarize(outs, time.Second, 1)
	}
	a, b := run(1, 2, 3), run(10, 20)
	b.Failed, b.Sent, b.Errors = 1, 3, []string{"status 503"}
	b.StatusCounts[503]++
	m := Merge(a, b)
	if m.Sent != 6 || m.OK != 5 || m.Failed != 1 || m.StatusCounts[200] != 5 || m.StatusCounts[503] != 1 {
		t.Fatalf("counts: %+v", m)
	}
	if m.TTFT.Mean != 36.0/5 || m.TTFT.P50 != 3 || m.TTFT.Max != 20 || m.E2E.Max != 40 {
		t.Fatalf("pooled TTFT %+v E2E %+v", m.TTFT, m.E2E)
	}
	if m.PromptTokens != 500 || m.Cached != 250 || m.RPS != 2.5 || len(m.Errors) != 1 {
		t.Fatalf("totals: prompt %d cached %d rps %g errors %v", m.PromptTokens, m.Cached, m.RPS, m.Errors)
	}
	// The runs' own summaries are untouched.
	if a.TTFT.Max != 3 || b.TTFT.P50 != 20 {
		t.Fatalf("inputs changed: %+v %+v", a.TTFT, b.TTFT)
	}
}
