package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
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
