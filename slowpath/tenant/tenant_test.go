package tenant

import (
	"strings"
	"testing"
	"time"
)

const sec = int64(time.Second)

func TestLedgerBudgets(t *testing.T) {
	l := NewLedger(3 * time.Second)
	b := Budget{InputTokensPerMinute: 1000, OutputTokensPerMinute: 500, MaxConcurrent: 2}
	var t1, t2, t3 Ticket
	now := 100 * sec
	if _, ok := l.Admit("a", b, 400, 100, now, &t1); !ok {
		t.Fatal("first refused")
	}
	if _, ok := l.Admit("a", b, 400, 100, now+sec, &t2); !ok {
		t.Fatal("second refused")
	}
	// Third: concurrency (2 in flight) refuses first.
	d, ok := l.Admit("a", b, 100, 100, now+2*sec, &t3)
	if ok || d.Limit != LimitConcurrent || d.RetryAfter != time.Second {
		t.Fatalf("want max_concurrent denial, got %+v ok=%v", d, ok)
	}
	// Another tenant is unaffected.
	var o Ticket
	if _, ok := l.Admit("b", b, 900, 100, now+2*sec, &o); !ok {
		t.Fatal("other tenant refused")
	}
	l.End(&o, -1, -1, now+2*sec)
	l.End(&t1, -1, -1, now+2*sec) // estimate stands: 800 input used
	d, ok = l.Admit("a", b, 300, 100, now+2*sec, &t3)
	if ok || d.Limit != LimitInput || d.Used != 800 || d.Want != 300 {
		t.Fatalf("want input denial, got %+v ok=%v", d, ok)
	}
	// 100 must leave the window: the first 400 (charged at 100s) leaves at 160s.
	if want := time.Duration(160*sec - (now + 2*sec)); d.RetryAfter != want {
		t.Fatalf("retry after %v, want %v", d.RetryAfter, want)
	}
	// The engine reports the second request used 150 prompt tokens, 20 out.
	l.End(&t2, 150, 20, now+3*sec)
	if loc, _ := l.Used("a", now+3*sec); loc != (Usage{In: 550, Out: 120}) {
		t.Fatalf("corrected usage %+v", loc)
	}
	if _, ok := l.Admit("a", b, 300, 100, now+3*sec, &t3); !ok {
		t.Fatal("refused after correction")
	}
	l.End(&t3, -1, -1, now+3*sec)
	// Past the window everything has slid out.
	if loc, _ := l.Used("a", now+64*sec); loc != (Usage{}) {
		t.Fatalf("after the window %+v", loc)
	}
	d, ok = l.Admit("a", b, 2000, 1, now+64*sec, &t3)
	if ok || !d.TooLarge || d.Limit != LimitInput {
		t.Fatalf("too large: %+v ok=%v", d, ok)
	}
	d, ok = l.Admit("a", b, 1, 600, now+64*sec, &t3)
	if ok || d.Limit != LimitOutput {
		t.Fatalf("output: %+v ok=%v", d, ok)
	}
	if _, ok := l.Admit("a", Budget{}, 1e9, 1e9, now, &t3); !ok {
		t.Fatal("unlimited refused")
	}
}

func TestLedgerPeers(t *testing.T) {
	l := NewLedger(3 * time.Second)
	b := Budget{InputTokensPerMinute: 1000, MaxConcurrent: 3}
	now := 10 * sec
	l.SetPeer("edge-2", "a", Usage{In: 900, InFlight: 1}, now)
	var tk Ticket
	d, ok := l.Admit("a", b, 200, 0, now, &tk)
	if ok || d.Limit != LimitInput || d.Used != 900 || d.RetryAfter != Window {
		t.Fatalf("peer usage not counted: %+v ok=%v", d, ok)
	}
	l.SetPeer("edge-3", "a", Usage{InFlight: 2}, now)
	if d, ok := l.Admit("a", b, 10, 0, now, &tk); ok || d.Limit != LimitConcurrent {
		t.Fatalf("peer concurrency not counted: %+v ok=%v", d, ok)
	}
	// A silent peer stops counting after the TTL.
	if _, ok := l.Admit("a", b, 200, 0, now+4*sec, &tk); !ok {
		t.Fatal("stale peer still counted")
	}
	l.End(&tk, -1, -1, now+4*sec)
	l.SetPeer("edge-2", "a", Usage{In: 900}, now+5*sec)
	l.ClearPeer("edge-2")
	if _, p := l.Used("a", now+5*sec); p != (Usage{}) {
		t.Fatalf("cleared peer: %+v", p)
	}
	// Local reports changes once, everything on a heartbeat, zero once.
	var got []string
	rec := func(n string, u Usage) { got = append(got, n) }
	l.Local(now+5*sec, false, rec)
	if len(got) != 1 {
		t.Fatalf("changed: %v", got)
	}
	got = nil
	l.Local(now+5*sec, false, rec)
	if len(got) != 0 {
		t.Fatalf("unchanged reported: %v", got)
	}
	l.Local(now+5*sec, true, rec)
	if len(got) != 1 {
		t.Fatalf("heartbeat: %v", got)
	}
	got = nil
	l.Local(now+70*sec, false, func(n string, u Usage) {
		if u != (Usage{}) {
			t.Fatalf("want the zero, got %+v", u)
		}
		got = append(got, n)
	})
	if len(got) != 1 {
		t.Fatalf("zero not reported once: %v", got)
	}
}

func TestSchedulerDRROrder(t *testing.T) {
	s := NewScheduler[string](3, 100, 100)
	push := func(tenant string, class int, cost int64, v string) {
		if _, ok := s.Push(&Item[string]{V: v, Tenant: tenant, Class: class, Cost: cost}); !ok {
			t.Fatalf("push %s refused", v)
		}
	}
	// a floods with 6 requests of 100 tokens; b queues 2 of 50 after them.
	for i := range 6 {
		push("a", 1, 100, "a"+string(rune('0'+i)))
	}
	push("b", 1, 50, "b0")
	push("b", 1, 50, "b1")
	push("c", 1, 250, "c0")
	var order []string
	for it := s.Pop(); it != nil; it = s.Pop() {
		order = append(order, it.V)
	}
	// Turn 1: a gets 100 (a0), b 100 (b0, b1), c 100 (not enough); turn 2:
	// a1, c 200; turn 3: a2, c 300 -> c0; then a alone.
	want := "a0 b0 b1 a1 a2 c0 a3 a4 a5"
	if got := strings.Join(order, " "); got != want {
		t.Fatalf("order %q, want %q", got, want)
	}
}

func TestSchedulerPriority(t *testing.T) {
	s := NewScheduler[string](3, 100, 10)
	s.Push(&Item[string]{V: "low", Tenant: "a", Class: 2, Cost: 1})
	s.Push(&Item[string]{V: "normal", Tenant: "a", Class: 1, Cost: 1})
	s.Push(&Item[string]{V: "high", Tenant: "b", Class: 0, Cost: 1})
	var order []string
	for it := s.Pop(); it != nil; it = s.Pop() {
		order = append(order, it.V)
	}
	if got := strings.Join(order, " "); got != "high normal low" {
		t.Fatalf("order %q", got)
	}
}

func TestSchedulerBoundAndShare(t *testing.T) {
	s := NewScheduler[int](3, 100, 4)
	var items []*Item[int]
	for i := range 4 {
		it := &Item[int]{V: i, Tenant: "flood", Class: 1, Cost: 10}
		items = append(items, it)
		if _, ok := s.Push(it); !ok {
			t.Fatal("refused under the bound")
		}
	}
	// The flooder's fifth is refused (it holds the whole queue)...
	if _, ok := s.Push(&Item[int]{V: 9, Tenant: "flood", Class: 1}); ok {
		t.Fatal("full queue took the flooder's fifth")
	}
	// ...a quiet tenant's first displaces the flooder's newest.
	ev, ok := s.Push(&Item[int]{V: 100, Tenant: "quiet", Class: 1, Cost: 10})
	if !ok || ev != items[3] || ev.Queued() {
		t.Fatalf("quiet refused or wrong eviction: %v %v", ev, ok)
	}
	// Another class has its own bound.
	if _, ok := s.Push(&Item[int]{V: 7, Tenant: "flood", Class: 2}); !ok {
		t.Fatal("other class refused")
	}
	if s.Len(1) != 4 || s.Total() != 5 || s.Queued(1, "quiet") != 1 {
		t.Fatalf("len %d total %d", s.Len(1), s.Total())
	}
	if !s.Remove(items[1]) || s.Remove(items[1]) {
		t.Fatal("remove")
	}
	// Requeue puts a popped item back first.
	it := s.Pop()
	s.Requeue(it)
	if again := s.Pop(); again != it {
		t.Fatalf("requeued not first: %v vs %v", again.V, it.V)
	}
}

func TestParseKeys(t *testing.T) {
	good := `
tenants:
  acme:
    priority: low
    input_tokens_per_minute: 1000
    max_concurrent: 2
keys:
  - sha256: ` + HashKey("sk-acme") + `
    tenant: acme
  - sha256: ` + HashKey("sk-acme-vip") + `
    tenant: acme
    priority: high
  - sha256: ` + HashKey("sk-other") + `
    tenant: other
`
	k, err := ParseKeys([]byte(good))
	if err != nil {
		t.Fatal(err)
	}
	if e, ok := k.Lookup([]byte("sk-acme")); !ok || e.Tenant != "acme" || e.Class != 2 {
		t.Fatalf("acme %+v %v", e, ok)
	}
	if e, ok := k.Lookup([]byte("sk-acme-vip")); !ok || e.Class != 0 {
		t.Fatalf("vip %+v", e)
	}
	if e, ok := k.Lookup([]byte("sk-other")); !ok || e.Class != DefaultClass || k.Tenant("other").Budget != (Budget{}) {
		t.Fatalf("other %+v", e)
	}
	if _, ok := k.Lookup([]byte("sk-nope")); ok {
		t.Fatal("unknown key found")
	}
	if b := k.Tenant("acme").Budget; b.InputTokensPerMinute != 1000 || b.MaxConcurrent != 2 {
		t.Fatalf("budget %+v", b)
	}
	for _, tc := range []struct{ in, want string }{
		{"keys:\n  - sha256: abc\n    tenant: a\n", "line 2: keys[0].sha256: must be 64 hex digits"},
		{"keys:\n  - sha256: " + HashKey("x") + "\n", "line 2: keys[0].tenant: required"},
		{"keys:\n  - sha256: " + HashKey("x") + "\n    tenant: a\n    priority: urgent\n", "keys[0].priority: must be one of high, normal, low"},
		{"tenants:\n  a:\n    max_concurrent: -1\n", "line 3: tenants.a.max_concurrent: must be >= 0"},
		{"tenants:\n  a:\n    bogus: 1\n", "field bogus not found"},
		{"keys:\n  - sha256: " + HashKey("x") + "\n    tenant: a\n  - sha256: " + HashKey("x") + "\n    tenant: b\n", "keys[1].sha256: the same key twice"},
	} {
		if _, err := ParseKeys([]byte(tc.in)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: got %v, want %q", tc.in, err, tc.want)
		}
	}
}

func TestSchedulerEligible(t *testing.T) {
	s := NewScheduler[string](3, 100, 100)
	for i := range 3 {
		s.Push(&Item[string]{V: "f" + string(rune('0'+i)), Tenant: "flood", Class: 1, Cost: 10})
	}
	s.Push(&Item[string]{V: "q0", Tenant: "quiet", Class: 1, Cost: 10})
	capped := func(tenant string) bool { return tenant != "flood" }
	if it := s.PopEligible(capped); it == nil || it.V != "q0" {
		t.Fatalf("capped flood: got %v", it)
	}
	if it := s.PopEligible(capped); it != nil {
		t.Fatalf("only the capped tenant left, got %v", it.V)
	}
	if s.Len(1) != 3 {
		t.Fatalf("flood lost its requests: %d", s.Len(1))
	}
	if it := s.PopEligible(nil); it == nil || it.V != "f0" {
		t.Fatalf("uncapped: %v", it)
	}
}

// TestSchedulerAnyQueued: the predicate sees the tenants with requests
// queued in the class asked for and the higher ones, not the lower ones
// nor tenants whose requests were all popped.
func TestSchedulerAnyQueued(t *testing.T) {
	s := NewScheduler[string](3, 100, 100)
	s.Push(&Item[string]{V: "h", Tenant: "a", Class: 0, Cost: 10})
	s.Push(&Item[string]{V: "n", Tenant: "b", Class: 1, Cost: 10})
	s.Push(&Item[string]{V: "l", Tenant: "c", Class: 2, Cost: 10})
	is := func(name string) func(string) bool { return func(t string) bool { return t == name } }
	for _, tc := range []struct {
		name   string
		upTo   int
		tenant string
		want   bool
	}{
		{"higher class seen", 1, "a", true},
		{"own class seen", 1, "b", true},
		{"lower class not seen", 1, "c", false},
		{"lowest class sees all", 2, "c", true},
		{"unknown tenant", 2, "z", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := s.AnyQueued(tc.upTo, is(tc.tenant)); got != tc.want {
				t.Fatalf("AnyQueued(%d, %s) = %v, want %v", tc.upTo, tc.tenant, got, tc.want)
			}
		})
	}
	if it := s.Pop(); it == nil || it.V != "h" {
		t.Fatalf("pop: %v", it)
	}
	if s.AnyQueued(2, is("a")) {
		t.Fatal("a tenant with nothing left queued is seen")
	}
}
