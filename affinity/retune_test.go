package affinity

import (
	"reflect"
	"sync"
	"testing"
	"time"
)

// retuneValues gives each live field a valid value unlike its default.
var retuneValues = map[string]any{
	"signal_max_age":       3 * time.Second,
	"session_ttl":          time.Minute,
	"max_ranked":           1,
	"load_factor":          2.0,
	"load_penalty_seconds": 0.02,
	"kv_high_water":        0.5,
	"kv_penalty_seconds":   2.0,
	"max_scan":             7,
	"slot_hold":            time.Second,
	"copy_computed":        true,
	"no_step_phase":        true,
}

// TestRetuneAppliesEveryLiveField: every field tagged reload:"live"
// changes on Retune and no other field does, for every policy.
func TestRetuneAppliesEveryLiveField(t *testing.T) {
	ct := reflect.TypeFor[Config]()
	live := 0
	for i := range ct.NumField() {
		f := ct.Field(i)
		name := f.Tag.Get("yaml")
		if f.Tag.Get("reload") != "live" {
			continue
		}
		live++
		val, ok := retuneValues[name]
		if !ok {
			t.Fatalf("live field %s has no test value in retuneValues", name)
		}
		for _, pol := range PolicyNames() {
			r, _ := newTestRouter(t, Config{Policy: pol}, 2)
			before := r.Config()
			next := Config{Policy: "round-robin", Hash: HashConfig{BlockTokens: 16}, RingVnodes: 3, Seed: 9}
			reflect.ValueOf(&next).Elem().Field(i).Set(reflect.ValueOf(val))
			if err := r.Retune(next); err != nil {
				t.Fatalf("%s/%s: %v", pol, name, err)
			}
			after := r.Config()
			if got := reflect.ValueOf(after).Field(i).Interface(); got != val {
				t.Errorf("%s/%s: after Retune = %v, want %v", pol, name, got, val)
			}
			// Everything else, fixed fields included, is as before.
			reflect.ValueOf(&after).Elem().Field(i).Set(reflect.ValueOf(before).Field(i))
			if !reflect.DeepEqual(after, before) || r.PolicyName() != pol {
				t.Errorf("%s/%s: Retune changed other fields:\n%+v\nwas\n%+v", pol, name, after, before)
			}
		}
	}
	if live != len(retuneValues) {
		t.Fatalf("%d live fields, %d test values", live, len(retuneValues))
	}
}

// TestRetuneMaxRankedDecides: the next decision ranks as many replicas as
// the retuned max_ranked says.
func TestRetuneMaxRankedDecides(t *testing.T) {
	r, _ := newTestRouter(t, Config{}, 4)
	req := request(t, chatBody("m", "system", "hi"), 1)
	var d Decision
	if err := r.Decide(req, &d); err != nil || len(d.Ranked) != DefaultMaxRanked {
		t.Fatalf("before: %d ranked, err %v", len(d.Ranked), err)
	}
	if err := r.Retune(Config{MaxRanked: 1}); err != nil {
		t.Fatal(err)
	}
	if err := r.Decide(req, &d); err != nil || len(d.Ranked) != 1 {
		t.Fatalf("after: %d ranked, err %v", len(d.Ranked), err)
	}
	if err := r.Retune(Config{MaxRanked: 99}); err == nil {
		t.Fatal("Retune accepted max_ranked 99")
	}
	if r.Config().MaxRanked != 1 {
		t.Fatalf("a refused Retune changed max_ranked to %d", r.Config().MaxRanked)
	}
}

// TestRetuneConcurrentDecide: Retune while decisions run (the race
// detector checks the locking).
func TestRetuneConcurrentDecide(t *testing.T) {
	r, _ := newTestRouter(t, Config{}, 4)
	var wg sync.WaitGroup
	for g := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := request(t, chatBody("m", "system", "hi"), int64(g+1))
			var d Decision
			for range 500 {
				_ = r.Decide(req, &d)
				_ = r.HashConfig()
			}
		}()
	}
	for i := range 200 {
		if err := r.Retune(Config{MaxRanked: 1 + i%3, LoadPenaltySeconds: float64(i%5) / 100}); err != nil {
			t.Error(err)
		}
	}
	wg.Wait()
}
