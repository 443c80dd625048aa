package analyze

import (
	"bufio"
	"bytes"
	"container/list"
	"encoding/json"
	"fmt"
	"io"
	"sort"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/bench/sim"
	"github.com/warmpath/warmpath/bench/workload"
)

// Options tune an analysis.
type Options struct {
	// Replicas is the user's replica count. 0 means 8.
	Replicas int
	// RPS is the request rate to simulate; 0 keeps the workload's own rate.
	RPS float64
	// CacheTokens are the per-replica KV cache sizes of the reuse curve.
	// Nil means a ladder from 16k to 4M tokens.
	CacheTokens []int
	// Seed for the simulator.
	Seed uint64
	// SkipSimulation leaves out the TTFT estimate (fast mode).
	SkipSimulation bool
}

// CachePoint is the reusable share with a bounded cache.
type CachePoint struct {
	TokensPerReplica int
	Share            float64
}

// Group is a prefix family: requests that begin with the same first block.
type Group struct {
	Requests    int
	SavedTokens int64 // prompt tokens reusable within the group
}

// Report is the answer to "should this workload use prefix-aware routing?".
type Report struct {
	Requests        int
	PromptTokens    int64
	ReusableShare   float64 // unbounded cache
	Curve           []CachePoint
	TopGroups       []Group
	GroupsFor80     int // prefix groups that hold 80% of the reusable tokens
	Simulated       bool
	Replicas        int
	RPS             float64
	LeastRequest    sim.Dist
	Cost            sim.Dist
	GainMean        float64 // 1 - cost/least-request, mean TTFT
	GainP99         float64
	Recommendation  string
	Recommendations []string
}

// Analyze studies w.
func Analyze(w *workload.Workload, opts Options) (*Report, error) {
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("analyze: empty workload")
	}
	if opts.Replicas == 0 {
		opts.Replicas = 8
	}
	if opts.CacheTokens == nil {
		opts.CacheTokens = []int{16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20}
	}
	rep := &Report{Requests: len(w.Requests), Replicas: opts.Replicas}
	reuse, total := workload.Reuse(w)
	rep.PromptTokens = total
	if total > 0 {
		rep.ReusableShare = float64(reuse) / float64(total)
	}
	for _, c := range opts.CacheTokens {
		rep.Curve = append(rep.Curve, CachePoint{TokensPerReplica: c, Share: lruShare(w, int64(c)*int64(opts.Replicas))})
	}
	rep.TopGroups, rep.GroupsFor80 = groups(w)
	if !opts.SkipSimulation {
		rw := *w
		rw.Requests = append([]workload.Request(nil), w.Requests...)
		if opts.RPS > 0 {
			rw.ScaleRate(opts.RPS)
		}
		if d := rw.Duration(); d > 0 {
			rep.RPS = float64(len(rw.Requests)-1) / (float64(d) / 1e9)
		}
		lr, err := sim.Run(sim.Config{Replicas: opts.Replicas, Policy: "least-request", Seed: opts.Seed}, &rw)
		if err != nil {
			return nil, fmt.Errorf("analyze: %w", err)
		}
		cost, err := sim.Run(sim.Config{Replicas: opts.Replicas, Policy: "cost", Seed: opts.Seed}, &rw)
		if err != nil {
			return nil, fmt.Errorf("analyze: %w", err)
		}
		rep.Simulated = true
		rep.LeastRequest, rep.Cost = lr.TTFT, cost.TTFT
		if lr.TTFT.Mean > 0 {
			rep.GainMean = 1 - cost.TTFT.Mean/lr.TTFT.Mean
		}
		if lr.TTFT.P99 > 0 {
			rep.GainP99 = 1 - cost.TTFT.P99/lr.TTFT.P99
		}
	}
	rep.recommend()
	return rep, nil
}

func (r *Report) recommend() {
	switch {
	case r.ReusableShare < 0.10:
		r.Recommendation = "No: under 10% of prompt tokens could ever come from cache. Use a load-only policy (warmpath policy: least-request); prefix-aware routing adds nothing here."
	case r.Simulated && r.GainMean < 0.05 && r.GainP99 < 0.05:
		r.Recommendation = fmt.Sprintf("Not needed at this scale: %.0f%% of prompt tokens are reusable, but at %d replicas and %.2f req/s the simulator shows under 5%% TTFT gain. Keep least-request unless load or prompt length grows.",
			100*r.ReusableShare, r.Replicas, r.RPS)
	case r.Simulated:
		r.Recommendation = fmt.Sprintf("Yes: %.0f%% of prompt tokens are reusable and the cost policy cuts mean TTFT by %.0f%% (p99 by %.0f%%) against least-request at %d replicas and %.2f req/s. Use warmpath's default policy (cost).",
			100*r.ReusableShare, 100*r.GainMean, 100*r.GainP99, r.Replicas, r.RPS)
	default:
		r.Recommendation = fmt.Sprintf("Likely: %.0f%% of prompt tokens are reusable; run without -fast to estimate the TTFT gain.", 100*r.ReusableShare)
	}
	if len(r.Curve) > 0 && r.ReusableShare > 0.1 {
		last := r.Curve[len(r.Curve)-1].Share
		for _, c := range r.Curve {
			if c.Share >= 0.9*last {
				r.Recommendations = append(r.Recommendations, fmt.Sprintf("A KV cache of about %d tokens per replica already captures 90%% of the reuse the largest cache does.", c.TokensPerReplica))
				break
			}
		}
	}
	if r.GroupsFor80 > 0 && r.GroupsFor80 <= r.Replicas {
		r.Recommendations = append(r.Recommendations, fmt.Sprintf("Only %d prefix groups hold 80%% of the reusable tokens: watch for hot spots (the cost policy replicates a hot prefix to a second replica when its home saturates).", r.GroupsFor80))
	}
}

// WriteText prints the report for a terminal.
func (r *Report) WriteText(w io.Writer) {
	fmt.Fprintf(w, "requests: %d, prompt tokens: %d\n", r.Requests, r.PromptTokens)
	fmt.Fprintf(w, "reusable prompt tokens with an unbounded cache: %.1f%%\n", 100*r.ReusableShare)
	fmt.Fprintf(w, "\nreuse with a bounded cache (%d replicas, perfect affinity, LRU):\n", r.Replicas)
	for _, c := range r.Curve {
		fmt.Fprintf(w, "  %9d tokens/replica  %5.1f%%\n", c.TokensPerReplica, 100*c.Share)
	}
	fmt.Fprintf(w, "\nprefix groups by tokens saved (%d groups hold 80%% of the reuse):\n", r.GroupsFor80)
	for i, g := range r.TopGroups {
		fmt.Fprintf(w, "  #%d  %6d requests  %10d tokens reusable\n", i+1, g.Requests, g.SavedTokens)
	}
	if r.Simulated {
		fmt.Fprintf(w, "\nsimulated TTFT at %d replicas, %.2f req/s (seconds):\n", r.Replicas, r.RPS)
		fmt.Fprintf(w, "  least-request  mean %.3f  p50 %.3f  p99 %.3f\n", r.LeastRequest.Mean, r.LeastRequest.P50, r.LeastRequest.P99)
		fmt.Fprintf(w, "  warmpath cost mean %.3f  p50 %.3f  p99 %.3f\n", r.Cost.Mean, r.Cost.P50, r.Cost.P99)
		fmt.Fprintf(w, "  gain           mean %.0f%%  p99 %.0f%%\n", 100*r.GainMean, 100*r.GainP99)
	}
	fmt.Fprintf(w, "\nrecommendation: %s\n", r.Recommendation)
	for _, s := range r.Recommendations {
		fmt.Fprintf(w, "  - %s\n", s)
	}
}

// lruShare is the reusable share with one LRU cache of capTokens over whole
// segments (perfect affinity spreads the same reuse over the replicas).
func lruShare(w *workload.Workload, capTokens int64) float64 {
	type entry struct {
		key    uint64
		tokens int64
	}
	ll := list.New()
	m := map[uint64]*list.Element{}
	var used, hit, total int64
	for i := range w.Requests {
		r := &w.Requests[i]
		h := modelSeed(r.Model)
		leading := true
		for mi := range r.Messages {
			h = chain(h, uint64(r.Messages[mi].Role+1)<<56)
			for _, s := range r.Messages[mi].Segments {
				h = chain(h, s.ID^uint64(s.Tokens)<<40)
				total += int64(s.Tokens)
				if e, ok := m[h]; ok {
					ll.MoveToFront(e)
					if leading {
						hit += int64(s.Tokens)
					}
					continue
				}
				leading = false
				m[h] = ll.PushFront(entry{h, int64(s.Tokens)})
				used += int64(s.Tokens)
				for used > capTokens && ll.Len() > 0 {
					back := ll.Back()
					e := back.Value.(entry)
					ll.Remove(back)
					delete(m, e.key)
					used -= e.tokens
				}
			}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

func groups(w *workload.Workload) ([]Group, int) {
	type acc struct {
		n     int
		saved int64
		seen  map[uint64]bool
	}
	by := map[uint64]*acc{}
	for i := range w.Requests {
		r := &w.Requests[i]
		h := modelSeed(r.Model)
		var key uint64
		first := true
		var a *acc
		leading := true
		for mi := range r.Messages {
			h = chain(h, uint64(r.Messages[mi].Role+1)<<56)
			for _, s := range r.Messages[mi].Segments {
				h = chain(h, s.ID^uint64(s.Tokens)<<40)
				if first {
					key, first = h, false
					if a = by[key]; a == nil {
						a = &acc{seen: map[uint64]bool{}}
						by[key] = a
					}
					a.n++
				}
				if leading && a.seen[h] {
					a.saved += int64(s.Tokens)
					continue
				}
				leading = false
				a.seen[h] = true
			}
		}
	}
	out := make([]Group, 0, len(by))
	var all int64
	for _, a := range by {
		out = append(out, Group{Requests: a.n, SavedTokens: a.saved})
		all += a.saved
	}
	sort.Slice(out, func(i, j int) bool { return out[i].SavedTokens > out[j].SavedTokens })
	n80 := 0
	var run int64
	for _, g := range out {
		if all == 0 || run >= all*8/10 {
			break
		}
		run += g.SavedTokens
		n80++
	}
	return out[:min(10, len(out))], n80
}

func modelSeed(m string) uint64 {
	h := uint64(0x9e3779b97f4a7c15)
	for i := 0; i < len(m); i++ {
		h = chain(h, uint64(m[i]))
	}
	return h
}

func chain(h, v uint64) uint64 {
	x := h ^ v
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// ReadRequests reads a JSONL file of OpenAI request bodies (chat or
// completions; an optional "timestamp" field in milliseconds gives arrival
// times, else one request per second). Prompts become segments of one
// hashing block each, via the router's own canonicalization, so shared
// prefixes stay shared and no prompt text is kept.
func ReadRequests(r io.Reader) (*workload.Workload, error) {
	p := affinity.NewParser(affinity.HashConfig{})
	hc := p.HashConfig()
	w := &workload.Workload{Name: "requests", Params: "jsonl of OpenAI request bodies"}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	var prompt affinity.Prompt
	line := 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var meta struct {
			Timestamp *float64 `json:"timestamp"`
			Messages  json.RawMessage
			MaxTokens int `json:"max_tokens"`
		}
		if err := json.Unmarshal(b, &meta); err != nil {
			return nil, fmt.Errorf("analyze: line %d: %w", line, err)
		}
		var err error
		if meta.Messages != nil {
			err = p.ParseChat(b, &prompt)
		} else {
			err = p.ParseCompletion(b, &prompt)
		}
		if err != nil {
			return nil, fmt.Errorf("analyze: line %d: %w", line, err)
		}
		segs := make([]workload.Segment, 0, len(prompt.Hashes)+1)
		for _, h := range prompt.Hashes {
			segs = append(segs, workload.Segment{ID: h, Tokens: hc.BlockTokens})
		}
		if rest := prompt.Tokens - len(prompt.Hashes)*hc.BlockTokens; rest > 0 {
			segs = append(segs, workload.Segment{ID: chain(uint64(line), 0x7a11), Tokens: rest})
		}
		at := int64(len(w.Requests)) * 1e9
		if meta.Timestamp != nil {
			at = int64(*meta.Timestamp * 1e6)
		}
		out := meta.MaxTokens
		if out <= 0 {
			out = 256
		}
		w.Requests = append(w.Requests, workload.Request{ID: len(w.Requests), Arrival: at, Model: string(prompt.Model),
			Messages: []workload.Message{{Role: workload.User, Segments: segs}}, OutputTokens: out, Group: -1, Conversation: -1})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("analyze: line %d: %w", line+1, err)
	}
	if len(w.Requests) == 0 {
		return nil, fmt.Errorf("analyze: no requests")
	}
	sort.SliceStable(w.Requests, func(i, j int) bool { return w.Requests[i].Arrival < w.Requests[j].Arrival })
	for i := range w.Requests {
		w.Requests[i].ID = i
	}
	return w, nil
}
