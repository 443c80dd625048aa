package slowpath

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/bench/workload"
)

func TestRecorderWritesAnalyzableSample(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sample.jsonl")
	rec, err := NewRecorder(path, 10, 64, nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen int
	counter := ObserverFunc(func(*RoutedEvent) { seen++ })
	obs := Observers{nil, rec, counter}
	// 3 groups x 4 requests: 4 shared blocks, then 1 own block and a partial tail
	for i := range 12 {
		g := uint64(i % 3)
		hashes := []uint64{g*100 + 1, g*100 + 2, g*100 + 3, g*100 + 4, 1000 + uint64(i)}
		obs.ObserveRouted(&RoutedEvent{Model: []byte("m"), Hashes: hashes, PromptTokens: 5*64 + 10,
			Start: int64(1e9 + i*int(1e6))})
	}
	obs.ObserveRouted(&RoutedEvent{Model: []byte("m"), PromptTokens: 8}) // embeddings: no hashes, not recorded
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	rec.ObserveRouted(&RoutedEvent{Model: []byte("m"), Hashes: []uint64{1}, PromptTokens: 64}) // after Close: ignored, no panic
	if seen != 13 {
		t.Fatalf("fan-out reached the second observer %d times", seen)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 10 {
		t.Fatalf("%d lines, want the limit 10:\n%s", n, b)
	}
	if strings.Contains(string(b), "content") {
		t.Fatal("sample carries prompt text")
	}
	w, err := workload.LoadMooncake(path, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Requests) != 10 || w.Requests[0].Model != "m" || w.Requests[0].PromptTokens() != 5*64+10 {
		t.Fatalf("read back %d requests, first %+v", len(w.Requests), w.Requests[0])
	}
	if w.Requests[9].Arrival != 9e6 {
		t.Fatalf("last arrival %d ns, want 9ms after the first", w.Requests[9].Arrival)
	}
	reuse, total := workload.Reuse(w)
	// 10 requests over 3 groups: 7 repeat their group's 4 shared blocks (256 tokens)
	if reuse != 7*256 || total != 10*(5*64+10) {
		t.Fatalf("reuse %d of %d tokens", reuse, total)
	}
}

// TestRecorderKeysHashes: the file's hash_ids are keyed (HMAC under the
// recorder's own random key), not the router's hashes, which anyone can
// compute for a guessed prompt; two recorders key differently, equal hashes
// stay equal within one file.
func TestRecorderKeysHashes(t *testing.T) {
	dir := t.TempDir()
	ids := func(name string) [][]uint64 {
		path := filepath.Join(dir, name)
		rec, err := NewRecorder(path, 10, 64, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 2 {
			rec.ObserveRouted(&RoutedEvent{Model: []byte("m"), Hashes: []uint64{11, 22}, PromptTokens: 128, Start: 1})
		}
		if err := rec.Close(); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var out [][]uint64
		for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
			var m struct {
				HashIDs []uint64 `json:"hash_ids"`
			}
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Fatal(err)
			}
			out = append(out, m.HashIDs)
		}
		return out
	}
	a, b := ids("a.jsonl"), ids("b.jsonl")
	if len(a) != 2 || len(a[0]) != 2 || a[0][0] != a[1][0] || a[0][1] != a[1][1] {
		t.Fatalf("equal hashes must give equal ids within a file: %v", a)
	}
	if a[0][0] == 11 || a[0][1] == 22 {
		t.Fatalf("router hashes written as is: %v", a[0])
	}
	if a[0][0] == b[0][0] {
		t.Fatal("two recorders used the same key")
	}
}
