package slowpath

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// value sums a collector's counter/gauge samples.
func value(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric, 64)
	c.Collect(ch)
	close(ch)
	var sum float64
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			t.Fatal(err)
		}
		switch {
		case d.Counter != nil:
			sum += d.Counter.GetValue()
		case d.Gauge != nil:
			sum += d.Gauge.GetValue()
		case d.Histogram != nil:
			sum += float64(d.Histogram.GetSampleCount())
		}
	}
	return sum
}

func TestProxyPassthrough(t *testing.T) {
	e := startFakeEngine(t)
	_, url := newTestServer(t, testConfig(e.addr))
	// Odd spacing, unicode and key order must survive byte for byte.
	body := "{ \"messages\" : [{\"role\":\"user\",\"content\":\"h\u00e9llo \\u00e9 \\n\"}],\n\t\"model\":\"m\" , \"temperature\": 0.70 }"
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions?x=1", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("Authorization", "Bearer sk-test-123")
	req.Header.Set("OpenAI-Organization", "org-1")
	req.Header.Set("Accept-Encoding", "gzip")
	req.Header.Set("X-Forwarded-For", "10.9.8.7")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if got := string(e.lastBody()); got != body {
		t.Fatalf("body changed:\n got %q\nwant %q", got, body)
	}
	h := e.lastHeader()
	for k, want := range map[string]string{
		"Authorization":       "Bearer sk-test-123",
		"Openai-Organization": "org-1",
		"Content-Type":        "application/json; charset=utf-8",
		"X-Forwarded-For":     "127.0.0.1", // no trusted_proxies: the client's own is replaced
		"Accept-Encoding":     "",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("upstream header %s = %q, want %q", k, got, want)
		}
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("response Content-Type %q", ct)
	}
	if !strings.Contains(string(b), `"cached_tokens":7`) {
		t.Errorf("response body not passed through: %s", b)
	}
}

// readEvent reads one SSE event ("data: ...\n\n") and returns its data. It
// fails the test if none arrives within 10s: a router that buffered a stream
// would otherwise hang gated tests instead of failing them.
func readEvent(t testing.TB, br *bufio.Reader) string {
	t.Helper()
	type res struct {
		data string
		err  error
	}
	c := make(chan res, 1)
	go func() {
		var data string
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				c <- res{"", fmt.Errorf("%w (partial %q)", err, line)}
				return
			}
			line = strings.TrimRight(line, "\n")
			if line == "" {
				if data != "" {
					c <- res{data, nil}
					return
				}
				continue
			}
			data = strings.TrimPrefix(line, "data: ")
		}
	}()
	select {
	case r := <-c:
		if r.err != nil {
			t.Fatalf("read event: %v", r.err)
		}
		return r.data
	case <-time.After(10 * time.Second):
		t.Fatal("no SSE event within 10s: the stream is not relayed incrementally")
		return ""
	}
}

func TestStreamingIsIncremental(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	e.Cached = 42
	s, url := newTestServer(t, testConfig(e.addr))
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}`))
	req.Header.Set("Content-Type", "application/json")
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	br := bufio.NewReader(resp.Body)
	// The engine is blocked on the gate after its first event: reading it
	// here proves the router flushed it before the rest was generated.
	first := readEvent(t, br)
	if !strings.Contains(first, `"t0 "`) {
		t.Fatalf("first event %q", first)
	}
	e.open()
	var events []string
	for {
		ev := readEvent(t, br)
		events = append(events, ev)
		if ev == "[DONE]" {
			break
		}
	}
	if len(events) != 4 || !strings.Contains(events[2], "cached_tokens") {
		t.Fatalf("events after the first: %q", events)
	}
	waitFor(t, "stream bookkeeping", func() bool { return s.inflight.Load() == 0 })
	if got := value(t, s.m.actual); got != 42 {
		t.Errorf("cached_tokens_actual_total = %v, want 42 (from the final usage chunk)", got)
	}
	if got := value(t, s.m.ttft); got != 1 {
		t.Errorf("ttft observations = %v, want 1", got)
	}
}

func TestNoRetryAfterFirstByte(t *testing.T) {
	e := startFakeEngine(t)
	e.DieMidStream.Store(true)
	cfg := testConfig(e.addr)
	cfg.Passive.ConsecutiveFailures = 0
	s, url := newTestServer(t, cfg)
	req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("want the stream ended by an error event, got a read error %v after %q", err, b)
	}
	if !strings.Contains(string(b), `"t0 "`) {
		t.Fatalf("first event did not reach the client: %q", b)
	}
	if !strings.HasSuffix(string(b), `data: {"error":{"message":"The upstream replica failed mid-stream.","type":"upstream_error","param":null,"code":"upstream_error"}}`+"\n\n") ||
		strings.Contains(string(b), "[DONE]") {
		t.Fatalf("broken stream must end with an SSE error event and no [DONE]: %q", b)
	}
	waitFor(t, "broken stream metric", func() bool { return value(t, s.m.broken) == 1 })
	if n := e.requests.Load(); n != 1 {
		t.Fatalf("engine saw %d requests, want 1 (no retry after bytes reached the client)", n)
	}
}

func TestRetryBeforeFirstByteAndEject(t *testing.T) {
	bad := startFakeEngine(t)
	bad.Status.Store(503)
	good := startFakeEngine(t)
	cfg := testConfig(bad.addr, good.addr)
	cfg.Routing.Policy = "round-robin"
	cfg.Passive.EjectTime = time.Hour // stays out for the test
	cfg.Passive.MaxEjectTime = time.Hour
	s, url := newTestServer(t, cfg)
	for i := range 20 {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
			t.Fatalf("request %d: status %d: %s", i, st, body)
		}
	}
	if n := bad.requests.Load(); n != 3 {
		t.Errorf("bad replica got %d attempts, want exactly 3 (ejected after 3 consecutive failures)", n)
	}
	if v := value(t, s.m.ejections); v != 1 {
		t.Errorf("ejections_total = %v, want 1", v)
	}
	if v := value(t, s.m.retries); v != 3 {
		t.Errorf("retries_total = %v, want 3", v)
	}
	if good.requests.Load() != 20 {
		t.Errorf("good replica served %d, want 20", good.requests.Load())
	}
}

func TestDeadReplicaRefusesThenRetried(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // connection refused from now on
	good := startFakeEngine(t)
	cfg := testConfig(dead, good.addr)
	cfg.Routing.Policy = "round-robin"
	cfg.Health.Interval = time.Hour // only passive ejection acts here
	cfg.Health.Timeout = time.Second
	_, url := newTestServer(t, cfg)
	for i := range 10 {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
			t.Fatalf("request %d: status %d: %s", i, st, body)
		}
	}
}

func TestReplicaLimitRejectAndQueue(t *testing.T) {
	for _, mode := range []string{OnLimitReject, OnLimitQueue} {
		t.Run(mode, func(t *testing.T) {
			e := startFakeEngine(t)
			e.Gate = make(chan struct{})
			cfg := testConfig(e.addr)
			cfg.Limits.MaxInFlightPerReplica = 1
			cfg.Limits.OnLimit = mode
			cfg.Limits.QueueTimeout = 10 * time.Second
			s, url := newTestServer(t, cfg)
			// Hold the only slot with a gated stream.
			resp, err := testClient.Post(url+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			readEvent(t, bufio.NewReader(resp.Body))
			if mode == OnLimitReject {
				st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
				want := "{\"error\":{\"message\":\"Every replica serving model `m` is at its concurrency limit; retry later.\",\"type\":\"rate_limit_exceeded\",\"param\":null,\"code\":\"rate_limit_exceeded\"}}"
				if st != 429 || body != want {
					t.Fatalf("got %d %s\nwant 429 %s", st, body, want)
				}
				e.open()
				return
			}
			type result struct {
				st   int
				body string
			}
			done := make(chan result, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(chatBody))
				r, err := testClient.Do(req)
				if err != nil {
					done <- result{0, err.Error()}
					return
				}
				b, _ := io.ReadAll(r.Body)
				r.Body.Close()
				done <- result{r.StatusCode, string(b)}
			}()
			waitFor(t, "second request queued", func() bool { return s.freed.waiters.Load() == 1 })
			select {
			case r := <-done:
				t.Fatalf("queued request finished while the slot was held: %d %s", r.st, r.body)
			default:
			}
			e.open()
			io.Copy(io.Discard, resp.Body) //nolint:errcheck
			if r := <-done; r.st != 200 {
				t.Fatalf("queued request: %d %s", r.st, r.body)
			}
		})
	}
}

func TestModelsEndpoint(t *testing.T) {
	a, b := startFakeEngine(t), startFakeEngine(t)
	cfg := testConfig()
	cfg.Replicas = []ReplicaConfig{
		{Address: a.addr, Models: []string{"llama", "lora-a"}},
		{Address: b.addr, Models: []string{"qwen", "llama"}},
	}
	_, url := newTestServer(t, cfg)
	resp, err := testClient.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object, OwnedBy string
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range out.Data {
		ids = append(ids, d.ID)
	}
	if out.Object != "list" || strings.Join(ids, ",") != "llama,lora-a,qwen" {
		t.Fatalf("models: %+v", out)
	}
	// Multi-model filtering: qwen only goes to b (/v1/models above asked
	// each engine for its own list).
	a0, b0 := a.requests.Load(), b.requests.Load()
	for range 5 {
		st, body := post(t, url+"/v1/chat/completions", "application/json", strings.Replace(chatBody, `"m"`, `"qwen"`, 1))
		if st != 200 {
			t.Fatalf("%d %s", st, body)
		}
	}
	if a.requests.Load() != a0 || b.requests.Load() != b0+5 {
		t.Fatalf("qwen requests went to a=%d b=%d, want 0/5", a.requests.Load(), b.requests.Load())
	}
}

func TestGracefulShutdownDrainsStreams(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	s, err := New(testConfig(e.addr), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	url := "http://" + ln.Addr().String()
	resp, err := testClient.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	readEvent(t, br)
	shut := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		shut <- s.Shutdown(ctx)
	}()
	// New connections are refused once the listener is closed.
	waitFor(t, "listener closed", func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return true
		}
		c.Close()
		return false
	})
	select {
	case err := <-shut:
		t.Fatalf("shutdown returned while a stream was in flight: %v", err)
	default:
	}
	e.open()
	n := 1
	for readEvent(t, br) != "[DONE]" {
		n++
	}
	if n != 4 {
		t.Fatalf("stream had %d events before [DONE], want 4", n)
	}
	if err := <-shut; err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
}

func TestShutdownDeadlineClosesStuckStreams(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	defer e.open()
	s, err := New(testConfig(e.addr), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln) //nolint:errcheck
	resp, err := testClient.Post("http://"+ln.Addr().String()+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	readEvent(t, bufio.NewReader(resp.Body))
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown with a stuck stream: %v, want deadline exceeded", err)
	}
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Fatal("stuck stream was not cut at the drain deadline")
	}
}

type recordingObserver struct {
	mu  sync.Mutex
	evs []RoutedEvent
}

func (o *recordingObserver) ObserveRouted(ev *RoutedEvent) {
	o.mu.Lock()
	defer o.mu.Unlock()
	c := *ev
	c.Model = append([]byte(nil), ev.Model...)
	c.Hashes = append([]uint64(nil), ev.Hashes...)
	o.evs = append(o.evs, c)
}

func TestObserverSeam(t *testing.T) {
	e := startFakeEngine(t)
	s, err := New(testConfig(e.addr), testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	obs := &recordingObserver{}
	s.Observer = obs
	url := startRouter(t, s)
	long := `{"model":"m","messages":[{"role":"system","content":"` + strings.Repeat("You answer in French. ", 40) + `"},{"role":"user","content":"hello"}]}`
	for range 2 {
		if st, body := post(t, url+"/v1/chat/completions", "application/json", long); st != 200 {
			t.Fatalf("%d %s", st, body)
		}
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if len(obs.evs) != 2 {
		t.Fatalf("observer saw %d events, want 2", len(obs.evs))
	}
	ev := obs.evs[1]
	if !ev.Client.Addr().IsLoopback() || !ev.Client.Addr().Is4() || ev.Client.Port() == 0 || string(ev.Model) != "m" ||
		ev.Replica != e.addr || ev.CachedTokens != 7 || ev.Status != 200 || !ev.OK ||
		ev.PromptTokens == 0 || ev.FirstBlock() == 0 || ev.Start <= 0 || ev.End < ev.Start {
		t.Fatalf("event %+v", ev)
	}
	// The second request repeats the first's prompt: predicted cached.
	if ev.PredictedCachedTokens <= 0 {
		t.Fatalf("second identical request: predicted %d cached tokens, want > 0", ev.PredictedCachedTokens)
	}
}

func TestEveryAttemptFails(t *testing.T) {
	t.Run("retryable status on the last attempt passes through", func(t *testing.T) {
		a, b := startFakeEngine(t), startFakeEngine(t)
		a.Status.Store(503)
		b.Status.Store(503)
		cfg := testConfig(a.addr, b.addr)
		cfg.Passive.ConsecutiveFailures = 0
		s, url := newTestServer(t, cfg)
		st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
		if st != 503 || body != `{"error":{"message":"engine says no","type":"x","param":null,"code":null}}` {
			t.Fatalf("got %d %s", st, body)
		}
		if a.requests.Load()+b.requests.Load() != 2 || value(t, s.m.retries) != 1 {
			t.Fatalf("attempts a=%d b=%d retries=%v, want one each and 1 retry", a.requests.Load(), b.requests.Load(), value(t, s.m.retries))
		}
	})
	t.Run("connection failures give 502", func(t *testing.T) {
		var addrs []string
		for range 2 {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addrs = append(addrs, ln.Addr().String())
			ln.Close()
		}
		cfg := testConfig(addrs...)
		cfg.Health.Interval, cfg.Health.Timeout = time.Hour, time.Second
		_, url := newTestServer(t, cfg)
		st, body := post(t, url+"/v1/chat/completions", "application/json", chatBody)
		// Generic: no socket address, no fasthttp text (the log has them).
		if st != 502 || body != `{"error":{"message":"The upstream replicas failed to answer.","type":"upstream_error","param":null,"code":"upstream_error"}}` {
			t.Fatalf("got %d %s", st, body)
		}
	})
}

func TestClientGoneMidStreamReleasesEverything(t *testing.T) {
	e := startFakeEngine(t)
	e.Gate = make(chan struct{})
	e.Events = 50
	s, url := newTestServer(t, testConfig(e.addr))
	conn, err := net.Dial("tcp", url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	body := `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`
	if _, err := io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(line, `"t0 "`) {
			break
		}
	}
	conn.Close() // client goes away mid-stream
	e.open()     // the engine keeps generating; the next write fails
	waitFor(t, "slots released", func() bool {
		return s.inflight.Load() == 0 && replicaStatus(t, s, e.addr).InFlight == 0
	})
	if v := value(t, s.m.broken); v != 0 {
		t.Fatalf("a client going away is not a broken upstream: broken_streams_total = %v", v)
	}
	// The router keeps serving.
	if st, b := post(t, url+"/v1/chat/completions", "application/json", chatBody); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
}

// TestBufferedAnswersTeachNoTTFT: a non-streaming answer's first byte
// arrives with its last, so it must not be read as a time to first token:
// only the streamed requests are checked against the TTFT model, whatever
// the pooled exchange served before.
func TestBufferedAnswersTeachNoTTFT(t *testing.T) {
	e := startFakeEngine(t)
	s, url := newTestServer(t, testConfig(e.addr))
	body := func(stream bool) string {
		return fmt.Sprintf(`{"model":"m","stream":%v,"messages":[{"role":"user","content":"hi"}]}`, stream)
	}
	for i, stream := range []bool{true, false, false, true, false, false} {
		if st, b := post(t, url+"/v1/chat/completions", "application/json", body(stream)); st != 200 {
			t.Fatalf("request %d: %d %s", i, st, b)
		}
	}
	waitFor(t, "stream bookkeeping", func() bool { return s.inflight.Load() == 0 })
	if got := s.brain.Replicas()[0].TTFT.Checked; got != 2 {
		t.Fatalf("TTFT predictions checked %d, want the 2 streamed requests only", got)
	}
}
