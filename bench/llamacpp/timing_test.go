package llamacpp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

// BenchmarkEngineTiming measures one llama-server as the live bench runs it
// (the tiny model, 4 slots of 8,192 tokens, one core) and fits the step
// model of enginesim.Timing to its own timings, for the simulator's
// llamacpp-cpu fleet (bench/sim/fleet.go):
//
//   - cold prompts of about 512 to 4,096 tokens, alone: prompt_ms against
//     n (PerPrefillToken) and its n(n+1)/2 attention pairs (PerPrefillKPairs),
//     least squares through the origin;
//   - 64-token answers decoded by 1 and by 4 requests at once after a short
//     prompt (StepBase and PerDecodeSeq from predicted_per_token_ms), and by 1
//     after a ~4,096-token one (PerContextToken, per token of context);
//   - the prompt_ms of those requests' 16-token questions, alone and after
//     the 4,096 tokens, reported as measured.
//
// Reported in microseconds (nanoseconds per context token); a benchmark,
// not a test: the machine's speed moves every figure.
func BenchmarkEngineTiming(b *testing.B) {
	f := startFleet(b, Options{N: 1, Slots: 4, CtxPerSlot: 8192})
	base := "http://" + f.Addrs()[0] + "/completion"
	type timings struct {
		PromptN    int     `json:"prompt_n"`
		PromptMS   float64 `json:"prompt_ms"`
		PerTokenMS float64 `json:"predicted_per_token_ms"`
	}
	// complete asks for predict tokens after prompt, streamed as the live
	// bench asks (an event per token is work for the server's loop too),
	// and returns the timings of its last event. It may run off the
	// benchmark's goroutine, so it returns its error.
	complete := func(prompt string, predict int) (timings, error) {
		var r struct {
			Timings timings `json:"timings"`
		}
		body, _ := json.Marshal(map[string]any{"prompt": prompt, "n_predict": predict, "ignore_eos": true, "cache_prompt": true, "stream": true})
		// A connection each: the server may close an idle kept-alive one
		// just as the next POST goes out on it (seen as EOF).
		resp, err := noKeepAlive.Post(base, "application/json", bytes.NewReader(body))
		if err != nil {
			return r.Timings, err
		}
		out, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if code := resp.StatusCode; err != nil || code != 200 {
			return r.Timings, fmt.Errorf("/completion: %d %v: %.300s", code, err, out)
		}
		var last []byte
		for _, line := range bytes.Split(out, []byte("\n")) {
			if d, ok := bytes.CutPrefix(line, []byte("data: ")); ok && bytes.Contains(d, []byte(`"timings"`)) {
				last = d
			}
		}
		if err := json.Unmarshal(last, &r); err != nil || r.Timings.PromptN == 0 {
			return r.Timings, fmt.Errorf("/completion: no timings (%v) in %.300s", err, out)
		}
		return r.Timings, nil
	}
	text := func(id uint64, tokens int) string {
		return string(workload.AppendSegment(nil, workload.Segment{ID: id, Tokens: tokens}))
	}
	// decode runs c requests at once, each a fresh short question after
	// prefix, twice (the first puts prefix in the slots), and returns the
	// mean per-token decode time of the second round and the mean
	// prompt_ms of its questions (computed after prefix, reused).
	decode := func(prefix string, c int, seed uint64) (ms, prompt float64) {
		for round := range 2 {
			var wg sync.WaitGroup
			errs := make([]error, c)
			tms := make([]timings, c)
			for i := range c {
				wg.Add(1)
				go func() {
					defer wg.Done()
					tms[i], errs[i] = complete(prefix+text(seed+uint64(10*round+i), 16), 64)
				}()
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				b.Fatal(err)
			}
			ms, prompt = 0, 0
			for _, tm := range tms {
				ms += tm.PerTokenMS / float64(c)
				prompt += tm.PromptMS / float64(c)
			}
		}
		return ms, prompt
	}
	for b.Loop() {
		// Σ t n, Σ t p, Σ n², Σ n p, Σ p² for t = a n + k p.
		var tn, tp, nn, np, pp float64
		for i, n := range []int{512, 1024, 2048, 4096} {
			tm, err := complete(text(1000+uint64(i), n), 1)
			if err != nil {
				b.Fatal(err)
			}
			x, p := float64(tm.PromptN), float64(tm.PromptN)*float64(tm.PromptN+1)/2
			tn, tp, nn, np, pp = tn+tm.PromptMS*x, tp+tm.PromptMS*p, nn+x*x, np+x*p, pp+p*p
		}
		det := nn*pp - np*np
		perToken := (tn*pp - tp*np) / det // ms
		perPair := (nn*tp - np*tn) / det  // ms
		d1, p1 := decode("", 1, 2000)
		d4, _ := decode("", 4, 3000)
		seq := (d4 - d1) / 3
		long := text(4000, 4096)
		dl, pl := decode(long, 1, 5000)
		b.ReportMetric(perToken*1e3, "prefill-us/token")
		b.ReportMetric(perPair*1e6, "prefill-us/kpair")
		b.ReportMetric((d1-seq)*1e3, "step-base-us")
		b.ReportMetric(seq*1e3, "decode-us/seq")
		b.ReportMetric((dl-d1)*1e6/4096, "context-ns/token")
		// What a 16-token question took to compute, alone and after the
		// 4,096 reused tokens: against the fit above, what the step model
		// lacks (a cost per prompt apart from its tokens).
		b.ReportMetric(p1, "question-ms")
		b.ReportMetric(pl, "question-after-4096-ms")
		b.Logf("decode ms/token: 1 short %.2f, 4 short %.2f, 1 after 4,096 tokens %.2f", d1, d4, dl)
	}
}

var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
