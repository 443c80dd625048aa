package loadgen

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/warmpath/warmpath/bench/workload"
)

// Config drives one load run.
type Config struct {
	// URL is the base URL of an OpenAI-compatible server, e.g.
	// "http://127.0.0.1:8080". Only loopback or test-namespace addresses.
	URL string
	// Workload supplies requests and their arrival times (open loop).
	Workload *workload.Workload
	// TimeScale maps workload time to wall time: arrivals are sent at
	// Arrival*TimeScale, and latencies are reported divided by it, in model
	// seconds. Match the engines' --time-scale. 0 means 1.
	TimeScale float64
	// MaxRequests bounds the run; 0 means the whole workload.
	MaxRequests int
	// MaxDuration bounds the run in wall time; 0 means 2 minutes. Requests
	// not yet sent when it passes are not sent; those in flight are cancelled.
	MaxDuration time.Duration
	// MaxInFlight bounds concurrent requests; an arrival beyond it waits
	// (reported as Delayed). 0 means 1024.
	MaxInFlight int
	// RequestTimeout bounds one request; 0 means 60s.
	RequestTimeout time.Duration
	// Stream asks for SSE and measures TTFT at the first content byte.
	Stream bool
	// Header is added to every request (e.g. Authorization).
	Header http.Header
	// LocalAddr, when set, is the source address of every connection (the
	// testbed's client hosts). Nil means the system's choice.
	LocalAddr net.Addr
	// Client overrides the HTTP client (tests); nil builds one.
	Client *http.Client
}

// Result summarises a load run. Latencies are in model seconds.
type Result struct {
	Sent, OK, Failed, Delayed int
	StatusCounts              map[int]int
	TTFT, E2E                 Dist
	PromptTokens, Cached      int64 // from usage
	OutputTokens              int64
	Wall                      time.Duration
	RPS                       float64  // completed requests per wall second
	Errors                    []string // the first few distinct errors

	// ttft and e2e are the successful requests' samples behind TTFT and
	// E2E, sorted, so Merge can pool runs.
	ttft, e2e []float64
}

// Merge pools runs of the same configuration into one Result: counts and
// token totals summed, latency summaries over every run's samples, RPS
// over the summed wall time, the first few distinct errors of all.
func Merge(rs ...*Result) *Result {
	out := &Result{StatusCounts: map[int]int{}}
	seen := map[string]bool{}
	for _, r := range rs {
		out.Sent += r.Sent
		out.OK += r.OK
		out.Failed += r.Failed
		out.Delayed += r.Delayed
		for k, v := range r.StatusCounts {
			out.StatusCounts[k] += v
		}
		out.PromptTokens += r.PromptTokens
		out.Cached += r.Cached
		out.OutputTokens += r.OutputTokens
		out.Wall += r.Wall
		out.ttft = append(out.ttft, r.ttft...)
		out.e2e = append(out.e2e, r.e2e...)
		for _, e := range r.Errors {
			if !seen[e] && len(out.Errors) < 8 {
				seen[e] = true
				out.Errors = append(out.Errors, e)
			}
		}
	}
	out.TTFT, out.E2E = dist(out.ttft), dist(out.e2e)
	if out.Wall > 0 {
		out.RPS = float64(out.OK) / out.Wall.Seconds()
	}
	return out
}

// Dist is a latency summary in seconds.
type Dist struct{ Mean, P50, P90, P99, Max float64 }

func dist(xs []float64) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	s := 0.0
	for _, x := range xs {
		s += x
	}
	q := func(p float64) float64 { return xs[min(len(xs)-1, int(p*float64(len(xs))))] }
	return Dist{Mean: s / float64(len(xs)), P50: q(0.5), P90: q(0.9), P99: q(0.99), Max: xs[len(xs)-1]}
}

// HitRate is cached prompt tokens over prompt tokens, from usage.
func (r *Result) HitRate() float64 {
	if r.PromptTokens == 0 {
		return 0
	}
	return float64(r.Cached) / float64(r.PromptTokens)
}

type outcome struct {
	status       int
	ttft, e2e    time.Duration
	prompt, hit  int64
	out          int64
	err          error
	delayed      bool
	sawFirstByte bool
}

// Run sends the workload and waits for every request it sent.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.URL == "" || cfg.Workload == nil || len(cfg.Workload.Requests) == 0 {
		return nil, errors.New("loadgen: need a URL and a non-empty workload")
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if cfg.TimeScale < 0 {
		return nil, fmt.Errorf("loadgen: time scale must be > 0, got %g", cfg.TimeScale)
	}
	if cfg.MaxDuration == 0 {
		cfg.MaxDuration = 2 * time.Minute
	}
	if cfg.MaxInFlight == 0 {
		cfg.MaxInFlight = 1024
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = 60 * time.Second
	}
	n := len(cfg.Workload.Requests)
	if cfg.MaxRequests > 0 {
		n = min(n, cfg.MaxRequests)
	}
	client := cfg.Client
	if client == nil {
		d := &net.Dialer{Timeout: 5 * time.Second, LocalAddr: cfg.LocalAddr}
		client = &http.Client{Transport: &http.Transport{
			DialContext: d.DialContext, MaxIdleConns: cfg.MaxInFlight, MaxIdleConnsPerHost: cfg.MaxInFlight,
			IdleConnTimeout: 30 * time.Second, DisableCompression: true,
		}}
		defer client.CloseIdleConnections()
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.MaxDuration)
	defer cancel()

	url := cfg.URL + "/v1/chat/completions"
	sem := make(chan struct{}, cfg.MaxInFlight)
	outs := make([]outcome, n)
	var wg sync.WaitGroup
	start := time.Now()
	t0 := cfg.Workload.Requests[0].Arrival
	sent := 0
loop:
	for i := 0; i < n; i++ {
		wr := &cfg.Workload.Requests[i]
		due := start.Add(time.Duration(float64(wr.Arrival-t0) * cfg.TimeScale))
		if d := time.Until(due); d > 0 {
			select {
			case <-time.After(d):
			case <-ctx.Done():
				break loop
			}
		}
		delayed := false
		select {
		case sem <- struct{}{}:
		default:
			delayed = true
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				break loop
			}
		}
		body := workload.AppendChatBody(nil, wr, cfg.Stream)
		sent++
		wg.Add(1)
		go func(o *outcome) {
			defer wg.Done()
			defer func() { <-sem }()
			*o = one(ctx, client, url, body, cfg)
			o.delayed = delayed
		}(&outs[i])
	}
	wg.Wait()
	return summarize(outs[:sent], time.Since(start), cfg.TimeScale), nil
}

// summarize folds outcomes into a Result; latencies are divided by
// timeScale (model seconds).
func summarize(outs []outcome, wall time.Duration, timeScale float64) *Result {
	res := &Result{Sent: len(outs), StatusCounts: map[int]int{}, Wall: wall}
	var ttft, e2e []float64
	seenErr := map[string]bool{}
	for _, o := range outs {
		if o.delayed {
			res.Delayed++
		}
		res.StatusCounts[o.status]++
		if o.err != nil || o.status != http.StatusOK {
			res.Failed++
			msg := fmt.Sprintf("status %d", o.status)
			if o.err != nil {
				msg = o.err.Error()
			}
			if !seenErr[msg] && len(res.Errors) < 8 {
				seenErr[msg] = true
				res.Errors = append(res.Errors, msg)
			}
			continue
		}
		res.OK++
		ttft = append(ttft, o.ttft.Seconds()/timeScale)
		e2e = append(e2e, o.e2e.Seconds()/timeScale)
		res.PromptTokens += o.prompt
		res.Cached += o.hit
		res.OutputTokens += o.out
	}
	res.TTFT, res.E2E = dist(ttft), dist(e2e)
	res.ttft, res.e2e = ttft, e2e
	if res.Wall > 0 {
		res.RPS = float64(res.OK) / res.Wall.Seconds()
	}
	return res
}

var (
	dataPrefix   = []byte("data: ")
	doneMarker   = []byte("[DONE]")
	contentKey   = []byte(`"content":"`)
	promptKey    = []byte(`"prompt_tokens":`)
	cachedKey    = []byte(`"cached_tokens":`)
	completedKey = []byte(`"completion_tokens":`)
)

func one(ctx context.Context, c *http.Client, url string, body []byte, cfg Config) (o outcome) {
	ctx, cancel := context.WithTimeout(ctx, cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		o.err = err
		return
	}
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range cfg.Header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	start := time.Now()
	resp, err := c.Do(req)
	if err != nil {
		o.err = err
		return
	}
	defer resp.Body.Close()
	o.status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return
	}
	if !cfg.Stream {
		b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
		o.ttft = time.Since(start) // without streaming the first token arrives with the body
		o.e2e = o.ttft
		o.err = err
		o.prompt, o.hit, o.out = usage(b)
		return
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	done := false
	for sc.Scan() {
		line := sc.Bytes()
		if !bytes.HasPrefix(line, dataPrefix) {
			continue
		}
		data := line[len(dataPrefix):]
		if bytes.Equal(data, doneMarker) {
			done = true
			break
		}
		if !o.sawFirstByte {
			if i := bytes.Index(data, contentKey); i >= 0 && i+len(contentKey) < len(data) && data[i+len(contentKey)] != '"' {
				o.ttft = time.Since(start)
				o.sawFirstByte = true
			}
		}
		if bytes.Contains(data, promptKey) {
			o.prompt, o.hit, o.out = usage(data)
		}
	}
	o.e2e = time.Since(start)
	if err := sc.Err(); err != nil {
		o.err = err
	} else if !done {
		o.err = errors.New("stream ended without [DONE]")
	} else if !o.sawFirstByte {
		o.ttft = o.e2e
	}
	return
}

// usage pulls prompt, cached and completion token counts out of a JSON body
// without decoding it whole.
func usage(b []byte) (prompt, cached, out int64) {
	return intAfter(b, promptKey), intAfter(b, cachedKey), intAfter(b, completedKey)
}

func intAfter(b, key []byte) int64 {
	i := bytes.LastIndex(b, key)
	if i < 0 {
		return 0
	}
	j := i + len(key)
	for j < len(b) && b[j] == ' ' {
		j++
	}
	k := j
	for k < len(b) && b[k] >= '0' && b[k] <= '9' {
		k++
	}
	v, _ := strconv.ParseInt(string(b[j:k]), 10, 64)
	return v
}
