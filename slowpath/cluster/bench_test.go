package cluster

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/warmpath/warmpath/affinity"
)

// BenchmarkSink: the cost one routed request adds for its peers (the
// PeerSink records of Begin, FirstToken and End, and its share of a
// batch's encoding), side by side with the same request routed alone.
// The request's prompt is 17 blocks (a 1088-token prompt).
func BenchmarkSink(b *testing.B) {
	for _, on := range []bool{false, true} {
		b.Run(fmt.Sprintf("sink=%v", on), func(b *testing.B) {
			r := newRouter(b, affinity.Config{})
			n, err := newNode(Options{Config: testCfg("nats://127.0.0.1:1", "a"), Router: r, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			n.connected.Store(true)
			if on {
				r.SetPeerSink(n)
			}
			reqs := make([]*affinity.Request, 64)
			for i := range reqs {
				reqs[i] = req(chain(i+1, 17))
			}
			var d affinity.Decision
			var f affinity.Flight
			var bytes, batches, i int
			b.ReportAllocs()
			for b.Loop() {
				q := reqs[i%len(reqs)]
				if err := r.Decide(q, &d); err != nil {
					b.Fatal(err)
				}
				r.Begin(d.Ranked[0], q, &d, &f)
				r.FirstToken(&f, 2)
				r.End(&f, 3, -1, true)
				i++
				if on && i%16 == 0 { // a batch per 16 requests (a 5ms flush at 3200 req/s)
					out, _ := n.encodeBatch(false, 1)
					bytes += len(out)
					batches++
				}
			}
			if on && i >= 16 {
				b.ReportMetric(float64(bytes)/float64(batches*16), "wire-B/req")
			}
		})
	}
}

// BenchmarkApplyBatch: decoding and applying one peer batch of reqs
// requests (each an insert of 17 blocks and three load records, coalesced
// per replica as the sender does).
func BenchmarkApplyBatch(b *testing.B) {
	for _, reqs := range []int{1, 16, 128} {
		b.Run(fmt.Sprintf("requests=%d", reqs), func(b *testing.B) {
			ra, rb := newRouter(b, affinity.Config{}), newRouter(b, affinity.Config{}, 2, 1, 0)
			a, err := newNode(Options{Config: testCfg("nats://127.0.0.1:1", "a"), Router: ra, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			rcv, err := newNode(Options{Config: testCfg("nats://127.0.0.1:1", "b"), Router: rb, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			a.connected.Store(true)
			ra.SetPeerSink(a)
			for i := range reqs {
				var f affinity.Flight
				ra.Begin(affinity.ReplicaID(i%3), req(chain(i+1, 17)), nil, &f)
				ra.FirstToken(&f, 2)
				ra.End(&f, 3, -1, true)
			}
			now := time.Now()
			batch, _ := a.encodeBatch(false, now.UnixNano())
			batch = append([]byte(nil), batch...)
			b.SetBytes(int64(len(batch)))
			b.ReportAllocs()
			for b.Loop() {
				rcv.applyBatch(batch, now)
			}
		})
	}
}
