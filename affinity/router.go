package affinity

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// Router holds the replica set, the prefix index and the load state, and
// answers Decide with the configured Policy. All methods are safe for
// concurrent use. Decide takes a read lock; Begin, and End when it corrects
// the index, take the write lock briefly; FirstToken and counter updates are
// atomic.
type Router struct {
	cfg      Config
	bt       int // tokens per block
	policy   Policy
	onBegin  BeginHook
	onRemove RemoveHook
	sink     PeerSink     // SetPeerSink; nil = single router
	tailSink PeerTailSink // sink, when it also takes finished tails

	mu     sync.RWMutex
	reps   []*replica // by ReplicaID; nil = free slot
	free   []ReplicaID
	byName map[string]ReplicaID
	groups map[string]*group
	idx    *index
	gen    uint32

	rnd    atomic.Uint64
	oracle atomic.Pointer[oracleBox] // SetCacheOracle; nil = the index answers
	// eligVersion changes whenever health, draining or membership changes;
	// groups cache their eligible list per version.
	eligVersion atomic.Uint64

	decisions     atomic.Uint64
	modelNotFound atomic.Uint64
	noReplica     atomic.Uint64
	mispredicts   atomic.Uint64
	rollbacks     atomic.Uint64
	promptTokens  atomic.Uint64
	cachedTokens  atomic.Uint64

	// tails remembers (block, replica) pairs that ended a finished request's
	// prompt: the engine's cache continues past such a block with the rest
	// of that prompt and its generated answer (see contCredit). A lossy
	// direct-mapped table of pairKey values (0 = empty): a collision only
	// forgets a credit.
	tails [tailSlots]atomic.Uint64
	// contCredit (float64 bits) is the EWMA of the cached tokens the engines
	// reported beyond the index's prediction on requests whose held prefix
	// ended at such a tail: what a continuation is worth (a chat's previous
	// answer), measured, so 0 where continuations do not pay.
	contCredit atomic.Uint64
	// slotSec (float64 bits) is the EWMA of every replica's slot-time
	// samples (ttft.go).
	slotSec atomic.Uint64
	// fleetPre: every replica's fitted prefill model, the prior of a
	// replica without samples of its own.
	fleetPre fleetPrefill
}

// tailSlots sizes Router.tails: 64K pairs, 512 KiB per Router.
const tailSlots = 1 << 16

// group is the set of replicas serving one model name.
type group struct {
	members  []ReplicaID
	hasLimit bool                     // some member has MaxInFlight: filter per call
	elig     atomic.Pointer[eligSnap] // cached eligible members when !hasLimit
	ring     atomic.Pointer[hashRing] // built on first use by the consistent-hash policy
}

type eligSnap struct {
	version uint64
	ids     []ReplicaID
	pos     []int32 // by ReplicaID: the index in ids, -1 for none
}

// eligible returns g's eligible members and, when they are a shared
// snapshot, each one's index in them by ReplicaID (nil otherwise). The
// results may be shared: do not modify them. scratch is used (and returned
// grown) when filtering per call.
func (r *Router) eligible(g *group, scratch []ReplicaID) (ids []ReplicaID, pos []int32, grown []ReplicaID) {
	if !g.hasLimit {
		ver := r.eligVersion.Load()
		if s := g.elig.Load(); s != nil && s.version == ver {
			return s.ids, s.pos, scratch
		}
		s := &eligSnap{version: ver}
		for _, id := range g.members {
			if r.reps[id].eligible() {
				s.ids = append(s.ids, id)
			}
		}
		if n := len(s.ids); n > 0 {
			s.pos = make([]int32, s.ids[n-1]+1)
			for i := range s.pos {
				s.pos[i] = -1
			}
			for i, id := range s.ids {
				s.pos[id] = int32(i)
			}
		}
		g.elig.Store(s)
		return s.ids, s.pos, scratch
	}
	scratch = scratch[:0]
	for _, id := range g.members {
		if r.reps[id].eligible() {
			scratch = append(scratch, id)
		}
	}
	return scratch, nil, scratch
}

type replica struct {
	// Hot: read for every candidate of every decision. The first cache line
	// holds what the cost policy reads when engine signals are stale.
	inFlight    atomic.Int64
	pending     atomic.Int64  // uncached prefill tokens routed, first token not seen
	rate        atomic.Uint64 // float64 bits: prefill tokens/s estimate
	sigAt       atomic.Int64  // 0 = never
	invWeight   float64       // 1 / weight
	maxInFlight int64         // 0 = unlimited
	healthy     atomic.Bool
	draining    atomic.Bool
	pendingReqs atomic.Int64  // requests routed, first token not seen
	uncachedAvg atomic.Uint64 // float64 bits: EWMA of uncached tokens per request
	sigWaiting  atomic.Int64
	sigRunning  atomic.Int64
	sigKV       atomic.Uint64 // float64 bits
	sigOwnBusy  atomic.Int64  // this router's and peers' in flight when the signals were set
	overhead    atomic.Uint64 // float64 bits: seconds to a first token besides prefill (rateFit intercept)

	id       ReplicaID
	gen      uint32
	spec     ReplicaSpec
	weight   float64
	capMax   int // index capacity in blocks (configured or signalled)
	capEff   int // current index capacity, lowered by mispredictions
	sigKVCap atomic.Int64

	mispredicts atomic.Uint64

	fitMu sync.Mutex // End's rate fit
	fit   rateFit
	model ttftModel // batch slots, slot time, prediction error (ttft.go)
	// fleetSlot is the Router's slotSec: every replica's slot-time samples,
	// the prior of a replica without its own.
	fleetSlot *atomic.Uint64
	// fleetPrefill is the Router's fleet prefill model (fleetPrefill): the
	// prior of a replica that has no rate of its own yet (fitted false).
	fleetPrefill *fleetPrefill
	fitted       atomic.Bool // a configured, engine-reported or fitted rate

	// Peers' load (peer.go): the sums over peer slots of peers[i], kept
	// apart from this router's own counters, which stay authoritative.
	peerInFlight    atomic.Int64
	peerPending     atomic.Int64
	peerPendingReqs atomic.Int64
	peers           []PeerLoad // by peer slot; written under Router.mu
}

func (p *replica) eligible() bool {
	return p.healthy.Load() && !p.draining.Load() &&
		(p.maxInFlight <= 0 || p.inFlight.Load() < p.maxInFlight)
}

func loadF(a *atomic.Uint64) float64     { return math.Float64frombits(a.Load()) }
func storeF(a *atomic.Uint64, f float64) { a.Store(math.Float64bits(f)) }

// ewma folds sample into a with weight w, lock-free.
func ewma(a *atomic.Uint64, sample, w float64) {
	for {
		old := a.Load()
		f := math.Float64frombits(old)
		n := f + w*(sample-f)
		if f == 0 {
			n = sample
		}
		if a.CompareAndSwap(old, math.Float64bits(n)) {
			return
		}
	}
}

// NewRouter validates cfg and returns an empty Router.
func NewRouter(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("affinity config: %w", err)
	}
	cfg = cfg.WithDefaults()
	pol, err := NewPolicy(cfg.Policy, cfg)
	if err != nil {
		return nil, err
	}
	r := &Router{
		cfg:    cfg,
		bt:     cfg.Hash.BlockTokens,
		policy: pol,
		byName: make(map[string]ReplicaID),
		groups: make(map[string]*group),
		idx:    newIndex(),
	}
	r.onBegin, _ = pol.(BeginHook)
	r.onRemove, _ = pol.(RemoveHook)
	r.rnd.Store(cfg.Seed)
	return r, nil
}

// Config returns the effective configuration (defaults filled in).
func (r *Router) Config() Config {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.cfg
}

// Retuner is a policy whose knobs follow Router.Retune.
type Retuner interface {
	Retune(cfg Config)
}

// Retune applies cfg's live fields (tagged reload:"live": signal_max_age,
// session_ttl, max_ranked, load_factor, load_penalty_seconds,
// kv_high_water, kv_penalty_seconds, max_scan) to the running router and
// its policy; decisions after it returns use them. The other fields are
// fixed at NewRouter (the hashing, the policy, the index sizing) and are
// ignored here. Index, load and sessions are kept.
func (r *Router) Retune(cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("affinity config: %w", err)
	}
	cfg = cfg.WithDefaults()
	r.mu.Lock()
	defer r.mu.Unlock()
	// Field by field: readers of the fixed fields (HashConfig) take no lock.
	r.cfg.SignalMaxAge = cfg.SignalMaxAge
	r.cfg.SessionTTL = cfg.SessionTTL
	r.cfg.MaxRanked = cfg.MaxRanked
	r.cfg.LoadFactor = cfg.LoadFactor
	r.cfg.LoadPenaltySeconds = cfg.LoadPenaltySeconds
	r.cfg.KVHighWater = cfg.KVHighWater
	r.cfg.KVPenaltySeconds = cfg.KVPenaltySeconds
	r.cfg.MaxScan = cfg.MaxScan
	if t, ok := r.policy.(Retuner); ok {
		t.Retune(r.cfg)
	}
	return nil
}

// HashConfig returns the hashing configuration parsers must use.
func (r *Router) HashConfig() HashConfig { return r.cfg.Hash }

// PolicyName is the name of the active policy.
func (r *Router) PolicyName() string { return r.policy.Name() }

func (r *Router) validSpec(spec *ReplicaSpec) error {
	switch {
	case spec.Name == "":
		return errors.New("replica name is empty")
	case len(spec.Models) == 0:
		return fmt.Errorf("replica %s: no models", spec.Name)
	case spec.Weight < 0 || math.IsNaN(spec.Weight) || math.IsInf(spec.Weight, 0):
		return fmt.Errorf("replica %s: weight %g: want >= 0", spec.Name, spec.Weight)
	case spec.KVCapacityTokens < 0:
		return fmt.Errorf("replica %s: kv capacity %d: want >= 0", spec.Name, spec.KVCapacityTokens)
	case spec.PrefillTokensPerSec < 0 || math.IsNaN(spec.PrefillTokensPerSec):
		return fmt.Errorf("replica %s: prefill rate %g: want >= 0", spec.Name, spec.PrefillTokensPerSec)
	case spec.MaxInFlight < 0:
		return fmt.Errorf("replica %s: max in flight %d: want >= 0", spec.Name, spec.MaxInFlight)
	case spec.BatchSlots < 0:
		return fmt.Errorf("replica %s: batch slots %d: want >= 0", spec.Name, spec.BatchSlots)
	}
	for _, m := range spec.Models {
		if m == "" {
			return fmt.Errorf("replica %s: empty model name", spec.Name)
		}
	}
	return nil
}

// capBlocks is the index capacity for a replica, in blocks.
func (r *Router) capBlocks(spec *ReplicaSpec, signalled int) int {
	tok := spec.KVCapacityTokens
	if tok == 0 {
		tok = signalled
	}
	if tok == 0 {
		tok = r.cfg.DefaultKVCapacityTokens
	}
	return max(tok/r.bt, 1)
}

// AddReplica adds a healthy replica. Names are unique.
func (r *Router) AddReplica(spec ReplicaSpec) (ReplicaID, error) {
	if err := r.validSpec(&spec); err != nil {
		return NoReplica, err
	}
	spec.Models = slices.Clone(spec.Models)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.byName[spec.Name]; dup {
		return NoReplica, fmt.Errorf("replica %s already added", spec.Name)
	}
	var id ReplicaID
	if k := len(r.free); k > 0 {
		id = r.free[k-1]
		r.free = r.free[:k-1]
	} else {
		id = ReplicaID(len(r.reps))
		r.reps = append(r.reps, nil)
	}
	r.gen++
	p := &replica{id: id, gen: r.gen, fleetSlot: &r.slotSec, fleetPrefill: &r.fleetPre}
	r.applySpec(p, spec)
	p.healthy.Store(true)
	r.reps[id] = p
	r.byName[spec.Name] = id
	r.rebuildGroups()
	return id, nil
}

func (r *Router) applySpec(p *replica, spec ReplicaSpec) {
	p.spec = spec
	p.weight = spec.Weight
	if p.weight == 0 {
		p.weight = 1
	}
	p.invWeight = 1 / p.weight
	p.maxInFlight = int64(spec.MaxInFlight)
	if loadF(&p.rate) == 0 || spec.PrefillTokensPerSec > 0 {
		rate := spec.PrefillTokensPerSec
		if rate == 0 {
			rate = r.cfg.DefaultPrefillTokensPerSec
		}
		storeF(&p.rate, rate)
	}
	if spec.PrefillTokensPerSec > 0 {
		p.fitted.Store(true)
	}
	p.capMax = r.capBlocks(&spec, int(p.sigKVCap.Load()))
	p.capEff = p.capMax
	r.idx.setCap(p.id, p.capEff)
}

// UpdateReplica replaces a replica's spec (models, weight, capacity, rate,
// limit). Load, health and cached state are kept.
func (r *Router) UpdateReplica(id ReplicaID, spec ReplicaSpec) error {
	if err := r.validSpec(&spec); err != nil {
		return err
	}
	spec.Models = slices.Clone(spec.Models)
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.rep(id)
	if p == nil {
		return fmt.Errorf("replica %d: unknown", id)
	}
	if other, ok := r.byName[spec.Name]; ok && other != id {
		return fmt.Errorf("replica %s already added", spec.Name)
	}
	delete(r.byName, p.spec.Name)
	r.byName[spec.Name] = id
	r.applySpec(p, spec)
	r.rebuildGroups()
	return nil
}

// RemoveReplica forgets a replica and its index entries. Flights still open
// on it may End safely; they no longer touch any state. Its ID may be reused.
func (r *Router) RemoveReplica(id ReplicaID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.rep(id)
	if p == nil {
		return
	}
	r.idx.dropReplica(id)
	delete(r.byName, p.spec.Name)
	r.reps[id] = nil
	r.free = append(r.free, id)
	r.rebuildGroups()
	if r.onRemove != nil {
		r.onRemove.OnRemove(id)
	}
}

// rep returns the live replica id or nil. Callers hold mu.
func (r *Router) rep(id ReplicaID) *replica {
	if id < 0 || int(id) >= len(r.reps) {
		return nil
	}
	return r.reps[id]
}

func (r *Router) rebuildGroups() {
	groups := make(map[string]*group, len(r.groups))
	for _, p := range r.reps {
		if p == nil {
			continue
		}
		for _, m := range p.spec.Models {
			g := groups[m]
			if g == nil {
				g = &group{}
				groups[m] = g
			}
			if n := len(g.members); n == 0 || g.members[n-1] != p.id { // a spec may repeat a model
				g.members = append(g.members, p.id)
			}
			if p.maxInFlight > 0 {
				g.hasLimit = true
			}
		}
	}
	r.groups = groups
	r.eligVersion.Add(1)
}

// SetHealthy marks a replica (un)healthy; unhealthy replicas are not ranked.
func (r *Router) SetHealthy(id ReplicaID, healthy bool) {
	r.mu.RLock()
	if p := r.rep(id); p != nil && p.healthy.Swap(healthy) != healthy {
		r.eligVersion.Add(1)
	}
	r.mu.RUnlock()
}

// SetDraining marks a replica draining: not ranked, open Flights finish.
func (r *Router) SetDraining(id ReplicaID, draining bool) {
	r.mu.RLock()
	if p := r.rep(id); p != nil && p.draining.Swap(draining) != draining {
		r.eligVersion.Add(1)
	}
	r.mu.RUnlock()
}

// SetSignals records engine signals. A KVCapacityTokens report sizes the
// replica's index when its spec gives no capacity.
func (r *Router) SetSignals(id ReplicaID, s EngineSignals) {
	r.mu.RLock()
	p := r.rep(id)
	if p == nil {
		r.mu.RUnlock()
		return
	}
	p.sigWaiting.Store(int64(s.Waiting))
	p.sigRunning.Store(int64(s.Running))
	storeF(&p.sigKV, s.KVUsage)
	p.sigOwnBusy.Store(p.totalInFlight())
	p.sigAt.Store(s.At)
	p.model.slotsSig.Store(int64(max(s.BatchSlots, 0)))
	p.learnSlots(s.Running, s.Waiting, s.KVUsage < r.cfg.KVHighWater)
	resize := s.KVCapacityTokens > 0 && p.spec.KVCapacityTokens == 0 &&
		int64(s.KVCapacityTokens) != p.sigKVCap.Load()
	r.mu.RUnlock()
	if !resize {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p = r.rep(id); p == nil {
		return
	}
	p.sigKVCap.Store(int64(s.KVCapacityTokens))
	p.capMax = r.capBlocks(&p.spec, s.KVCapacityTokens)
	p.capEff = p.capMax
	r.idx.setCap(id, p.capEff)
}

// ResetCache forgets every prefix cached on the replica (engine restart).
func (r *Router) ResetCache(id ReplicaID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rep(id) != nil {
		r.idx.dropReplica(id)
		if r.sink != nil {
			r.sink.PeerReset(id)
		}
	}
}

// Decide ranks eligible replicas for req into d with the active policy.
// It returns ErrModelNotFound when no replica serves req.Model and
// ErrNoReplica when none is eligible. It does not change any state except
// tie-breaking randomness: call Begin for the replica actually used.
func (r *Router) Decide(req *Request, d *Decision) error {
	d.Ranked = d.Ranked[:0]
	d.CachedTokens = d.CachedTokens[:0]
	d.Policy = ""
	r.mu.RLock()
	defer r.mu.RUnlock()
	g := r.groups[string(req.Model)]
	if g == nil {
		r.modelNotFound.Add(1)
		return ErrModelNotFound
	}
	v := &d.view
	v.reset(r, req, g)
	v.cands, v.pos, v.own = r.eligible(g, v.own)
	if len(v.cands) == 0 {
		r.noReplica.Add(1)
		return ErrNoReplica
	}
	r.policy.Rank(v, req, d)
	d.Policy = r.policy.Name()
	if len(d.Ranked) == 0 {
		r.noReplica.Add(1)
		return ErrNoReplica
	}
	if len(d.CachedTokens) != len(d.Ranked) {
		d.CachedTokens = d.CachedTokens[:0]
		for _, id := range d.Ranked {
			d.CachedTokens = append(d.CachedTokens, v.CachedTokens(id))
		}
	}
	r.decisions.Add(1)
	return nil
}

// Begin records that req was sent to replica id: the request's prefix is
// inserted into the index speculatively (the engine will cache it), and the
// replica's in-flight count and pending prefill grow. f is filled for
// FirstToken and End. d may be nil. An unknown id leaves f.Replica ==
// NoReplica and changes nothing.
func (r *Router) Begin(id ReplicaID, req *Request, d *Decision, f *Flight) {
	*f = Flight{Replica: NoReplica}
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.rep(id)
	if p == nil {
		return
	}
	hs := req.Hashes
	if len(hs) > p.capEff {
		hs = hs[:p.capEff]
	}
	held := r.idx.insert(id, hs)
	cached := min(held*r.bt, req.PromptTokens)
	// The prefill the replica is expected to do: the index's hit discounted
	// by how much of its predicted hits come true there (an engine without
	// prefix caching computes the whole prompt however warm the index is).
	unc := max(req.PromptTokens-int(p.confidence()*float64(cached)), 0)
	wait := p.slotWait(p.totalInFlight())
	*f = Flight{
		Replica:        id,
		UncachedTokens: unc,
		PromptTokens:   req.PromptTokens,
		predCached:     cached,
		Start:          req.Now,
		gen:            p.gen,
		queued:         p.totalPending(),
		newBlocks:      int32(len(hs) - held),
		buffered:       req.Buffered,
		predTTFT:       p.predictTTFT(float64(unc)),
		slotWait:       wait,
		busy:           int32(min(p.totalInFlight(), 1<<30)),
	}
	if len(hs) > 0 {
		f.tail = hs[len(hs)-1]
	}
	f.cont = held > 0 && held < len(hs) && r.finishedTail(hs[held-1], id)
	p.inFlight.Add(1)
	p.pending.Add(int64(unc))
	p.pendingReqs.Add(1)
	p.pend(f)
	r.promptTokens.Add(uint64(max(req.PromptTokens, 0)))
	r.cachedTokens.Add(uint64(cached))
	ewma(&p.uncachedAvg, float64(unc), 0.1)
	if r.onBegin != nil {
		r.onBegin.OnBegin(id, req)
	}
	if r.sink != nil {
		if len(hs) > 0 {
			r.sink.PeerInsert(id, hs)
		}
		r.sink.PeerLoad(id, p.localLoad())
	}
}

// live returns f's replica if it is still the one f began on. Callers hold mu.
func (r *Router) live(f *Flight) *replica {
	p := r.rep(f.Replica)
	if p == nil || p.gen != f.gen {
		return nil
	}
	return p
}

// FirstToken records the end of prefill: the replica's pending prefill drops
// by f.UncachedTokens. Its time is kept in f: End, once the engine's real
// cached tokens are known, gives the replica's rate fit the sample (tokens
// queued ahead at Begin + the real uncached tokens, FirstTokenAt - Start),
// unless the request was Buffered (see rateFit and sampleRate).
func (r *Router) FirstToken(f *Flight, now int64) {
	if f.Replica == NoReplica || f.FirstTokenAt != 0 {
		return
	}
	f.FirstTokenAt = max(now, 1)
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.live(f)
	if p == nil {
		return
	}
	p.pending.Add(-int64(f.UncachedTokens))
	p.pendingReqs.Add(-1)
	p.unpend(f)
	if r.sink != nil {
		r.sink.PeerLoad(f.Replica, p.localLoad())
	}
}

// sampleRate feeds the replica's TTFT model with f's outcome. It runs at
// End, when the engine's real cached tokens are known: timing a prefill
// with the predicted uncached tokens would read an unpredicted cache hit (a
// prefix another router sent, or one our index evicted too early) as a
// very fast prefill of the whole prompt and inflate the rate without bound.
// o.CachedTokens < 0 (unknown) falls back to the prediction. A request that
// waited for a batch slot waited for decodes to finish (decode time, not
// prefill), so the prefill fit takes its TTFT less the predicted
// slot wait; every request gives a slot-time sample, and a
// streamed one checks the TTFT prediction made at Begin.
func (r *Router) sampleRate(p *replica, f *Flight, now int64, o *Outcome) {
	uncached := f.UncachedTokens
	if o.CachedTokens >= 0 {
		uncached = max(0, f.PromptTokens-o.CachedTokens)
	}
	if o.PrefillSeconds > 0 {
		p.sampleEngineRate(o.PrefillTokens, o.PrefillSeconds)
	}
	rate, over0 := p.prefill()
	switch {
	case o.PrefillSeconds > 0 && o.DecodeSeconds > 0:
		p.sampleSlot(o.PrefillSeconds + o.DecodeSeconds)
	case f.FirstTokenAt != 0 && !f.buffered:
		p.sampleSlot(float64(now-f.FirstTokenAt)/1e9 + float64(uncached)/rate)
	default:
		p.sampleSlot(float64(now-f.Start)/1e9 - f.slotWait)
	}
	dt := float64(f.FirstTokenAt-f.Start) / 1e9
	if f.FirstTokenAt == 0 || dt <= 0 || f.buffered {
		return
	}
	p.checkPrediction(f.predTTFT, dt)
	// The wait for a batch slot is the slot term's, not prefill: the fit
	// explains what is left of the TTFT (at least a quarter of it, in case
	// the slot wait was overestimated).
	y := max(dt-f.slotWait, dt/4)
	p.fitMu.Lock()
	rate, over := p.fit.add(float64(f.queued+int64(uncached)), y, rate, over0, loadF(&p.model.engRate))
	if !p.fitted.Load() {
		storeF(&p.overhead, over0)
		p.fitted.Store(true)
	}
	storeF(&p.rate, rate)
	if s := p.slots(); s > 0 {
		// With known slots the intercept comes from clean samples only:
		// requests that found a free slot and no prefill queued ahead.
		// The line's intercept absorbs queueing the model missed (a burst
		// before the slot count was learned), and a replica whose
		// intercept is inflated gets no traffic to correct it.
		over = loadF(&p.overhead)
		if f.queued == 0 && int64(f.busy) < s {
			over = max(dt-float64(uncached)/rate, 0)
			if p.model.cleanN++; p.model.cleanN > 1 {
				over = loadF(&p.overhead) + 0.1*(over-loadF(&p.overhead))
			}
		} else if p.model.cleanN == 0 {
			over = 0
		}
	}
	storeF(&p.overhead, over)
	p.fitMu.Unlock()
	r.fleetPre.sample(rate, over)
}

// Outcome is what a finished request reports back (EndWith).
type Outcome struct {
	// OK: the request succeeded.
	OK bool
	// CachedTokens is the engine's usage.prompt_tokens_details.cached_tokens
	// (or llama.cpp's timings.cache_n); < 0 when unknown.
	CachedTokens int
	// PrefillTokens and PrefillSeconds are the engine's own prefill timing
	// (llama.cpp timings.prompt_n and prompt_ms); 0 when not reported.
	PrefillTokens  int
	PrefillSeconds float64
	// DecodeSeconds is the engine's own decode time (llama.cpp
	// timings.predicted_ms); 0 when not reported.
	DecodeSeconds float64
}

// End is EndWith with only the cached tokens and success known.
func (r *Router) End(f *Flight, now int64, cachedTokens int, ok bool) {
	r.EndWith(f, now, Outcome{OK: ok, CachedTokens: cachedTokens})
}

// EndWith closes a Flight with what the engine reported. A request
// that failed before its first token rolls back its speculative index
// insert. An engine report of fewer than half the predicted cached tokens
// means the replica evicted blocks we still index: its index capacity shrinks
// by the missed blocks (to at least a quarter of its KV capacity) and grows
// back one block per correct prediction. It is idempotent.
func (r *Router) EndWith(f *Flight, now int64, o Outcome) {
	if f.Replica == NoReplica {
		return
	}
	cachedTokens, ok := o.CachedTokens, o.OK
	predicted := f.predCached
	rollback := !ok && f.FirstTokenAt == 0 && f.newBlocks > 0
	miss := ok && cachedTokens >= 0 && predicted >= r.bt && cachedTokens*2 < predicted
	grow := ok && cachedTokens >= 0 && predicted >= r.bt && cachedTokens >= predicted
	if rollback || miss || grow {
		r.mu.Lock()
		defer r.mu.Unlock()
	} else {
		r.mu.RLock()
		defer r.mu.RUnlock()
	}
	p := r.live(f)
	if p == nil {
		f.Replica = NoReplica
		return
	}
	p.inFlight.Add(-1)
	if f.FirstTokenAt == 0 {
		p.pending.Add(-int64(f.UncachedTokens))
		p.pendingReqs.Add(-1)
		p.unpend(f)
	} else if ok {
		r.sampleRate(p, f, now, &o)
	}
	if ok && cachedTokens >= 0 && predicted >= r.bt {
		p.sampleHit(predicted, cachedTokens)
	}
	if ok {
		if f.tail != 0 {
			k := tailKey(f.tail, f.Replica)
			r.tails[k%tailSlots].Store(k)
			if r.tailSink != nil {
				r.tailSink.PeerTail(f.Replica, f.tail)
			}
		}
		if f.cont && cachedTokens >= 0 {
			ewma(&r.contCredit, float64(max(cachedTokens-predicted, 0)), 0.1)
		}
	}
	if r.sink != nil {
		r.sink.PeerLoad(f.Replica, p.localLoad())
		if rollback {
			r.sink.PeerTruncate(f.Replica, f.tail, int(f.newBlocks))
		}
	}
	switch {
	case rollback:
		r.idx.rollback(f.Replica, f.tail, int(f.newBlocks))
		r.rollbacks.Add(1)
	case miss:
		r.mispredicts.Add(1)
		p.mispredicts.Add(1)
		p.capEff = max(p.capEff-(predicted-cachedTokens)/r.bt, p.capMax/4, 1)
		r.idx.setCap(p.id, p.capEff)
	case grow:
		if p.capEff < p.capMax {
			p.capEff++
			r.idx.setCap(p.id, p.capEff)
		}
	}
	f.Replica = NoReplica
}

func tailKey(h uint64, id ReplicaID) uint64 { return pairKey(h, id) | 1 }

// finishedTail reports whether block h was the deepest block of a request
// that finished successfully on replica id (lossy: may forget, never
// invents a pair that was not recorded, up to hash collisions).
func (r *Router) finishedTail(h uint64, id ReplicaID) bool {
	k := tailKey(h, id)
	return r.tails[k%tailSlots].Load() == k
}

// ContinuationCredit is the measured number of tokens a replica caches
// beyond the index's prediction when the request's held prefix there ends
// exactly where a finished request's prompt ended (a chat's next turn: the
// engine also cached the previous answer, which the router never hashes).
// The cost policy subtracts it (up to the unmatched rest) from that
// replica's uncached tokens.
func (r *Router) ContinuationCredit() float64 { return loadF(&r.contCredit) }

// PrefillRate is replica id's current prefill-rate estimate in tokens/s
// (0 for an unknown id). Cheap: for per-request callers (Observation.Capacity).
func (r *Router) PrefillRate(id ReplicaID) float64 {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p := r.rep(id); p != nil {
		return loadF(&p.rate)
	}
	return 0
}

// Lookup finds a replica by name.
func (r *Router) Lookup(name string) (ReplicaID, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	id, ok := r.byName[name]
	return id, ok
}

// Models lists the model names served by at least one healthy replica,
// sorted. It allocates; not for the hot path.
func (r *Router) Models() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []string
	for m, g := range r.groups {
		for _, id := range g.members {
			if r.reps[id].healthy.Load() {
				out = append(out, m)
				break
			}
		}
	}
	slices.Sort(out)
	return out
}

// ReplicaStatus is a snapshot of one replica for /debug and metrics.
type ReplicaStatus struct {
	ID                   ReplicaID
	Name                 string
	Models               []string
	Healthy              bool
	Draining             bool
	Weight               float64
	MaxInFlight          int
	InFlight             int     // this router's requests in flight
	PendingPrefillTokens int     // this router's uncached tokens awaiting prefill
	PeerInFlight         int     // peers' requests in flight (ApplyPeer)
	PeerPendingTokens    int     // peers' uncached tokens awaiting prefill
	PrefillTokensPerSec  float64 // current estimate
	OverheadSeconds      float64 // current estimate of time to first token besides prefill
	CachedBlocks         int     // blocks the index attributes to it
	CapacityBlocks       int     // its index bound (effective)
	Signals              EngineSignals
	Mispredictions       uint64
	BatchSlots           int       // S_r in use: spec, engine or learned; 0 = unknown
	SlotSeconds          float64   // D_r: mean time a request holds a batch slot
	EnginePrefillRate    float64   // engine-reported prefill tokens/s; 0 = not reported
	Confidence           float64   // how far the cost policy trusts its predicted hits, 0..1
	TTFT                 TTFTStats // predicted vs measured TTFT
}

// Replicas returns a snapshot of every replica, by ID. It allocates.
func (r *Router) Replicas() []ReplicaStatus {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]ReplicaStatus, 0, len(r.reps))
	for _, p := range r.reps {
		if p == nil {
			continue
		}
		out = append(out, ReplicaStatus{
			ID:                   p.id,
			Name:                 p.spec.Name,
			Models:               slices.Clone(p.spec.Models),
			Healthy:              p.healthy.Load(),
			Draining:             p.draining.Load(),
			Weight:               p.weight,
			MaxInFlight:          p.spec.MaxInFlight,
			InFlight:             int(p.inFlight.Load()),
			PendingPrefillTokens: int(p.pending.Load()),
			PeerInFlight:         int(p.peerInFlight.Load()),
			PeerPendingTokens:    int(p.peerPending.Load()),
			PrefillTokensPerSec:  loadF(&p.rate),
			OverheadSeconds:      loadF(&p.overhead),
			CachedBlocks:         r.idx.blocksOf(p.id),
			CapacityBlocks:       p.capEff,
			Signals: EngineSignals{
				Waiting:          int(p.sigWaiting.Load()),
				Running:          int(p.sigRunning.Load()),
				KVUsage:          loadF(&p.sigKV),
				KVCapacityTokens: int(p.sigKVCap.Load()),
				BatchSlots:       int(p.model.slotsSig.Load()),
				At:               p.sigAt.Load(),
			},
			Mispredictions:    p.mispredicts.Load(),
			BatchSlots:        int(p.slots()),
			SlotSeconds:       p.slotSeconds(),
			EnginePrefillRate: loadF(&p.model.engRate),
			Confidence:        p.confidence(),
			TTFT:              p.ttftStats(),
		})
	}
	return out
}

// Stats are router-wide counters for metrics.
type Stats struct {
	Decisions      uint64 // successful Decide calls
	ModelNotFound  uint64 // Decide calls that returned ErrModelNotFound
	NoReplica      uint64 // Decide calls that returned ErrNoReplica
	Mispredictions uint64 // End reports far below the predicted cached tokens
	Rollbacks      uint64 // speculative inserts undone (failed before first token)
	Evictions      uint64 // (block, replica) pairs evicted by LRU bounds
	TrackedBlocks  int    // distinct block hashes in the index
	TrackedPairs   int    // (block, replica) pairs in the index

	PromptTokens          uint64 // estimated prompt tokens of begun requests
	PredictedCachedTokens uint64 // of which predicted cached on their replica at Begin
}

// Stats returns the router's counters.
func (r *Router) Stats() Stats {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return Stats{
		Decisions:      r.decisions.Load(),
		ModelNotFound:  r.modelNotFound.Load(),
		NoReplica:      r.noReplica.Load(),
		Mispredictions: r.mispredicts.Load(),
		Rollbacks:      r.rollbacks.Load(),
		Evictions:      r.idx.evictions,
		TrackedBlocks:  len(r.idx.blocks),
		TrackedPairs:   len(r.idx.pairs),

		PromptTokens:          r.promptTokens.Load(),
		PredictedCachedTokens: r.cachedTokens.Load(),
	}
}

// random returns the next tie-breaking random value (splitmix64).
func (r *Router) random() uint64 {
	z := r.rnd.Add(0x9E3779B97F4A7C15)
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
