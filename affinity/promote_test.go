package affinity

import (
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

func newPromoter(t testing.TB, cfg PromoterConfig) *Promoter {
	t.Helper()
	p, err := NewPromoter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// step is one observation in a scripted sequence and the answer expected.
type step struct {
	o    Observation
	want Action
	to   ReplicaID
}

// chat is a client that always sends prefix 0xAB with a warm cache on rep.
func chat(client uint64, rep ReplicaID, at time.Duration, cached int) Observation {
	return Observation{Client: client, Replica: rep, FirstBlock: 0xAB, PromptTokens: 4096,
		CachedTokens: cached, Now: int64(at)}
}

func TestPromoterObserve(t *testing.T) {
	sec := time.Second
	withSession := func(o Observation, s uint64) Observation { o.SessionKey = s; return o }
	withPrefix := func(o Observation, h uint64) Observation { o.FirstBlock = h; return o }
	tests := []struct {
		name  string
		cfg   PromoterConfig
		steps []step
	}{
		{"consistent cached client is promoted on the Nth request", PromoterConfig{}, []step{
			{chat(1, 2, 1*sec, 0), ActionNone, NoReplica}, // cold first request warms replica 2
			{chat(1, 2, 2*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 4000), ActionPromote, 2},
			{chat(1, 2, 4*sec, 4000), ActionNone, 2}, // re-validated: keep
		}},
		{"replicas differ within the window: no promotion", PromoterConfig{}, []step{
			{chat(1, 2, 1*sec, 4000), ActionNone, NoReplica},
			{chat(1, 3, 2*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 4*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 5*sec, 4000), ActionPromote, 2}, // three in a row now
		}},
		{"cached prefix too small: no promotion", PromoterConfig{}, []step{
			{chat(1, 2, 1*sec, 1000), ActionNone, NoReplica},
			{chat(1, 2, 2*sec, 1000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 1000), ActionNone, NoReplica}, // 25% < 50%
		}},
		{"small prompts below MinCachedTokens: no promotion", PromoterConfig{}, []step{
			{Observation{Client: 1, Replica: 2, FirstBlock: 1, PromptTokens: 200, CachedTokens: 128, Now: int64(sec)}, ActionNone, NoReplica},
			{Observation{Client: 1, Replica: 2, FirstBlock: 1, PromptTokens: 200, CachedTokens: 128, Now: int64(2 * sec)}, ActionNone, NoReplica},
			{Observation{Client: 1, Replica: 2, FirstBlock: 1, PromptTokens: 200, CachedTokens: 128, Now: int64(3 * sec)}, ActionNone, NoReplica},
		}},
		{"a session id pins without a cached prefix", PromoterConfig{}, []step{
			{withSession(chat(1, 4, 1*sec, 0), 77), ActionNone, NoReplica},
			{withSession(chat(1, 4, 2*sec, 0), 77), ActionNone, NoReplica},
			{withSession(chat(1, 4, 3*sec, 0), 77), ActionPromote, 4},
		}},
		{"changing sessions without a cached prefix: no promotion", PromoterConfig{}, []step{
			{withSession(chat(1, 4, 1*sec, 0), 77), ActionNone, NoReplica},
			{withSession(chat(1, 4, 2*sec, 0), 78), ActionNone, NoReplica},
			{withSession(chat(1, 4, 3*sec, 0), 79), ActionNone, NoReplica},
		}},
		{"window of one", PromoterConfig{Window: 1}, []step{
			{chat(1, 5, 1*sec, 4000), ActionPromote, 5},
		}},
		{"many users behind one address: diverse prefixes never promote", PromoterConfig{}, []step{
			{withPrefix(chat(1, 2, 1*sec, 4000), 1), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 2*sec, 4000), 2), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 3*sec, 4000), 3), ActionPromote, 2}, // 3 prefixes: still one user
			{withPrefix(chat(1, 2, 4*sec, 4000), 4), ActionNone, 2},
			{withPrefix(chat(1, 2, 5*sec, 4000), 5), ActionDrop, 2}, // 5 distinct > 4: a crowd
			{withPrefix(chat(1, 2, 6*sec, 4000), 6), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 7*sec, 4000), 7), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 8*sec, 4000), 8), ActionNone, NoReplica},
		}},
		{"many sessions behind one address: no promotion", PromoterConfig{}, []step{
			{withSession(chat(1, 2, 1*sec, 4000), 1), ActionNone, NoReplica},
			{withSession(chat(1, 2, 2*sec, 4000), 2), ActionNone, NoReplica},
			{withSession(chat(1, 2, 3*sec, 4000), 3), ActionPromote, 2},
			{withSession(chat(1, 2, 4*sec, 4000), 4), ActionNone, 2},
			{withSession(chat(1, 2, 5*sec, 4000), 5), ActionDrop, 2},
		}},
		{"diversity is forgotten after the horizon", PromoterConfig{Horizon: 10 * time.Second}, []step{
			{withPrefix(chat(1, 2, 1*sec, 4000), 1), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 2*sec, 4000), 2), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 3*sec, 4000), 3), ActionPromote, 2},
			{withPrefix(chat(1, 2, 4*sec, 4000), 4), ActionNone, 2},
			{withPrefix(chat(1, 2, 5*sec, 4000), 5), ActionDrop, 2},
			{withPrefix(chat(1, 2, 30*sec, 4000), 9), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 31*sec, 4000), 9), ActionNone, NoReplica},
			{withPrefix(chat(1, 2, 32*sec, 4000), 9), ActionPromote, 2},
		}},
		{"re-validation moves to a warm replica the router now prefers", PromoterConfig{}, []step{
			{chat(1, 2, 1*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 2*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 4000), ActionPromote, 2},
			{chat(1, 6, 4*sec, 4000), ActionMove, 6},
			{chat(1, 6, 5*sec, 4000), ActionNone, 6},
		}},
		{"re-validation drops when the router picks a cold replica", PromoterConfig{}, []step{
			{chat(1, 2, 1*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 2*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 4000), ActionPromote, 2},
			{chat(1, 6, 4*sec, 0), ActionDrop, 2},
			{chat(1, 6, 5*sec, 4000), ActionNone, NoReplica}, // must earn a new window
			{chat(1, 6, 6*sec, 4000), ActionNone, NoReplica},
			{chat(1, 6, 7*sec, 4000), ActionPromote, 6},
		}},
		{"an observation without a replica is ignored", PromoterConfig{Window: 2}, []step{
			{chat(1, 2, 1*sec, 4000), ActionNone, NoReplica},
			{chat(1, NoReplica, 2*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 4000), ActionPromote, 2},
		}},
		{"clients are independent", PromoterConfig{}, []step{
			{chat(1, 2, 1*sec, 4000), ActionNone, NoReplica},
			{chat(2, 3, 1*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 2*sec, 4000), ActionNone, NoReplica},
			{chat(2, 3, 2*sec, 4000), ActionNone, NoReplica},
			{chat(1, 2, 3*sec, 4000), ActionPromote, 2},
			{chat(2, 3, 3*sec, 4000), ActionPromote, 3},
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPromoter(t, tc.cfg)
			for i, s := range tc.steps {
				a, r := p.Observe(&s.o)
				if a != s.want || r != s.to {
					t.Fatalf("step %d: got %v %d, want %v %d", i, a, r, s.want, s.to)
				}
			}
		})
	}
}

// TestPromoterDemand: one address sending the same warm prefix at a high
// rate (an application server for many users with one system prompt) takes
// more than MaxShare of a replica's prefill capacity: it stays on the
// slowpath. The same client at a modest rate is promoted.
func TestPromoterDemand(t *testing.T) {
	tests := []struct {
		name     string
		every    time.Duration
		capacity float64
		scale    float64
		want     bool // promoted at the end
	}{
		// demand per request: 96 uncached + 256 request cost = 352 tokens
		{"one request per second", time.Second, 10000, 0, true},
		{"fifty per second on a 10k tok/s replica", 20 * time.Millisecond, 10000, 0, false},
		{"fifty per second on a 100k tok/s replica", 20 * time.Millisecond, 100000, 0, true},
		{"capacity unknown: the default 10k", 20 * time.Millisecond, 0, 0, false},
		{"sampled 1 in 64 at two per second stands for 128 per second", 500 * time.Millisecond, 10000, 64, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPromoter(t, PromoterConfig{})
			promoted := false
			for i := range 3000 {
				o := Observation{Client: 9, Replica: 1, FirstBlock: 0xAB, PromptTokens: 4096, CachedTokens: 4000,
					Capacity: tc.capacity, Scale: tc.scale, Now: int64(i+1) * int64(tc.every)}
				switch a, _ := p.Observe(&o); a {
				case ActionPromote:
					promoted = true
				case ActionDrop:
					promoted = false
				}
			}
			if promoted != tc.want {
				t.Fatalf("promoted = %v, want %v (stats %+v)", promoted, tc.want, p.Stats())
			}
			if !tc.want && p.Stats().Crowds == 0 {
				t.Fatal("refused without counting a crowd")
			}
		})
	}
}

func TestPromoterLRUBound(t *testing.T) {
	p := newPromoter(t, PromoterConfig{MaxClients: 4, Window: 1})
	for c := range uint64(10) {
		o := chat(c, 1, time.Second, 4000)
		if a, _ := p.Observe(&o); a != ActionPromote {
			t.Fatalf("client %d: %v", c, a)
		}
	}
	st := p.Stats()
	if st.Tracked != 4 || st.Evictions != 6 || st.Promoted != 4 {
		t.Fatalf("stats %+v, want 4 tracked, 6 evicted, 4 promoted", st)
	}
	if got := len(p.Promoted(nil)); got != 4 {
		t.Fatalf("%d promoted entries", got)
	}
	// Client 9 is still tracked (re-validated), client 0 was forgotten
	// (promoted afresh).
	o := chat(9, 1, 2*time.Second, 4000)
	if a, _ := p.Observe(&o); a != ActionNone {
		t.Fatalf("tracked client: %v", a)
	}
	o = chat(0, 1, 2*time.Second, 4000)
	if a, _ := p.Observe(&o); a != ActionPromote {
		t.Fatalf("evicted client: %v", a)
	}
	if !p.Demote(0) || p.Demote(0) || p.Demote(12345) {
		t.Fatal("Demote: want true once, then false")
	}
}

func TestPromoterRebalance(t *testing.T) {
	now := int64(time.Hour)
	ago := func(d time.Duration) int64 { return now - int64(d) }
	lo := func(id ReplicaID, busy float64) ReplicaLoad {
		return ReplicaLoad{Replica: id, Eligible: true, Busy: busy}
	}
	ent := func(client uint64, id ReplicaID, promotedAgo time.Duration, value float64) Entry {
		return Entry{Client: client, Replica: id, PromotedAt: ago(promotedAgo), LastUsed: ago(time.Second), CacheValue: value}
	}
	tests := []struct {
		name    string
		loads   []ReplicaLoad
		entries []Entry
		want    []Change
	}{
		{"balanced: nothing", []ReplicaLoad{lo(0, 10), lo(1, 12), lo(2, 11)},
			[]Entry{ent(1, 0, time.Minute, 100), ent(2, 1, time.Minute, 100)}, nil},
		{"idle entries expire", []ReplicaLoad{lo(0, 1), lo(1, 1)},
			[]Entry{{Client: 1, Replica: 0, LastUsed: ago(6 * time.Minute)}, {Client: 2, Replica: 1, LastUsed: ago(time.Minute)}},
			[]Change{{Client: 1, Action: ActionDrop, From: 0, To: NoReplica, Reason: ReasonIdle}}},
		{"unhealthy or removed replica", []ReplicaLoad{{Replica: 0, Busy: 1}, lo(1, 1)},
			[]Entry{ent(1, 0, time.Minute, 9), ent(2, 1, time.Minute, 9), ent(3, 7, time.Minute, 9)},
			[]Change{{Client: 1, Action: ActionDrop, From: 0, To: NoReplica, Reason: ReasonIneligible},
				{Client: 3, Action: ActionDrop, From: 7, To: NoReplica, Reason: ReasonIneligible}}},
		// mean u = (40+10+10)/3 = 20; replica 0: f = (40-20)/40 = 0.5 of its
		// 4 entries, all load steered: drop 2, least valuable then newest.
		{"saturated: least cache-valuable, then newest, first", []ReplicaLoad{lo(0, 40), lo(1, 10), lo(2, 10)},
			[]Entry{ent(1, 0, time.Minute, 500), ent(2, 0, 2*time.Minute, 100), ent(3, 0, 3*time.Minute, 500),
				ent(4, 0, 10*time.Second, 9000), ent(5, 1, time.Minute, 1)},
			[]Change{{Client: 2, Action: ActionDrop, From: 0, To: NoReplica, Reason: ReasonSaturated},
				{Client: 1, Action: ActionDrop, From: 0, To: NoReplica, Reason: ReasonSaturated}}},
		// Entries carry half the load (steered 50 of 100): shedding half the
		// load takes all of them.
		{"saturated, half the load steered", []ReplicaLoad{{Replica: 0, Eligible: true, Busy: 40, Steered: 50, Routed: 50}, lo(1, 10), lo(2, 10)},
			[]Entry{ent(1, 0, time.Minute, 500), ent(2, 0, 2*time.Minute, 100)},
			[]Change{{Client: 2, Action: ActionDrop, From: 0, To: NoReplica, Reason: ReasonSaturated},
				{Client: 1, Action: ActionDrop, From: 0, To: NoReplica, Reason: ReasonSaturated}}},
		{"relatively high but within the absolute excess", []ReplicaLoad{lo(0, 4), lo(1, 1), lo(2, 1)},
			[]Entry{ent(1, 0, time.Minute, 1)}, nil},
		{"weight scales capacity", []ReplicaLoad{{Replica: 0, Eligible: true, Busy: 40, Weight: 4}, lo(1, 10), lo(2, 10)},
			[]Entry{ent(1, 0, time.Minute, 1)}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := newPromoter(t, PromoterConfig{})
			got := p.Rebalance(now, tc.loads, tc.entries, nil)
			if len(got) != len(tc.want) {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("change %d: got %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

// TestPromoterRebalanceDemotes: a dropped entry's client must earn a new
// window before it is promoted again.
func TestPromoterRebalanceDemotes(t *testing.T) {
	p := newPromoter(t, PromoterConfig{})
	for i := range 3 {
		o := chat(1, 0, time.Duration(i+1)*time.Second, 4000)
		p.Observe(&o)
	}
	es := p.Promoted(nil)
	if len(es) != 1 || es[0].Replica != 0 || es[0].CacheValue != 4000 {
		t.Fatalf("promoted %+v", es)
	}
	ch := p.Rebalance(int64(10*time.Second), []ReplicaLoad{{Replica: 0, Busy: 1}}, es, nil)
	if len(ch) != 1 || ch[0].Reason != ReasonIneligible || p.Stats().Promoted != 0 {
		t.Fatalf("changes %+v stats %+v", ch, p.Stats())
	}
	o := chat(1, 1, 11*time.Second, 4000)
	if a, _ := p.Observe(&o); a != ActionNone {
		t.Fatalf("demoted client: %v on its first new request", a)
	}
}

func TestPromoterZeroAllocs(t *testing.T) {
	p := newPromoter(t, PromoterConfig{MaxClients: 64})
	now := int64(0)
	c := uint64(0)
	run := func() {
		now += int64(time.Millisecond)
		c++
		o := Observation{Client: c % 100, Replica: ReplicaID(c % 3), FirstBlock: c % 7, SessionKey: c % 5,
			PromptTokens: 2048, CachedTokens: int(c % 2048), Now: now} // 100 clients > 64: evictions
		p.Observe(&o)
	}
	for range 1000 {
		run()
	}
	if n := testing.AllocsPerRun(1000, run); n != 0 {
		t.Fatalf("%v allocs per Observe", n)
	}
	if p.Stats().Evictions == 0 {
		t.Fatal("no evictions exercised")
	}
}

func TestPromoterRace(t *testing.T) {
	p := newPromoter(t, PromoterConfig{MaxClients: 32, Window: 2})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 2000 {
				o := chat(uint64(g*7+i%50), ReplicaID(i%2), time.Duration(i)*time.Millisecond, 4000)
				p.Observe(&o)
			}
		})
	}
	wg.Go(func() {
		var es []Entry
		var ch []Change
		for i := range 200 {
			es = p.Promoted(es[:0])
			ch = p.Rebalance(int64(i)*int64(10*time.Millisecond), []ReplicaLoad{{Replica: 0, Eligible: true, Busy: 50}, {Replica: 1, Eligible: true}}, es, ch[:0])
			p.Demote(uint64(i % 50))
			_ = p.Stats()
		}
	})
	wg.Wait()
	st := p.Stats()
	if st.Tracked > 32 || st.Promoted < 0 || st.Promoted > st.Tracked {
		t.Fatalf("stats %+v", st)
	}
	if got := len(p.Promoted(nil)); got != st.Promoted {
		t.Fatalf("%d promoted entries, counter says %d", got, st.Promoted)
	}
}

func TestPromoterConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  PromoterConfig
		want string // error substring; "" = valid
	}{
		{"zero is defaults", PromoterConfig{}, ""},
		{"window too big", PromoterConfig{Window: 9}, "window 9: want 1..8"},
		{"max prefixes too big", PromoterConfig{MaxPrefixes: 8}, "max_prefixes 8: want 1..7"},
		{"share above one", PromoterConfig{MaxShare: 1.5}, "max_share 1.5"},
		{"fraction above one", PromoterConfig{MinCachedFraction: 2}, "min_cached_fraction 2"},
		{"ratio not above one", PromoterConfig{SaturationRatio: 1}, "saturation_ratio 1"},
		{"negative clients", PromoterConfig{MaxClients: -1}, "max_clients -1"},
		{"negative ttl", PromoterConfig{IdleTTL: -time.Second}, "idle_ttl -1s"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
			if _, err := NewPromoter(tc.cfg); err == nil {
				t.Fatal("NewPromoter accepted it")
			}
		})
	}
}

func TestObservationFill(t *testing.T) {
	r, ids := newTestRouter(t, Config{}, 2)
	req := &Request{Model: []byte("m"), Hashes: []uint64{11, 12, 13}, PromptTokens: 192, SessionKey: 5, Now: 42}
	warm(r, ids[1], req)
	var f Flight
	r.Begin(ids[1], req, nil, &f)
	var o Observation
	o.Fill(99, req, &f)
	want := Observation{Client: 99, Replica: ids[1], FirstBlock: 11, SessionKey: 5, PromptTokens: 192, CachedTokens: 192, Now: 42}
	if o != want {
		t.Fatalf("got %+v, want %+v", o, want)
	}
	if r.PrefillRate(ids[1]) != DefaultPrefillTokensPerSec || r.PrefillRate(77) != 0 {
		t.Fatalf("PrefillRate %v / %v", r.PrefillRate(ids[1]), r.PrefillRate(77))
	}
}

// BenchmarkPromoterObserve: the per-request cost, for client populations
// inside and beyond the LRU bound (4096), and the Rebalance control loop.
func BenchmarkPromoterObserve(b *testing.B) {
	for _, clients := range []int{16, 4096, 65536} {
		b.Run("clients="+strconv.Itoa(clients), func(b *testing.B) {
			p := newPromoter(b, PromoterConfig{MaxClients: 4096})
			b.ReportAllocs()
			i := uint64(0)
			for b.Loop() {
				i++
				o := Observation{Client: (i * 0x9E3779B97F4A7C15) % uint64(clients), Replica: ReplicaID(i % 8),
					FirstBlock: 0xAB, PromptTokens: 4096, CachedTokens: 4000, Now: int64(i) * 1000}
				p.Observe(&o)
			}
		})
	}
}

func BenchmarkPromoterRebalance(b *testing.B) {
	p := newPromoter(b, PromoterConfig{})
	loads := make([]ReplicaLoad, 64)
	for i := range loads {
		loads[i] = ReplicaLoad{Replica: ReplicaID(i), Eligible: true, Busy: float64(10 + 40*(i%8/7))}
	}
	entries := make([]Entry, 10000)
	for i := range entries {
		entries[i] = Entry{Client: uint64(i), Replica: ReplicaID(i % 64), PromotedAt: int64(i), LastUsed: int64(time.Hour), CacheValue: float64(i % 97)}
	}
	b.ReportAllocs()
	var ch []Change
	for b.Loop() {
		ch = p.Rebalance(int64(time.Hour), loads, entries, ch[:0])
	}
}

func TestPromoterSaturated(t *testing.T) {
	p, err := NewPromoter(PromoterConfig{})
	if err != nil {
		t.Fatal(err)
	}
	loads := []ReplicaLoad{
		{Replica: 0, Eligible: true, Busy: 2, Weight: 1},
		{Replica: 2, Eligible: true, Busy: 30, Weight: 1}, // mean 34/3=11.3: 30 > 1.5x and > mean+4
		{Replica: 1, Eligible: true, Busy: 2, Weight: 1},
		{Replica: 3, Eligible: false, Busy: 90, Weight: 1}, // not eligible: never saturated
	}
	got := p.Saturated(loads, nil)
	want := []bool{false, false, true, false}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	// Rebalance drops entries of exactly that replica for saturation.
	entries := []Entry{{Client: 1, Replica: 2, LastUsed: 0}, {Client: 2, Replica: 0, LastUsed: 0}}
	for _, c := range p.Rebalance(0, loads, entries, nil) {
		if c.Reason == ReasonSaturated && c.From != 2 {
			t.Fatalf("saturation drop from replica %d", c.From)
		}
	}
}
