package slowpath

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
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
}

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
		ctx.SetBody(chat)
	}).addr
	// Registered after the server's: runs first, so no answer is left
	// waiting when the server shuts down.
	t.Cleanup(func() { close(f.release) })
	return f
}

// TestSlotHoldWaitsForWarmSlot: in front of two llama.cpp engines (each
// slot keeps only its own prompt), a third request with a long company
// prompt that both engines are computing for the first two is held at
// the router (routing.slot_hold) instead of computing the prompt a third
// time beside one of them, shows in /debug/replicas as held, and goes to
// the engine whose slot frees first once its request ends, where that
// slot holds the prompt. Without holds it goes to an engine at once.
func TestSlotHoldWaitsForWarmSlot(t *testing.T) {
	e := [2]*holdLlama{startHoldLlama(t), startHoldLlama(t)}
	cfg := testConfig(e[0].addr, e[1].addr)
	for i := range cfg.Replicas {
		// 4,096 prompt tokens take 2 s to compute.
		cfg.Replicas[i].PrefillTokensPerSec = 2000
	}
	access := filepath.Join(t.TempDir(), "access.log")
	cfg.Log = LogConfig{Format: LogFormatJSON, Access: access}
	s, url := newTestServer(t, cfg)
	for _, x := range e {
		waitFor(t, "slots from /props", func() bool {
			st := replicaStatus(t, s, x.addr)
			return st.Affinity != nil && st.Affinity.BatchSlots == 2 && st.Affinity.CacheModel == "slots"
		})
	}
	company := strings.Repeat("Our company policy says so. ", 585) // 16 KiB: 4,096 tokens
	body := func(q string) string {
		return `{"model":"m","messages":[{"role":"system","content":"` + company + `"},{"role":"user","content":"` + q + `"}]}`
	}
	type answer struct {
		status int
		body   string
	}
	answers := make(chan answer, 3)
	send := func(q string) {
		go func() {
			resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body(q)))
			if err != nil {
				answers <- answer{0, err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- answer{resp.StatusCode, string(b)}
		}()
	}
	got := func() int32 { return e[0].got.Load() + e[1].got.Load() }
	// The first two compute the prompt, one on each engine: the second
	// finds the other engine idle, where computing it is faster than
	// waiting for the first's slot.
	send("What is the travel policy?")
	waitFor(t, "the first request at an engine", func() bool { return got() == 1 })
	first := 0
	if e[1].got.Load() == 1 {
		first = 1
	}
	send("How many holidays do we have?")
	waitFor(t, "the second request at the other engine", func() bool { return e[1-first].got.Load() == 1 })
	// The third waits at the router for the first engine's slot.
	send("Who approves expenses?")
	waitFor(t, "the third request held", func() bool {
		return replicaStatus(t, s, e[first].addr).Affinity.HeldRequests == 1
	})
	if n := got(); n != 2 {
		t.Fatalf("%d requests reached the engines while the third is held, want 2", n)
	}
	// The first answers: its slot frees with the prompt in it, and the
	// held request goes there.
	e[first].release <- struct{}{}
	waitFor(t, "the held request at the first engine", func() bool { return e[first].got.Load() == 2 })
	if n := e[1-first].got.Load(); n != 1 {
		t.Fatalf("the other engine got %d requests, want 1", n)
	}
	if st := replicaStatus(t, s, e[first].addr); st.Affinity.HeldRequests != 0 {
		t.Fatalf("held requests %d after the slot freed, want 0", st.Affinity.HeldRequests)
	}
	e[first].release <- struct{}{}
	e[1-first].release <- struct{}{}
	for range 3 {
		if a := <-answers; a.status != 200 {
			t.Fatalf("answer %d: %s", a.status, a.body)
		}
	}
	// The access log says which request waited, and how long.
	var held []float64
	waitFor(t, "3 access log lines", func() bool {
		raw, _ := os.ReadFile(access)
		n := 0
		held = held[:0]
		for l := range bytes.Lines(raw) {
			var m map[string]any
			if json.Unmarshal(l, &m) == nil && m["msg"] == "request" {
				n++
				if h, ok := m["held_ms"].(float64); ok {
					held = append(held, h)
				}
			}
		}
		return n == 3
	})
	if len(held) != 1 || held[0] <= 0 {
		t.Fatalf("held_ms %v in the access log, want one request's", held)
	}
	m := scrapeMetrics(t, s)
	if !strings.Contains(m, `warmpath_slowpath_slot_holds_total{outcome="woken"} 1`) {
		t.Fatalf("metrics lack one woken hold:\n%s", grepLines(m, "slot_hold"))
	}
	if !strings.Contains(m, "warmpath_slowpath_slot_hold_seconds_count 1") {
		t.Fatalf("metrics lack the held request's time:\n%s", grepLines(m, "slot_hold"))
	}
}
