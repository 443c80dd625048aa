// Long because it is one job: the proxy-cost section (answer shapes, targets,
// the measurement of CPU and writes per request, its table), kept together so
// a shape's definition and its measurement read side by side.

package live

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/warmpath/warmpath/bench/internal/child"
)

// The proxy-cost bench ("perf"): warmpath and nginx in front of the same
// in-process engine, per answer shape, side by side in one run. Per shape
// and target: CPU per request of the router's process tree (every
// thread's run time from /proc/<pid>/task/<tid>/schedstat, nanoseconds),
// write syscalls per request (/proc/<pid>/io syscw: the request forwarded
// upstream plus the writes of the answer to the client), and the p50
// latency at concurrency 1 against going direct. The ratios warmpath /
// nginx are the figures to watch.

// PerfShape is one kind of answer the perf engine gives.
type PerfShape struct {
	Name, About string
	// Stream: the request asks for SSE.
	Stream bool
	// Replicas the router is given (the perf engine listens on as many
	// ports); the answer comes from whichever the router picks.
	Replicas int
	// PromptBytes is the size of the request's prompt (0 = a short chat).
	PromptBytes int
	// Prose: the long prompt is lines of prose and code, as documents and
	// source files are, so its JSON has an escape every line or two (\n,
	// \t, \"); otherwise one phrase repeated, with no escape.
	Prose bool
	// Requests and Concurrency size the CPU phase; LatencyRequests the
	// concurrency-1 phase.
	Requests, Concurrency, LatencyRequests int

	head   []byte   // the answer's status line and headers
	pieces [][]byte // the answer's body, one write each
	gap    time.Duration
}

// perfShapes are the shapes of the run; smoke shrinks the counts.
func perfShapes(smoke bool) []PerfShape {
	n := func(full, sm int) int {
		if smoke {
			return sm
		}
		return full
	}
	json4 := perfJSONBody(4 << 10)
	json32 := perfJSONBody(32 << 10)
	events := perfEvents(64)
	oneWrite := [][]byte{bytes.Join(chunkAll(events), nil)}
	ev := chunkAll(events)
	shapes := []PerfShape{
		{Name: "buffered-4KiB", About: "a 4 KiB JSON answer (Content-Length)", Requests: n(4000, 100), Concurrency: 8, LatencyRequests: n(1000, 40),
			head: perfJSONHead(len(json4)), pieces: [][]byte{json4}},
		{Name: "buffered-32KiB", About: "a 32 KiB JSON answer", Requests: n(3000, 100), Concurrency: 8, LatencyRequests: n(800, 40),
			head: perfJSONHead(len(json32)), pieces: [][]byte{json32}},
		{Name: "sse-one-write", About: "64 SSE events (chunked, one chunk each) in one upstream write", Stream: true,
			Requests: n(3000, 100), Concurrency: 8, LatencyRequests: n(800, 40), head: perfSSEHead, pieces: oneWrite},
		{Name: "sse-flushed", About: "64 SSE events, one upstream write each, back to back", Stream: true,
			Requests: n(1500, 60), Concurrency: 8, LatencyRequests: n(400, 20), head: perfSSEHead, pieces: ev},
		{Name: "sse-paced", About: "64 SSE events 1.6 ms apart (an LLM's decode pace)", Stream: true,
			Requests: n(320, 16), Concurrency: 16, LatencyRequests: n(40, 4), head: perfSSEHead, pieces: ev, gap: 1600 * time.Microsecond},
		{Name: "prompt-400KB", About: "a 400 KB (100k-token) prompt, 100 replicas (cost policy), a short JSON answer",
			Replicas: 100, PromptBytes: 400_000, Requests: n(600, 20), Concurrency: 4, LatencyRequests: n(200, 10),
			head: perfJSONHead(len(fastBody)), pieces: [][]byte{fastBody}},
		{Name: "prompt-400KB-prose", About: "the same with prose and code lines: a \\n escape every line, quotes and tabs now and then",
			Replicas: 100, PromptBytes: 400_000, Prose: true, Requests: n(600, 20), Concurrency: 4, LatencyRequests: n(200, 10),
			head: perfJSONHead(len(fastBody)), pieces: [][]byte{fastBody}},
	}
	for i := range shapes {
		shapes[i].Replicas = max(shapes[i].Replicas, 1)
	}
	return shapes
}

var perfSSEHead = []byte("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n")

func perfJSONHead(n int) []byte {
	return []byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n")
}

// perfJSONBody is a chat completion of about size bytes, usage last.
func perfJSONBody(size int) []byte {
	head := `{"id":"chatcmpl-perf","object":"chat.completion","created":0,"model":"M","choices":[{"index":0,"message":{"role":"assistant","content":"`
	tail := `"},"finish_reason":"stop"}],"usage":{"prompt_tokens":64,"completion_tokens":900,"total_tokens":964,"prompt_tokens_details":{"cached_tokens":0}}}`
	words := strings.Repeat("lorem ipsum dolor sit amet ", size/27+1)
	return []byte(head + words[:max(size-len(head)-len(tail), 0)] + tail)
}

// perfEvents is n vLLM-shaped chat chunks, the last one with usage, then [DONE].
func perfEvents(n int) [][]byte {
	var ev [][]byte
	for i := range n - 1 {
		ev = append(ev, fmt.Appendf(nil, `data: {"id":"chatcmpl-perf","object":"chat.completion.chunk","created":0,"model":"M","choices":[{"index":0,"delta":{"content":"word%02d "},"logprobs":null,"finish_reason":null}]}`+"\n\n", i))
	}
	ev = append(ev, []byte(`data: {"id":"chatcmpl-perf","object":"chat.completion.chunk","created":0,"model":"M","choices":[],"usage":{"prompt_tokens":64,"completion_tokens":63,"total_tokens":127,"prompt_tokens_details":{"cached_tokens":0}}}`+"\n\n"))
	return append(ev, []byte("data: [DONE]\n\n"))
}

// chunkAll frames each event as one HTTP chunk, the terminator after the last.
func chunkAll(events [][]byte) [][]byte {
	out := make([][]byte, len(events))
	for i, e := range events {
		out[i] = append(append(strconv.AppendInt(nil, int64(len(e)), 16), "\r\n"...), append(e, "\r\n"...)...)
	}
	out[len(out)-1] = append(out[len(out)-1], "0\r\n\r\n"...)
	return out
}

// hdrShape names the answer shape; routers pass it through.
const hdrShape = "X-Perf-Shape"

// perfEngine answers chat completions in the shape the request's
// X-Perf-Shape names, on n loopback ports, and serves what warmpath's
// health checks and scrapes ask for.
type perfEngine struct {
	lns    []net.Listener
	shapes map[string]*PerfShape
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

func startPerfEngine(n int, shapes []PerfShape) (*perfEngine, error) {
	e := &perfEngine{shapes: map[string]*PerfShape{}, conns: map[net.Conn]struct{}{}}
	for i := range shapes {
		e.shapes[shapes[i].Name] = &shapes[i]
	}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			e.close()
			return nil, err
		}
		e.lns = append(e.lns, ln)
		e.wg.Add(1)
		go e.accept(ln)
	}
	return e, nil
}

func (e *perfEngine) addrs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = e.lns[i].Addr().String()
	}
	return out
}

func (e *perfEngine) accept(ln net.Listener) {
	defer e.wg.Done()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		e.mu.Lock()
		e.conns[c] = struct{}{}
		e.mu.Unlock()
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.serve(c)
			e.mu.Lock()
			delete(e.conns, c)
			e.mu.Unlock()
		}()
	}
}

var perfMetrics = []byte("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"M\"} 0\n" +
	"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"M\"} 0\n")

func (e *perfEngine) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		sh := e.shapes[req.Header.Get(hdrShape)]
		var werr error
		switch {
		case req.URL.Path == "/metrics":
			_, werr = c.Write(append([]byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "+strconv.Itoa(len(perfMetrics))+"\r\n\r\n"), perfMetrics...))
		case req.URL.Path == "/v1/chat/completions" && sh != nil:
			for i, p := range sh.pieces {
				if i == 0 {
					p = append(append([]byte(nil), sh.head...), p...)
				} else if sh.gap > 0 {
					time.Sleep(sh.gap)
				}
				if _, werr = c.Write(p); werr != nil {
					break
				}
			}
		default: // health checks, /v1/models, unknown shapes: an empty 200
			_, werr = c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
		}
		if werr != nil {
			return
		}
	}
}

func (e *perfEngine) close() {
	for _, ln := range e.lns {
		_ = ln.Close()
	}
	e.mu.Lock()
	for c := range e.conns {
		_ = c.Close()
	}
	e.mu.Unlock()
	e.wg.Wait()
}

// PerfRow is one target on one shape; figures are medians over rounds.
type PerfRow struct {
	Shape, Target string
	// CPUPerReq is the router process tree's CPU seconds per request in the
	// concurrency phase; -1 for direct.
	CPUPerReq float64
	// WritesPerReq is its write syscalls per request (-1 for direct).
	WritesPerReq float64
	// P50 is the concurrency-1 latency (wall seconds, to the last byte);
	// AddedP50 is P50 minus direct's.
	P50, AddedP50 float64
	// CPURatio and AddedRatio are the median over rounds of this target's
	// figure over nginx's in the same round (0 when there is none); on a
	// shared machine a round's targets share its noise, so these are the
	// figures to compare. CPUToBase is the same against the baseline binary.
	CPURatio, AddedRatio, CPUToBase float64
	Requests, Failed                int
	Errors                          []string
}

// perfTarget is one front of the perf engine.
type perfTarget struct {
	name string
	url  string // per replica count
	pid  int
}

// runPerf runs the proxy-cost bench: per round, per shape, per target in
// turn (interleaved, so a noisy neighbour hits every target alike).
func runPerf(ctx context.Context, o Options, tmp, nginx string) ([]PerfRow, []PerfShape, error) {
	shapes := perfShapes(o.Smoke)
	if len(o.PerfShapes) > 0 {
		shapes = slices.DeleteFunc(shapes, func(s PerfShape) bool { return !slices.Contains(o.PerfShapes, s.Name) })
		if len(shapes) == 0 {
			return nil, nil, fmt.Errorf("perf: no shape named %q", o.PerfShapes)
		}
	}
	maxRep := 1
	for _, s := range shapes {
		maxRep = max(maxRep, s.Replicas)
	}
	eng, err := startPerfEngine(maxRep, shapes)
	if err != nil {
		return nil, nil, err
	}
	defer eng.close()
	var g child.Group
	defer g.Stop()
	// targets[replicas] is the list of fronts for that replica count.
	targets := map[int][]perfTarget{}
	for _, s := range shapes {
		if _, ok := targets[s.Replicas]; ok {
			continue
		}
		ups := eng.addrs(s.Replicas)
		ts := []perfTarget{{name: "direct", url: "http://" + ups[0]}}
		bins := []struct{ name, bin string }{{"warmpath", o.WarmpathBin}}
		if o.BaselineWarmpathBin != "" {
			bins = append(bins, struct{ name, bin string }{"warmpath " + o.BaselineLabel, o.BaselineWarmpathBin})
		}
		for _, b := range bins {
			p, listen, _, err := startWarmpath(ctx, b.bin, tmp, routerSetup{
				policy: "cost", model: "M", replicas: ups, timeScale: 1, seed: o.Seed, quiet: true,
			})
			if err != nil {
				return nil, nil, fmt.Errorf("%s: %w", b.name, err)
			}
			g.Add(p)
			ts = append(ts, perfTarget{name: b.name, url: "http://" + listen, pid: p.Pid()})
		}
		if nginx != "" {
			p, listen, err := startNginx(ctx, nginx, tmp, ups)
			if err != nil {
				return nil, nil, err
			}
			g.Add(p)
			ts = append(ts, perfTarget{name: "nginx", url: "http://" + listen, pid: p.Pid()})
		}
		targets[s.Replicas] = ts
	}

	type sample struct{ cpu, writes, p50, added float64 }
	samples := map[string][]sample{}
	fails := map[string]int{}
	sent := map[string]int{}
	errs := map[string][]string{}
	key := func(shape, target string) string { return shape + "\x00" + target }
	for round := range o.Rounds {
		for si := range shapes {
			sh := &shapes[si]
			body := perfRequestBody(sh)
			for _, t := range targets[sh.Replicas] {
				k := key(sh.Name, t.name)
				run := func(conc, n int) (*closedRun, error) {
					return runClosedRaw(ctx, t.url+"/v1/chat/completions", body, sh.Name, conc, n)
				}
				if _, err := run(sh.Concurrency, max(sh.Requests/10, 8)); err != nil { // warm-up: connections, pools
					return nil, nil, err
				}
				lat, err := run(1, sh.LatencyRequests)
				if err != nil {
					return nil, nil, err
				}
				var c0, c1 procCost
				if t.pid != 0 {
					if c0, err = treeCost(t.pid); err != nil {
						return nil, nil, err
					}
				}
				thr, err := run(sh.Concurrency, sh.Requests)
				if err != nil {
					return nil, nil, err
				}
				s := sample{cpu: -1, writes: -1, p50: lat.p50()}
				if t.pid != 0 {
					if c1, err = treeCost(t.pid); err != nil {
						return nil, nil, err
					}
					s.cpu = float64(c1.cpuNS-c0.cpuNS) / 1e9 / float64(thr.sent)
					s.writes = float64(c1.writes-c0.writes) / float64(thr.sent)
				}
				samples[k] = append(samples[k], s)
				fails[k] += lat.failed + thr.failed
				sent[k] += lat.sent + thr.sent
				for _, e := range append(lat.errs, thr.errs...) {
					if len(errs[k]) < 4 && !slices.Contains(errs[k], e) {
						errs[k] = append(errs[k], e)
					}
				}
				progress(o, "perf round %d %s %s: cpu %.1fµs/req, %.2f writes/req, p50 %.0fµs, failed %d",
					round+1, sh.Name, t.name, 1e6*s.cpu, s.writes, 1e6*s.p50, lat.failed+thr.failed)
			}
		}
	}
	for _, p := range g.Procs {
		if err := p.Failure(); err != nil {
			return nil, nil, err
		}
	}
	// ratio is the median over rounds of f(target) / f(other), rounds where
	// both are positive; 0 when none.
	ratio := func(shape, target, other string, f func(sample) float64) float64 {
		a, b := samples[key(shape, target)], samples[key(shape, other)]
		var v []float64
		for i := range min(len(a), len(b)) {
			if x, y := f(a[i]), f(b[i]); x > 0 && y > 0 {
				v = append(v, x/y)
			}
		}
		if len(v) == 0 {
			return 0
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	base := ""
	if o.BaselineWarmpathBin != "" {
		base = "warmpath " + o.BaselineLabel
	}
	var rows []PerfRow
	for _, sh := range shapes {
		var direct float64
		// Per-round added latency, for the ratios.
		dl := samples[key(sh.Name, "direct")]
		for _, t := range targets[sh.Replicas] {
			for i := range samples[key(sh.Name, t.name)] {
				if i < len(dl) {
					samples[key(sh.Name, t.name)][i].added = samples[key(sh.Name, t.name)][i].p50 - dl[i].p50
				}
			}
		}
		for _, t := range targets[sh.Replicas] {
			k := key(sh.Name, t.name)
			ss := samples[k]
			med := func(f func(sample) float64) float64 {
				v := make([]float64, len(ss))
				for i, s := range ss {
					v[i] = f(s)
				}
				slices.Sort(v)
				return v[len(v)/2]
			}
			r := PerfRow{Shape: sh.Name, Target: t.name, CPUPerReq: med(func(s sample) float64 { return s.cpu }),
				WritesPerReq: med(func(s sample) float64 { return s.writes }), P50: med(func(s sample) float64 { return s.p50 }),
				Requests: sent[k], Failed: fails[k], Errors: errs[k]}
			if t.name == "direct" {
				direct = r.P50
			} else if nginx != "" {
				r.CPURatio = ratio(sh.Name, t.name, "nginx", func(s sample) float64 { return s.cpu })
				r.AddedRatio = ratio(sh.Name, t.name, "nginx", func(s sample) float64 { return s.added })
			}
			if base != "" && t.name != "direct" {
				r.CPUToBase = ratio(sh.Name, t.name, base, func(s sample) float64 { return s.cpu })
			}
			r.AddedP50 = r.P50 - direct
			rows = append(rows, r)
		}
	}
	return rows, shapes, nil
}

// perfRequestBody is the chat request of a shape: a short conversation, or
// one whose user message is PromptBytes of text.
func perfRequestBody(sh *PerfShape) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"M",`)
	if sh.Stream {
		b.WriteString(`"stream":true,"stream_options":{"include_usage":true},`)
	}
	b.WriteString(`"max_tokens":64,"messages":[{"role":"system","content":"You are a helpful assistant. Answer briefly."},{"role":"user","content":"`)
	if sh.PromptBytes > 0 {
		words := "the quick brown fox jumps over the lazy dog, "
		if sh.Prose {
			// JSON-escaped lines of a document and of code
			words = `The router reads the prompt once; the \"engine\" renders it with its template.\n` +
				`\tif n := len(blocks); n > 0 {\n\t\treturn blocks[n-1]\n\t}\n`
		}
		for b.Len() < sh.PromptBytes {
			b.WriteString(words)
		}
	} else {
		b.WriteString("What is the capital of France?")
	}
	b.WriteString(`"}]}`)
	return b.Bytes()
}

// closedRun is one closed-loop phase's outcome.
type closedRun struct {
	sent, failed int
	lat          []time.Duration
	errs         []string
}

func (r *closedRun) p50() float64 {
	if len(r.lat) == 0 {
		return 0
	}
	slices.Sort(r.lat)
	return r.lat[len(r.lat)/2].Seconds()
}

// runClosedRaw sends n copies of body at concurrency conc over keep-alive
// connections, reading every answer to its end (bounded: 2 minutes, 30 s
// per request).
func runClosedRaw(ctx context.Context, url string, body []byte, shape string, conc, n int) (*closedRun, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	tr := &http.Transport{MaxIdleConns: conc, MaxIdleConnsPerHost: conc, DisableCompression: true, IdleConnTimeout: 30 * time.Second}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	var (
		mu   sync.Mutex
		next int
		run  closedRun
		wg   sync.WaitGroup
	)
	for range min(conc, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= n || ctx.Err() != nil {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				t0 := time.Now()
				err := perfOnce(ctx, client, url, body, shape)
				d := time.Since(t0)
				mu.Lock()
				run.sent++
				if err != nil {
					run.failed++
					if len(run.errs) < 4 && !slices.Contains(run.errs, err.Error()) {
						run.errs = append(run.errs, err.Error())
					}
				} else {
					run.lat = append(run.lat, d)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if run.sent < n {
		return nil, fmt.Errorf("perf %s: sent %d of %d requests within the time bound", shape, run.sent, n)
	}
	return &run, nil
}

var errPerfStatus = errors.New("perf: status not 200")

func perfOnce(ctx context.Context, c *http.Client, url string, body []byte, shape string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(hdrShape, shape)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%w: %d", errPerfStatus, resp.StatusCode)
	}
	return nil
}

// procCost is a process tree's CPU time (ns, every thread) and write
// syscalls so far.
type procCost struct{ cpuNS, writes int64 }

// treeCost reads pid's and its children's (nginx workers) threads'
// run time from schedstat and their write syscall counts from io.
func treeCost(pid int) (procCost, error) {
	pids := []int{pid}
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		c, err := strconv.Atoi(filepath.Base(d))
		if err != nil || c == pid {
			continue
		}
		if st, err := readStat(c); err == nil && st.ppid == pid {
			pids = append(pids, c)
		}
	}
	var pc procCost
	for _, p := range pids {
		tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(p) + "/task/[0-9]*/schedstat")
		if len(tasks) == 0 && p == pid {
			return procCost{}, fmt.Errorf("cpu of pid %d: no schedstat", pid)
		}
		for _, t := range tasks {
			b, err := os.ReadFile(t)
			if err != nil {
				continue // a thread that ended
			}
			f := bytes.Fields(b)
			if len(f) < 1 {
				continue
			}
			ns, err := strconv.ParseInt(string(f[0]), 10, 64)
			if err != nil {
				return procCost{}, fmt.Errorf("%s: %w", t, err)
			}
			pc.cpuNS += ns
		}
		w, err := syscw(p)
		if err != nil && p == pid {
			return procCost{}, err
		}
		pc.writes += w
	}
	return pc, nil
}

// syscw is the write syscall count of a process (all its threads).
func syscw(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/io")
	if err != nil {
		return 0, err
	}
	for _, line := range bytes.Split(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("syscw: ")); ok {
			return strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
		}
	}
	return 0, fmt.Errorf("/proc/%d/io: no syscw", pid)
}

// writePerfMarkdown writes the perf table: per shape, every target, and
// the warmpath / nginx ratios.
func writePerfMarkdown(b io.Writer, rows []PerfRow, shapes []PerfShape, rounds int, baseline string) {
	fmt.Fprintf(b, "\n## Proxy cost per answer shape: warmpath vs nginx\n\n")
	fmt.Fprintf(b, "One in-process engine answers in the shape each row names (its write pattern exact: raw socket writes). "+
		"Each target is measured in turn, %d round(s) interleaved, medians over rounds. CPU = the router process tree's run time "+
		"over every thread (`/proc/<pid>/task/*/schedstat`, ns) in the concurrency phase, per request; writes = its write syscalls "+
		"(`/proc/<pid>/io` syscw) per request, the request sent upstream included; p50 at concurrency 1, to the answer's last byte. "+
		"nginx: `proxy_pass` with keep-alive upstreams, `proxy_buffering off`, worker_processes auto. The load generator and the "+
		"engine share the same cores.\n\n", rounds)
	for _, sh := range shapes {
		fmt.Fprintf(b, "- **%s**: %s; %d requests at concurrency %d, %d at concurrency 1.\n", sh.Name, sh.About, sh.Requests, sh.Concurrency, sh.LatencyRequests)
	}
	fmt.Fprintf(b, "Ratios are the median over rounds of the ratio within each round (a round's targets share its noise); "+
		"an added-latency ratio only where both added p50s are positive (paced streams: the engine's pace dominates).\n")
	fmt.Fprintf(b, "\n| shape | target | CPU / req | CPU ratio to nginx | CPU ratio to baseline | writes / req | p50 | added p50 | added p50 ratio to nginx | failed / sent |\n")
	fmt.Fprintf(b, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	x := func(v float64) string {
		if v <= 0 {
			return "—"
		}
		return fmt.Sprintf("%.2fx", v)
	}
	for _, sh := range shapes {
		for _, r := range rows {
			if r.Shape != sh.Name {
				continue
			}
			cpu, wr, add := "—", "—", "—"
			if r.CPUPerReq >= 0 {
				cpu = fmt.Sprintf("%.1f µs", 1e6*r.CPUPerReq)
				wr = fmt.Sprintf("%.2f", r.WritesPerReq)
			}
			if r.Target != "direct" {
				add = us(r.AddedP50)
			}
			fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %d / %d |\n", r.Shape, r.Target, cpu, x(r.CPURatio), x(r.CPUToBase), wr, us(r.P50), add, x(r.AddedRatio), r.Failed, r.Requests)
		}
	}
	for _, r := range rows {
		if len(r.Errors) > 0 {
			fmt.Fprintf(b, "\n%s on %s errors: %s\n", r.Target, r.Shape, strings.Join(r.Errors, "; "))
		}
	}
	if baseline != "" {
		fmt.Fprintf(b, "\n`warmpath %s` is the same bench's baseline binary, run side by side.\n", baseline)
	}
}
