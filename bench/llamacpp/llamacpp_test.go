package llamacpp

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/internal/child"
	"github.com/warmpath/warmpath/bench/workload"
)

var update = flag.Bool("update", false, "rewrite testdata/ from a live llama-server")

func TestArgs(t *testing.T) {
	tests := []struct {
		name string
		opts Options
		want string
	}{
		{"defaults", Options{Root: "/r"},
			"/r taskset -c 1 llama-server -m /opt/warmpath/tiny.gguf --host 127.0.0.1 --port 9000 -np 4 -c 32768 --no-kv-unified -t 1 -tb 1 --metrics --slots --no-webui"},
		{"alias and extra flags", Options{Root: "/r", Slots: 2, CtxPerSlot: 1024, Threads: 2, Alias: "m", Args: []string{"--cache-ram", "0"}},
			"/r taskset -c 1 llama-server -m /opt/warmpath/tiny.gguf --host 127.0.0.1 --port 9000 -np 2 -c 2048 --no-kv-unified -t 2 -tb 2 --metrics --slots --no-webui --alias m --cache-ram 0"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := strings.Join(tt.opts.args(9000, 1), " "); got != tt.want {
				t.Fatalf("args\n got %s\nwant %s", got, tt.want)
			}
		})
	}
}

func TestRootFromEnv(t *testing.T) {
	t.Setenv("WARMPATH_LLAMA_ROOT", "")
	if Root() != DefaultRoot {
		t.Fatalf("Root() = %q, want %q", Root(), DefaultRoot)
	}
	t.Setenv("WARMPATH_LLAMA_ROOT", "/elsewhere")
	if Root() != "/elsewhere" {
		t.Fatalf("Root() = %q", Root())
	}
}

// startFleet runs Setup and Start for a test (root only: CI runs as root,
// so a skip there would hide the real-engine coverage) and asserts at
// cleanup that no server's process group outlived Stop.
func startFleet(t testing.TB, o Options) *Fleet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: debootstrap and chroot (CI runs as root)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if _, err := SetupWith(ctx, testWriter{t}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var pids []int
	child.OnStart = func(pid int) { mu.Lock(); pids = append(pids, pid); mu.Unlock() }
	f, err := Start(ctx, o)
	child.OnStart = nil
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		f.Stop()
		for _, pid := range pids {
			if alive(pid) {
				t.Errorf("llama-server pid %d alive after Stop", pid)
			}
		}
	})
	return f
}

// alive: /proc/pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(b), "\n"))
	return len(b), nil
}

// TestFleet starts two servers and checks what they report matches the
// options: slots, per-slot context, the alias.
func TestFleet(t *testing.T) {
	f := startFleet(t, Options{N: 2, Slots: 2, CtxPerSlot: 2048, Alias: "tiny"})
	if len(f.Addrs()) != 2 || f.Addrs()[0] == f.Addrs()[1] {
		t.Fatalf("addrs %v", f.Addrs())
	}
	for _, a := range f.Addrs() {
		var props struct {
			TotalSlots int `json:"total_slots"`
			Gen        struct {
				NCtx int `json:"n_ctx"`
			} `json:"default_generation_settings"`
			Alias string `json:"model_alias"`
		}
		getJSON(t, "http://"+a+"/props", &props)
		if props.TotalSlots != 2 || props.Gen.NCtx != 2048 || props.Alias != "tiny" {
			t.Fatalf("%s /props: %+v", a, props)
		}
		var slots []map[string]any
		getJSON(t, "http://"+a+"/slots", &slots)
		if len(slots) != 2 {
			t.Fatalf("%s /slots: %d slots", a, len(slots))
		}
	}
	if err := f.Failure(); err != nil {
		t.Fatal(err)
	}
	f.Stop()
	f.Stop() // idempotent
}

// TestStartPortTaken: a server whose port was taken between FreeAddr and
// its bind (here held by a listener of the test's) starts again on another
// port, and the one that failed leaves nothing running.
func TestStartPortTaken(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	taken, picks := ln.Addr().String(), 0
	f := startFleet(t, Options{N: 1, Slots: 1, CtxPerSlot: 512, freeAddr: func() (string, error) {
		if picks++; picks == 1 {
			return taken, nil
		}
		return child.FreeAddr()
	}})
	if picks != 2 || len(f.Addrs()) != 1 || f.Addrs()[0] == taken {
		t.Fatalf("%d port picks, addrs %v (taken %s); want 2 picks and another port", picks, f.Addrs(), taken)
	}
	getJSON(t, "http://"+f.Addrs()[0]+"/props", &struct{}{})
	if err := f.Failure(); err != nil {
		t.Fatal(err)
	}
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	b := get(t, url)
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v: %s", url, err, b)
	}
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v: %s", url, resp.StatusCode, err, b)
	}
	return b
}

func post(t testing.TB, url, body string) (int, []byte) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, b
}

// TestCapture asks a live server for each testdata sample and checks that
// its shape (JSON key paths, metric names, SSE event layout) is the
// committed one, so a llama.cpp upgrade that changes what the parsers read
// fails here. -update rewrites testdata/ from the live answers.
func TestCapture(t *testing.T) {
	f := startFleet(t, Options{N: 1, Slots: 2, CtxPerSlot: 8192})
	base := "http://" + f.Addrs()[0]
	sys := string(workload.AppendSegment(nil, workload.Segment{ID: 1, Tokens: 1024}))
	chat := func(q uint64, extra string) string {
		user := string(workload.AppendSegment(nil, workload.Segment{ID: 100 + q, Tokens: 32}))
		return fmt.Sprintf(`{"model":"tiny","messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":8%s}`, sys, user, extra)
	}
	got := map[string][]byte{}
	got["props.json"] = get(t, base+"/props")
	got["slots-idle.json"] = get(t, base+"/slots")
	got["models.json"] = get(t, base+"/v1/models")
	post(t, base+"/v1/chat/completions", chat(0, "")) // the cold request: the captured ones reuse its prefix
	_, got["chat.json"] = post(t, base+"/v1/chat/completions", chat(1, ""))
	_, got["chat-stream.txt"] = post(t, base+"/v1/chat/completions", chat(2, `,"stream":true,"stream_options":{"include_usage":true}`))
	done := make(chan struct{})
	go func() { // a long answer keeps a slot busy while /slots and /metrics are read
		defer close(done)
		// ignore_eos: the random-weight model may sample its end of
		// sequence before the 50th token, and the slot is then never seen
		// decoding.
		post(t, base+"/v1/chat/completions", strings.Replace(chat(3, ""), `"max_tokens":8`, `"max_tokens":400,"ignore_eos":true`, 1))
	}()
	deadline := time.Now().Add(30 * time.Second)
poll:
	for time.Now().Before(deadline) {
		select {
		case <-done:
			break poll // the answer ended: no slot is decoding any more
		default:
		}
		b := get(t, base+"/slots")
		if decoding(t, b) {
			got["slots-busy.json"] = b
			got["metrics-busy.txt"] = get(t, base+"/metrics")
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	<-done
	if got["slots-busy.json"] == nil {
		t.Fatal("never saw a slot 50 tokens into an answer")
	}
	got["slots-used.json"] = get(t, base+"/slots")
	got["metrics.txt"] = get(t, base+"/metrics")
	long := string(workload.AppendSegment(nil, workload.Segment{ID: 2, Tokens: 9000}))
	code, b := post(t, base+"/v1/chat/completions", fmt.Sprintf(`{"model":"tiny","messages":[{"role":"user","content":%q}],"max_tokens":4}`, long))
	if code != http.StatusBadRequest {
		t.Fatalf("over-long prompt: status %d, want 400: %s", code, b)
	}
	got["error-context.json"] = b

	for name, b := range got {
		path := filepath.Join("testdata", name)
		if strings.HasSuffix(name, ".json") {
			b = indent(t, b)
		}
		if *update {
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update)", err)
		}
		if g, w := shape(t, name, b), shape(t, name, want); !slices.Equal(g, w) {
			t.Errorf("%s: shape changed (llama.cpp upgrade? rerun with -update and check the parsers)\n got %v\nwant %v", name, g, w)
		}
	}
}

// decoding: a slot of this /slots answer is generating (past its prefill),
// so the sample shows a slot's counters mid-answer.
func decoding(t *testing.T, b []byte) bool {
	var slots []struct {
		IsProcessing bool `json:"is_processing"`
		NextToken    []struct {
			NDecoded int `json:"n_decoded"`
		} `json:"next_token"`
	}
	if err := json.Unmarshal(b, &slots); err != nil {
		t.Fatalf("/slots: %v: %s", err, b)
	}
	for _, s := range slots {
		if s.IsProcessing && len(s.NextToken) > 0 && s.NextToken[0].NDecoded >= 50 {
			return true
		}
	}
	return false
}

// indent re-indents a JSON answer, keeping the engine's key order.
func indent(t *testing.T, b []byte) []byte {
	t.Helper()
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	return append(out.Bytes(), '\n')
}

// shape is a sample's structure without its values: JSON key paths (array
// elements merged), metric names, or per SSE event the key paths.
func shape(t *testing.T, name string, b []byte) []string {
	t.Helper()
	switch {
	case strings.HasSuffix(name, ".txt") && strings.HasPrefix(name, "metrics"):
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" && f[1] == "TYPE" {
				out = append(out, f[2]+" "+f[3])
			}
		}
		sort.Strings(out)
		return out
	case strings.HasSuffix(name, ".txt"): // SSE
		var out []string
		for _, l := range strings.Split(string(b), "\n") {
			d, ok := strings.CutPrefix(l, "data: ")
			if !ok {
				continue
			}
			if d == "[DONE]" {
				out = append(out, d)
				continue
			}
			out = append(out, strings.Join(keyPaths(t, []byte(d)), ","))
		}
		return slices.Compact(out) // one event per token: the count varies
	default:
		return keyPaths(t, b)
	}
}

func keyPaths(t *testing.T, b []byte) []string {
	t.Helper()
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	set := map[string]bool{}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				p := prefix + "." + k
				set[p] = true
				walk(p, e)
			}
		case []any:
			for _, e := range x {
				walk(prefix+"[]", e)
			}
		}
	}
	walk("", v)
	out := make([]string, 0, len(set))
	for k := range set {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
