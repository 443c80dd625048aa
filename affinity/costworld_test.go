package affinity

import (
	"fmt"
	"math/rand/v2"
)

// costWorld drives a Router through random states with the public API
// only (replica specs, flights begun, first tokens, ends with and without
// hits, engine signals fresh and stale, peers' load, health, time passing)
// for tests that compare decisions: its sequence depends on its seed alone.
type costWorld struct {
	r       *Router
	rnd     *rand.Rand
	ids     []ReplicaID
	flights []*Flight
	chains  [][]uint64
	now     int64
}

// newCostWorld builds a Router of n replicas (models "m" and, for some,
// "m2" first: a second prefill pool) with a random configuration.
func newCostWorld(seed uint64, n int) (*costWorld, error) {
	rnd := rand.New(rand.NewPCG(seed, seed^0x5eed))
	cfg := Config{Seed: seed}
	switch rnd.IntN(4) {
	case 0:
		cfg.MaxScan = 8
	case 1:
		cfg.MaxScan = -1
	}
	cfg.MaxRanked = 1 + rnd.IntN(5)
	switch rnd.IntN(4) {
	case 0:
		cfg.LoadPenaltySeconds = -1
	case 1:
		cfg.LoadPenaltySeconds = 0.05
	}
	if rnd.IntN(3) == 0 {
		cfg.KVPenaltySeconds = -1
	}
	r, err := NewRouter(cfg)
	if err != nil {
		return nil, err
	}
	w := &costWorld{r: r, rnd: rnd, now: 1e9}
	for i := range n {
		spec := ReplicaSpec{Name: fmt.Sprintf("r%d", i), Models: []string{"m"}}
		if rnd.IntN(5) == 0 {
			spec.Models = []string{"m2", "m"}
		}
		switch rnd.IntN(4) {
		case 0:
			spec.Weight = 2
		case 1:
			spec.Weight = 0.5
		}
		if rnd.IntN(4) == 0 {
			spec.BatchSlots = 1 + rnd.IntN(4)
		}
		if rnd.IntN(5) == 0 {
			spec.PrefillTokensPerSec = float64(2000 + rnd.IntN(20000))
		}
		if rnd.IntN(8) == 0 {
			spec.MaxInFlight = 2 + rnd.IntN(4)
		}
		id, err := r.AddReplica(spec)
		if err != nil {
			return nil, err
		}
		w.ids = append(w.ids, id)
	}
	if rnd.IntN(6) == 0 {
		r.SetCacheOracle(worldOracle{})
	}
	for c := range 4 {
		w.chains = append(w.chains, chainOf(seed, uint64(c+1), 8*c, 64)) // chain c shares 8c blocks
	}
	return w, nil
}

// request returns a random request: a prefix of one of the chains, or
// none, with a prompt of at least its blocks.
func (w *costWorld) request() *Request {
	req := &Request{Model: []byte("m"), Now: w.now, Buffered: w.rnd.IntN(4) == 0}
	if w.rnd.IntN(5) > 0 {
		ch := w.chains[w.rnd.IntN(len(w.chains))]
		req.Hashes = ch[:1+w.rnd.IntN(len(ch))]
	}
	req.PromptTokens = len(req.Hashes)*64 + w.rnd.IntN(300)
	return req
}

// step changes the state at random, one event.
func (w *costWorld) step() {
	w.now += int64(w.rnd.IntN(400)) * 1e6
	id := w.ids[w.rnd.IntN(len(w.ids))]
	switch k := w.rnd.IntN(100); {
	case k < 30:
		f := new(Flight)
		if w.r.TryBegin(id, w.request(), nil, f) {
			w.flights = append(w.flights, f)
		}
	case k < 50 && len(w.flights) > 0:
		w.r.FirstToken(w.flights[w.rnd.IntN(len(w.flights))], w.now)
	case k < 70 && len(w.flights) > 0:
		i := w.rnd.IntN(len(w.flights))
		f := w.flights[i]
		o := Outcome{OK: w.rnd.IntN(6) > 0, CachedTokens: -1}
		if w.rnd.IntN(2) == 0 {
			o.CachedTokens = w.rnd.IntN(f.PromptTokens + 1)
		}
		if w.rnd.IntN(5) == 0 {
			o.PrefillTokens, o.PrefillSeconds, o.DecodeSeconds = f.PromptTokens, 0.01+w.rnd.Float64(), w.rnd.Float64()
		}
		w.r.EndWith(f, w.now, o)
		w.flights[i] = w.flights[len(w.flights)-1]
		w.flights = w.flights[:len(w.flights)-1]
	case k < 80:
		at := w.now - int64(w.rnd.IntN(3))*int64(8e9) // fresh, or older than SignalMaxAge
		s := EngineSignals{Waiting: w.rnd.IntN(6), Running: w.rnd.IntN(8), KVUsage: w.rnd.Float64(), At: at}
		if w.rnd.IntN(2) == 0 { // a KV capacity: the penalty prices the request's own tokens
			s.KVCapacityTokens = 1<<12 + w.rnd.IntN(1<<16)
		}
		if w.rnd.IntN(3) == 0 {
			s.BatchSlots = 1 + w.rnd.IntN(6)
		}
		w.r.SetSignals(id, s)
	case k < 88:
		l := PeerLoad{InFlight: int32(w.rnd.IntN(4)), PendingPrefillTokens: int32(w.rnd.IntN(3000)), PendingRequests: int32(w.rnd.IntN(3))}
		_ = w.r.ApplyPeer(w.rnd.IntN(3), []PeerUpdate{{Kind: PeerKindLoad, Replica: id, Load: l}})
	case k < 91:
		w.r.SetHealthy(id, w.rnd.IntN(4) > 0)
	case k < 93:
		w.r.SetDraining(id, w.rnd.IntN(3) == 0)
	}
}

// worldOracle answers a made-up but deterministic cached prefix: some
// replicas hold some of the prompt, a few claim more than it or less than 0.
type worldOracle struct{}

func (worldOracle) CachedTokens(id ReplicaID, req *Request) int {
	h := uint64(id)*0x9E3779B97F4A7C15 ^ uint64(len(req.Hashes))
	switch h % 5 {
	case 0:
		return 0
	case 1:
		return -3
	case 2:
		return req.PromptTokens + 7
	}
	return int(h>>40) % (req.PromptTokens + 1)
}
