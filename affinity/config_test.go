package affinity

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestConfigNonFinite: NaN and infinities are refused, naming the field
// (every comparison with NaN is false, so range checks alone let it in).
func TestConfigNonFinite(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for _, tc := range []struct {
		name string
		cfg  Config
	}{
		{"load_factor", Config{LoadFactor: nan}},
		{"kv_high_water", Config{KVHighWater: nan}},
		{"load_penalty_seconds", Config{LoadPenaltySeconds: inf}},
		{"kv_penalty_seconds", Config{KVPenaltySeconds: -inf}},
		{"default_prefill_tokens_per_sec", Config{DefaultPrefillTokensPerSec: nan}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if err == nil || !strings.HasPrefix(err.Error(), tc.name+" ") || !strings.Contains(err.Error(), "want a finite number") {
				t.Fatalf("Validate: %v, want an error naming %s", err, tc.name)
			}
			if _, err := NewRouter(tc.cfg); err == nil {
				t.Fatal("NewRouter accepted it")
			}
		})
	}
}

// TestPenaltyOff: a negative penalty turns its term off (0 cannot: it
// means the default), and stays off through repeated WithDefaults.
func TestPenaltyOff(t *testing.T) {
	c := Config{LoadPenaltySeconds: -1, KVPenaltySeconds: -0.5}.WithDefaults().WithDefaults()
	if c.LoadPenaltySeconds != 0 || c.KVPenaltySeconds != 0 || c.Validate() != nil {
		t.Fatalf("off: load %v, kv %v, %v", c.LoadPenaltySeconds, c.KVPenaltySeconds, c.Validate())
	}
	if d := (Config{}).WithDefaults(); d.LoadPenaltySeconds != DefaultLoadPenaltySeconds || d.KVPenaltySeconds != DefaultKVPenaltySeconds {
		t.Fatalf("0 must still mean the default: %+v", d)
	}
	// Behaviour: with the KV penalty on, the replica under KV pressure
	// never wins a tie; with it off, it does.
	for _, off := range []bool{false, true} {
		cfg := Config{SignalMaxAge: time.Minute}
		if off {
			cfg.KVPenaltySeconds = -1
		}
		r, ids := buildRouter(t, cfg, state{n: 2})
		req := promptReq(t, "cold", "u")
		req.Now = int64(10 * time.Second)
		r.SetSignals(ids[0], EngineSignals{KVUsage: 0.99, At: req.Now})
		r.SetSignals(ids[1], EngineSignals{KVUsage: 0.5, At: req.Now})
		pressured := 0
		for range 40 {
			if decide(t, r, req).Ranked[0] == ids[0] {
				pressured++
			}
		}
		if !off && pressured != 0 {
			t.Fatalf("penalty on: the pressured replica won %d of 40", pressured)
		}
		if off && pressured == 0 {
			t.Fatal("penalty off: the pressured replica never won a tie")
		}
	}
}
