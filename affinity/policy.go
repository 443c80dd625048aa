package affinity

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/zeebo/xxh3"
)

// BeginHook is an optional Policy hook: the Router calls OnBegin (under its
// write lock) when a request is sent to replica id.
type BeginHook interface {
	OnBegin(id ReplicaID, req *Request)
}

// RemoveHook is an optional Policy hook: the Router calls OnRemove (under its
// write lock) when replica id is removed; the id may be reused later.
type RemoveHook interface {
	OnRemove(id ReplicaID)
}

// policies is the one list of built-in policies, in documentation order.
var policies = []struct {
	name string
	make func(cfg Config) Policy
}{
	{"cost", func(cfg Config) Policy { return &CostPolicy{cfg: cfg} }},
	{"round-robin", func(Config) Policy { return &RoundRobin{} }},
	{"least-request", func(Config) Policy { return LeastRequest{} }},
	{"power-of-two", func(Config) Policy { return PowerOfTwo{} }},
	{"consistent-hash", func(cfg Config) Policy { return &ConsistentHash{cfg: cfg} }},
	{"prefix", func(Config) Policy { return PrefixOnly{} }},
	{"session", func(cfg Config) Policy { return newSession(cfg) }},
}

// PolicyNames lists the built-in policy names; the first is the default.
func PolicyNames() []string {
	out := make([]string, len(policies))
	for i, p := range policies {
		out[i] = p.name
	}
	return out
}

func knownPolicy(name string) bool {
	for _, p := range policies {
		if p.name == name {
			return true
		}
	}
	return false
}

// NewPolicy builds the named policy; cfg zero fields take defaults.
func NewPolicy(name string, cfg Config) (Policy, error) {
	cfg = cfg.WithDefaults()
	for _, p := range policies {
		if p.name == name {
			return p.make(cfg), nil
		}
	}
	return nil, fmt.Errorf("policy %q: want one of %v", name, PolicyNames())
}

// RoundRobin ranks candidates in rotation, ignoring load and cache.
type RoundRobin struct{ next atomic.Uint64 }

func (*RoundRobin) Name() string { return "round-robin" }

func (p *RoundRobin) Rank(v *View, _ *Request, d *Decision) {
	c := v.Candidates()
	n := uint64(len(c))
	start := p.next.Add(1) - 1
	for i := range uint64(min(v.MaxRanked(), len(c))) {
		d.Ranked = append(d.Ranked, c[(start+i)%n])
	}
}

// LeastRequest ranks by router-local in-flight requests divided by weight,
// ties at random.
type LeastRequest struct{}

func (LeastRequest) Name() string { return "least-request" }

func (LeastRequest) Rank(v *View, _ *Request, d *Decision) {
	sc := v.Scores()
	for i, id := range v.Candidates() {
		l := v.Load(id)
		sc[i] = float64(l.InFlight) / l.Weight
	}
	v.RankLowest(d)
}

// PowerOfTwo samples two distinct candidates and ranks the one with fewer
// in-flight requests (per weight) first; further retry choices follow from a
// random offset.
type PowerOfTwo struct{}

func (PowerOfTwo) Name() string { return "power-of-two" }

func (PowerOfTwo) Rank(v *View, _ *Request, d *Decision) {
	c := v.Candidates()
	n := len(c)
	if n == 1 {
		d.Ranked = append(d.Ranked, c[0])
		return
	}
	i := int(v.Random() % uint64(n))
	j := int(v.Random() % uint64(n-1))
	if j >= i {
		j++
	}
	li, lj := v.Load(c[i]), v.Load(c[j])
	si, sj := float64(li.InFlight)/li.Weight, float64(lj.InFlight)/lj.Weight
	if sj < si {
		i, j = j, i
	}
	d.Ranked = append(d.Ranked, c[i], c[j])
	k := min(v.MaxRanked(), n)
	for off := int(v.Random() % uint64(n)); len(d.Ranked) < k; off = (off + 1) % n {
		if off != i && off != j {
			d.Ranked = append(d.Ranked, c[off])
		}
	}
	if len(d.Ranked) > k {
		d.Ranked = d.Ranked[:k]
	}
}

// PrefixOnly ranks by the longest predicted cached prefix, ties at random.
// It ignores load entirely (the baseline for pure cache affinity).
type PrefixOnly struct{}

func (PrefixOnly) Name() string { return "prefix" }

func (PrefixOnly) Rank(v *View, _ *Request, d *Decision) {
	sc := v.Scores()
	for i, id := range v.Candidates() {
		sc[i] = -float64(v.CachedBlocks(id))
	}
	v.RankLowest(d)
}

// ConsistentHash is consistent hashing with bounded load (Mirrokni et al.,
// as in KubeAI's CHWBL): the key (the request's first block hash, so requests
// sharing their first block share a home; else the session key; else
// random) is placed on a ring of RingVnodes points per unit of weight, and
// the ring is walked clockwise to the first replica whose in-flight+1 stays
// within LoadFactor x the mean (weighted).
type ConsistentHash struct{ cfg Config }

func (*ConsistentHash) Name() string { return "consistent-hash" }

// Retune takes the live knobs; RingVnodes stays (rings are cached).
func (p *ConsistentHash) Retune(cfg Config) {
	cfg.RingVnodes = p.cfg.RingVnodes
	p.cfg = cfg
}

type hashRing struct {
	points []uint64
	owners []ReplicaID
}

func (p *ConsistentHash) ring(v *View) *hashRing {
	if r := v.g.ring.Load(); r != nil {
		return r
	}
	r := &hashRing{}
	type pt struct {
		h  uint64
		id ReplicaID
	}
	var pts []pt
	for _, id := range v.g.members {
		rp := v.r.reps[id]
		n := max(int(float64(p.cfg.RingVnodes)*rp.weight+0.5), 1)
		base := xxh3.HashString(rp.spec.Name)
		for k := range n {
			pts = append(pts, pt{chain(base, uint64(k)), id})
		}
	}
	sort.Slice(pts, func(a, b int) bool { return pts[a].h < pts[b].h })
	r.points = make([]uint64, len(pts))
	r.owners = make([]ReplicaID, len(pts))
	for i, x := range pts {
		r.points[i], r.owners[i] = x.h, x.id
	}
	v.g.ring.CompareAndSwap(nil, r)
	return v.g.ring.Load()
}

func (p *ConsistentHash) Rank(v *View, req *Request, d *Decision) {
	c := v.Candidates()
	var key uint64
	switch {
	case len(req.Hashes) > 0:
		key = req.Hashes[0]
	case req.SessionKey != 0:
		key = chain(req.SessionKey, 0x5E55)
	default:
		key = v.Random()
	}
	var total, wsum float64
	for _, id := range c {
		l := v.Load(id)
		total += float64(l.InFlight)
		wsum += l.Weight
	}
	mean := (total + 1) / wsum
	ring := p.ring(v)
	k := min(v.MaxRanked(), len(c))
	n := len(ring.points)
	start := sort.Search(n, func(i int) bool { return ring.points[i] >= key })
	// Pass 0 takes replicas within the load bound, pass 1 anyone left.
	for pass := 0; pass < 2 && len(d.Ranked) < k; pass++ {
		for s := 0; s < n && len(d.Ranked) < k; s++ {
			id := ring.owners[(start+s)%n]
			if slices.Contains(d.Ranked, id) || !v.r.reps[id].eligible() {
				continue
			}
			if pass == 0 {
				l := v.Load(id)
				if float64(l.InFlight)+1 > mean*p.cfg.LoadFactor*l.Weight {
					continue
				}
			}
			d.Ranked = append(d.Ranked, id)
		}
	}
}

// Session pins a session (Request.SessionKey: a session header or the
// OpenAI `user` field, hashed by the caller) to the replica its last request
// went to, for SessionTTL after that request. Unpinned requests, and pinned
// ones whose replica is not eligible, rank by least-request; the pinned
// replica, when eligible, is ranked first.
type Session struct {
	ttl, max int64
	mu       sync.Mutex
	m        map[uint64]sessionEntry
	epoch    []uint32 // per ReplicaID, bumped on removal
}

// sweepPerBegin is how many session entries OnBegin examines for expiry.
const sweepPerBegin = 8

type sessionEntry struct {
	id      ReplicaID
	epoch   uint32
	expires int64
}

func newSession(cfg Config) *Session {
	return &Session{ttl: int64(cfg.SessionTTL), max: int64(cfg.MaxSessions), m: make(map[uint64]sessionEntry)}
}

func (*Session) Name() string { return "session" }

// Retune takes a new SessionTTL for pins made after it.
func (s *Session) Retune(cfg Config) {
	s.mu.Lock()
	s.ttl = int64(cfg.SessionTTL)
	s.mu.Unlock()
}

func (s *Session) Rank(v *View, req *Request, d *Decision) {
	pinned := NoReplica
	if req.SessionKey != 0 {
		s.mu.Lock()
		if e, ok := s.m[req.SessionKey]; ok && e.expires >= req.Now &&
			int(e.id) < len(s.epoch) && s.epoch[e.id] == e.epoch {
			pinned = e.id
		}
		s.mu.Unlock()
		if pinned != NoReplica && !slices.Contains(v.Candidates(), pinned) {
			pinned = NoReplica
		}
	}
	LeastRequest{}.Rank(v, req, d)
	if pinned == NoReplica {
		return
	}
	if i := slices.Index(d.Ranked, pinned); i >= 0 {
		copy(d.Ranked[1:i+1], d.Ranked[:i])
	} else {
		d.Ranked = append(d.Ranked[:min(len(d.Ranked), v.MaxRanked()-1)], NoReplica)
		copy(d.Ranked[1:], d.Ranked[:len(d.Ranked)-1])
	}
	d.Ranked[0] = pinned
}

// OnBegin pins req's session to id.
func (s *Session) OnBegin(id ReplicaID, req *Request) {
	if req.SessionKey == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for int(id) >= len(s.epoch) {
		s.epoch = append(s.epoch, 0)
	}
	// Incremental sweep: look at a few entries from a random map position
	// each time, so expired sessions never pile up (at most about
	// 1/sweepPerBegin of the table) and no call pays for a full scan.
	n := 0
	for k, e := range s.m {
		if e.expires < req.Now {
			delete(s.m, k)
		}
		if n++; n >= sweepPerBegin {
			break
		}
	}
	if _, ok := s.m[req.SessionKey]; !ok && int64(len(s.m)) >= s.max {
		return
	}
	s.m[req.SessionKey] = sessionEntry{id: id, epoch: s.epoch[id], expires: req.Now + s.ttl}
}

// OnRemove unpins every session on id.
func (s *Session) OnRemove(id ReplicaID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if int(id) < len(s.epoch) {
		s.epoch[id]++
	}
}

// Sessions is the number of pinned sessions (expired ones included until
// swept).
func (s *Session) Sessions() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.m)
}

// CostPolicy (the default) ranks by estimated time to first token plus the
// delay the request's own prefill imposes on the requests queued behind it:
//
//	est_r = O_r + max(slotWait_r, backlog_r) + Q_r / P_r + (T - c_r C_r) / P_r   the TTFT model (ttft.go)
//	      + (X_r - 1) * (T - c_r C_r) / P_r                                       externality: the queue it delays
//	      + LoadPenaltySeconds * B_r / W_r                                         decode work sharing the batch
//	      + KVPenaltySeconds * max(0, (U_r - KVHighWater) / (1 - KVHighWater))
//
// slotWait_r the expected wait for a batch slot, backlog_r how far this
// router's pending requests there are past their predictions, Q_r queued
// prefill tokens (Load.QueuedTokens), P_r and O_r the replica's measured
// prefill rate and overhead, T the request's prompt tokens, C_r its
// predicted cached prefix on r (the index's match, plus the measured
// continuation credit when that match ends where a request finished on r:
// see Router.ContinuationCredit), c_r the replica's prediction confidence
// (Load.Confidence), B_r busy requests (Load.Busy), W_r weight, U_r fresh
// KV usage. X_r = 1 + max(N_r, N): N_r the requests queued for prefill on
// r (Load.QueuedRequests), which a batching engine prefills in the steps
// this request's prefill joins, N the mean of N_c over the candidates not
// holding the prefix (less than half the best hit; every candidate when
// none holds it), the queue those that will join r while it prefills find
// on a replica that could take a recompute. The prefix's own homes are not
// in N: in a burst of one shared prompt their queues made an idle cold
// replica look (1 + N) times dearer than it was and the burst piled onto
// them (one-company mean TTFT 3.4x round-robin's in the simulator). On a
// replica that is not full when every replica holding at least half of the
// best predicted hit is (replica.full: no free batch slot, or a backlog),
// X_r = 1, so a prefix too hot for its homes' batches is computed once
// more where a slot is free instead of waiting for
// decodes to finish. Ties break at random.
// Above Config.MaxScan candidates it scores a random window of them plus
// every prefix holder (View.Sample). See README.md for intent and the
// guards.
type CostPolicy struct{ cfg Config }

func (*CostPolicy) Name() string { return "cost" }

// Retune takes the live knobs (the Router holds its write lock: no Rank
// runs meanwhile).
func (p *CostPolicy) Retune(cfg Config) { p.cfg = cfg }

func (p *CostPolicy) Rank(v *View, req *Request, d *Decision) {
	if p.cfg.MaxScan > 0 {
		v.Sample(p.cfg.MaxScan)
	}
	cfg := &p.cfg
	t := float64(req.PromptTokens)
	v.match()
	m := v.ms.m
	var otok []int32 // oracle-fed cached tokens (SetCacheOracle)
	if v.oracle {
		otok = v.otok
	}
	bt := float64(v.r.bt)
	credit := 0.0 // continuation credit: see Router.ContinuationCredit
	if otok == nil {
		credit = loadF(&v.r.contCredit)
	}
	now, maxAge := req.Now, int64(cfg.SignalMaxAge)
	cands := v.Candidates()
	// One pass reads each candidate's state once: its cached tokens, N_r,
	// whether it is full, and every term of its estimate but X_r, which
	// needs N and whether the prefix's homes are all full (both known only
	// after the pass). The estimate is then summed in the order written
	// above, so it is the same float64.
	cs := v.costScratch(len(cands))
	best := 0.0
	for i, id := range cands {
		rp := v.r.reps[id]
		c := 0.0
		switch {
		case otok != nil:
			c = min(float64(otok[id]), t)
		case int(id) < len(m) && m[id] > 0:
			c = min(float64(m[id])*bt, t)
			if credit > 0 && int(m[id]) < len(req.Hashes) && v.r.finishedTail(req.Hashes[m[id]-1], id) {
				c = min(c+credit, t)
			}
		}
		best = max(best, c)
		busy, fresh, waiting := rp.busy(now, maxAge)
		queued := float64(max(rp.totalPending(), 0))
		var kv float64
		if fresh {
			if pr := rp.totalPendingReqs(); waiting > pr {
				queued += float64(waiting-pr) * loadF(&rp.uncachedAvg)
			}
			kv = loadF(&rp.sigKV)
		}
		backlog := rp.backlog(now)
		rate, over := rp.prefill()
		inv := 1 / rate
		e := &cs[i]
		e.cached = c
		e.queuedReqs = rp.queuedReqs(busy, fresh, waiting)
		e.full = rp.fullWith(busy, backlog)
		e.unc = max(t-rp.confidence()*c, 0)
		e.inv = inv
		e.pre = over + max(rp.slotWait(busy), backlog) + queued*inv
		e.pen = cfg.LoadPenaltySeconds * float64(busy) * rp.invWeight
		e.kv = kv > cfg.KVHighWater
		if e.kv {
			e.kvPen = cfg.KVPenaltySeconds * (kv - cfg.KVHighWater) / (1 - cfg.KVHighWater)
		}
	}
	// The typical prefill queue a recompute joins: the mean over the
	// candidates not holding the prefix (less than half the best hit).
	var coldQueued, cold int64
	homesFull := best > 0
	for i := range cs {
		if cs[i].cached < best/2 || best == 0 {
			coldQueued += cs[i].queuedReqs
			cold++
		} else if !cs[i].full {
			homesFull = false
		}
	}
	typical := 0.0
	if cold > 0 {
		typical = float64(coldQueued) / float64(cold)
	}
	sc := v.Scores()
	for i := range cs {
		e := &cs[i]
		x := 1 + max(float64(e.queuedReqs), typical)
		if homesFull && !e.full {
			x = 1
		}
		est := e.pre + x*e.unc*e.inv + e.pen
		if e.kv {
			est += e.kvPen
		}
		sc[i] = est
	}
	v.RankLowest(d)
}

// busy is B_r: the requests on the replica (this router's and its peers'),
// plus, when the engine's signals are fresh, the requests the engine ran
// or queued beyond those at the scrape (other routers' traffic the peers
// did not report). The engine's own count is as old as the scrape; the
// router's is current, so only the excess is taken from the engine. Also
// whether the signals are fresh and the engine's waiting count.
func (p *replica) busy(now, maxAge int64) (b int64, fresh bool, waiting int64) {
	b = p.totalInFlight()
	if at := p.sigAt.Load(); at != 0 && now-at <= maxAge {
		waiting = p.sigWaiting.Load()
		return b + max(waiting+p.sigRunning.Load()-p.sigOwnBusy.Load(), 0), true, waiting
	}
	return b, false, 0
}

// full reports whether a new request on the replica would wait for others
// to finish: every batch slot is taken, or its pending requests are behind
// their predictions by more than the TTFT the model predicts for a new one
// (queueing the model has not learned yet, such as a batch limit before
// any scrape showed it).
func (p *replica) full(busy, now int64) bool { return p.fullWith(busy, p.backlog(now)) }

// fullWith is full with the replica's backlog already computed.
func (p *replica) fullWith(busy int64, backlog float64) bool {
	if s := p.slots(); s > 0 && busy >= s {
		return true
	}
	return backlog > 0 && backlog > p.predictTTFT(0)
}

// costCand is one candidate's part of a CostPolicy decision.
type costCand struct {
	cached     float64 // predicted cached tokens
	queuedReqs int64   // N_r
	unc        float64 // T - c_r C_r, at least 0
	inv        float64 // 1 / P_r
	pre        float64 // O_r + max(slotWait_r, backlog_r) + Q_r / P_r
	pen        float64 // the load penalty
	kvPen      float64 // the KV penalty, when kv
	kv         bool    // U_r is past KVHighWater
	full       bool
}

// queuedReqs is the replica's share of N: requests waiting for prefill, not
// for a batch slot. With known slots, the busy requests beyond them wait
// for a slot; without, the engine's waiting count (when fresh and larger)
// stands for the prefill queue.
func (p *replica) queuedReqs(busy int64, fresh bool, waiting int64) int64 {
	n := max(p.totalPendingReqs(), 0)
	if s := p.slots(); s > 0 {
		return max(n-max(busy-s, 0), 0)
	}
	if fresh {
		n = max(n, waiting)
	}
	return n
}

// Interface guards.
var (
	_ Policy     = (*RoundRobin)(nil)
	_ Policy     = LeastRequest{}
	_ Policy     = PowerOfTwo{}
	_ Policy     = PrefixOnly{}
	_ Policy     = (*ConsistentHash)(nil)
	_ Policy     = (*Session)(nil)
	_ BeginHook  = (*Session)(nil)
	_ RemoveHook = (*Session)(nil)
	_ Policy     = (*CostPolicy)(nil)
)

var (
	_ Retuner = (*CostPolicy)(nil)
	_ Retuner = (*ConsistentHash)(nil)
	_ Retuner = (*Session)(nil)
)
