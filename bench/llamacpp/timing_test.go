package llamacpp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
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
//   - prompts of n new tokens after c reused ones (n from 4 to 4,096 cold,
//     4 to 512 after 1,024 and 4,096 reused), prompt_ms against a fixed
//     cost per prompt (StepBase + PerPrefillChunk), n (PerPrefillToken), the
//     n c + n(n+1)/2 attention pairs (PerPrefillKPairs) and c
//     (PerChunkContextToken), least squares in relative error;
//   - 64-token answers decoded by 1 and by 4 requests at once after a short
//     prompt (StepBase and PerDecodeSeq from predicted_per_token_ms), and by 1
//     after a ~4,096-token one (PerContextToken, per token of context).
//
// Reported in microseconds (nanoseconds per context token), with the fit's
// worst relative error over the prompts; a benchmark, not a test: the
// machine's speed moves every figure.
func BenchmarkEngineTiming(b *testing.B) {
	f := startFleet(b, Options{N: 1, Slots: 4, CtxPerSlot: 8192})
	base := "http://" + f.Addrs()[0] + "/completion"
	type timings struct {
		CacheN     int     `json:"cache_n"`
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
	// mean per-token decode time of the second round.
	decode := func(prefix string, c int, seed uint64) (ms float64) {
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
			ms = 0
			for _, tm := range tms {
				ms += tm.PerTokenMS / float64(c)
			}
		}
		return ms
	}
	for b.Loop() {
		// Prompt points: x = (1, n, pairs/1000, c), y = prompt_ms.
		var xs [][]float64
		var ys []float64
		point := func(prompt string) {
			tm, err := complete(prompt, 1)
			if err != nil {
				b.Fatal(err)
			}
			n, c := float64(tm.PromptN), float64(tm.CacheN)
			xs = append(xs, []float64{1, n, (n*c + n*(n+1)/2) / 1000, c})
			ys = append(ys, tm.PromptMS)
		}
		for i, n := range []int{4, 16, 64, 256, 512, 1024, 2048, 4096} {
			point(text(1000+uint64(i), n))
		}
		for _, c := range []int{1024, 4096} {
			prefix := text(uint64(2000+c), c)
			if _, err := complete(prefix+text(1, 8), 1); err != nil { // into a slot
				b.Fatal(err)
			}
			for _, n := range []int{4, 16, 64, 256, 512} {
				point(prefix + text(uint64(3000+c+n), n))
			}
		}
		w, worst := fitRelative(xs, ys)
		d1 := decode("", 1, 2000)
		d4 := decode("", 4, 3000)
		seq := (d4 - d1) / 3
		dl := decode(text(4000, 4096), 1, 5000)
		b.ReportMetric(w[1]*1e3, "prefill-us/token")
		b.ReportMetric(w[2]*1e3, "prefill-us/kpair")
		b.ReportMetric(w[3]*1e6, "chunk-context-ns/token")
		b.ReportMetric((w[0]-(d1-seq))*1e3, "prefill-chunk-us")
		b.ReportMetric((d1-seq)*1e3, "step-base-us")
		b.ReportMetric(seq*1e3, "decode-us/seq")
		b.ReportMetric((dl-d1)*1e6/4096, "context-ns/token")
		b.ReportMetric(worst, "prompt-fit-worst-ratio")
		b.Logf("prompt ms = %.3f + %.1f us n + %.1f ns a pair + %.0f ns c; decode ms/token: 1 short %.2f, 4 short %.2f, 1 after 4,096 tokens %.2f",
			w[0], w[1]*1e3, w[2]*1e3, w[3]*1e6, d1, d4, dl)
	}
}

// fitRelative is the least-squares fit of y ≈ w·x in relative error
// (each point weighted 1/y²), and the fit's worst ratio of model to
// measurement over the points, as max(r, 1/r).
func fitRelative(xs [][]float64, ys []float64) (w []float64, worst float64) {
	k := len(xs[0])
	// normal equations, augmented: a[i][j] = Σ x_i x_j / y², a[i][k] = Σ x_i / y
	a := make([][]float64, k)
	for i := range a {
		a[i] = make([]float64, k+1)
	}
	for p, x := range xs {
		wt := 1 / (ys[p] * ys[p])
		for i := range k {
			for j := range k {
				a[i][j] += wt * x[i] * x[j]
			}
			a[i][k] += wt * x[i] * ys[p]
		}
	}
	for i := range k { // Gauss-Jordan with partial pivoting
		p := i
		for r := i + 1; r < k; r++ {
			if math.Abs(a[r][i]) > math.Abs(a[p][i]) {
				p = r
			}
		}
		a[i], a[p] = a[p], a[i]
		for r := range k {
			if r != i {
				f := a[r][i] / a[i][i]
				for j := i; j <= k; j++ {
					a[r][j] -= f * a[i][j]
				}
			}
		}
	}
	w = make([]float64, k)
	for i := range k {
		w[i] = a[i][k] / a[i][i]
	}
	for p, x := range xs {
		m := 0.0
		for i := range k {
			m += w[i] * x[i]
		}
		worst = max(worst, m/ys[p], ys[p]/m)
	}
	return w, worst
}

var noKeepAlive = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
