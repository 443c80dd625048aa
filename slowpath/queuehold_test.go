package slowpath

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// guardServer is a fair queue with the prefill guard (headroom 1) in
// front of two step engines of two slots each, and tenants flood and
// quiet.
func guardServer(t *testing.T) (*stepEngines, *Server, string) {
	t.Helper()
	return guardServerWith(t, 2, 2, 1, 1)
}

// guardServerWith is guardServer with n engines of slots each and the
// guard's headroom and headroom_min.
func guardServerWith(t *testing.T, n, slots, headroom, least int) (*stepEngines, *Server, string) {
	t.Helper()
	e := startStepEngines(t, n)
	cfg := testConfig(e.addrs...)
	for i := range cfg.Replicas {
		cfg.Replicas[i].MaxInFlight = slots
	}
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	writeKeys(t, keys, "keys:\n"+keyEntry("sk-flood", "flood", "")+keyEntry("sk-quiet", "quiet", ""))
	cfg.Tenants.KeysFile = keys
	cfg.Tenants.Queue.Enabled = true
	cfg.Tenants.Queue.Headroom = headroom
	cfg.Tenants.Queue.HeadroomMin = least
	cfg.Tenants.Queue.ActiveWindow = time.Minute
	s, base := newTestServer(t, cfg)
	// One request first: the router serves (its shutdown at cleanup
	// waits for a Serve that has begun).
	if r := tpost(t, base, "sk-quiet", "{"); r.status != 400 {
		t.Fatalf("bad JSON: status %d", r.status)
	}
	return e, s, base
}

// guardPlace is decideFair's part for one exchange once its turn came:
// active, ranked, placed (its slot held).
func guardPlace(t *testing.T, s *Server, ex *exchange) bool {
	t.Helper()
	s.fq.arrived(ex)
	if err := ex.decide(); err != nil {
		t.Fatal(err)
	}
	ok := s.fq.place(ex)
	if ok {
		s.fq.dispatched(ex)
	}
	return ok
}

// TestPrefillGuardHeadroomMin: one replica of six slots, headroom 2. The
// quiet tenant runs one request (past its first token) and the flood
// three (its share), all past their first token: two slots are free.
// With headroom_min 1 the guard counts the quiet request as part of the
// headroom and the flood's fourth takes one of the two; with
// headroom_min 2 both stay free for a burst of the quiet tenant.
func TestPrefillGuardHeadroomMin(t *testing.T) {
	for _, tc := range []struct {
		least      int
		floodPlace bool
	}{{1, true}, {2, false}} {
		t.Run(fmt.Sprintf("headroom_min=%d", tc.least), func(t *testing.T) {
			_, s, _ := guardServerWith(t, 1, 6, 2, tc.least)
			var all []*exchange
			start := func(ten, tag string) bool {
				ex := guardExchange(t, s, ten, tag)
				all = append(all, ex)
				ok := guardPlace(t, s, ex)
				if ok {
					s.fq.prefilled(ex) // its first token came
				}
				return ok
			}
			if !start("quiet", "tag-q1") {
				t.Fatal("the quiet request held back")
			}
			for i := 1; i <= 3; i++ {
				if !start("flood", fmt.Sprintf("tag-f%d", i)) {
					t.Fatalf("flood %d within its share held back", i)
				}
			}
			if got := start("flood", "tag-f4"); got != tc.floodPlace {
				t.Fatalf("flood 4 over its share placed %v, want %v (in flight %d of 6)", got, tc.floodPlace, inFlightAll(s))
			}
			for _, ex := range all {
				s.putExchange(ex)
			}
			if !guardIdle(s) {
				t.Fatalf("slots left held: in flight %d", inFlightAll(s))
			}
		})
	}
}

// guardExchange is a parsed streamed chat request of tenant ten, as
// route hands it to forward.
func guardExchange(t *testing.T, s *Server, ten, tag string) *exchange {
	t.Helper()
	ex := s.getExchange()
	ex.start = s.now()
	ex.ep = epChat
	if err := ex.parser.ParseChat([]byte(streamBody(tag)), &ex.prompt); err != nil {
		t.Fatal(err)
	}
	ex.model = append(ex.model[:0], ex.prompt.Model...)
	ex.ten.name = ten
	ex.req.Model, ex.req.Hashes, ex.req.PromptTokens = ex.model, ex.prompt.Hashes, ex.prompt.Tokens
	return ex
}

// inFlightAll is the router's requests in flight over every replica, as
// affinity counts them (the count TryBegin checks).
func inFlightAll(s *Server) int {
	n := 0
	for _, r := range *s.table.Load() {
		if r != nil {
			n += int(r.inFlight())
		}
	}
	return n
}

// guardIdle reports whether the guard's books are empty: nothing pending,
// running or in flight.
func guardIdle(s *Server) bool {
	q := s.fq
	q.mu.Lock()
	defer q.mu.Unlock()
	running := 0
	for _, m := range q.running {
		for _, n := range m {
			running += n
		}
	}
	return len(q.pending) == 0 && running == 0 && inFlightAll(s) == 0
}

// TestPrefillGuardHoldsPlacedSlot: requests placed one after another,
// before any of them reaches its attempt, each see the slots and pending
// prefills of those placed before them. The flood (over its share of the
// four slots once the quiet tenant is active) is placed on at most one
// clean replica and then held back: without the slot taken at placement
// every placement would see four free slots and no prefill, and the
// flood would fill the headroom. The quiet tenant's request is placed on
// the replica kept for it, skips the flood's queued request (ahead), and
// every slot held by a request that never made its attempt is given back
// when the exchange ends.
func TestPrefillGuardHoldsPlacedSlot(t *testing.T) {
	_, s, _ := guardServer(t)
	q := s.fq
	place := func(ex *exchange) bool { t.Helper(); return guardPlace(t, s, ex) }
	quiet := guardExchange(t, s, "quiet", "tag-q1")
	q.arrived(quiet) // the quiet tenant is active: the flood's share is 2 of 4

	var placed []*exchange
	for i := 1; i <= 3; i++ {
		ex := guardExchange(t, s, "flood", fmt.Sprintf("tag-f%d", i))
		if place(ex) {
			placed = append(placed, ex)
		} else if i <= 2 {
			t.Fatalf("flood %d within its share held back", i)
		}
	}
	f4 := guardExchange(t, s, "flood", "tag-f4")
	if place(f4) {
		t.Fatalf("flood 4 placed after %d others: the headroom kept for the quiet tenant is filled", len(placed))
	}
	for i, ex := range placed {
		if ex.ten.held == nil || ex.ten.pendOn != ex.ten.held {
			t.Fatalf("flood %d placed without its slot held (held %v, pending on %v)", i+1, ex.ten.held, ex.ten.pendOn)
		}
		if got := ex.dec.Ranked[0]; got != ex.ten.held.id {
			t.Fatalf("flood %d: held replica %d is not first in its ranking %v", i+1, ex.ten.held.id, ex.dec.Ranked)
		}
	}
	if f4.ten.held != nil || inFlightAll(s) != len(placed) {
		t.Fatalf("flood 4 held back but holds %v (in flight %d)", f4.ten.held, inFlightAll(s))
	}
	w, ok := q.push(f4) // it waits its turn
	if !ok {
		t.Fatal("flood 4 not queued")
	}
	if q.ahead(guardExchange(t, s, "flood", "tag-f5")) {
		t.Fatal("the flood's next request skips its own tenant's queue")
	}
	if !q.ahead(quiet) {
		t.Fatal("the quiet tenant's request does not skip the flood's queued work")
	}
	if !place(quiet) {
		t.Fatal("the quiet tenant's request held back")
	}
	r := quiet.ten.held
	q.mu.Lock()
	for _, p := range q.pending[r] {
		if p != quiet && p.ten.heavy {
			t.Errorf("the quiet request was placed beside the flood's held-back prefill %s", p.prompt.Model)
		}
	}
	q.mu.Unlock()

	// Ends without an attempt: every held slot goes back.
	if !q.remove(w) {
		t.Fatal("flood 4 not in the queue")
	}
	s.putExchange(f4)
	for _, ex := range append(placed, quiet) {
		s.putExchange(ex)
	}
	if !guardIdle(s) {
		t.Fatalf("after every exchange ended: in flight %d, pending %d, running %v", inFlightAll(s), len(q.pending), q.running)
	}
}

// TestPrefillGuardHoldReleased: a slot the guard took at placement is
// released on every way an exchange ends: a retried 503 (the next replica
// in its own slot, the answer passed on), a connection reset before any
// byte (retried), the client leaving before its first token, and a
// success. After each, nothing is in flight, pending or running, and
// both tenants are served again (no stalled queue).
func TestPrefillGuardHoldReleased(t *testing.T) {
	e, s, base := guardServer(t)
	idle := func(what string) {
		t.Helper()
		waitFor(t, what+": the guard's books empty", func() bool { return guardIdle(s) })
	}

	// Retried 503 on both replicas: the client gets the last one.
	e.reply("tag-503a", 503)
	if r := tpost(t, base, "sk-quiet", streamBody("tag-503a")); r.status != 503 {
		t.Fatalf("503 on every replica: status %d: %s", r.status, r.body)
	}
	if n := e.count("tag-503a"); n != 2 {
		t.Fatalf("the 503 reached %d replicas, want 2 (retried once)", n)
	}
	idle("after a retried 503")

	// A reset before any byte on the first replica tried, then the second
	// answers.
	e.reply("tag-rst", -1)
	e.finish("tag-rst")
	if r := tpost(t, base, "sk-flood", streamBody("tag-rst")); r.status != 200 {
		t.Fatalf("reset then retried: status %d: %s", r.status, r.body)
	}
	idle("after a reset and a retry")

	// The client leaves while the engine holds its first token.
	c, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := streamBody("tag-gone")
	fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer sk-quiet\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	waitFor(t, "the leaving client's request at an engine", func() bool { return e.arrived("tag-gone") })
	_ = c.Close()
	idle("after the client left")
	e.finish("tag-gone")

	// Both tenants are served again.
	for _, k := range []string{"sk-flood", "sk-quiet"} {
		tag := "tag-ok-" + k
		e.finish(tag)
		if r := tpost(t, base, k, streamBody(tag)); r.status != 200 {
			t.Fatalf("%s after the failures: status %d: %s", k, r.status, r.body)
		}
	}
	idle("after two successes")
}
