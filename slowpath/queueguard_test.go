package slowpath

import (
	"bufio"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// stepEngines are streaming engines whose every request the test moves
// on by hand: its first token is sent when the test calls prefill(tag),
// its end when the test calls finish(tag). They record the order in
// which requests arrived and on which engine.
type stepEngines struct {
	mu      sync.Mutex
	order   []string       // tags, in arrival order over all engines
	on      map[string]int // tag -> engine index
	steps   map[string]*engineStep
	replies map[string]int // tag -> a status to answer at once; -1: reset its first attempt
	addrs   []string
	servers []*fasthttp.Server
}

type engineStep struct{ first, done chan struct{} }

func startStepEngines(t *testing.T, n int) *stepEngines {
	t.Helper()
	e := &stepEngines{on: map[string]int{}, steps: map[string]*engineStep{}}
	for i := range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) { e.handle(ctx, i) }}
		go srv.Serve(ln) //nolint:errcheck
		e.addrs = append(e.addrs, ln.Addr().String())
		e.servers = append(e.servers, srv)
	}
	t.Cleanup(func() {
		e.mu.Lock()
		for _, st := range e.steps {
			closeOnce(st.first)
			closeOnce(st.done)
		}
		e.mu.Unlock()
		for _, s := range e.servers {
			_ = s.Shutdown()
		}
	})
	return e
}

func closeOnce(c chan struct{}) {
	select {
	case <-c:
	default:
		close(c)
	}
}

func (e *stepEngines) step(tag string) *engineStep {
	st := e.steps[tag]
	if st == nil {
		st = &engineStep{first: make(chan struct{}), done: make(chan struct{})}
		e.steps[tag] = st
	}
	return st
}

func (e *stepEngines) handle(ctx *fasthttp.RequestCtx, engine int) {
	switch string(ctx.Path()) {
	case "/health":
		ctx.SetBodyString("ok")
		return
	case "/metrics":
		ctx.SetStatusCode(404)
		return
	}
	body := string(ctx.PostBody())
	i := strings.Index(body, "tag-")
	if i < 0 {
		ctx.SetStatusCode(400)
		return
	}
	tag := body[i : i+strings.IndexAny(body[i:], " \"")]
	e.mu.Lock()
	e.order = append(e.order, tag)
	e.on[tag] = engine
	st := e.step(tag)
	reply, n := e.replies[tag], e.countLocked(tag)
	e.mu.Unlock()
	switch {
	case reply == -1 && n == 1:
		ctx.Hijack(func(c net.Conn) { _ = c.Close() }) // no byte of an answer
		return
	case reply > 0:
		ctx.SetStatusCode(reply)
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"error":{"message":"busy","type":"server_error","param":null,"code":null}}`)
		return
	}
	ctx.SetContentType("text/event-stream")
	ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
		wait := func(c chan struct{}) {
			select {
			case <-c:
			case <-time.After(10 * time.Second): // bounded: a failing test does not hang
			}
		}
		wait(st.first)
		fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"ok\"}}]}\n\n")
		_ = w.Flush()
		wait(st.done)
		fmt.Fprint(w, "data: {\"id\":\"x\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n")
		_ = w.Flush()
	})
}

// prefill sends tag's first token; finish ends its answer.
func (e *stepEngines) prefill(tag string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	closeOnce(e.step(tag).first)
}

func (e *stepEngines) finish(tag string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.step(tag)
	closeOnce(st.first)
	closeOnce(st.done)
}

// reply makes tag's requests answer status at once (-1: the first
// attempt's connection is closed before any byte).
func (e *stepEngines) reply(tag string, status int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.replies == nil {
		e.replies = map[string]int{}
	}
	e.replies[tag] = status
}

// count is how many of tag's requests arrived.
func (e *stepEngines) count(tag string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.countLocked(tag)
}

func (e *stepEngines) countLocked(tag string) int {
	n := 0
	for _, x := range e.order {
		if x == tag {
			n++
		}
	}
	return n
}

func (e *stepEngines) arrivals() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return slices.Clone(e.order)
}

func (e *stepEngines) arrived(tag string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.on[tag]
	return ok
}

func streamBody(tag string) string {
	return `{"model":"m","stream":true,"messages":[{"role":"user","content":"` + tag + ` hello"}],"max_tokens":8}`
}

// TestFairQueuePrefillGuard: two replicas of two slots, the prefill guard
// on (headroom 1). A tenant alone takes every slot. Once another tenant
// is active, a freed slot goes to the quiet tenant's queued request ahead
// of the flood's queued ones (within one release); the next freed slot is
// kept from the flood, so the quiet tenant's next request gets it at
// once instead of waiting for another release; when the quiet tenant
// leaves, the flood takes every slot again.
func TestFairQueuePrefillGuard(t *testing.T) {
	e := startStepEngines(t, 2)
	cfg := testConfig(e.addrs...)
	for i := range cfg.Replicas {
		cfg.Replicas[i].MaxInFlight = 2
	}
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	writeKeys(t, keys, "keys:\n"+keyEntry("sk-flood", "flood", "")+keyEntry("sk-quiet", "quiet", ""))
	cfg.Tenants.KeysFile = keys
	cfg.Tenants.Queue.Enabled = true
	cfg.Tenants.Queue.Headroom = 1
	cfg.Tenants.Queue.ActiveWindow = 300 * time.Millisecond
	s, base := newTestServer(t, cfg)

	res := make(chan tresp, 16)
	send := func(key, tag string) { go func() { res <- tpost(t, base, key, streamBody(tag)) }() }
	arrivedAll := func(tags ...string) func() bool {
		return func() bool {
			for _, tag := range tags {
				if !e.arrived(tag) {
					return false
				}
			}
			return true
		}
	}

	// The flood alone: every slot is used.
	for _, tag := range []string{"tag-f1", "tag-f2", "tag-f3", "tag-f4"} {
		send("sk-flood", tag)
	}
	waitFor(t, "the flood alone on all 4 slots", arrivedAll("tag-f1", "tag-f2", "tag-f3", "tag-f4"))
	for _, tag := range []string{"tag-f1", "tag-f2", "tag-f3", "tag-f4"} {
		e.prefill(tag) // decoding
	}
	send("sk-flood", "tag-f5")
	send("sk-flood", "tag-f6")
	waitFor(t, "the flood's next two queued", func() bool { return queued(s) == 2 })
	send("sk-quiet", "tag-q1")
	waitFor(t, "the quiet request queued", func() bool { return queued(s) == 3 })

	// One release: the slot goes to the quiet tenant.
	e.finish("tag-f1")
	waitFor(t, "the quiet request dispatched", arrivedAll("tag-q1"))
	if got := e.arrivals()[4]; got != "tag-q1" {
		t.Fatalf("after one release the engines got %q, want tag-q1 (arrivals %q)", got, e.arrivals())
	}
	// The next release: the flood is over its share and the freed slot is
	// the last one free, so it stays free for the quiet tenant.
	e.finish("tag-f2")
	for range 2 { // tag-f1's and tag-f2's answers
		if r := <-res; r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	send("sk-quiet", "tag-q2")
	waitFor(t, "the quiet tenant's second request dispatched at once", arrivedAll("tag-q2"))
	if got, want := strings.Join(e.arrivals()[4:], " "), "tag-q1 tag-q2"; got != want {
		t.Fatalf("arrivals after the flood's first four: %q, want %q", got, want)
	}
	if n := queued(s); n != 2 {
		t.Fatalf("queued %d, want the flood's two", n)
	}

	// The quiet tenant ends and leaves: the flood gets every slot back.
	for _, tag := range []string{"tag-q1", "tag-q2", "tag-f3", "tag-f4"} {
		e.finish(tag)
	}
	waitFor(t, "the flood's queued requests dispatched", arrivedAll("tag-f5", "tag-f6"))
	for _, tag := range []string{"tag-f5", "tag-f6"} {
		e.prefill(tag)
	}
	for range 4 {
		if r := <-res; r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
	time.Sleep(cfg.Tenants.Queue.ActiveWindow) // the quiet tenant is no longer active
	send("sk-flood", "tag-f7")
	send("sk-flood", "tag-f8")
	waitFor(t, "the flood alone again on all 4 slots", arrivedAll("tag-f7", "tag-f8"))
	for _, tag := range []string{"tag-f5", "tag-f6", "tag-f7", "tag-f8"} {
		e.finish(tag)
	}
	for range 4 {
		if r := <-res; r.status != 200 {
			t.Fatalf("status %d: %s", r.status, r.body)
		}
	}
}
