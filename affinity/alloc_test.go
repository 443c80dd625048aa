package affinity

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
)

// TestZeroAllocs: once warm, parsing, hashing, deciding and the flight
// calls allocate nothing, for every policy and endpoint.
func TestZeroAllocs(t *testing.T) {
	bodies := []struct {
		name  string
		body  []byte
		parse func(p *Parser, b []byte, out *Prompt) error
	}{
		{"chat", chatBody("m", longSystem, "first", "answer", "second"), (*Parser).ParseChat},
		{"chat parts and tools", []byte(`{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"system","content":"` +
			longSystem + `"},{"role":"user","content":[{"type":"text","text":"hi"},{"type":"image_url","image_url":{"url":"u"}}]}]}`), (*Parser).ParseChat},
		{"completion", []byte(`{"model":"m","prompt":"` + longSystem + `"}`), (*Parser).ParseCompletion},
		{"completion ids", []byte(`{"model":"m","prompt":[1,2,3,4,5,6,7,8,9]}`), (*Parser).ParseCompletion},
		{"embedding", []byte(`{"model":"m","input":"abc"}`), (*Parser).ParseEmbedding},
	}
	type variant struct {
		name string
		cfg  Config
		sink bool // a PeerSink is set (scale-out)
	}
	var variants []variant
	for _, pol := range PolicyNames() {
		variants = append(variants, variant{pol, Config{Policy: pol}, false})
	}
	variants = append(variants, variant{"cost-sampled", Config{MaxScan: 4}, false}, variant{"cost-peer-sink", Config{}, true})
	for _, vr := range variants {
		for _, b := range bodies {
			t.Run(vr.name+"/"+b.name, func(t *testing.T) {
				r, _ := newTestRouter(t, vr.cfg, 16)
				if vr.sink {
					r.SetPeerSink(nopSink{})
				}
				p := NewParser(r.HashConfig())
				var (
					pr  Prompt
					req Request
					d   Decision
					f   Flight
				)
				now := int64(1)
				run := func() {
					if err := b.parse(p, b.body, &pr); err != nil {
						t.Fatal(err)
					}
					now++
					req = Request{Model: pr.Model, Hashes: pr.Hashes, PromptTokens: pr.Tokens, SessionKey: 7, Now: now}
					if err := r.Decide(&req, &d); err != nil {
						t.Fatal(err)
					}
					r.Begin(d.Ranked[0], &req, &d, &f)
					r.FirstToken(&f, now)
					r.End(&f, now, pr.Tokens/2, true)
				}
				for range 10 {
					run()
				}
				if n := testing.AllocsPerRun(100, run); n != 0 {
					t.Fatalf("%v allocs per request", n)
				}
			})
		}
	}
}

// TestConcurrentRouting runs Decide/Begin/FirstToken/End from many
// goroutines while replicas are added, removed, drained, reset and fed
// signals. Run with -race. At the end every flight has ended, so every
// remaining replica must be idle and the index consistent.
func TestConcurrentRouting(t *testing.T) {
	r, _ := newTestRouter(t, Config{}, 8)
	const workers, perWorker = 6, 300
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 9))
			p := NewParser(r.HashConfig())
			var (
				pr Prompt
				d  Decision
				f  Flight
			)
			for i := range perWorker {
				body := chatBody("m", strings.Repeat(fmt.Sprintf("sys%d ", rng.IntN(5)), 100), fmt.Sprintf("q%d", rng.IntN(50)))
				if err := p.ParseChat(body, &pr); err != nil {
					t.Error(err)
					return
				}
				req := Request{Model: pr.Model, Hashes: pr.Hashes, PromptTokens: pr.Tokens, SessionKey: uint64(rng.IntN(20) + 1), Now: int64(i)}
				if err := r.Decide(&req, &d); err != nil {
					continue // ErrNoReplica while everything is drained/removed
				}
				r.Begin(d.Ranked[0], &req, &d, &f)
				if rng.IntN(4) > 0 {
					r.FirstToken(&f, int64(i)+1)
				}
				r.End(&f, int64(i)+2, rng.IntN(pr.Tokens+1), rng.IntN(5) > 0)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		rng := rand.New(rand.NewPCG(99, 9))
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			name := fmt.Sprintf("x%d", rng.IntN(6))
			if id, ok := r.Lookup(name); ok {
				switch rng.IntN(5) {
				case 0:
					r.RemoveReplica(id)
				case 1:
					r.SetDraining(id, rng.IntN(2) == 0)
				case 2:
					r.ResetCache(id)
				case 3:
					r.SetSignals(id, EngineSignals{Waiting: rng.IntN(5), KVUsage: rng.Float64(), KVCapacityTokens: 64 * (1 + rng.IntN(100)), At: int64(i)})
				case 4:
					r.SetHealthy(id, rng.IntN(2) == 0)
				}
			} else {
				_, _ = r.AddReplica(ReplicaSpec{Name: name, Models: []string{"m"}, MaxInFlight: 1 + rng.IntN(3)})
			}
			_ = r.Replicas()
			_ = r.Stats()
		}
	}()
	// Stop the churn once the workers are done.
	done := make(chan struct{})
	go func() {
		defer close(done)
		for r.Stats().Decisions < workers*perWorker/2 {
			select {
			case <-stop:
				return
			default:
			}
			_ = r.Models()
		}
	}()
	<-done
	close(stop)
	wg.Wait()
	for _, st := range r.Replicas() {
		if st.InFlight != 0 || st.PendingPrefillTokens != 0 {
			t.Fatalf("replica %s not idle after all flights ended: %+v", st.Name, st)
		}
	}
	checkIndex(t, r.idx)
}

// nopSink is a PeerSink that keeps nothing: what the Router itself costs
// to feed one.
type nopSink struct{}

func (nopSink) PeerInsert(ReplicaID, []uint64)      {}
func (nopSink) PeerTruncate(ReplicaID, uint64, int) {}
func (nopSink) PeerReset(ReplicaID)                 {}
func (nopSink) PeerLoad(ReplicaID, PeerLoad)        {}
