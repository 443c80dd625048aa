package enginesim

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// BenchmarkEngineStep measures virtual-time steps per second of CPU with a
// steady decode batch of the given size.
func BenchmarkEngineStep(b *testing.B) {
	for _, batch := range []int{1, 16, 64, 256} {
		b.Run(fmt.Sprintf("running=%d", batch), func(b *testing.B) {
			e := newTestEngine(b, func(c *Config) { c.NumGPUBlocks = 1 << 16; c.MaxNumSeqs = batch })
			reqs := make([]Request, batch)
			p := prompt("sys", 200)
			refill := func() {
				now := e.NextEventTime()
				if now == NoEvent {
					now = 0
				}
				for i := range reqs {
					reqs[i] = Request{ID: uint64(i), Prompt: p, MaxTokens: 2000}
					if err := e.Submit(&reqs[i], now); err != nil {
						b.Fatal(err)
					}
				}
				e.Advance(now, nil)
			}
			refill()
			b.ReportAllocs()
			steps := 0
			for b.Loop() {
				if e.NextEventTime() == NoEvent {
					b.StopTimer()
					refill()
					b.StartTimer()
				}
				steps += e.Advance(e.NextEventTime(), nil)
			}
			b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
			b.ReportMetric(float64(steps*batch)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// recycler hands finished requests back for reuse.
type recycler struct{ free []*Request }

func (r *recycler) OnToken(*Request, int64) {}
func (r *recycler) OnFinish(q *Request, _ int64) {
	r.free = append(r.free, q)
}

// BenchmarkSimulatedRequests measures simulated requests per second of CPU
// for a chat-like workload: 1000-token prompts whose first 600 tokens are
// one of 8 shared system prompts, jittered arrivals at about 70% of the
// engine's cold capacity, and output lengths of out tokens. One iteration is one
// request from arrival to finish. The cache=off twin is the baseline.
func BenchmarkSimulatedRequests(b *testing.B) {
	for _, out := range []int{32, 128, 512} {
		for _, caching := range []bool{true, false} {
			name := fmt.Sprintf("out=%d/cache=%v", out, map[bool]string{true: "on", false: "off"}[caching])
			b.Run(name, func(b *testing.B) {
				e := newTestEngine(b, func(c *Config) {
					c.Timing = DefaultTiming()
					c.NumGPUBlocks = 25000
					c.DisablePrefixCaching = !caching
				})
				systems := make([][]byte, 8)
				for i := range systems {
					systems[i] = prompt(fmt.Sprint("system", i), 600)
				}
				prompts := make([][]byte, 1024)
				for i := range prompts {
					prompts[i] = append(append([]byte(nil), systems[i%8]...), prompt(fmt.Sprint("user", i), 400)...)
				}
				// Mean gap: a request costs about 1000 prefill tokens × 40µs
				// (cold) plus out × ~130µs of decode (per-seq + context); arrive
				// at ~70% of that so the queue stays bounded in both twins.
				gap := int64((40*time.Millisecond + time.Duration(out)*130*time.Microsecond) * 10 / 7)
				rec := &recycler{}
				var now, id uint64
				var ttft time.Duration
				finished := 0
				b.ReportAllocs()
				for b.Loop() {
					var r *Request
					if n := len(rec.free); n > 0 {
						r, rec.free = rec.free[n-1], rec.free[:n-1]
						ttft += r.TTFT()
						finished++
					} else {
						r = new(Request)
					}
					id++
					*r = Request{ID: id, Prompt: prompts[id%1024], MaxTokens: out}
					// Deterministic jittered arrivals: 0.5..1.5 × gap.
					now += uint64(gap/2) + splitmix64(id)%uint64(gap)
					e.Advance(int64(now), rec)
					if err := e.Submit(r, int64(now)); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				st := e.Stats()
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				b.ReportMetric(float64(b.N)*60/b.Elapsed().Seconds()/1e6, "Mreq/min")
				if finished > 0 {
					b.ReportMetric(float64(ttft.Milliseconds())/float64(finished), "sim-ttft-ms")
				}
				b.ReportMetric(float64(st.PrefixHits)/float64(max(st.PrefixQueries, 1)), "hit-ratio")
			})
		}
	}
}

// BenchmarkServerChat measures non-streaming chat requests per second
// through the HTTP face (TimeScale 1e-6, so the model's time is negligible)
// against a baseline twin: a bare net/http handler returning a fixed body.
func BenchmarkServerChat(b *testing.B) {
	body := `{"model":"m","max_tokens":8,"messages":[{"role":"system","content":"` + string(prompt("sys", 500)) + `"},{"role":"user","content":"hi"}]}`
	run := func(b *testing.B, url string) {
		c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
		defer c.CloseIdleConnections()
		b.ReportAllocs()
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				resp, err := c.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Errorf("status %d", resp.StatusCode)
					return
				}
			}
		})
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
	}
	b.Run("enginesim", func(b *testing.B) {
		cfg := DefaultConfig()
		cfg.ServedModelNames = []string{"m"}
		cfg.TimeScale = 1e-6
		cfg.Logger = discardLogger()
		s, err := Start(cfg, "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		run(b, "http://"+s.Addr()+"/v1/chat/completions")
	})
	b.Run("baseline=nethttp-fixed", func(b *testing.B) {
		fixed := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"the and for are "},"finish_reason":"length"}],"usage":{"prompt_tokens":512,"completion_tokens":8,"total_tokens":520}}`)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Write(fixed)
		}))
		defer srv.Close()
		run(b, srv.URL+"/v1/chat/completions")
	})
}
