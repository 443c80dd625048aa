package slowpath

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/valyala/fasthttp"
)

// holdLlama is a llama.cpp-like engine (startFakeLlama) whose chat
// answers wait until the test releases them, one per release, in arrival
// order.
type holdLlama struct {
	addr    string
	got     atomic.Int32  // chat requests received
	release chan struct{} // one answer per value; closed at cleanup
	// plain makes the next answer holdPlainAnswer
	plain atomic.Bool
}

// holdPlainAnswer is a chat answer whose llama.cpp timings report a
// second of decoding and no prompt processing: the router measures a 1 s
// slot time from it and learns no engine prefill rate.
const holdPlainAnswer = `{"id":"w","object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi."},"finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":2,"total_tokens":6},"timings":{"predicted_n":2,"predicted_ms":1000}}`

func startHoldLlama(t *testing.T) *holdLlama {
	t.Helper()
	f := &holdLlama{release: make(chan struct{})}
	chat := llamaSample(t, "chat.json")
	var order sync.Mutex
	f.addr = startFakeLlamaWith(t, func(ctx *fasthttp.RequestCtx) {
		order.Lock()
		f.got.Add(1)
		<-f.release
		order.Unlock()
		ctx.SetContentType("application/json")
		if f.plain.CompareAndSwap(true, false) {
			ctx.SetBodyString(holdPlainAnswer)
			return
		}
		ctx.SetBody(chat)
	}).addr
	// Registered after the server's: runs first, so no answer is left
	// waiting when the server shuts down.
	t.Cleanup(func() { close(f.release) })
	return f
}

// holdRig is two holdLlama engines behind a router that has measured a
// slot time (a short warm-up request answered), the first two requests of
// a long company prompt computing it on one engine each, and a third held
// at the router for the first engine's slot (startHoldRig).
type holdRig struct {
	s       *Server
	e       [2]*holdLlama
	first   int            // the engine of the first request
	answers chan holdReply // the first two requests' answers
	third   net.Conn       // the held request's client connection
	base    [2]int32       // each engine's requests before the first (a warm-up's)
	access  string         // the access log
}

type holdReply struct {
	status int
	body   string
}

func (g *holdRig) got() int32 { return g.e[0].got.Load() + g.e[1].got.Load() }

func holdBody(q string) string {
	company := strings.Repeat("Our company policy says so. ", 585) // 16 KiB: 4,096 tokens
	return `{"model":"m","messages":[{"role":"system","content":"` + company + `"},{"role":"user","content":"` + q + `"}]}`
}

func startHoldRig(t *testing.T) *holdRig {
	t.Helper()
	g := &holdRig{e: [2]*holdLlama{startHoldLlama(t), startHoldLlama(t)}, answers: make(chan holdReply, 2)}
	cfg := testConfig(g.e[0].addr, g.e[1].addr)
	for i := range cfg.Replicas {
		// 4,096 prompt tokens take 2 s to compute.
		cfg.Replicas[i].PrefillTokensPerSec = 2000
	}
	g.access = filepath.Join(t.TempDir(), "access.log")
	cfg.Log = LogConfig{Format: LogFormatJSON, Access: g.access}
	var url string
	g.s, url = newTestServer(t, cfg)
	for _, x := range g.e {
		waitFor(t, "slots from /props", func() bool {
			st := replicaStatus(t, g.s, x.addr)
			return st.Affinity != nil && st.Affinity.BatchSlots == 2 && st.Affinity.CacheModel == "slots"
		})
	}
	sendBody := func(body string) {
		go func() {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				g.answers <- holdReply{0, err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			g.answers <- holdReply{resp.StatusCode, string(b)}
		}()
	}
	send := func(q string) { sendBody(holdBody(q)) }
	// A request that ends gives the router a measured slot time (1 s, from
	// its answer's timings): holds are priced on measured ones only. The
	// engines' prefill stays priced at the configured rate.
	g.e[0].plain.Store(true)
	g.e[1].plain.Store(true)
	sendBody(`{"model":"m","messages":[{"role":"user","content":"Hello?"}]}`)
	waitFor(t, "the warm-up request at an engine", func() bool { return g.got() == 1 })
	warm := 0
	if g.e[1].got.Load() == 1 {
		warm = 1
	}
	g.e[warm].release <- struct{}{}
	if a := <-g.answers; a.status != http.StatusOK {
		t.Fatalf("warm-up: %d %s", a.status, a.body)
	}
	g.e[1-warm].plain.Store(false)
	base := [2]int32{g.e[0].got.Load(), g.e[1].got.Load()}
	gotNew := func() int32 { return g.got() - base[0] - base[1] }
	// The first two compute the prompt, one on each engine: the second
	// finds the other engine idle, where computing it is faster than
	// waiting for the first's slot.
	send("What is the travel policy?")
	waitFor(t, "the first request at an engine", func() bool { return gotNew() == 1 })
	if g.e[1].got.Load() > base[1] {
		g.first = 1
	}
	send("How many holidays do we have?")
	waitFor(t, "the second request at the other engine", func() bool { return g.e[1-g.first].got.Load() == base[1-g.first]+1 })
	// The third waits at the router for the first engine's slot.
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	body := holdBody("Who approves expenses?")
	if _, err := c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)); err != nil {
		t.Fatal(err)
	}
	g.third = c
	waitFor(t, "the third request held", func() bool {
		return replicaStatus(t, g.s, g.e[g.first].addr).Affinity.HeldRequests == 1
	})
	if n := gotNew(); n != 2 {
		t.Fatalf("%d requests reached the engines while the third is held, want 2", n)
	}
	g.base = base
	return g
}

// TestSlotHoldWaitsForWarmSlot: in front of two llama.cpp engines (each
// slot keeps only its own prompt), a third request with a long company
// prompt that both engines are computing for the first two is held at
// the router (routing.slot_hold) instead of computing the prompt a third
// time beside one of them, shows in /debug/replicas as held, and goes to
// the engine whose slot frees first once its request ends, where that
// slot holds the prompt. Without holds it goes to an engine at once.
func TestSlotHoldWaitsForWarmSlot(t *testing.T) {
	g := startHoldRig(t)
	e, first := g.e, g.first
	// The first answers: its slot frees with the prompt in it, and the
	// held request goes there.
	e[first].release <- struct{}{}
	waitFor(t, "the held request at the first engine", func() bool { return e[first].got.Load()-g.base[first] == 2 })
	if n := e[1-first].got.Load() - g.base[1-first]; n != 1 {
		t.Fatalf("the other engine got %d requests, want 1", n)
	}
	if st := replicaStatus(t, g.s, e[first].addr); st.Affinity.HeldRequests != 0 {
		t.Fatalf("held requests %d after the slot freed, want 0", st.Affinity.HeldRequests)
	}
	e[first].release <- struct{}{}
	e[1-first].release <- struct{}{}
	for range 2 {
		if a := <-g.answers; a.status != 200 {
			t.Fatalf("answer %d: %s", a.status, a.body)
		}
	}
	resp, err := http.ReadResponse(bufio.NewReader(g.third), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("held request: status %d", resp.StatusCode)
	}
	// The access log says which request waited, how long, for which
	// replica and how the wait ended; the others carry no hold fields.
	var held []map[string]any
	waitFor(t, "4 access log lines (the warm-up's too)", func() bool {
		raw, _ := os.ReadFile(g.access)
		n := 0
		held = held[:0]
		for l := range bytes.Lines(raw) {
			var m map[string]any
			if json.Unmarshal(l, &m) == nil && m["msg"] == "request" {
				n++
				_, ms := m["held_ms"]
				_, on := m["held_on"]
				if ms || on {
					held = append(held, m)
				}
			}
		}
		return n == 4
	})
	if len(held) != 1 {
		t.Fatalf("%d access log lines with hold fields, want the held request's: %v", len(held), held)
	}
	if h := held[0]; !(h["held_ms"].(float64) > 0) || h["holds"] != 1.0 || h["held_on"] != e[first].addr ||
		h["hold_end"] != "woken" || h["replica"] != e[first].addr || !(h["hold_promised_tokens"].(float64) > 0) ||
		!(h["hold_wait_ms"].(float64) > 0) || !(h["hold_gain_ms"].(float64) > 0) {
		t.Fatalf("held request's line %v: want held_ms > 0, 1 hold on %s ended woken with a promise, a predicted wait and gain, served there", h, e[first].addr)
	}
	m := scrapeMetrics(t, g.s)
	if !strings.Contains(m, `warmpath_slowpath_slot_holds_total{outcome="woken"} 1`) {
		t.Fatalf("metrics lack one woken hold:\n%s", grepLines(m, "slot_hold"))
	}
	if !strings.Contains(m, "warmpath_slowpath_slot_hold_seconds_count 1") {
		t.Fatalf("metrics lack the held request's time:\n%s", grepLines(m, "slot_hold"))
	}
}

// TestSlotHoldClientLeaves: a held request whose client leaves stops
// waiting: it is no longer counted as held, reaches no engine, and the
// hold counts as client_gone; the others are answered.
func TestSlotHoldClientLeaves(t *testing.T) {
	g := startHoldRig(t)
	g.third.Close()
	waitFor(t, "the hold to end", func() bool {
		return replicaStatus(t, g.s, g.e[g.first].addr).Affinity.HeldRequests == 0
	})
	m := scrapeMetrics(t, g.s)
	if !strings.Contains(m, `warmpath_slowpath_slot_holds_total{outcome="client_gone"} 1`) {
		t.Fatalf("metrics lack the client_gone hold:\n%s", grepLines(m, "slot_hold"))
	}
	g.e[0].release <- struct{}{}
	g.e[1].release <- struct{}{}
	for range 2 {
		if a := <-g.answers; a.status != 200 {
			t.Fatalf("answer %d: %s", a.status, a.body)
		}
	}
	if n := g.got() - g.base[0] - g.base[1]; n != 2 {
		t.Fatalf("%d requests reached the engines, want 2 (the held one's client left)", n)
	}
}
