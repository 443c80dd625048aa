// About 500 lines, one job: the replica set (add, update, remove, groups,
// signals) and Decide; flights, the rate fit and status have their own files.

package affinity

import (
	"cmp"
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

	slotReps atomic.Int32 // replicas in slot mode (replica.slotMode)
	// noCacheReps counts replicas whose engine caches nothing
	// (replica.noCache).
	noCacheReps atomic.Int32
	// stepClocks: some replica's step clock has a step (Router.Token);
	// until then the cost policy reads none.
	stepClocks atomic.Bool

	mu     sync.RWMutex
	reps   []*replica          // by ReplicaID; nil = free slot
	hot    []*[hotChunk]repHot // by ReplicaID in chunks: each replica's repHot
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
	turnsKept     atomic.Uint64 // CostPolicy.keepTurn's moves
	holdCopies    atomic.Uint64 // holds declined for a copy (holdRents)
	rents         holdRents
	promptTokens  atomic.Uint64
	cachedTokens  atomic.Uint64

	// tails remembers (block, replica) pairs that ended a finished request's
	// prompt: the engine's cache continues past such a block with the rest
	// of that prompt and its generated answer (see contCredit). A lossy
	// direct-mapped table of pairKey values (0 = empty): a collision only
	// forgets a credit.
	tails [tailSlots]atomic.Uint64
	// turns remembers which replica a finished request's prompt ended on,
	// keyed by that tail block alone: the conversation's last server, which
	// a later turn finds by the block its prompt continues from, even after
	// the index has aged that history out (CostPolicy.keepTurn). Lossy and
	// direct-mapped like tails: turnEntry values, 0 = empty.
	turns [tailSlots]atomic.Uint64
	// contCredit (float64 bits) is the EWMA of the cached tokens the engines
	// reported beyond the index's prediction on requests whose held prefix
	// ended at such a tail: what a continuation is worth (a chat's previous
	// answer), measured, so 0 where continuations do not pay.
	contCredit atomic.Uint64
	// slotSec (float64 bits) is the EWMA of every replica's slot-time
	// samples (ttft.go).
	slotSec atomic.Uint64
	// pools: the pooled prefill model per model, keyed by a replica's
	// first served model (ReplicaSpec.Models[0]); what the cost policy
	// prices a replica's prefill with (replica.prefill).
	pools map[string]*fleetPrefill
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
// kv_high_water, kv_penalty_seconds, max_scan, slot_hold, copy_computed,
// no_step_phase) to the running router and its policy; decisions after it
// returns use them. The other fields are fixed at NewRouter (the hashing,
// the policy, the index sizing) and are ignored here. Index, load and
// sessions are kept.
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
	r.cfg.SlotHold = cfg.SlotHold
	r.cfg.CopyComputed = cfg.CopyComputed
	r.cfg.NoStepPhase = cfg.NoStepPhase
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
	case spec.CacheModel < CacheAuto || spec.CacheModel > CacheNone:
		return fmt.Errorf("replica %s: cache model %d: want CacheAuto, CacheShared, CacheSlots or CacheNone", spec.Name, spec.CacheModel)
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
	p := &replica{repHot: r.newHot(id), id: id, gen: r.gen}
	p.fleetSlot = &r.slotSec
	r.applySpec(p, spec)
	p.healthy.Store(true)
	r.reps[id] = p
	r.byName[spec.Name] = id
	r.rebuildGroups()
	return id, nil
}

func (r *Router) applySpec(p *replica, spec ReplicaSpec) {
	p.spec = spec
	p.specSlots = int16(min(spec.BatchSlots, math.MaxInt16))
	p.kvInvCap.Store(invTokens(spec.KVCapacityTokens)) // the engine's next report fills in a 0
	p.specRate = spec.PrefillTokensPerSec > 0
	p.fleetPrefill = r.pool(spec)
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
	r.updateSlotMode(p)
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
	if p.slotMode.Swap(false) {
		r.slotReps.Add(-1)
	}
	if p.noCache.Swap(false) {
		r.noCacheReps.Add(-1)
	}
	delete(r.byName, p.spec.Name)
	r.reps[id] = nil
	p.repHot = new(repHot) // the slot goes to the ID's next replica
	r.free = append(r.free, id)
	r.rebuildGroups()
	if r.onRemove != nil {
		r.onRemove.OnRemove(id)
	}
}

// pool returns the pooled prefill model of the replicas whose first served
// model is spec's. Callers hold mu for writing.
func (r *Router) pool(spec ReplicaSpec) *fleetPrefill {
	key := ""
	if len(spec.Models) > 0 {
		key = spec.Models[0]
	}
	f := r.pools[key]
	if f == nil {
		if r.pools == nil {
			r.pools = make(map[string]*fleetPrefill)
		}
		f = &fleetPrefill{}
		r.pools[key] = f
	}
	return f
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

// MarkSignals returns the replica's load now, for the EngineSignals.Mark
// of a scrape about to be sent; the zero mark for an unknown id.
func (r *Router) MarkSignals(id ReplicaID) SignalMark {
	r.mu.RLock()
	defer r.mu.RUnlock()
	p := r.rep(id)
	if p == nil {
		return SignalMark{}
	}
	return SignalMark{
		busy:  p.totalInFlight(),
		pend:  max(p.totalPendingReqs(), 0),
		began: p.begunSince(0),
		gen:   p.gen,
		set:   true,
	}
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
	p.sigWaiting.Store(clamp32(int64(s.Waiting)))
	p.sigRunning.Store(clamp32(int64(s.Running)))
	storeF(&p.sigKV, s.KVUsage)
	if kvCap := cmp.Or(p.spec.KVCapacityTokens, s.KVCapacityTokens); kvCap > 0 {
		p.kvInvCap.Store(invTokens(kvCap))
	}
	busy, pending := p.totalInFlight(), max(p.totalPendingReqs(), 0)
	if m := s.Mark; m.set && m.gen == p.gen {
		// The engine counted at some moment since the mark: this router
		// then had at most the mark's requests plus those begun since.
		began := int64(p.begunSince(m.began))
		busy, pending = max(busy, m.busy+began), max(pending, m.pend+began)
	}
	p.sigOwnBusy.Store(clamp32(busy))
	p.sigOwnPend.Store(clamp32(pending))
	p.sigAt.Store(s.At)
	p.slotsSig.Store(clamp32(int64(max(s.BatchSlots, 0))))
	if s.FreshSlots > 0 {
		p.slotc.setFresh(s.FreshSlots)
	}
	if s.At != 0 {
		p.slotSig.Store(s.SlotCaches)
		p.noCacheSig.Store(s.NoPrefixCache)
		r.updateSlotMode(p)
	}
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

// invTokens is repHot.kvInvCap's bits for a capacity of n tokens (0:
// unknown).
func invTokens(n int) uint32 {
	if n <= 0 {
		return 0
	}
	return math.Float32bits(float32(1 / float64(n)))
}

// ResetCache forgets every prefix cached on the replica (engine restart).
func (r *Router) ResetCache(id ReplicaID) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.rep(id); p != nil {
		p.slotc.reset()
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
	d.Hold = HoldAdvice{}
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

// Hold counts a request the caller holds as h advised (delta 1,
// Decision.Hold) or no longer holds (delta -1): a later request advised
// to wait for the same replica waits behind it. Nothing changes when h's
// replica was removed since (its ID may name another now).
func (r *Router) Hold(h HoldAdvice, delta int) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if p := r.rep(h.Replica); p != nil && p.gen == h.gen {
		p.holds.Add(int32(delta))
	}
	if delta > 0 && h.rentKey != 0 {
		r.rents.charge(h.rentKey, h.at, h.Wait)
	}
}

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

// random returns the next tie-breaking random value (splitmix64).
func (r *Router) random() uint64 {
	z := r.rnd.Add(0x9E3779B97F4A7C15)
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}
