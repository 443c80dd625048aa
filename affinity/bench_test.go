package affinity

import (
	"fmt"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

var benchSizes = []struct {
	name string
	n    int
}{{"1KiB", 1 << 10}, {"32KiB", 32 << 10}, {"1MiB", 1 << 20}}

// BenchmarkHash: chained block hashing throughput; twins: the same chain with
// one xxh3.Hash call per block (chained-xxh3, the reference), and the same
// bytes as one xxh3 call, no blocks.
func BenchmarkHash(b *testing.B) {
	b.Logf("hash path %s (cpu: %s)", HashPath(), CPUFeatures())
	for _, sz := range benchSizes {
		data := []byte(strings.Repeat("The quick brown fox jumps over the lazy dog. ", sz.n/45+1)[:sz.n])
		dst := make([]uint64, 0, sz.n/256)
		b.Run("chained/"+sz.name, func(b *testing.B) {
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			cpuPerOp(b, func() { dst = AppendHashes(dst[:0], 1, data, 256) })
		})
		b.Run("chained-xxh3/"+sz.name, func(b *testing.B) {
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			cpuPerOp(b, func() { dst = appendHashesRef(dst[:0], 1, data, 256) })
		})
		b.Run("xxh3-oneshot/"+sz.name, func(b *testing.B) {
			b.SetBytes(int64(sz.n))
			b.ReportAllocs()
			var s uint64
			for b.Loop() {
				s += xxh3.Hash(data)
			}
			_ = s
		})
	}
}

// BenchmarkParse: canonicalize + hash a chat body (ParseChat: the scanner);
// twin: the same body through fastjson's parse tree.
func BenchmarkParse(b *testing.B) {
	for _, sz := range benchSizes {
		body := chatBody("m", strings.Repeat("You are a helpful assistant. ", sz.n/29+1)[:sz.n], "question")
		p := NewParser(HashConfig{})
		var pr Prompt
		b.Run(sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpuPerOp(b, func() {
				if err := p.ParseChat(body, &pr); err != nil {
					b.Fatal(err)
				}
			})
		})
		b.Run("fastjson/"+sz.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			cpuPerOp(b, func() {
				if err := p.parseChatJSON(body, &pr); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// benchRouter builds n replicas; every 8th holds the first half of the
// request's prefix, so the lookup has work to do, and every replica carries
// some load.
func benchRouter(b *testing.B, policy string, n int, req *Request) *Router {
	b.Helper()
	cfg := Config{Policy: policy}
	if policy == "cost-exact" {
		cfg = Config{MaxScan: -1}
	}
	r, err := NewRouter(cfg)
	if err != nil {
		b.Fatal(err)
	}
	for i := range n {
		id, err := r.AddReplica(ReplicaSpec{Name: fmt.Sprintf("r%d", i), Models: []string{"m"}})
		if err != nil {
			b.Fatal(err)
		}
		var f Flight
		for range i % 5 {
			r.Begin(id, &Request{Model: req.Model, PromptTokens: 100}, nil, &f)
		}
		if i%8 == 0 && len(req.Hashes) > 0 {
			half := *req
			half.Hashes = req.Hashes[:max(len(req.Hashes)/2, 1)]
			warm(r, id, &half)
		}
	}
	return r
}

func benchReq(b *testing.B, size int) (*Request, []byte) {
	b.Helper()
	body := chatBody("m", strings.Repeat("You are a helpful assistant. ", size/29+1)[:size], "question")
	p := NewParser(HashConfig{})
	var pr Prompt
	if err := p.ParseChat(body, &pr); err != nil {
		b.Fatal(err)
	}
	return &Request{Model: []byte("m"), Hashes: append([]uint64(nil), pr.Hashes...), PromptTokens: pr.Tokens, Now: 1}, body
}

// BenchmarkDecide: Decide alone (lookup + policy) for the cost policy
// (default MaxScan, and scoring every replica) and its round-robin twin,
// over replicas x prompt size; cpu-ns/op and min-ns/op as cpuPerOp.
func BenchmarkDecide(b *testing.B) {
	for _, pol := range []string{"cost", "cost-exact", "round-robin"} {
		for _, n := range []int{4, 64, 1024} {
			for _, sz := range benchSizes {
				req, _ := benchReq(b, sz.n)
				r := benchRouter(b, pol, n, req)
				b.Run(fmt.Sprintf("%s/replicas=%d/%s", pol, n, sz.name), func(b *testing.B) {
					b.ReportAllocs()
					var d Decision
					cpuPerOp(b, func() {
						if err := r.Decide(req, &d); err != nil {
							b.Fatal(err)
						}
					})
				})
			}
		}
	}
}

// BenchmarkDecideCold: Decide over eight routers of 1024 replicas in
// turn (32 KiB prompt, the cost policy), so that each decision finds the
// caches holding the other routers' state, as a proxy's decisions find them
// after the request bodies and the network between two of them.
func BenchmarkDecideCold(b *testing.B) {
	req, _ := benchReq(b, 32<<10)
	var rs []*Router
	for range 8 {
		rs = append(rs, benchRouter(b, "cost", 1024, req))
	}
	b.ReportAllocs()
	var d Decision
	i := 0
	cpuPerOp(b, func() {
		if err := rs[i%len(rs)].Decide(req, &d); err != nil {
			b.Fatal(err)
		}
		i++
	})
}

// BenchmarkDecideSharedPrefix: Decide at n replicas where every replica
// holds the request's first 8 blocks (a system prompt the whole fleet has
// served) and every 8th holds half the prompt.
func BenchmarkDecideSharedPrefix(b *testing.B) {
	for _, n := range []int{64, 1024, 4096} {
		req, _ := benchReq(b, 32<<10)
		r := benchRouter(b, "cost", n, req)
		for i := range n {
			sys := *req
			sys.Hashes = req.Hashes[:8]
			warm(r, ReplicaID(i), &sys)
		}
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			var d Decision
			cpuPerOp(b, func() {
				if err := r.Decide(req, &d); err != nil {
					b.Fatal(err)
				}
			})
		})
	}
}

// parseDecide is the proxy's decision from a raw chat body: ParseChat into
// pr, the Request q from it, Decide into d.
func parseDecide(b *testing.B, p *Parser, r *Router, body []byte, pr *Prompt, q *Request, d *Decision) {
	if err := p.ParseChat(body, pr); err != nil {
		b.Fatal(err)
	}
	*q = Request{Model: pr.Model, Hashes: pr.Hashes, PromptTokens: pr.Tokens, Now: 1}
	if err := r.Decide(q, d); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkFullDecision: canonicalize + hash + lookup + pick from the raw
// body, the per-request router cost in the proxy (Begin/End excluded).
func BenchmarkFullDecision(b *testing.B) {
	for _, n := range []int{4, 64, 1024} {
		for _, sz := range benchSizes {
			req, body := benchReq(b, sz.n)
			r := benchRouter(b, "cost", n, req)
			p := NewParser(r.HashConfig())
			b.Run(fmt.Sprintf("replicas=%d/%s", n, sz.name), func(b *testing.B) {
				b.ReportAllocs()
				var (
					pr Prompt
					q  Request
					d  Decision
				)
				cpuPerOp(b, func() { parseDecide(b, p, r, body, &pr, &q, &d) })
			})
		}
	}
}

// BenchmarkFlight: Begin (speculative insert of the whole chain) + FirstToken + End.
func BenchmarkFlight(b *testing.B) {
	for _, sz := range benchSizes {
		req, _ := benchReq(b, sz.n)
		r := benchRouter(b, "cost", 4, req)
		b.Run(sz.name, func(b *testing.B) {
			b.ReportAllocs()
			var f Flight
			for b.Loop() {
				r.Begin(0, req, nil, &f)
				r.FirstToken(&f, 2)
				r.End(&f, 3, -1, true)
			}
		})
	}
}

// BenchmarkLookup: longest-prefix lookup by binary search over the chain vs
// the linear walk (one probe per block), 64 replicas of which 16 hold
// prefixes of 4 different lengths.
func BenchmarkLookup(b *testing.B) {
	for _, blocks := range []int{4, 128, 4096} {
		x := newIndex()
		h := chainOf(1, 2, blocks, blocks)
		for id := range ReplicaID(64) {
			x.setCap(id, 1<<20)
			if id%4 == 0 {
				x.insert(id, h[:blocks*(1+int(id/4)%4)/4])
			}
		}
		for _, mode := range []string{"bsearch", "linear"} {
			b.Run(fmt.Sprintf("%s/blocks=%d", mode, blocks), func(b *testing.B) {
				b.ReportAllocs()
				var s matchSet
				for b.Loop() {
					s.reset(64)
					if mode == "bsearch" {
						x.longest(h, &s)
					} else {
						x.longestLinear(h, &s)
					}
				}
			})
		}
	}
}

// BenchmarkIndexMemory reports heap bytes per tracked (block, replica) pair
// with 1M pairs: unshared (every pair its own block) and shared (8 replicas
// hold the same blocks).
func BenchmarkIndexMemory(b *testing.B) {
	for _, shared := range []int{1, 8} {
		b.Run(fmt.Sprintf("holders=%d", shared), func(b *testing.B) {
			const pairs = 1 << 20
			var perPair float64
			for b.Loop() {
				var ms runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&ms)
				before := ms.HeapAlloc
				x := newIndex()
				reps := 8
				for id := range ReplicaID(reps) {
					x.setCap(id, pairs/reps)
				}
				buf := make([]uint64, 64)
				for i := 0; len(x.pairs) < pairs; i++ {
					prev := uint64(i / shared)
					for j := range buf {
						prev = chain(prev, uint64(j))
						buf[j] = prev
					}
					x.insert(ReplicaID(i%reps), buf)
				}
				runtime.GC()
				runtime.ReadMemStats(&ms)
				perPair = float64(ms.HeapAlloc-before) / float64(len(x.pairs))
				runtime.KeepAlive(x)
			}
			b.ReportMetric(perPair, "B/pair")
			b.ReportMetric(perPair*1e6/(1<<20), "MB/Mpairs")
		})
	}
}

// BenchmarkDecideParallel: Decide+Begin+End from all cores, 64 replicas,
// 32 KiB prompts (lock contention).
func BenchmarkDecideParallel(b *testing.B) {
	req, _ := benchReq(b, 32<<10)
	r := benchRouter(b, "cost", 64, req)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		var (
			d Decision
			f Flight
		)
		q := *req
		for pb.Next() {
			if err := r.Decide(&q, &d); err != nil {
				b.Fatal(err)
			}
			r.Begin(d.Ranked[0], &q, &d, &f)
			r.FirstToken(&f, 2)
			r.End(&f, 3, -1, true)
		}
	})
}

// cpuPerOp reports the process's CPU time (user + system, getrusage) per
// iteration beside ns/op: on a machine shared with other work, wall time
// counts the waits for a core, CPU time does not. min-ns/op is the fastest
// single iteration: the cost when nothing else ran on the core meanwhile.
func cpuPerOp(b *testing.B, f func()) {
	b.Helper()
	var r0, r1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r0)
	n := 0
	best := time.Duration(1<<63 - 1)
	for b.Loop() {
		t0 := time.Now()
		f()
		if d := time.Since(t0); d < best {
			best = d
		}
		n++
	}
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &r1)
	cpu := time.Duration(r1.Utime.Nano()+r1.Stime.Nano()-r0.Utime.Nano()-r0.Stime.Nano()) * time.Nanosecond
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(max(n, 1)), "cpu-ns/op")
	b.ReportMetric(float64(best.Nanoseconds()), "min-ns/op")
}

// BenchmarkLongPrompt: the routing work for one 400 KB (about 100k-token)
// chat prompt, replicas holding parts of it: parse (canonicalize + hash)
// and the full decision (parse + Decide) at 100 and 1024 replicas; the
// hash-only twin is the floor (the same bytes through AppendHashes).
func BenchmarkLongPrompt(b *testing.B) {
	const size = 400_000
	req, body := benchReq(b, size)
	canon := make([]byte, 0, size+64)
	p := NewParser(HashConfig{})
	var pr Prompt
	if err := p.ParseChat(body, &pr); err != nil {
		b.Fatal(err)
	}
	canon = append(canon, pr.Canonical...)
	b.Run("hash-only", func(b *testing.B) {
		b.SetBytes(int64(len(canon)))
		dst := make([]uint64, 0, len(canon)/256)
		cpuPerOp(b, func() { dst = AppendHashes(dst[:0], 1, canon, 256) })
	})
	b.Run("parse", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		cpuPerOp(b, func() {
			if err := p.ParseChat(body, &pr); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("parse-fastjson", func(b *testing.B) {
		b.SetBytes(int64(len(body)))
		b.ReportAllocs()
		cpuPerOp(b, func() {
			if err := p.parseChatJSON(body, &pr); err != nil {
				b.Fatal(err)
			}
		})
	})
	// prose and code: a newline escape every line, quotes now and then
	esc := chatBody("m", strings.Repeat("The \"router\" reads the prompt once; the engine renders it.\n\tif x { return }\n", size/60+1)[:size], "question")
	b.Run("parse-escaped", func(b *testing.B) {
		b.SetBytes(int64(len(esc)))
		b.ReportAllocs()
		cpuPerOp(b, func() {
			if err := p.ParseChat(esc, &pr); err != nil {
				b.Fatal(err)
			}
		})
	})
	b.Run("parse-escaped-fastjson", func(b *testing.B) {
		b.SetBytes(int64(len(esc)))
		b.ReportAllocs()
		cpuPerOp(b, func() {
			if err := p.parseChatJSON(esc, &pr); err != nil {
				b.Fatal(err)
			}
		})
	})
	for _, n := range []int{100, 1024} {
		r := benchRouter(b, "cost", n, req)
		b.Run(fmt.Sprintf("full/replicas=%d", n), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var (
				q Request
				d Decision
			)
			cpuPerOp(b, func() { parseDecide(b, p, r, body, &pr, &q, &d) })
		})
	}
}

// BenchmarkIndexInsertLong: one new 1,600-block chain (a 100k-token prompt
// at 64 tokens a block) inserted on a replica at capacity, so as many old
// blocks are evicted, in an index of 8 replicas x 256k blocks (2M pairs:
// tables far larger than the caches). The cost of Begin for a long prompt
// nobody sent before.
func BenchmarkIndexInsertLong(b *testing.B) {
	const reps, capBlocks, chainLen = 8, 256 << 10, 1600
	x := newIndex()
	for id := range ReplicaID(reps) {
		x.setCap(id, capBlocks)
		for c := 0; c < capBlocks/chainLen; c++ {
			x.insert(id, chainOf(uint64(id)<<32|uint64(c), 1, chainLen, chainLen))
		}
	}
	// Enough chains that each is evicted before its turn comes again.
	chains := make([][]uint64, 2*reps*capBlocks/chainLen)
	for i := range chains {
		chains[i] = chainOf(1<<60|uint64(i), 1, chainLen, chainLen)
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		x.insert(ReplicaID(i%reps), chains[i%len(chains)])
		i++
	}
}
