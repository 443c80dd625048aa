package slowpath_test

import (
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/slowpath"
)

// soakFor is the soak's load duration: `go test ./slowpath -run TestSoakChurn
// -soak=3m` (make soak) or WARMPATH_SOAK=3m. The default keeps the CI suite,
// which runs it under -race, short.
var soakFor = flag.Duration("soak", 0, "TestSoakChurn load duration (default 10s, or $WARMPATH_SOAK)")

func soakDuration(t *testing.T) time.Duration {
	t.Helper()
	if *soakFor > 0 {
		return *soakFor
	}
	if v := os.Getenv("WARMPATH_SOAK"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("WARMPATH_SOAK=%q: want a positive duration (e.g. 3m)", v)
		}
		return d
	}
	return 10 * time.Second
}

// latHist is a fixed-size latency histogram (5% wide buckets from 100 us):
// its memory does not grow with the soak's length, so the heap check
// measures the router, not the test.
type latHist struct {
	mu sync.Mutex
	n  [400]int64
}

const latBase, latStep = 100 * time.Microsecond, 1.05

func (h *latHist) add(d time.Duration) {
	i := 0
	if d > latBase {
		i = min(len(h.n)-1, int(math.Log(float64(d)/float64(latBase))/math.Log(latStep))+1)
	}
	h.mu.Lock()
	h.n[i]++
	h.mu.Unlock()
}

// quantile returns the upper bound of the bucket holding quantile q.
func (h *latHist) quantile(q float64) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	var total int64
	for _, c := range h.n {
		total += c
	}
	want := int64(math.Ceil(q * float64(total)))
	var acc int64
	for i, c := range h.n {
		acc += c
		if acc >= want && c > 0 {
			return time.Duration(float64(latBase) * math.Pow(latStep, float64(i)))
		}
	}
	return 0
}

// routerCount counts the router's completed proxied requests (the Observer
// seam sees each exactly once, broken streams included). requests_total
// cannot be summed for this: a removed replica's series are deleted.
type routerCount struct {
	n      atomic.Int64
	broken atomic.Int64
}

func (c *routerCount) ObserveRouted(ev *slowpath.RoutedEvent) {
	c.n.Add(1)
	if !ev.OK {
		c.broken.Add(1)
	}
}

// TestSoakChurn: 32 concurrent streaming clients for a bounded time
// (soakDuration: 10 s by default, `make soak` runs 3 min without -race) while
// the replica set churns (a config reload adds or removes one replica every
// second) and one engine restarts every 3 s. Every request is accounted for
// by the client, the router and the engines; the heap after a GC at the end
// is within a small factor of the heap after warm-up; goroutine leaks fail
// the package in TestMain (goleak). p99 is logged, not asserted.
func TestSoakChurn(t *testing.T) {
	if testing.Short() {
		t.Skip("soak: skipped in -short")
	}
	const (
		clients = 32
		warm    = 2 * time.Second
	)
	load := soakDuration(t) // bounded: by default the whole test stays under ~15 s
	engines := startEngines(t, 4, func(c *enginesim.Config) {
		c.NumGPUBlocks = 2000 // the engines' caches fill during warm-up: their memory is flat after it
	})
	cfgFile := filepath.Join(t.TempDir(), "warmpath.yaml")
	writeCfg := func(eng []*enginesim.Server) {
		t.Helper()
		var b strings.Builder
		b.WriteString("listen: 127.0.0.1:0\nadmin: 127.0.0.1:0\nreload_interval: 20ms\nhealth: {interval: 200ms, timeout: 200ms}\nscrape: {interval: 50ms, timeout: 50ms, stale_after: 500ms}\npassive: {eject_time: 100ms, max_eject_time: 400ms}\nreplicas:\n")
		for _, en := range eng {
			fmt.Fprintf(&b, "  - address: %s\n    models: [%s]\n", en.Addr(), e2eModel)
		}
		tmp := cfgFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfgFile); err != nil {
			t.Fatal(err)
		}
	}
	// engines[0] is always configured and is the one restarted; 1..3 churn.
	set := []*enginesim.Server{engines[0], engines[1], engines[2]}
	writeCfg(set)
	s, err := slowpath.StartFromFile(cfgFile, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	rc := &routerCount{}
	s.Observer = rc
	url := serve(t, s)

	var (
		stop             atomic.Bool
		sent, ok, failed atomic.Int64
		lats             latHist
		wg               sync.WaitGroup
	)
	for w := range clients {
		wg.Go(func() {
			for i := 0; i < 100_000_000 && !stop.Load(); i++ {
				sent.Add(1)
				start := time.Now()
				// A few shared system prompts: some cache reuse, many prefixes.
				r := doChat(t, url, chatJSON(fmt.Sprintf("tenant %d says %d", w%4, i), true, 8))
				d := time.Since(start)
				if r.complete() {
					ok.Add(1)
					lats.add(d)
					continue
				}
				failed.Add(1)
				if r.status != 200 || r.done {
					// Anything but a visibly cut stream is a real failure.
					t.Errorf("client %d request %d: %+v", w, i, r)
				}
			}
		})
	}

	heap := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	var heapWarm uint64
	var reloads, restarts int
	deadline := time.Now().Add(load)
	started := time.Now()
	tick := time.NewTicker(time.Second)
	churn := []*enginesim.Server{engines[3], engines[1], engines[2]} // add 3, remove 1, add 1, remove 2, ...
	for sec := 1; time.Now().Before(deadline); sec++ {
		<-tick.C
		if heapWarm == 0 && time.Since(started) >= warm {
			heapWarm = heap()
		}
		en := churn[(sec-1)%len(churn)]
		if i := slices.Index(set, en); i >= 0 {
			set = slices.Delete(set, i, i+1)
		} else {
			set = append(set, en)
		}
		writeCfg(set)
		reloads++
		if sec%3 == 0 {
			engines[0].Restart()
			restarts++
		}
	}
	tick.Stop()
	stop.Store(true)
	wg.Wait()
	heapEnd := heap()

	// Accounting. Every request the client sent got an answer or a visibly
	// cut stream; the router observed each exactly once; every complete
	// answer was produced by exactly one engine.
	if ok.Load()+failed.Load() != sent.Load() {
		t.Fatalf("client: sent %d, ok %d, failed %d", sent.Load(), ok.Load(), failed.Load())
	}
	waitCond(t, "router finished every request", func() bool { return rc.n.Load() == sent.Load() })
	var served int64
	for _, en := range engines {
		served += en.Served(e2eModel)
	}
	if served != ok.Load() {
		t.Fatalf("engines served %d complete answers, clients got %d (lost or duplicated)", served, ok.Load())
	}
	if rc.broken.Load() != failed.Load() {
		t.Fatalf("router saw %d broken streams, clients %d", rc.broken.Load(), failed.Load())
	}
	if failed.Load() > int64(restarts*clients) {
		t.Fatalf("%d failed requests, more than the %d restarts could cut", failed.Load(), restarts)
	}
	// Memory: flat after warm-up (a leak of even a few hundred bytes per
	// request would exceed this over tens of thousands of requests).
	if heapWarm == 0 || heapEnd > 2*heapWarm {
		t.Fatalf("heap after warm-up %d B, at the end %d B: not flat", heapWarm, heapEnd)
	}
	p := func(q float64) time.Duration { return lats.quantile(q).Round(10 * time.Microsecond) }
	t.Logf("soak: %d clients, %v, %d requests (%d complete, %d cut by %d engine restarts), %d config reloads, engines served %d, p50 %v p99 %v p99.9 %v (5%% buckets), heap %d KiB -> %d KiB",
		clients, load, sent.Load(), ok.Load(), failed.Load(), restarts, reloads, served, p(0.5), p(0.99), p(0.999), heapWarm>>10, heapEnd>>10)
}
