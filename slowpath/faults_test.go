package slowpath_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
)

// Fault injection with real enginesim engines behind the in-process router
// over loopback. Each case starts its own engines and
// router; engines run 100x faster than life, every loop is bounded.

// sseResult is what a raw HTTP client saw of one request.
type sseResult struct {
	status int
	events []string // data payloads, in order
	done   bool     // saw data: [DONE]
	errEv  bool     // saw an event carrying an "error" object
	err    error    // transport or read error (a cut stream)
	body   string   // non-streamed body (or error body)
}

var faultClient = &http.Client{Timeout: 20 * time.Second} // hang guard, not a latency assertion

func chatJSON(q string, stream bool, maxTokens int) string {
	opts := ""
	if stream {
		opts = `"stream_options":{"include_usage":true},`
	}
	return fmt.Sprintf(`{"model":%q,"stream":%t,%s"max_tokens":%d,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":%q}]}`,
		e2eModel, stream, opts, maxTokens, q)
}

// doChat posts body to the router's chat endpoint and reads the whole answer.
func doChat(t testing.TB, url, body string) sseResult {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk-test")
	resp, err := faultClient.Do(req)
	if err != nil {
		return sseResult{err: err}
	}
	defer resp.Body.Close()
	r := sseResult{status: resp.StatusCode}
	if !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		b, err := io.ReadAll(resp.Body)
		r.body, r.err = string(b), err
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		d, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		if d == "[DONE]" {
			r.done = true
			continue
		}
		var ev struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal([]byte(d), &ev) != nil {
			r.err = fmt.Errorf("event is not JSON: %q", d)
			continue
		}
		if len(ev.Error) > 0 {
			r.errEv = true
		}
		r.events = append(r.events, d)
	}
	if err := sc.Err(); err != nil {
		r.err = err
	}
	return r
}

// complete reports a successful answer: a finished stream or a 200 JSON body.
func (r sseResult) complete() bool {
	if r.err != nil || r.status != 200 {
		return false
	}
	if r.events != nil || r.done {
		return r.done && !r.errEv && len(r.events) > 0
	}
	return strings.Contains(r.body, `"choices"`)
}

func startFaultRouter(t testing.TB, engines []*enginesim.Server, mutate func(*slowpath.Config)) (*slowpath.Server, string, *routed) {
	t.Helper()
	cfg := e2eConfig(engines)
	cfg.Routing.Policy = "round-robin" // every replica sees traffic, deterministic spread
	cfg.Passive.EjectTime, cfg.Passive.MaxEjectTime = time.Minute, time.Minute
	if mutate != nil {
		mutate(&cfg)
	}
	return startObserved(t, cfg)
}

func replicaStatus(t testing.TB, s *slowpath.Server, name string) slowpath.ReplicaStatus {
	t.Helper()
	for _, st := range s.Replicas() {
		if st.Name == name {
			return st
		}
	}
	t.Fatalf("replica %s not found", name)
	return slowpath.ReplicaStatus{}
}

func waitCond(t testing.TB, what string, cond func() bool) {
	t.Helper()
	for range 2000 {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

// TestFaultsUpstream injects one upstream fault into engines[0] of three and
// checks what clients get, where the retries went and whether the replica
// was ejected.
func TestFaultsUpstream(t *testing.T) {
	tests := []struct {
		name   string
		faults enginesim.Faults
		stream bool
		down   bool // close the engine: connection refused
		// outcome
		victimBreaks bool // requests routed to the victim break mid-stream (no retry after the first byte)
		ejected      bool
		retried      bool
	}{
		{name: "close mid-stream", faults: enginesim.Faults{CloseAfterChunks: 2}, stream: true, victimBreaks: true, ejected: true},
		{name: "stall after first byte", faults: enginesim.Faults{StallAfterChunks: 2}, stream: true, victimBreaks: true, ejected: true},
		{name: "503 burst", faults: enginesim.Faults{ErrorRate: 1, ErrorStatus: 503}, stream: true, ejected: true, retried: true},
		{name: "502 burst json", faults: enginesim.Faults{ErrorRate: 1, ErrorStatus: 502}, ejected: true, retried: true},
		{name: "connection refused", down: true, stream: true, ejected: true, retried: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			engines := startEngines(t, 3, nil)
			victim := engines[0]
			s, url, obs := startFaultRouter(t, engines, func(c *slowpath.Config) {
				// Timeouts fire fast; healthy answers take a few ms.
				c.Upstream.ResponseTimeout = 400 * time.Millisecond
				c.Passive.ConsecutiveFailures = 3
				c.Health.Interval, c.Health.Timeout = time.Minute, time.Second // passive ejection only
			})
			if tc.down {
				victim.Close()
			} else {
				victim.SetFaults(tc.faults)
			}
			const n = 18
			var broken, okOthers int
			for i := range n {
				r := doChat(t, url, chatJSON(fmt.Sprintf("q%d", i), tc.stream, 6))
				obs.mu.Lock()
				rep := ""
				if len(obs.reps) > 0 {
					rep = obs.reps[len(obs.reps)-1]
				}
				obs.mu.Unlock()
				switch {
				case r.complete():
					if rep == victim.Addr() {
						t.Fatalf("request %d: complete answer attributed to the faulty replica", i)
					}
					okOthers++
				case tc.victimBreaks && r.status == 200 && rep == victim.Addr():
					// Committed stream cut by the engine: the client must
					// see it is incomplete (no [DONE]), never a fake end.
					if r.done {
						t.Fatalf("request %d: broken stream ended with [DONE]: %+v", i, r)
					}
					if !r.errEv {
						t.Fatalf("request %d: broken stream did not end with an SSE error event: %+v", i, r)
					}
					broken++
					t.Logf("request %d broken mid-stream after %d events: read err=%v, error event=%v", i, len(r.events), r.err, r.errEv)
				default:
					t.Fatalf("request %d (replica %q): client got %+v", i, rep, r)
				}
			}
			st := replicaStatus(t, s, victim.Addr())
			if tc.ejected && (st.Healthy || st.Ejections == 0) {
				t.Fatalf("faulty replica not ejected: %+v", st)
			}
			if tc.victimBreaks && broken != 3 {
				t.Fatalf("%d broken streams, want exactly consecutive_failures=3 before ejection", broken)
			}
			if !tc.victimBreaks && okOthers != n {
				t.Fatalf("%d of %d requests succeeded", okOthers, n)
			}
			retries := slowpath.MetricSum(t, s, "warmpath_slowpath_retries_total", "replica", victim.Addr())
			if tc.retried && retries != 3 {
				t.Fatalf("retries_total{replica=victim} = %v, want 3 (then ejected)", retries)
			}
			if !tc.retried && retries != 0 {
				t.Fatalf("retries_total{replica=victim} = %v after the first byte, want 0", retries)
			}
			for _, other := range engines[1:] {
				if o := replicaStatus(t, s, other.Addr()); !o.Healthy || o.ConsecutiveFailures != 0 {
					t.Fatalf("healthy replica affected: %+v", o)
				}
			}
			t.Logf("%s: %d/%d complete, %d broken on the victim, retries %v, ejections %d", tc.name, okOthers, n, broken, retries, st.Ejections)
		})
	}
}

// TestFaultsSlowDrip: an engine that emits one token every ~50 ms (wall)
// streams to completion through the router; the response timeout, far
// above the stream's length, does not misfire and nothing is retried.
func TestFaultsSlowDrip(t *testing.T) {
	engines := startEngines(t, 2, func(c *enginesim.Config) {
		c.Timing.StepBase = 5 * time.Second // x TimeScale 0.01 = 50 ms per decode step
	})
	s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Upstream.ResponseTimeout = 5 * time.Second
	})
	const tokens = 8
	for i := range 2 {
		start := time.Now()
		r := doChat(t, url, chatJSON(fmt.Sprintf("drip %d", i), true, tokens))
		if !r.complete() {
			t.Fatalf("slow stream %d: %+v", i, r)
		}
		// role chunk + one chunk per token (EOS carries no text) + usage.
		if len(r.events) < tokens {
			t.Fatalf("slow stream %d: %d events, want >= %d", i, len(r.events), tokens)
		}
		t.Logf("slow drip %d: %d events in %v", i, len(r.events), time.Since(start))
	}
	if n := slowpath.MetricSum(t, s, "warmpath_slowpath_retries_total", "", ""); n != 0 {
		t.Fatalf("retries_total = %v on a slow but healthy stream", n)
	}
	if n := slowpath.MetricSum(t, s, "warmpath_slowpath_broken_streams_total", "", ""); n != 0 {
		t.Fatalf("broken_streams_total = %v on a slow but healthy stream", n)
	}
}

// TestFaultsMetricsGarbageAndStall: engines whose /metrics answers garbage,
// then hangs: their signals go stale and are withdrawn (affinity sees At 0),
// routing continues on router-local counts, and fresh signals return when
// the endpoint recovers.
func TestFaultsMetricsGarbageAndStall(t *testing.T) {
	engines := startEngines(t, 3, nil)
	s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Routing.Policy = "cost"
	})
	fresh := func(want bool) func() bool {
		return func() bool {
			for _, st := range s.Replicas() {
				if st.Affinity == nil {
					return false
				}
				isFresh := !st.Engine.Stale && !st.Affinity.Signals.ScrapedAt.IsZero()
				isStale := st.Engine.Stale && st.Affinity.Signals.ScrapedAt.IsZero() && st.Engine.Error != ""
				if (want && !isFresh) || (!want && !isStale) {
					return false
				}
			}
			return true
		}
	}
	waitCond(t, "fresh signals", fresh(true))
	for _, f := range []enginesim.Faults{{MetricsGarbage: true}, {MetricsStall: true}} {
		for _, en := range engines {
			en.SetFaults(f)
		}
		waitCond(t, fmt.Sprintf("signals withdrawn (%+v)", f), fresh(false))
		for i := range 6 {
			if r := doChat(t, url, chatJSON(fmt.Sprintf("q%d", i), i%2 == 0, 4)); !r.complete() {
				t.Fatalf("request %d with stale signals (%+v): %+v", i, f, r)
			}
		}
		for _, st := range s.Replicas() {
			if !st.Healthy {
				t.Fatalf("metrics fault took a replica out of routing: %+v", st)
			}
		}
		t.Logf("%+v: %v scrape errors, signals withdrawn, 6/6 requests served", f,
			slowpath.MetricSum(t, s, "warmpath_slowpath_scrape_errors_total", "", ""))
		for _, en := range engines {
			en.SetFaults(enginesim.Faults{})
		}
		waitCond(t, "fresh signals after recovery", fresh(true))
	}
}

// TestFaultsAllReplicasDown: with every engine gone the client gets an
// OpenAI error (502 while the router still believes in them, then 503
// no_replica_available), and service returns when one engine comes back on
// its address.
func TestFaultsAllReplicasDown(t *testing.T) {
	engines := startEngines(t, 2, nil)
	s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Passive.EjectTime, c.Passive.MaxEjectTime = 50*time.Millisecond, 200*time.Millisecond
	})
	if r := doChat(t, url, chatJSON("warm", false, 4)); !r.complete() {
		t.Fatalf("before: %+v", r)
	}
	addr := engines[0].Addr()
	cfg := engines[0].Config()
	for _, en := range engines {
		en.Close()
	}
	var got503 bool
	for i := 0; i < 200 && !got503; i++ {
		r := doChat(t, url, chatJSON(fmt.Sprintf("down %d", i), i%2 == 0, 4))
		var e struct {
			Error struct {
				Message, Type, Code string
			} `json:"error"`
		}
		if r.err != nil || json.Unmarshal([]byte(r.body), &e) != nil || e.Error.Message == "" {
			t.Fatalf("request %d with all replicas down: not an OpenAI error: %+v", i, r)
		}
		switch {
		case r.status == 503 && e.Error.Code == "no_replica_available" && e.Error.Type == "service_unavailable":
			got503 = true
		case r.status == 502 && e.Error.Code == "upstream_error":
		default:
			t.Fatalf("request %d: status %d body %s", i, r.status, r.body)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if !got503 {
		t.Fatal("never answered 503 no_replica_available with every replica down")
	}
	back, err := enginesim.Start(cfg, addr)
	if err != nil {
		t.Fatalf("restart engine on %s: %v", addr, err)
	}
	t.Cleanup(func() { back.Close() })
	waitCond(t, "replica re-admitted", func() bool { return replicaStatus(t, s, addr).Healthy })
	for i := range 4 {
		if r := doChat(t, url, chatJSON(fmt.Sprintf("back %d", i), i%2 == 0, 4)); !r.complete() {
			t.Fatalf("after recovery %d: %+v", i, r)
		}
	}
}

// TestFaultsReplicaRestart: an engine restart wipes its KV cache; the
// router's prefix index must forget what it believed that replica held.
// A restart that cuts an in-flight stream is detected (broken stream ->
// ejection -> re-admission -> ResetCache). A restart while idle is detected
// from the engine's counters going backwards on the next scrape.
func TestFaultsReplicaRestart(t *testing.T) {
	engines := startEngines(t, 3, func(c *enginesim.Config) {
		c.Timing.StepBase = 2 * time.Second // 20 ms per step: a long stream stays in flight
	})
	s, url, obs := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Routing.Policy = "cost"
		c.Upstream.ResponseTimeout = 15 * time.Second
		c.Passive.ConsecutiveFailures = 1
		c.Passive.EjectTime, c.Passive.MaxEjectTime = 100*time.Millisecond, 200*time.Millisecond
	})
	sys := longSystem(120) // ~100 blocks of 64 tokens
	body := func(q string, stream bool) string {
		n := 4
		if stream {
			n = 400 // ~8 s: cut by the restart long before it ends
		}
		b, _ := json.Marshal(map[string]any{"model": e2eModel, "stream": stream, "max_tokens": n,
			"messages": []map[string]string{{"role": "system", "content": sys}, {"role": "user", "content": q}}})
		return string(b)
	}
	last := func() (rep string, pred, got int) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		n := len(obs.reps) - 1
		return obs.reps[n], obs.pred[n], obs.got[n]
	}
	for i := range 3 {
		if r := doChat(t, url, body(fmt.Sprintf("warm %d", i), false)); !r.complete() {
			t.Fatalf("warm-up %d: %+v", i, r)
		}
	}
	homeName, pred, got := last()
	if pred <= 0 || got <= 0 {
		t.Fatalf("shared prefix not cached before the restart: predicted %d, engine %d", pred, got)
	}
	var home *enginesim.Server
	for _, en := range engines {
		if en.Addr() == homeName {
			home = en
		}
	}
	blocks := func() int { return replicaStatus(t, s, homeName).Affinity.CachedBlocks }
	before := blocks()

	// Idle restart: the engine's counters start again from zero (as a real
	// engine process's do), the scraper sees them go backwards, and the
	// router forgets what it believed the replica held.
	home.Restart()
	waitCond(t, "the index to forget the idle-restarted replica's prefixes", func() bool { return blocks() == 0 })
	if r := doChat(t, url, body("after idle restart", false)); !r.complete() {
		t.Fatalf("after idle restart: %+v", r)
	}
	rep, pred, got := last()
	if pred > got {
		t.Fatalf("after an idle restart the router predicted %d cached tokens on %s, engine had %d", pred, rep, got)
	}
	t.Logf("idle restart detected: %d blocks forgotten; next request on %s predicted %d, engine %d", before, rep, pred, got)
	// The prefix now lives where that request went: it is the home below.
	homeName = rep
	for _, en := range engines {
		if en.Addr() == homeName {
			home = en
		}
	}
	before = blocks()

	// Restart with a long stream in flight on the home replica.
	done := make(chan sseResult, 1)
	go func() { done <- doChat(t, url, body("in flight", true)) }()
	// In flight at the engine, not only at the router: a restart before
	// the request arrives would not touch it.
	waitCond(t, "stream in flight on the home replica", func() bool {
		return replicaStatus(t, s, homeName).InFlight == 1 && home.Stats().InFlight == 1
	})
	ejections := replicaStatus(t, s, homeName).Ejections
	home.Restart()
	r := <-done
	t.Logf("stream cut by the restart after %d events: err=%v error event=%v", len(r.events), r.err, r.errEv)
	if r.status != 200 || r.done || !r.errEv {
		t.Fatalf("stream cut by the restart: client got %+v, want a visibly broken stream", r)
	}
	waitCond(t, "restarted replica ejected and re-admitted", func() bool {
		st := replicaStatus(t, s, homeName)
		return st.Ejections > ejections && st.Healthy
	})
	if b := blocks(); b != 0 {
		t.Fatalf("re-admitted replica: index still holds %d cached blocks (had %d before the restart)", b, before)
	}
	if r := doChat(t, url, body("after restart", false)); !r.complete() {
		t.Fatalf("after restart: %+v", r)
	}
	rep, pred, got = last()
	if rep == homeName && pred > got {
		t.Fatalf("after the detected restart the index predicted %d cached tokens on %s, engine had %d", pred, rep, got)
	}
	t.Logf("in-flight restart detected: %d blocks forgotten; next request on %s predicted %d, engine %d", before, rep, pred, got)
}

// TestFaultsIdleTimeout: an engine that stalls a stream after its first
// events, with a 10-minute response_timeout. upstream.idle_timeout ends the
// client's stream with the SSE error event, frees the replica slot and the
// router's in-flight count, counts a broken stream against the replica and
// ejects it after passive.consecutive_failures of them; the engine sees the
// upstream connection close (its handler is cancelled).
func TestFaultsIdleTimeout(t *testing.T) {
	engines := startEngines(t, 1, nil)
	victim := engines[0]
	const fails = 2
	s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Upstream.ResponseTimeout = 10 * time.Minute // the old bound: never reached here
		c.Upstream.IdleTimeout = 300 * time.Millisecond
		c.Passive.ConsecutiveFailures = fails
		c.Health.Interval, c.Health.Timeout = time.Minute, time.Second // passive ejection only
	})
	victim.SetFaults(enginesim.Faults{StallAfterChunks: 2})
	for i := range fails {
		r := doChat(t, url, chatJSON(fmt.Sprintf("stall %d", i), true, 8))
		if r.status != 200 || r.done || !r.errEv || r.err != nil {
			t.Fatalf("stalled stream %d: client got %+v, want 200, events, then an SSE error event and no [DONE]", i, r)
		}
		waitCond(t, "in-flight back to 0", func() bool {
			return replicaStatus(t, s, victim.Addr()).InFlight == 0 &&
				slowpath.MetricSum(t, s, "warmpath_slowpath_in_flight", "", "") == 0
		})
		t.Logf("stalled stream %d ended by idle_timeout after %d events", i, len(r.events))
	}
	if b := slowpath.MetricSum(t, s, "warmpath_slowpath_broken_streams_total", "replica", victim.Addr()); b != fails {
		t.Fatalf("broken_streams_total = %v, want %d", b, fails)
	}
	if st := replicaStatus(t, s, victim.Addr()); st.Healthy || st.Ejections != 1 {
		t.Fatalf("replica not ejected after %d idle streams: %+v", fails, st)
	}
	// The router closed the upstream connections: the engine saw both
	// requests cancelled (it would otherwise stall until it shuts down).
	waitCond(t, "engine sees the stalled requests cancelled", func() bool { return victim.Stats().Cancelled == fails })
}

// TestFaultsIdleTimeoutJSON: a buffered (non-stream) answer whose body
// stops after its first bytes is retried on the next replica like any
// failure before the client got a byte.
func TestFaultsIdleTimeoutJSON(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stalled := make(chan struct{}, 4)
	release := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() { close(release); ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() { // headers and half a body, then nothing until the test ends
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				if _, err := http.ReadRequest(bufio.NewReader(c)); err != nil {
					return
				}
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
				select {
				case stalled <- struct{}{}:
				default:
				}
				<-release
			}()
		}
	}()
	engines := startEngines(t, 1, nil)
	s, url, obs := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Upstream.IdleTimeout = 200 * time.Millisecond
		c.Health.Interval, c.Health.Timeout = time.Minute, time.Second
		c.Scrape.Interval = 0
		c.Replicas = append([]slowpath.ReplicaConfig{{Address: ln.Addr().String(), Models: []string{e2eModel}}}, c.Replicas...)
	})
	// Round-robin: one request to each. The one whose answer stalls
	// mid-body is a 502: its engine had the request (bytes of its answer
	// came), so it is not sent to another replica, and it counts against
	// the replica.
	var complete, failed int
	for i := range 2 {
		r := doChat(t, url, chatJSON(fmt.Sprintf("json %d", i), false, 4))
		switch {
		case r.complete():
			complete++
		case r.status == http.StatusBadGateway && strings.Contains(r.body, `"code":"upstream_error"`):
			failed++
		default:
			t.Fatalf("request %d: %+v", i, r)
		}
	}
	if complete != 1 || failed != 1 || len(stalled) == 0 { // stalled also counts the health probe
		t.Fatalf("%d complete, %d failed, %d stalled; want 1, 1, > 0", complete, failed, len(stalled))
	}
	if st := replicaStatus(t, s, ln.Addr().String()); st.ConsecutiveFailures != 1 {
		t.Fatalf("stalling replica: %d consecutive failures, want 1", st.ConsecutiveFailures)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, rep := range obs.reps {
		if rep != engines[0].Addr() {
			t.Fatalf("answer attributed to %s", rep)
		}
	}
	if n := slowpath.MetricSum(t, s, "warmpath_slowpath_retries_total", "", ""); n != 0 {
		t.Fatalf("retries_total = %v, want 0 (the answer had begun)", n)
	}
}

// TestFaultsLongGeneration: a request that outlives
// upstream.response_timeout (an engine that takes longer than that before
// its first byte, streamed or not) is a 504 upstream_timeout to its
// client. It is not sent to another replica (a long generation would start
// over there, and again) and does not count toward ejection: the replica
// answers its health checks (retrying it on up to three replicas and
// ejecting the replica after three is the failure it catches).
func TestFaultsLongGeneration(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			engines := startEngines(t, 3, nil)
			victim := engines[0]
			victim.SetFaults(enginesim.Faults{Hang: true})
			s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
				c.Upstream.ResponseTimeout = 300 * time.Millisecond
				c.Passive.ConsecutiveFailures = 1 // one counted failure would eject
				c.Health.Interval, c.Health.Timeout = 50*time.Millisecond, 50*time.Millisecond
			})
			const n = 9
			var ok, timedOut int
			for i := range n {
				r := doChat(t, url, chatJSON(fmt.Sprintf("q%d", i), stream, 4))
				switch {
				case r.complete():
					ok++
				case r.status == http.StatusGatewayTimeout && strings.Contains(r.body, `"code":"upstream_timeout"`):
					timedOut++
				default:
					t.Fatalf("request %d: %+v", i, r)
				}
			}
			hung := victim.Stats().FaultsInjected
			if timedOut == 0 || int64(timedOut) != hung || ok+timedOut != n {
				t.Fatalf("%d complete, %d timed out, the slow replica got %d requests; want every one it got to time out and nothing else", ok, timedOut, hung)
			}
			var served int64
			for _, e := range engines[1:] {
				served += e.Stats().Served[e2eModel]
			}
			if served != int64(ok) {
				t.Fatalf("the other replicas served %d, want %d (no retries)", served, ok)
			}
			if r := slowpath.MetricSum(t, s, "warmpath_slowpath_retries_total", "", ""); r != 0 {
				t.Fatalf("retries_total = %v, want 0", r)
			}
			if st := replicaStatus(t, s, victim.Addr()); !st.Healthy || st.Ejections != 0 || st.ConsecutiveFailures != 0 {
				t.Fatalf("slow replica held against: %+v", st)
			}
			if m := slowpath.MetricSum(t, s, "warmpath_slowpath_upstream_timeouts_total", "replica", victim.Addr()); int(m) != timedOut {
				t.Fatalf("upstream_timeouts_total = %v, want %d", m, timedOut)
			}
			t.Logf("stream=%v: %d/%d complete, %d answered 504 (every request the slow replica got), 0 retries, slow replica healthy", stream, ok, n, timedOut)
		})
	}
}

// TestFaultsClientGoneMidStream: a client that leaves mid-stream makes the
// router close the upstream connection at once (not drain it): the engine
// sees the request cancelled and aborts the generation, the router's slots
// return to 0 and, while the engine streams, the replica is not blamed.
// Both with the engine streaming (noticed at the next write) and with the
// engine stalled (noticed at idle_timeout: it is then a broken stream).
func TestFaultsClientGoneMidStream(t *testing.T) {
	tests := []struct {
		name   string
		faults enginesim.Faults
	}{
		{name: "engine streaming"},
		{name: "engine stalled", faults: enginesim.Faults{StallAfterChunks: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			engines := startEngines(t, 1, func(c *enginesim.Config) {
				c.Timing.StepBase = 2 * time.Second // 20 ms per token: 2000 tokens take ~40 s
				c.OutputLen = enginesim.OutputLen{Median: 4000, Sigma: 0.01, Min: 2000, Max: 4000}
			})
			en := engines[0]
			en.SetFaults(tc.faults)
			s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
				c.Upstream.IdleTimeout = 300 * time.Millisecond
				c.Passive.ConsecutiveFailures = 1
			})
			req, err := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
				strings.NewReader(chatJSON("a long answer", true, 2000)))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := faultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			sc := bufio.NewScanner(resp.Body)
			for events := 0; events < 3 && sc.Scan(); {
				if strings.HasPrefix(sc.Text(), "data: ") {
					events++
				}
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			resp.Body.Close() // leave mid-stream: closes the connection
			waitCond(t, "engine sees the request cancelled", func() bool { return en.Stats().Cancelled == 1 })
			waitCond(t, "router in-flight back to 0", func() bool {
				return replicaStatus(t, s, en.Addr()).InFlight == 0 &&
					slowpath.MetricSum(t, s, "warmpath_slowpath_in_flight", "", "") == 0
			})
			st := en.Stats()
			if st.Served[e2eModel] != 0 {
				t.Fatalf("engine finished the abandoned stream (served %d): the router drained it", st.Served[e2eModel])
			}
			if tc.faults.StallAfterChunks == 0 && st.Engine.Aborted != 1 {
				t.Fatalf("engine aborted %d generations, want 1 (the abandoned one)", st.Engine.Aborted)
			}
			rs := replicaStatus(t, s, en.Addr())
			if tc.faults.StallAfterChunks == 0 && (!rs.Healthy || rs.ConsecutiveFailures != 0) {
				t.Fatalf("replica blamed for a client leaving: %+v", rs)
			}
			t.Logf("%s: engine cancelled %d, aborted %d, broken_streams_total %v", tc.name, st.Cancelled, st.Engine.Aborted,
				slowpath.MetricSum(t, s, "warmpath_slowpath_broken_streams_total", "", ""))
		})
	}
}

// TestFaultsIdleTimeoutQueuedStream: upstream.idle_timeout starts at a
// stream's first token, not at its headers. An engine running one sequence
// at a time sends every stream's headers (and role chunk) at once, then
// queues them: the later streams wait far longer than idle_timeout before
// their first token, and must neither be cut nor count against the
// replica (it is busy, not broken).
func TestFaultsIdleTimeoutQueuedStream(t *testing.T) {
	engines := startEngines(t, 1, func(c *enginesim.Config) {
		c.MaxNumSeqs = 1
		c.Timing.StepBase = time.Second // 10 ms a step at the test's time scale
		c.OutputLen = enginesim.OutputLen{Median: 30, Sigma: 0, Min: 30, Max: 30}
	})
	s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
		c.Upstream.IdleTimeout = 100 * time.Millisecond
		c.Passive.ConsecutiveFailures = 1
		c.Health.Interval, c.Health.Timeout = time.Minute, time.Second // passive ejection only
	})
	const n = 4
	res := make([]sseResult, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = doChat(t, url, chatJSON(fmt.Sprintf("queued %d", i), true, 30))
		}()
		time.Sleep(20 * time.Millisecond) // arrival order, not a timing assertion
	}
	wg.Wait()
	for i, r := range res {
		if !r.complete() {
			t.Errorf("stream %d: %d events, error event %v, [DONE] %v, err %v: cut while queued", i, len(r.events), r.errEv, r.done, r.err)
		}
	}
	if b := slowpath.MetricSum(t, s, "warmpath_slowpath_broken_streams_total", "replica", engines[0].Addr()); b != 0 {
		t.Errorf("broken_streams_total = %v, want 0", b)
	}
	if st := replicaStatus(t, s, engines[0].Addr()); !st.Healthy || st.Ejections != 0 {
		t.Errorf("a busy replica was ejected: %+v", st)
	}
}

// TestFaultsIdleTimeoutLongStream: a healthy stream that keeps sending is
// never cut by idle_timeout, however much longer than it the stream runs
// (the deadline moves with the bytes).
func TestFaultsIdleTimeoutLongStream(t *testing.T) {
	engines := startEngines(t, 1, func(c *enginesim.Config) {
		c.Timing.StepBase = time.Second // 10 ms a token at the test's time scale
		c.OutputLen = enginesim.OutputLen{Median: 60, Sigma: 0, Min: 60, Max: 60}
	})
	_, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) { c.Upstream.IdleTimeout = 100 * time.Millisecond })
	if r := doChat(t, url, chatJSON("long", true, 60)); !r.complete() || len(r.events) < 60 {
		t.Fatalf("healthy long stream cut: %d events, error event %v, [DONE] %v", len(r.events), r.errEv, r.done)
	}
}

// TestFaultsClientGoneBeforeAnswer: a client that leaves before its answer
// began (a non-streamed request while the engine generates, a stream the
// engine holds before its headers) is noticed while the router waits: it
// closes the upstream connection, so the engine stops working for nobody,
// and frees its slots, without waiting for upstream.response_timeout (10 m
// here, the default) and without blaming the replica, instead of letting
// the engine generate to the end with the slot held.
func TestFaultsClientGoneBeforeAnswer(t *testing.T) {
	tests := []struct {
		name   string
		stream bool
		faults enginesim.Faults
	}{
		{name: "json, engine generating"},
		{name: "stream, engine holding its headers", stream: true, faults: enginesim.Faults{Hang: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			engines := startEngines(t, 1, func(c *enginesim.Config) {
				c.Timing.StepBase = 2 * time.Second // 20 ms per token: 2000 tokens take ~40 s
				c.OutputLen = enginesim.OutputLen{Median: 4000, Sigma: 0.01, Min: 2000, Max: 4000}
			})
			en := engines[0]
			en.SetFaults(tc.faults)
			s, url, _ := startFaultRouter(t, engines, func(c *slowpath.Config) {
				c.Passive.ConsecutiveFailures = 1
			})
			c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			body := chatJSON("a long answer", tc.stream, 2000)
			if _, err := fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
				t.Fatal(err)
			}
			waitCond(t, "the request at the engine", func() bool {
				st := en.Stats()
				return st.InFlight == 1 || st.FaultsInjected == 1 // a hung request is not in flight
			})
			c.Close() // leave before any byte of the answer
			waitCond(t, "the engine's request ended", func() bool { return en.Stats().InFlight == 0 })
			waitCond(t, "router in-flight back to 0", func() bool {
				return replicaStatus(t, s, en.Addr()).InFlight == 0 &&
					slowpath.MetricSum(t, s, "warmpath_slowpath_in_flight", "", "") == 0
			})
			st := en.Stats()
			if st.Served[e2eModel] != 0 {
				t.Fatalf("engine finished the abandoned request (served %d)", st.Served[e2eModel])
			}
			if !tc.stream && st.Cancelled != 1 {
				t.Fatalf("engine saw %d cancelled requests, want 1", st.Cancelled)
			}
			rs := replicaStatus(t, s, en.Addr())
			if !rs.Healthy || rs.ConsecutiveFailures != 0 {
				t.Fatalf("replica blamed for a client leaving: %+v", rs)
			}
			if n := slowpath.MetricSum(t, s, "warmpath_slowpath_client_gone_total", "", ""); n != 1 {
				t.Fatalf("client_gone_total = %v, want 1", n)
			}
			if n := slowpath.MetricSum(t, s, "warmpath_slowpath_retries_total", "", ""); n != 0 {
				t.Fatalf("retries_total = %v, want 0", n)
			}
		})
	}
}
