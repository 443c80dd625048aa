package affinity

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Defaults for HashConfig and Config. Each field's doc says what its zero
// value means.
const (
	DefaultBytesPerToken  = 4
	DefaultBlockTokens    = 64
	DefaultMaxPromptBytes = 16 << 20

	DefaultKVCapacityTokens    = 1 << 18 // 262144 tokens = 4096 blocks of 64
	DefaultPrefillTokensPerSec = 10000
	DefaultSignalMaxAge        = 10 * time.Second
	DefaultSessionTTL          = 10 * time.Minute
	DefaultMaxSessions         = 1 << 20
	DefaultMaxRanked           = 3
	DefaultLoadFactor          = 1.25
	DefaultRingVnodes          = 64
	DefaultLoadPenaltySeconds  = 0.005
	DefaultKVHighWater         = 0.9
	DefaultKVPenaltySeconds    = 0.5
	DefaultMaxScan             = 128
	DefaultSlotHold            = 5 * time.Second
	DefaultPolicy              = "cost"
)

// HashConfig fixes how prompts become block hashes. The Parser and the Router
// must use the same HashConfig (Router.HashConfig returns the one it uses).
type HashConfig struct {
	// BytesPerToken is the assumed mean canonical bytes per engine token, used
	// to turn bytes into token estimates and blocks into tokens. 0 means 4
	// (English BPE text averages 3.5-4.5 bytes per token; token-id prompts are
	// encoded as 4 bytes per id, so 4 makes them exact).
	BytesPerToken int `yaml:"bytes_per_token"`
	// BlockTokens is the hashing block, in tokens. 0 means 64. A block is
	// BlockTokens*BytesPerToken bytes (default 256). Smaller blocks find longer
	// shared prefixes and cost more index memory and hashing calls.
	BlockTokens int `yaml:"block_tokens"`
	// MaxPromptBytes caps the canonical prompt kept and hashed per request;
	// the token estimate still counts the rest. 0 means 16 MiB.
	MaxPromptBytes int `yaml:"max_prompt_bytes"`
}

// WithDefaults returns c with zero fields replaced by defaults.
func (c HashConfig) WithDefaults() HashConfig {
	if c.BytesPerToken == 0 {
		c.BytesPerToken = DefaultBytesPerToken
	}
	if c.BlockTokens == 0 {
		c.BlockTokens = DefaultBlockTokens
	}
	if c.MaxPromptBytes == 0 {
		c.MaxPromptBytes = DefaultMaxPromptBytes
	}
	return c
}

// Validate checks ranges after defaults.
func (c HashConfig) Validate() error {
	c = c.WithDefaults()
	switch {
	case c.BytesPerToken < 1 || c.BytesPerToken > 16:
		return fmt.Errorf("hash.bytes_per_token %d: want 1..16", c.BytesPerToken)
	case c.BlockTokens < 1 || c.BlockTokens > 4096:
		return fmt.Errorf("hash.block_tokens %d: want 1..4096", c.BlockTokens)
	case c.MaxPromptBytes < c.BlockBytes():
		return fmt.Errorf("hash.max_prompt_bytes %d: want >= one block (%d)", c.MaxPromptBytes, c.BlockBytes())
	}
	return nil
}

// BlockBytes is the block size in canonical bytes.
func (c HashConfig) BlockBytes() int {
	c = c.WithDefaults()
	return c.BlockTokens * c.BytesPerToken
}

// HashPath reports the xxh3 vector path used for this block size.
func (c HashConfig) HashPath() string { return hashPathFor(c.BlockBytes()) }

// Config configures a Router. The zero value is valid: every zero field takes
// its documented default. Fields tagged reload:"live" can change on a
// running Router (Router.Retune); the others are fixed at NewRouter.
type Config struct {
	// Policy names the ranking policy (see PolicyNames). "" means "cost".
	Policy string `yaml:"policy"`
	// Hash must match the Parser's HashConfig.
	Hash HashConfig `yaml:"hash"`
	// DefaultKVCapacityTokens bounds the index for a replica whose spec and
	// signals give no KV capacity. 0 means 262144 tokens (4096 blocks).
	DefaultKVCapacityTokens int `yaml:"default_kv_capacity_tokens"`
	// DefaultPrefillTokensPerSec seeds each replica's prefill-rate estimate
	// when its spec gives none. 0 means 10000 tokens/s.
	DefaultPrefillTokensPerSec float64 `yaml:"default_prefill_tokens_per_sec"`
	// SignalMaxAge: engine signals older than this (by the request's Now) are
	// ignored; the router then relies on its own in-flight counts. 0 means 10s.
	SignalMaxAge time.Duration `yaml:"signal_max_age" reload:"live"`
	// SessionTTL: how long a session stays pinned to its replica after its
	// last request (session policy). 0 means 10m.
	SessionTTL time.Duration `yaml:"session_ttl" reload:"live"`
	// MaxSessions bounds the session table; new sessions beyond it are not
	// pinned. 0 means 1<<20.
	MaxSessions int `yaml:"max_sessions"`
	// MaxRanked is how many replicas a Decision ranks (the proxy's retry
	// budget). 0 means 3.
	MaxRanked int `yaml:"max_ranked" reload:"live"`
	// LoadFactor is the bounded-load factor of the consistent-hash policy: a
	// replica accepts while in-flight+1 <= LoadFactor * mean. 0 means 1.25.
	LoadFactor float64 `yaml:"load_factor" reload:"live"`
	// RingVnodes is the number of ring points per unit of weight (consistent
	// hash policy). 0 means 64.
	RingVnodes int `yaml:"ring_vnodes"`
	// LoadPenaltySeconds (cost policy) is the TTFT cost of each request in
	// flight on a replica (decode work sharing the batch). 0 means 0.005;
	// negative turns the term off.
	LoadPenaltySeconds float64 `yaml:"load_penalty_seconds" reload:"live"`
	// KVHighWater and KVPenaltySeconds (cost policy): above this KV usage an
	// engine starts evicting or preempting; the penalty grows linearly to
	// KVPenaltySeconds at full usage. 0 means 0.9 and 0.5; a negative
	// KVPenaltySeconds turns the term off.
	KVHighWater      float64 `yaml:"kv_high_water" reload:"live"`
	KVPenaltySeconds float64 `yaml:"kv_penalty_seconds" reload:"live"`
	// MaxScan (cost policy) bounds the replicas scored per decision: above
	// it, a random window of MaxScan candidates plus the MaxScan candidates
	// outside it holding the deepest parts of the request's prefix (all of
	// them when fewer hold any). 0 means 128; negative scores all.
	MaxScan int `yaml:"max_scan" reload:"live"`
	// LearnSlotWaits scales the priced wait for a batch slot by what such
	// waits measured on the replica's pool (fleetPrefill.waitScale). How
	// slot time grows as the batch fills (σ, llama.cpp on CPU cores) is
	// learned without it; this corrects what that leaves. Off by default:
	// on the simulator's engines the learned factor moved conversations
	// off their replicas and cost 5-13% on small-batch fleets
	// (affinity/README.md).
	LearnSlotWaits bool `yaml:"learn_slot_waits"`
	// SlotHold (cost policy) bounds how long in all a request may wait at
	// the router for a busy batch slot that holds its prompt, on engines
	// whose slots each keep only their own prompt (llama.cpp), where that
	// is predicted faster than computing the prompt again in another slot
	// (Decision.Hold). 0 means 5s; negative never holds.
	SlotHold time.Duration `yaml:"slot_hold" reload:"live"`
	// CopyComputed (cost policy, with SlotHold) advises no wait for a busy
	// slot whose prompt holds the request's prefix computed already (its
	// request decodes, or found the prefix there and computes only the
	// rest): the request computes a copy in another slot, which the
	// requests after it can use too. Holds remain for a prefix a busy slot
	// is still computing. Off by default: it suits one hot prefix (the
	// one-company workload), and costs where many prefixes share the
	// slots (a copy evicts another's only one) (affinity/README.md
	// "Copies instead of waits").
	CopyComputed bool `yaml:"copy_computed" reload:"live"`
	// NoStepPhase (cost policy) turns off the step-phase term: the wait
	// for an engine's running step, learned from the gaps between a
	// stream's events (stepphase.go, affinity/README.md "The step's
	// phase"). For comparisons; on by default.
	NoStepPhase bool `yaml:"no_step_phase" reload:"live"`
	// Seed seeds tie-breaking randomness (set it for reproducible
	// simulations). 0 means a fixed default.
	Seed uint64 `yaml:"seed"`
}

// WithDefaults returns c with zero fields replaced by defaults.
func (c Config) WithDefaults() Config {
	if c.Policy == "" {
		c.Policy = DefaultPolicy
	}
	c.Hash = c.Hash.WithDefaults()
	if c.DefaultKVCapacityTokens == 0 {
		c.DefaultKVCapacityTokens = DefaultKVCapacityTokens
	}
	if c.DefaultPrefillTokensPerSec == 0 {
		c.DefaultPrefillTokensPerSec = DefaultPrefillTokensPerSec
	}
	if c.SignalMaxAge == 0 {
		c.SignalMaxAge = DefaultSignalMaxAge
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.MaxSessions == 0 {
		c.MaxSessions = DefaultMaxSessions
	}
	if c.MaxRanked == 0 {
		c.MaxRanked = DefaultMaxRanked
	}
	if c.LoadFactor == 0 {
		c.LoadFactor = DefaultLoadFactor
	}
	if c.RingVnodes == 0 {
		c.RingVnodes = DefaultRingVnodes
	}
	c.LoadPenaltySeconds = defaultOrOff(c.LoadPenaltySeconds, DefaultLoadPenaltySeconds)
	if c.KVHighWater == 0 {
		c.KVHighWater = DefaultKVHighWater
	}
	c.KVPenaltySeconds = defaultOrOff(c.KVPenaltySeconds, DefaultKVPenaltySeconds)
	if c.SlotHold == 0 {
		c.SlotHold = DefaultSlotHold
	}
	if c.MaxScan == 0 {
		c.MaxScan = DefaultMaxScan
	}
	if c.Seed == 0 {
		c.Seed = 0x5EED
	}
	return c
}

// defaultOrOff resolves a penalty term: 0 takes the default, a negative
// value is "off" and becomes -0, which multiplies to nothing in the policy
// and which a second WithDefaults keeps (it is 0 with the sign bit set, not
// the unset 0).
func defaultOrOff(v, def float64) float64 {
	switch {
	case v < 0 || (v == 0 && math.Signbit(v)):
		return math.Copysign(0, -1)
	case v == 0:
		return def
	}
	return v
}

// finite reports whether f is neither NaN nor an infinity.
func finite(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }

// Validate checks every field after defaults and returns every problem (an
// errors.Join); messages name the field and the allowed range.
func (c Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	nonFinite := map[string]bool{}
	for _, f := range [...]struct {
		name string
		v    float64
	}{
		{"default_prefill_tokens_per_sec", c.DefaultPrefillTokensPerSec}, {"load_factor", c.LoadFactor},
		{"load_penalty_seconds", c.LoadPenaltySeconds}, {"kv_high_water", c.KVHighWater},
		{"kv_penalty_seconds", c.KVPenaltySeconds},
	} {
		if !finite(f.v) {
			add("%s %g: want a finite number", f.name, f.v)
			nonFinite[f.name] = true
		}
	}
	c = c.WithDefaults()
	if err := c.Hash.Validate(); err != nil {
		errs = append(errs, err)
	}
	if !knownPolicy(c.Policy) {
		add("policy %q: want one of %v", c.Policy, PolicyNames())
	}
	if c.DefaultKVCapacityTokens < 0 {
		add("default_kv_capacity_tokens %d: want >= 0", c.DefaultKVCapacityTokens)
	}
	if c.DefaultPrefillTokensPerSec < 0 && !nonFinite["default_prefill_tokens_per_sec"] {
		add("default_prefill_tokens_per_sec %g: want > 0", c.DefaultPrefillTokensPerSec)
	}
	if c.SignalMaxAge < 0 {
		add("signal_max_age %v: want > 0", c.SignalMaxAge)
	}
	if c.SessionTTL < 0 {
		add("session_ttl %v: want > 0", c.SessionTTL)
	}
	if c.MaxSessions < 0 {
		add("max_sessions %d: want >= 0", c.MaxSessions)
	}
	if c.MaxRanked < 1 || c.MaxRanked > 64 {
		add("max_ranked %d: want 1..64", c.MaxRanked)
	}
	if c.LoadFactor < 1 && !nonFinite["load_factor"] {
		add("load_factor %g: want >= 1", c.LoadFactor)
	}
	if c.RingVnodes < 1 || c.RingVnodes > 4096 {
		add("ring_vnodes %d: want 1..4096", c.RingVnodes)
	}
	if c.LoadPenaltySeconds < 0 && !nonFinite["load_penalty_seconds"] {
		add("load_penalty_seconds %g: want >= 0", c.LoadPenaltySeconds)
	}
	if (c.KVHighWater <= 0 || c.KVHighWater >= 1) && !nonFinite["kv_high_water"] {
		add("kv_high_water %g: want (0, 1)", c.KVHighWater)
	}
	if c.KVPenaltySeconds < 0 && !nonFinite["kv_penalty_seconds"] {
		add("kv_penalty_seconds %g: want >= 0", c.KVPenaltySeconds)
	}
	return errors.Join(errs...)
}
