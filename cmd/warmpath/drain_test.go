package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
)

// child is `warmpath serve --log-format json` run as a child process (the
// test binary, see TestMain), so it can be signalled alone.
type child struct {
	cmd        *exec.Cmd
	api, admin string
	done       chan error // Wait's result, once
	mu         sync.Mutex
	lines      []map[string]any
	bad        []string // stderr lines that are not JSON
}

// startChild starts serve with args (plus --log-format json and loopback
// listeners) and env, and waits for its "warmpath serving" line.
func startChild(t *testing.T, env []string, args ...string) *child {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args = append([]string{"serve", "--log-format", "json", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, args...)
	c := &child{cmd: exec.Command(exe, args...), done: make(chan error, 1)}
	c.cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	stderr, err := c.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	serving := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := sync.Once{}
		for sc.Scan() {
			var m map[string]any
			c.mu.Lock()
			if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
				c.bad = append(c.bad, sc.Text())
			} else {
				c.lines = append(c.lines, m)
				if m["msg"] == "warmpath serving" {
					c.api, _ = m["api"].(string)
					c.admin, _ = m["admin"].(string)
					once.Do(func() { close(serving) })
				}
			}
			c.mu.Unlock()
		}
		c.done <- c.cmd.Wait()
	}()
	// Kill, not a look at ProcessState: the goroutine above writes that
	// in Wait. Killing a process that already exited does nothing.
	t.Cleanup(func() { _ = c.cmd.Process.Kill() })
	select {
	case <-serving:
	case err := <-c.done:
		c.done <- err
		t.Fatalf("serve exited during start-up: %v\n%s", err, c.stderr())
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not come up\n%s", c.stderr())
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c
}

func (c *child) stderr() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var b strings.Builder
	for _, l := range c.lines {
		j, _ := json.Marshal(l)
		b.Write(append(j, '\n'))
	}
	for _, l := range c.bad {
		b.WriteString("NOT JSON: " + l + "\n")
	}
	return b.String()
}

// wait returns the exit error (nil = exit 0); a hang guard, not a timing.
func (c *child) wait(t *testing.T) error {
	t.Helper()
	select {
	case err := <-c.done:
		c.done <- err
		return err
	case <-time.After(60 * time.Second):
		_ = c.cmd.Process.Kill()
		t.Fatalf("serve did not exit\n%s", c.stderr())
		return nil
	}
}

// checkJSONLogs fails when any stderr line of c was not JSON, except the
// process's exit error ("warmpath: ...", main's last words, plain text).
func (c *child) checkJSONLogs(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	bad := c.bad
	if n := len(bad); n > 0 && strings.HasPrefix(bad[n-1], "warmpath: ") {
		bad = bad[:n-1]
	}
	if len(bad) > 0 || len(c.lines) == 0 {
		t.Errorf("--log-format json: %d lines, not JSON: %q", len(c.lines), bad)
	}
}

// testBalancer is a TCP load balancer as the ones in front of warmpath
// work: it polls each backend's GET /readyz and sends each new client
// connection to the next backend whose last poll answered 200. A refused
// dial to a backend is counted and the client connection closed (what a
// client would see as a failed request).
type testBalancer struct {
	ln      net.Listener
	mu      sync.Mutex
	backs   []string
	ready   map[string]bool
	served  map[string]int
	next    int
	refused atomic.Int64
	stop    chan struct{}
	wg      sync.WaitGroup
}

func startBalancer(t *testing.T, backends ...string) *testBalancer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &testBalancer{ln: ln, backs: backends, ready: map[string]bool{}, served: map[string]int{}, stop: make(chan struct{})}
	b.wg.Add(2)
	go b.poll()
	go b.accept()
	t.Cleanup(func() { close(b.stop); ln.Close(); b.wg.Wait() })
	return b
}

func (b *testBalancer) add(addr string) {
	b.mu.Lock()
	b.backs = append(b.backs, addr)
	b.mu.Unlock()
}

func (b *testBalancer) isReady(addr string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.ready[addr]
}

func (b *testBalancer) servedBy(addr string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.served[addr]
}

func (b *testBalancer) poll() {
	defer b.wg.Done()
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for {
		select {
		case <-b.stop:
			return
		case <-time.After(10 * time.Millisecond):
		}
		b.mu.Lock()
		backs := append([]string(nil), b.backs...)
		b.mu.Unlock()
		for _, a := range backs {
			ok := false
			if resp, err := hc.Get("http://" + a + "/readyz"); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				ok = resp.StatusCode == 200
			}
			b.mu.Lock()
			b.ready[a] = ok
			b.mu.Unlock()
		}
	}
}

func (b *testBalancer) pick() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	for range len(b.backs) {
		a := b.backs[b.next%len(b.backs)]
		b.next++
		if b.ready[a] {
			b.served[a]++
			return a
		}
	}
	return ""
}

func (b *testBalancer) accept() {
	defer b.wg.Done()
	for {
		c, err := b.ln.Accept()
		if err != nil {
			return
		}
		go b.relay(c)
	}
}

func (b *testBalancer) relay(c net.Conn) {
	defer c.Close()
	a := b.pick()
	if a == "" {
		return
	}
	u, err := net.Dial("tcp", a)
	if err != nil {
		if errors.Is(err, syscall.ECONNREFUSED) {
			b.refused.Add(1)
		}
		return
	}
	defer u.Close()
	go func() { io.Copy(u, c); u.(*net.TCPConn).CloseWrite() }() //nolint:errcheck
	io.Copy(c, u)                                                //nolint:errcheck
}

func drainEngines(t *testing.T, n int) []*enginesim.Server {
	t.Helper()
	return startEngines(t, n, func(i int, c *enginesim.Config) {
		c.TimeScale = 0.02
		c.Seed = uint64(i + 1)
		c.OutputLen = enginesim.OutputLen{Median: 6, Sigma: 0.1, Min: 4, Max: 8}
	})
}

// TestGracefulRestartBehindLoadBalancer: two warmpath instances behind a
// load balancer that polls /readyz; one is restarted gracefully (SIGTERM,
// then a new instance) while clients send requests, streamed and not, on
// fresh connections. Readiness fails first and the listener stays open for
// shutdown.drain_delay, so the balancer stops sending to it before it stops
// accepting: no client request fails and the balancer never meets a
// refused connection. The instance exits 0, every log line is JSON.
func TestGracefulRestartBehindLoadBalancer(t *testing.T) {
	engines := drainEngines(t, 2)
	cfg := filepath.Join(t.TempDir(), "warmpath.yaml")
	var y strings.Builder
	// drain_delay is 150 polls of the balancer: the margin, not a measurement.
	y.WriteString("shutdown: {drain_delay: 1500ms}\nhealth: {interval: 50ms, timeout: 50ms}\nscrape: {interval: 50ms, timeout: 50ms, stale_after: 500ms}\nreplicas:\n")
	for _, en := range engines {
		fmt.Fprintf(&y, "  - {address: %q, models: [m]}\n", en.Addr())
	}
	if err := os.WriteFile(cfg, []byte(y.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	a := startChild(t, nil, "--config", cfg)
	b := startChild(t, nil, "--config", cfg)
	lb := startBalancer(t, a.api, b.api)
	waitForCond(t, "both ready at the balancer", func() bool { return lb.isReady(a.api) && lb.isReady(b.api) })

	client := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var stop atomic.Bool
	var ok, failed atomic.Int64
	var firstErr atomic.Value
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; i < 5000 && !stop.Load(); i++ {
				stream := ""
				if (w+i)%2 == 0 {
					stream = `"stream":true,`
				}
				body := fmt.Sprintf(`{"model":"m",%s"max_tokens":6,"messages":[{"role":"user","content":"w%d q%d"}]}`, stream, w, i)
				resp, err := client.Post("http://"+lb.ln.Addr().String()+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err == nil {
					var rb []byte
					rb, err = io.ReadAll(resp.Body)
					resp.Body.Close()
					if err == nil && (resp.StatusCode != 200 || (stream != "" && !strings.Contains(string(rb), "[DONE]"))) {
						err = fmt.Errorf("status %d: %.200s", resp.StatusCode, rb)
					}
				}
				if err != nil {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, err.Error())
					continue
				}
				ok.Add(1)
			}
		})
	}
	finish := func() {
		stop.Store(true)
		wg.Wait()
	}
	defer finish()
	waitForCond(t, "both serving", func() bool { return lb.servedBy(a.api) > 5 && lb.servedBy(b.api) > 5 })

	if err := a.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitForCond(t, "the balancer sees the draining instance not ready", func() bool { return !lb.isReady(a.api) })
	if err := a.wait(t); err != nil {
		t.Fatalf("drained instance exited %v\n%s", err, a.stderr())
	}
	a2 := startChild(t, nil, "--config", cfg)
	lb.add(a2.api)
	waitForCond(t, "the restarted instance serving", func() bool { return lb.servedBy(a2.api) > 5 })
	finish()

	if n := lb.refused.Load(); n != 0 {
		t.Errorf("the balancer met %d refused connections", n)
	}
	if n := failed.Load(); n != 0 {
		t.Errorf("%d of %d requests failed across the restart; first: %v", n, n+ok.Load(), firstErr.Load())
	}
	t.Logf("%d requests, %d via the drained instance, %d via the other, %d via the restarted one",
		ok.Load()+failed.Load(), lb.servedBy(a.api), lb.servedBy(b.api), lb.servedBy(a2.api))
	a.checkJSONLogs(t)
	var sawDrain bool
	a.mu.Lock()
	for _, l := range a.lines {
		if m, _ := l["msg"].(string); strings.HasPrefix(m, "draining: listener closed") {
			sawDrain = true
		}
	}
	a.mu.Unlock()
	if !sawDrain {
		t.Errorf("no drain log line:\n%s", a.stderr())
	}
	for _, c := range []*child{b, a2} {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
	}
}

// holdingEngine answers health checks and scrapes, and holds every chat
// stream open after its first event until the client (the router) leaves.
func holdingEngine(t *testing.T) (addr string, streams *atomic.Int64) {
	t.Helper()
	streams = &atomic.Int64{}
	mux := http.NewServeMux()
	mux.HandleFunc("/health", func(w http.ResponseWriter, _ *http.Request) {})
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n")
	})
	mux.HandleFunc("/v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		streams.Add(1)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"first\"}}]}\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), streams
}

// TestSdNotifyAndSecondSignal: under a service manager ($NOTIFY_SOCKET, a
// unix datagram socket here) serve sends READY=1 after its first health
// round and STOPPING=1 when SIGTERM begins the drain; readiness then fails
// while the listener still serves. A second SIGTERM, while the drain delay
// and drain timeout (an hour each) are pending and a stream is in flight,
// stops it at once: exit status 1, the stream cut.
func TestSdNotifyAndSecondSignal(t *testing.T) {
	engine, streams := holdingEngine(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "notify.sock")
	nc, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	msgs := make(chan string, 8)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := nc.Read(buf)
			if err != nil {
				return
			}
			msgs <- string(buf[:n])
		}
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case m := <-msgs:
			return m
		case <-time.After(30 * time.Second): // hang guard
			t.Fatalf("no %s notification", what)
			return ""
		}
	}
	cfg := filepath.Join(dir, "warmpath.yaml")
	if err := os.WriteFile(cfg, []byte("shutdown: {drain_delay: 1h}\ndrain_timeout: 1h\nhealth: {interval: 100ms, timeout: 100ms}\nreplicas:\n  - {address: "+engine+", models: [m]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := startChild(t, []string{"NOTIFY_SOCKET=" + sock}, "--config", cfg)
	if m := next("READY"); m != "READY=1" {
		t.Fatalf("first notification %q, want READY=1", m)
	}
	// READY=1 follows the first health round whatever it found (a fleet
	// whose engines are all down must still start); readiness follows health.
	waitForCond(t, "ready", func() bool { st, _ := getStatus(t, "http://"+c.api+"/readyz"); return st == 200 })
	resp, err := testClient.Post("http://"+c.api+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hold"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	first := make([]byte, 6)
	if _, err := io.ReadFull(resp.Body, first); err != nil || streams.Load() != 1 {
		t.Fatalf("stream did not begin: %v", err)
	}

	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if m := next("STOPPING"); m != "STOPPING=1" {
		t.Fatalf("notification after SIGTERM %q, want STOPPING=1", m)
	}
	waitForCond(t, "readiness failing", func() bool { st, _ := getStatus(t, "http://"+c.api+"/readyz"); return st == 503 })
	if st, _ := getStatus(t, "http://"+c.admin+"/livez"); st != 200 {
		t.Fatalf("livez while draining: %d", st)
	}
	if err := c.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	err = c.wait(t)
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Fatalf("after a second SIGTERM: %v, want exit status 1\n%s", err, c.stderr())
	}
	rest, _ := io.ReadAll(resp.Body)
	if strings.Contains(string(rest), "[DONE]") {
		t.Fatalf("the held stream completed: %q", rest)
	}
	if !strings.Contains(c.stderr(), "second signal") {
		t.Errorf("no second-signal log line:\n%s", c.stderr())
	}
	c.checkJSONLogs(t)
}

func getStatus(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := testClient.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
