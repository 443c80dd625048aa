package affinity

import (
	"math"
	"slices"
)

// View is what a Policy ranks from during one Decide: the eligible
// candidates, their load, and (computed on first use) how much of the
// request's prefix each one holds. It lives inside the caller's Decision, so
// it costs no allocation once warm. It is valid only during Rank.
type View struct {
	r       *Router
	req     *Request
	g       *group
	cands   []ReplicaID // eligible candidates; may alias a shared snapshot
	pos     []int32     // by ReplicaID, the index in cands (shared snapshot only; else nil)
	own     []ReplicaID // scratch for per-call filtering
	sub     []ReplicaID // scratch for Sample
	deep    []ReplicaID // scratch for Sample's deepest holders
	depths  []int32     // scratch for their depths
	score   []float64
	ms      matchSet
	matched bool
	oracle  bool    // this decision's cached prefixes came from a CacheOracle
	otok    []int32 // oracle tokens by ReplicaID, valid when oracle
	rnd     uint64
	top     []rankItem
	cost    []costCand // CostPolicy's per-candidate scratch
	holders []int32    // CostPolicy's scratch: indices of candidates caching part of the prompt
}

// costScratch returns the cost policy's scratch for n candidates.
func (v *View) costScratch(n int) []costCand {
	if cap(v.cost) < n {
		v.cost = make([]costCand, n, n+n/2)
	}
	v.cost = v.cost[:n]
	return v.cost
}

type rankItem struct {
	score float64
	tie   uint64
	id    ReplicaID
}

// Load is a replica's load as a policy sees it.
type Load struct {
	InFlight             int     // requests in flight: this router's plus its peers' (ApplyPeer)
	PendingPrefillTokens int     // uncached prompt tokens not yet prefilled: this router's plus peers'
	PendingRequests      int     // requests without a first token yet: this router's plus peers'
	PeerInFlight         int     // of InFlight, the peers' share (0 for a single router)
	Waiting, Running     int     // engine signals; 0 when stale
	KVUsage              float64 // engine signal, 0..1; 0 when stale
	Fresh                bool    // engine signals younger than Config.SignalMaxAge
	SignalBaseline       int     // InFlight when the signals were scraped
	SignalPending        int     // PendingRequests when the signals were scraped
	PrefillTokensPerSec  float64 // measured (seeded by spec / config)
	OverheadSeconds      float64 // measured time to first token besides prefill
	UncachedAvg          float64 // EWMA of uncached prompt tokens per routed request
	Weight               float64 // spec weight, 0 means 1
	MaxInFlight          int     // 0 = unlimited
	BatchSlots           int     // S_r: spec, engine-reported or learned; 0 = unknown
	SlotWaitSeconds      float64 // expected wait for a batch slot now (ttft.go)
	Confidence           float64 // trust in the replica's predicted hits, 0..1 (ttft.go)
	kvInvCap             float64 // 1 / the KV capacity in tokens, with fresh signals; 0 = unknown
}

// QueuedTokens is Q_r, the prefill tokens queued ahead of a new request:
// PendingPrefillTokens, plus, when fresh engine signals showed more waiting
// requests than this router and its peers had pending at that scrape
// (SignalPending: other routers' traffic), the excess times the mean
// uncached size. The excess is the scrape's, not the scrape's waiting less
// today's pending: a request that waited at the scrape and has since had
// its first token would otherwise count as someone else's until the signal
// ages out (an idle replica priced 0.37 s of phantom prefill for a second).
func (l *Load) QueuedTokens() float64 {
	return queuedTokens(l.PendingPrefillTokens, l.otherWaiting(), l.UncachedAvg)
}

// queuedTokens is QueuedTokens of its inputs.
func queuedTokens(pendingTokens, otherWaiting int, uncachedAvg float64) float64 {
	return float64(pendingTokens) + float64(otherWaiting)*uncachedAvg
}

// otherWaiting is the fresh scrape's waiting count beyond the requests this
// router and its peers had pending at it; 0 when stale.
func (l *Load) otherWaiting() int {
	if !l.Fresh {
		return 0
	}
	return max(l.Waiting-l.SignalPending, 0)
}

// QueuedRequests is N_r, the requests on the replica still awaiting their
// first token: PendingRequests (this router's and its peers') plus the
// fresh scrape's waiting requests of other routers (otherWaiting). Those
// waiting for a batch slot count too: a new prefill shares the engine's
// steps with the running requests' decoding, so their slots free later by
// about its prefill time, and every request waiting for one waits that
// much longer, as a request queued for prefill does.
func (l *Load) QueuedRequests() int {
	return queuedRequests(l.PendingRequests, l.otherWaiting())
}

// queuedRequests is QueuedRequests of its inputs.
func queuedRequests(pending, otherWaiting int) int {
	return pending + otherWaiting
}

// Busy is B_r, the number of requests occupying the replica: InFlight
// (this router's and its peers'), plus, when fresh, what the engine ran and
// queued beyond that count at the scrape (SignalBaseline): other routers'
// traffic the peers did not report.
func (l *Load) Busy() int {
	if l.Fresh {
		return l.InFlight + max(l.Waiting+l.Running-l.SignalBaseline, 0)
	}
	return l.InFlight
}

func (v *View) reset(r *Router, req *Request, g *group) {
	v.r, v.req, v.g = r, req, g
	v.cands, v.pos = nil, nil
	v.matched = false
	v.oracle = false
	v.rnd = r.random()
	v.ms.reset(0)
}

// Candidates are the eligible replicas serving the request's model, in ID
// order. Do not modify.
func (v *View) Candidates() []ReplicaID { return v.cands }

// Request is the request being ranked.
func (v *View) Request() *Request { return v.req }

// Now is the request's clock.
func (v *View) Now() int64 { return v.req.Now }

// BlockTokens is the hashing block size in tokens.
func (v *View) BlockTokens() int { return v.r.bt }

// MaxRanked is how many replicas a Decision should rank.
func (v *View) MaxRanked() int { return v.r.cfg.MaxRanked }

// Random returns a fresh pseudo-random value (per-decision stream).
func (v *View) Random() uint64 {
	v.rnd += 0x9E3779B97F4A7C15
	z := v.rnd
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func (v *View) match() {
	if v.matched {
		return
	}
	v.matched = true
	v.ms.reset(len(v.r.reps))
	if b := v.r.oracle.Load(); b != nil {
		v.oracleMatch(b.o)
		return
	}
	v.r.idx.longest(v.req.Hashes, &v.ms)
	if v.r.slotReps.Load() > 0 {
		v.slotMatch()
	}
	if v.r.noCacheReps.Load() > 0 {
		// an engine that caches nothing holds no prefix, whatever was
		// routed to it
		for _, id := range v.ms.touched {
			if p := v.r.reps[id]; p != nil && p.noCache.Load() {
				v.ms.m[id] = 0
			}
		}
	}
}

// slotMatch replaces the index's match with the slot model's prediction
// for every candidate whose engine has per-slot caches (slotcache.go).
func (v *View) slotMatch() {
	for _, id := range v.cands {
		sc, n := v.r.reps[id].slotModel()
		if sc == nil {
			continue
		}
		v.ms.set(id, int32(sc.predict(n, v.req.Hashes)))
	}
}

// CachedBlocks is the predicted number of leading request blocks cached on
// replica id (from the CacheOracle when one is set, for candidates).
func (v *View) CachedBlocks(id ReplicaID) int {
	v.match()
	if int(id) < 0 || int(id) >= len(v.ms.m) {
		return 0
	}
	return int(v.ms.m[id])
}

// CachedTokens is CachedBlocks in tokens, capped at the prompt size. With a
// CacheOracle it is the oracle's answer (not rounded to blocks), capped.
func (v *View) CachedTokens(id ReplicaID) int {
	b := v.CachedBlocks(id)
	if v.oracle {
		if int(id) < 0 || int(id) >= len(v.otok) {
			return 0
		}
		return min(int(v.otok[id]), v.req.PromptTokens)
	}
	return min(b*v.r.bt, v.req.PromptTokens)
}

// Load reads replica id's load.
func (v *View) Load(id ReplicaID) Load {
	p := v.r.reps[id]
	var l Load
	p.queueLoad(&l, v.req.Now, int64(v.r.cfg.SignalMaxAge))
	l.PeerInFlight = int(p.peerInFlight.Load())
	l.PrefillTokensPerSec = loadF(&p.rate)
	l.OverheadSeconds = loadF(&p.overhead)
	l.Weight = p.weight
	l.MaxInFlight = int(p.maxInFlight)
	l.Confidence = p.confidence()
	l.SlotWaitSeconds = p.slotWait(int64(l.Busy()), v.req.Now)
	return l
}

// queueLoad sets the fields of l that Busy, QueuedTokens and QueuedRequests
// derive from: p's counters, its batch slots and, when younger than maxAge
// at now, its engine signals (zero when stale). It leaves the other fields
// as they are: the cost policy reuses one Load for every candidate.
func (p *repHot) queueLoad(l *Load, now, maxAge int64) {
	p.queueLoadSlots(l, p.slots(), now, maxAge)
}

// queueLoadSlots is queueLoad with S_r given (s = p.slots()).
func (p *repHot) queueLoadSlots(l *Load, s, now, maxAge int64) {
	l.InFlight = int(p.totalInFlight())
	l.PendingPrefillTokens = int(max(p.totalPending(), 0))
	l.PendingRequests = int(max(p.totalPendingReqs(), 0))
	l.UncachedAvg = loadF(&p.uncachedAvg)
	l.BatchSlots = int(s)
	l.Fresh, l.Waiting, l.Running, l.KVUsage, l.kvInvCap, l.SignalBaseline, l.SignalPending = false, 0, 0, 0, 0, 0, 0
	if at := p.sigAt.Load(); at != 0 && now-at <= maxAge {
		l.Fresh = true
		l.Waiting = int(p.sigWaiting.Load())
		l.Running = int(p.sigRunning.Load())
		l.KVUsage = loadF(&p.sigKV)
		l.kvInvCap = float64(math.Float32frombits(p.kvInvCap.Load()))
		l.SignalBaseline = int(p.sigOwnBusy.Load())
		l.SignalPending = int(p.sigOwnPend.Load())
	}
}

// Scores returns a zeroed score slice parallel to Candidates, for RankLowest.
func (v *View) Scores() []float64 {
	n := len(v.cands)
	if cap(v.score) < n {
		v.score = make([]float64, n, n+n/2)
	}
	v.score = v.score[:n]
	clear(v.score)
	return v.score
}

// RankLowest fills d.Ranked with the MaxRanked candidates of lowest score
// (from Scores), ties broken at random. NaN scores rank last.
func (v *View) RankLowest(d *Decision) {
	k := min(v.r.cfg.MaxRanked, len(v.cands))
	top := v.top[:0]
	salt := v.Random()
	for i, id := range v.cands {
		if s := v.score[i]; len(top) < k || !(s > top[k-1].score) { // insertTop's first test, without the call
			top = insertTop(top, k, s, id, salt)
		}
	}
	v.top = top
	for _, it := range top {
		d.Ranked = append(d.Ranked, it.id)
	}
}

// insertTop puts candidate id of score s into top, the k best so far in
// order (lowest score first, ties by their salted mix), if it belongs
// there. A NaN score counts as +Inf.
func insertTop(top []rankItem, k int, s float64, id ReplicaID, salt uint64) []rankItem {
	if math.IsNaN(s) {
		s = math.Inf(1)
	}
	if len(top) == k && s > top[k-1].score {
		return top
	}
	it := rankItem{score: s, tie: mixID(id, salt), id: id}
	if len(top) == k && !it.less(&top[k-1]) {
		return top
	}
	if len(top) < k {
		top = append(top, it)
	} else {
		top[k-1] = it
	}
	for j := len(top) - 1; j > 0 && top[j].less(&top[j-1]); j-- {
		top[j], top[j-1] = top[j-1], top[j]
	}
	return top
}

func (a *rankItem) less(b *rankItem) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return a.tie < b.tie
}

func mixID(id ReplicaID, salt uint64) uint64 {
	z := uint64(id)*0x9E3779B97F4A7C15 ^ salt
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// Sample narrows Candidates (and so Scores and RankLowest) to at most 2k of
// them: a window of k consecutive candidates from a random offset, plus the
// candidates outside it holding the deepest parts of the request's prefix,
// at most k of them (View.deepest). It does nothing when there are k
// candidates or fewer.
//
// Without the bound on holders a prefix every replica has served (a
// system prompt common to the fleet) made every replica a holder and every
// decision score the whole fleet (40 us at 1,024 replicas, 160 us at
// 4,096; 23 and 68 us with it: BenchmarkDecideSharedPrefix). The holders
// left out are never deeper than one kept: a cache hit is missed only
// where more than k replicas hold a longer one, and then the k scored are
// a random draw of them.
func (v *View) Sample(k int) {
	c := v.cands
	n := len(c)
	if k <= 0 || n <= k {
		return
	}
	v.match()
	start := int(v.Random() % uint64(n))
	// c[(start+i)%n] for i < k: the window, wrapping once at most.
	sub := append(v.sub[:0], c[start:min(start+k, n)]...)
	sub = append(sub, c[:k-len(sub)]...)
	for _, id := range v.ms.touched {
		var j int
		ok := false
		if v.pos != nil {
			if int(id) < len(v.pos) && v.pos[id] >= 0 {
				j, ok = int(v.pos[id]), true
			}
		} else {
			// Candidates are sorted by ID (groups list members in ID order).
			j, ok = slices.BinarySearch(c, id)
		}
		if j -= start; j < 0 {
			j += n
		}
		if ok && j >= k { // outside the window
			sub = append(sub, id)
		}
	}
	if len(sub) > 2*k {
		sub = append(sub[:k], v.deepest(sub[k:], k)...)
	}
	v.sub = sub
	v.cands, v.pos = sub, nil
}

// deepest returns k of the holders hs (len(hs) > k) with the longest
// predicted prefixes: every holder deeper than the k-th deepest, and of
// those as deep as it, as many as fit, taken in hs's order from a random
// offset. The result is View scratch, valid until the next call.
func (v *View) deepest(hs []ReplicaID, k int) []ReplicaID {
	m := v.ms.m
	ds := v.depths[:0]
	for _, id := range hs {
		ds = append(ds, m[id])
	}
	v.depths = ds
	cut := kthLargest(ds, k, v)
	take := k // holders kept at the cut's depth: k less those deeper
	for _, id := range hs {
		if m[id] > cut {
			take--
		}
	}
	out := v.deep[:0]
	off := int(v.Random() % uint64(len(hs)))
	for i := range hs {
		id := hs[(off+i)%len(hs)]
		switch d := m[id]; {
		case d > cut:
			out = append(out, id)
		case d == cut && take > 0:
			out = append(out, id)
			take--
		}
	}
	v.deep = out
	return out
}

// kthLargest returns the k-th largest of a (1 <= k <= len(a)), reordering
// a: a quickselect with random pivots and a three-way partition, linear
// in len(a) however many values repeat (holders share few depths).
func kthLargest(a []int32, k int, v *View) int32 {
	lo, hi, at := 0, len(a), k-1 // a[at] in descending order, within a[lo:hi]
	for hi-lo > 1 {
		p := a[lo+int(v.Random()%uint64(hi-lo))]
		// a[lo:gt] > p, a[gt:eq] == p, a[lt:hi] < p, a[eq:lt] unread
		gt, eq, lt := lo, lo, hi
		for eq < lt {
			switch x := a[eq]; {
			case x > p:
				a[gt], a[eq] = x, a[gt]
				gt++
				eq++
			case x < p:
				lt--
				a[eq], a[lt] = a[lt], x
			default:
				eq++
			}
		}
		switch {
		case at < gt:
			hi = gt
		case at >= lt:
			lo = lt
		default:
			return p
		}
	}
	return a[lo]
}
