package affinity

import (
	"fmt"
	"math"
	"sync"
	"time"
)

// This file is the fast-path promotion rule: which clients get an in-kernel
// affinity entry to one replica, and when it is re-validated, moved or
// dropped. rebalance.go drops the entries of saturated replicas;
// promote_clients.go keeps the tracked clients. Pure: the caller passes
// every time and does the map writes. README.md "Promotion".

// Action is what the caller should do with a client's fast-path entry.
type Action uint8

const (
	// ActionNone: leave the entry, or its absence, as it is.
	ActionNone Action = iota
	// ActionPromote: write client -> replica (the client had no entry).
	ActionPromote
	// ActionMove: re-point the client's entry to the replica.
	ActionMove
	// ActionDrop: delete the client's entry; its requests go back to the
	// slowpath and are routed on their own merits.
	ActionDrop
)

func (a Action) String() string {
	switch a {
	case ActionPromote:
		return "promote"
	case ActionMove:
		return "move"
	case ActionDrop:
		return "drop"
	}
	return "none"
}

// Defaults of PromoterConfig.
const (
	DefaultPromoteMaxClients        = 1 << 16
	DefaultPromoteWindow            = 3
	DefaultPromoteMinCachedFraction = 0.5
	DefaultPromoteMinCachedTokens   = 256
	DefaultPromoteHorizon           = 30 * time.Second
	DefaultPromoteMaxPrefixes       = 4
	DefaultPromoteMaxShare          = 0.5
	DefaultPromoteRequestCostTokens = 256
	DefaultPromoteIdleTTL           = 5 * time.Minute
	DefaultSaturationRatio          = 1.5
	DefaultSaturationExcess         = 4

	maxPromoteWindow = 8 // Window's upper bound (fixed per-client ring)
	distinctSlots    = 8 // distinct first blocks / sessions tracked per client
)

// PromoterConfig holds the promotion rule's thresholds. Every zero value
// means the default; yaml keys are the snake_case names.
type PromoterConfig struct {
	// MaxClients bounds the tracked clients (an LRU). 0 means 65536; each
	// costs about 560 bytes.
	MaxClients int `yaml:"max_clients"`
	// Window is N: a client is promoted when its last N requests chose the
	// same replica (with a substantial cached prefix, or one session id).
	// 0 means 3; 1..8.
	Window int `yaml:"window"`
	// MinCachedFraction and MinCachedTokens define "substantial": over the
	// window, predicted cached tokens / prompt tokens >= the fraction (0
	// means 0.5) and cached tokens per request >= MinCachedTokens (0 means
	// 256, four default blocks).
	MinCachedFraction float64 `yaml:"min_cached_fraction"`
	MinCachedTokens   int     `yaml:"min_cached_tokens"`
	// Horizon is the window of the demand rate and of prefix diversity:
	// distinct keys older than Horizon are forgotten and the demand sum
	// decays with this time constant. 0 means 30s.
	Horizon time.Duration `yaml:"horizon"`
	// MaxPrefixes is the most distinct first-block hashes (and, separately,
	// session keys) a client may show within Horizon and still be one user.
	// 0 means 4; 1..7.
	MaxPrefixes int `yaml:"max_prefixes"`
	// MaxShare is the largest fraction of its replica's prefill rate a
	// promoted client's demand may take. 0 means 0.5; (0, 1].
	MaxShare float64 `yaml:"max_share"`
	// RequestCostTokens is a request's fixed cost (decode share, scheduling)
	// in prefill-token equivalents, added to its uncached tokens in the
	// demand. 0 means 256.
	RequestCostTokens float64 `yaml:"request_cost_tokens"`
	// DefaultPrefillTokensPerSec is the replica capacity used when an
	// Observation gives none. 0 means 10000 (Config's default).
	DefaultPrefillTokensPerSec float64 `yaml:"default_prefill_tokens_per_sec"`
	// IdleTTL: Rebalance drops entries unused for longer. 0 means 5m.
	IdleTTL time.Duration `yaml:"idle_ttl"`
	// SaturationRatio and SaturationExcess: a replica is saturated when its
	// busy requests per unit weight exceed both SaturationRatio x the mean
	// over eligible replicas (0 means 1.5; > 1) and the mean plus
	// SaturationExcess (0 means 4).
	SaturationRatio  float64 `yaml:"saturation_ratio"`
	SaturationExcess float64 `yaml:"saturation_excess"`
}

// WithDefaults returns c with zero fields replaced by defaults.
func (c PromoterConfig) WithDefaults() PromoterConfig {
	def := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	if c.MaxClients == 0 {
		c.MaxClients = DefaultPromoteMaxClients
	}
	if c.Window == 0 {
		c.Window = DefaultPromoteWindow
	}
	def(&c.MinCachedFraction, DefaultPromoteMinCachedFraction)
	if c.MinCachedTokens == 0 {
		c.MinCachedTokens = DefaultPromoteMinCachedTokens
	}
	if c.Horizon == 0 {
		c.Horizon = DefaultPromoteHorizon
	}
	if c.MaxPrefixes == 0 {
		c.MaxPrefixes = DefaultPromoteMaxPrefixes
	}
	def(&c.MaxShare, DefaultPromoteMaxShare)
	def(&c.RequestCostTokens, DefaultPromoteRequestCostTokens)
	def(&c.DefaultPrefillTokensPerSec, DefaultPrefillTokensPerSec)
	if c.IdleTTL == 0 {
		c.IdleTTL = DefaultPromoteIdleTTL
	}
	def(&c.SaturationRatio, DefaultSaturationRatio)
	def(&c.SaturationExcess, DefaultSaturationExcess)
	return c
}

// Validate checks ranges after defaults; the error names the field.
func (c PromoterConfig) Validate() error {
	c = c.WithDefaults()
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) }
	switch {
	case c.MaxClients < 1 || c.MaxClients > 1<<26:
		return fmt.Errorf("max_clients %d: want 1..%d", c.MaxClients, 1<<26)
	case c.Window < 1 || c.Window > maxPromoteWindow:
		return fmt.Errorf("window %d: want 1..%d", c.Window, maxPromoteWindow)
	case bad(c.MinCachedFraction) || c.MinCachedFraction < 0 || c.MinCachedFraction > 1:
		return fmt.Errorf("min_cached_fraction %g: want 0..1", c.MinCachedFraction)
	case c.MinCachedTokens < 0:
		return fmt.Errorf("min_cached_tokens %d: want >= 0", c.MinCachedTokens)
	case c.Horizon < 0:
		return fmt.Errorf("horizon %v: want > 0", c.Horizon)
	case c.MaxPrefixes < 1 || c.MaxPrefixes >= distinctSlots:
		return fmt.Errorf("max_prefixes %d: want 1..%d", c.MaxPrefixes, distinctSlots-1)
	case bad(c.MaxShare) || c.MaxShare <= 0 || c.MaxShare > 1:
		return fmt.Errorf("max_share %g: want (0, 1]", c.MaxShare)
	case bad(c.RequestCostTokens) || c.RequestCostTokens < 0:
		return fmt.Errorf("request_cost_tokens %g: want >= 0", c.RequestCostTokens)
	case bad(c.DefaultPrefillTokensPerSec) || c.DefaultPrefillTokensPerSec <= 0:
		return fmt.Errorf("default_prefill_tokens_per_sec %g: want > 0", c.DefaultPrefillTokensPerSec)
	case c.IdleTTL < 0:
		return fmt.Errorf("idle_ttl %v: want > 0", c.IdleTTL)
	case bad(c.SaturationRatio) || c.SaturationRatio <= 1:
		return fmt.Errorf("saturation_ratio %g: want > 1", c.SaturationRatio)
	case bad(c.SaturationExcess) || c.SaturationExcess < 0:
		return fmt.Errorf("saturation_excess %g: want >= 0", c.SaturationExcess)
	}
	return nil
}

// Observation is one routed request as the promotion rule sees it. Fill it
// from the request and its Flight after Router.Begin (Observation.Fill).
type Observation struct {
	Client       uint64    // hash of the source address (the fast path's key)
	Replica      ReplicaID // the replica the request was sent to
	FirstBlock   uint64    // Request.Hashes[0] (model-seeded); 0 = none
	SessionKey   uint64    // Request.SessionKey; 0 = none
	PromptTokens int       // estimated prompt tokens
	CachedTokens int       // predicted cached prefix on Replica
	// Capacity is the replica's prefill rate in tokens/s
	// (Router.PrefillRate); 0 means PromoterConfig.DefaultPrefillTokensPerSec.
	Capacity float64
	// Scale is how many requests this one stands for in the demand estimate:
	// a promoted client's sampled connection stands for the sampling period
	// (every Nth SYN: N). 0 means 1.
	Scale float64
	Now   int64 // nanoseconds on the caller's clock
}

// Fill sets o from a begun request: client key, replica and predicted cached
// tokens from f (Router.Begin), first block, session, prompt size and time
// from req. Capacity and Scale are left to the caller.
func (o *Observation) Fill(client uint64, req *Request, f *Flight) {
	*o = Observation{Client: client, Replica: f.Replica, SessionKey: req.SessionKey,
		PromptTokens: f.PromptTokens, CachedTokens: f.PromptTokens - f.UncachedTokens, Now: req.Now}
	if len(req.Hashes) > 0 {
		o.FirstBlock = req.Hashes[0]
	}
}

// PromoterStats are cumulative counters.
type PromoterStats struct {
	Observed, Promotions, Moves, Drops uint64
	Crowds                             uint64 // observations of a many-user client (not promoted, or dropped)
	Evictions                          uint64 // tracked clients evicted by the LRU bound
	Tracked, Promoted                  int    // current
}

// Promoter applies the promotion rule. Observe is the per-request call (no
// allocation once warm); Rebalance the control loop's. Safe for concurrent
// use (one mutex, held for O(1) work per Observe).
type Promoter struct {
	cfg     PromoterConfig
	horizon float64 // seconds

	mu       sync.Mutex
	clients  []pclient // slab; LRU list through prev/next
	head     int32     // most recently seen; -1 = empty
	tail     int32
	table    clientTable
	promoted int
	st       PromoterStats
}

// NewPromoter validates cfg and returns an empty Promoter.
func NewPromoter(cfg PromoterConfig) (*Promoter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("promoter config: %w", err)
	}
	cfg = cfg.WithDefaults()
	return &Promoter{cfg: cfg, horizon: cfg.Horizon.Seconds(), head: -1, tail: -1,
		table: newClientTable(cfg.MaxClients)}, nil
}

// Config returns the effective configuration.
func (p *Promoter) Config() PromoterConfig { return p.cfg }

// Observe records one routed request and says what to do with its client's
// fast-path entry: promote it to the returned replica, move it there, drop
// it (the returned replica is the one it pointed to), or nothing. For a
// client the Promoter believes promoted, every observation re-validates the
// entry (its requests only reach the slowpath through sampled connections).
// An observation without a replica (NoReplica) is ignored.
func (p *Promoter) Observe(o *Observation) (Action, ReplicaID) {
	if o.Replica < 0 { // the request was not begun anywhere
		return ActionNone, NoReplica
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.st.Observed++
	c := p.touch(o.Client, o.Now)
	cfg := &p.cfg
	now := o.Now

	// Demand: decayed sum, time constant Horizon.
	scale := o.Scale
	if !(scale > 0) {
		scale = 1
	}
	if c.demandAt != 0 && now > c.demandAt {
		c.demand *= math.Exp(-float64(now-c.demandAt) / 1e9 / p.horizon)
	}
	c.demandAt = max(c.demandAt, now)
	c.demand += scale * (float64(max(o.PromptTokens-o.CachedTokens, 0)) + cfg.RequestCostTokens)
	hz := int64(cfg.Horizon)
	np := noteKey(&c.prefixes, o.FirstBlock, now, hz)
	ns := noteKey(&c.sessions, o.SessionKey, now, hz)
	capacity := o.Capacity
	if !(capacity > 0) {
		capacity = cfg.DefaultPrefillTokensPerSec
	}
	crowd := np > cfg.MaxPrefixes || ns > cfg.MaxPrefixes ||
		c.demand/p.horizon > cfg.MaxShare*capacity

	// The ring of recent choices.
	c.ring[c.pos] = pobs{replica: o.Replica, cached: int32(min(max(o.CachedTokens, 0), math.MaxInt32)),
		prompt: int32(min(max(o.PromptTokens, 0), math.MaxInt32)), session: o.SessionKey}
	c.pos = uint8((int(c.pos) + 1) % cfg.Window)
	c.n = uint8(min(int(c.n)+1, cfg.Window))

	if crowd {
		p.st.Crowds++
	}
	if c.promoted != NoReplica { // re-validation
		from := c.promoted
		switch {
		case crowd:
		case o.Replica == from:
			c.cacheAvg += 0.25 * (float64(o.CachedTokens) - c.cacheAvg)
			return ActionNone, from
		case p.substantial(int64(o.CachedTokens), int64(o.PromptTokens), 1):
			c.promoted, c.promotedAt = o.Replica, now
			c.cacheAvg = float64(o.CachedTokens)
			p.st.Moves++
			return ActionMove, o.Replica
		}
		p.demote(c)
		p.st.Drops++
		return ActionDrop, from
	}
	if crowd || int(c.n) < cfg.Window {
		return ActionNone, NoReplica
	}
	r := c.ring[0].replica
	sess := c.ring[0].session
	var cached, prompt int64
	for i := range cfg.Window {
		e := &c.ring[i]
		if e.replica != r {
			return ActionNone, NoReplica
		}
		if e.session != sess {
			sess = 0
		}
		cached += int64(e.cached)
		prompt += int64(e.prompt)
	}
	if sess == 0 && !p.substantial(cached, prompt, cfg.Window) {
		return ActionNone, NoReplica
	}
	c.promoted, c.promotedAt = r, now
	c.cacheAvg = float64(cached) / float64(cfg.Window)
	p.promoted++
	p.st.Promotions++
	return ActionPromote, r
}

// substantial: n requests with cached of prompt tokens reuse enough.
func (p *Promoter) substantial(cached, prompt int64, n int) bool {
	return cached > 0 && float64(cached) >= p.cfg.MinCachedFraction*float64(prompt) &&
		cached >= int64(p.cfg.MinCachedTokens)*int64(n)
}

// noteKey records key (0 = none) as seen at now and returns how many
// distinct keys were seen within hz (saturating at distinctSlots).
func noteKey(set *[distinctSlots]seenKey, key uint64, now, hz int64) int {
	live, slot, oldest := 0, -1, -1
	for i := range set {
		e := &set[i]
		if key != 0 && e.key == key {
			e.at = now
			slot = -2
		}
		if e.key != 0 && now-e.at <= hz {
			live++
		} else if slot == -1 {
			slot = i // free or expired
		}
		if oldest < 0 || e.at < set[oldest].at {
			oldest = i
		}
	}
	if key == 0 || slot == -2 {
		return live
	}
	if slot < 0 {
		slot = oldest // all live: the set is saturated, keep the newest
	} else {
		live++
	}
	set[slot] = seenKey{key, now}
	return live
}

// demote clears c's promotion and its window (it must earn a new one).
func (p *Promoter) demote(c *pclient) {
	if c.promoted != NoReplica {
		p.promoted--
	}
	c.promoted = NoReplica
	c.n, c.pos = 0, 0
}

// Demote forgets client's promotion (its entry was deleted elsewhere, e.g.
// by the datapath's own expiry). It reports whether the client was promoted.
func (p *Promoter) Demote(client uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := p.table.get(client)
	if i < 0 || p.clients[i].promoted == NoReplica {
		return false
	}
	p.demote(&p.clients[i])
	return true
}

// Promoted appends the promoted clients' entries to dst, as the Promoter
// knows them (LastUsed = its last observation; merge the datapath's
// last-steered time before Rebalance). It allocates only to grow dst.
func (p *Promoter) Promoted(dst []Entry) []Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i := range p.clients {
		c := &p.clients[i]
		if c.promoted != NoReplica {
			dst = append(dst, Entry{Client: c.key, Replica: c.promoted, PromotedAt: c.promotedAt,
				LastUsed: c.lastSeen, CacheValue: c.cacheAvg})
		}
	}
	return dst
}

// Stats returns the counters.
func (p *Promoter) Stats() PromoterStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	s := p.st
	s.Tracked, s.Promoted = len(p.clients), p.promoted
	return s
}
