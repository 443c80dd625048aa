package fastpath

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"
)

// fakeClock is a settable monotonic clock for Options.Now / NewUserspace.
type fakeClock struct{ ns int64 }

func (c *fakeClock) now() int64 { return c.ns }

// testContract drives the Datapath API the way the control loop does and
// asserts the same observable behaviour for every implementation.
func testContract(t *testing.T, dp Datapath, clk *fakeClock) {
	t.Helper()
	svcA := netip.MustParseAddrPort("10.100.0.1:8000")
	svcB := netip.MustParseAddrPort("10.100.0.2:8000")
	c1 := netip.MustParseAddr("10.1.0.2")
	c2 := netip.MustParseAddr("10.1.0.3")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}

	t.Run("services replace", func(t *testing.T) {
		must(dp.SetServices([]Service{svcB, svcA}))
		must(dp.SetServices([]Service{svcA}))
		got, err := dp.Services()
		must(err)
		if !slices.Equal(got, []Service{svcA}) {
			t.Fatalf("services %v, want [%v]", got, svcA)
		}
	})
	t.Run("invalid arguments", func(t *testing.T) {
		for name, err := range map[string]error{
			"ipv6 service":   dp.SetServices([]Service{netip.MustParseAddrPort("[fd00::1]:80")}),
			"port 0":         dp.SetServices([]Service{netip.MustParseAddrPort("10.0.0.1:0")}),
			"backend id":     dp.SetBackends([]Backend{{ID: MaxBackends, Addr: c1}}),
			"backend addr":   dp.SetBackends([]Backend{{ID: 1}}),
			"duplicate id":   dp.SetBackends([]Backend{{ID: 1, Addr: c1}, {ID: 1, Addr: c2}}),
			"ipv6 client":    dp.SetAffinity(Affinity{Client: netip.MustParseAddr("fd00::1"), Service: svcA}),
			"affinity range": dp.SetAffinity(Affinity{Client: c1, Service: svcA, Backend: MaxBackends}),
		} {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: got %v, want ErrInvalid", name, err)
			}
		}
	})
	t.Run("backends replace and bump", func(t *testing.T) {
		must(dp.SetBackends([]Backend{
			{ID: 3, Addr: netip.MustParseAddr("10.2.0.3"), Healthy: true, Generation: 1},
			{ID: 9, Addr: netip.MustParseAddr("10.2.0.9"), Healthy: true, Generation: 5, SampleEvery: 10},
		}))
		must(dp.SetBackends([]Backend{
			{ID: 1, Addr: netip.MustParseAddr("10.2.0.1"), Healthy: true, Generation: 1},
			{ID: 9, Addr: netip.MustParseAddr("10.2.0.9"), Healthy: false, Generation: 5, SampleEvery: 10},
		}))
		g, err := dp.BumpGeneration(9)
		must(err)
		if g != 6 {
			t.Errorf("bumped generation %d, want 6", g)
		}
		if _, err := dp.BumpGeneration(3); !errors.Is(err, ErrUnknownBackend) {
			t.Errorf("bump removed backend: %v, want ErrUnknownBackend", err)
		}
		got, err := dp.Backends()
		must(err)
		want := []Backend{
			{ID: 1, Addr: netip.MustParseAddr("10.2.0.1"), Healthy: true, Generation: 1},
			{ID: 9, Addr: netip.MustParseAddr("10.2.0.9"), Healthy: false, Generation: 6, SampleEvery: 10},
		}
		if !slices.Equal(got, want) {
			t.Errorf("backends %+v, want %+v", got, want)
		}
	})
	t.Run("affinity set, lookup, range, delete", func(t *testing.T) {
		if err := dp.SetAffinity(Affinity{Client: c1, Service: svcA, Backend: 3}); !errors.Is(err, ErrUnknownBackend) {
			t.Errorf("affinity to unknown backend: %v, want ErrUnknownBackend", err)
		}
		clk.ns = 1_000_000_000
		a1 := Affinity{Client: c1, Service: svcA, Backend: 1, Generation: 1}
		a2 := Affinity{Client: c2, Service: svcA, Backend: 9, Generation: 6}
		must(dp.SetAffinity(a1))
		must(dp.SetAffinity(a2))
		must(dp.SetAffinity(Affinity{Client: c1, Service: svcB, Backend: 1, Generation: 1}))
		clk.ns += int64(3 * time.Second)
		e, ok, err := dp.LookupAffinity(c1, svcA)
		must(err)
		if !ok || e.Affinity != a1 || e.Idle != 3*time.Second {
			t.Errorf("lookup %+v %v, want %+v idle 3s", e, ok, a1)
		}
		if _, ok, err := dp.LookupAffinity(c2, svcB); ok || err != nil {
			t.Errorf("lookup of absent entry: %v %v", ok, err)
		}
		var seen []Affinity
		must(dp.RangeAffinity(func(e AffinityEntry) bool { seen = append(seen, e.Affinity); return true }))
		if len(seen) != 3 || !slices.Contains(seen, a1) || !slices.Contains(seen, a2) {
			t.Errorf("range saw %+v", seen)
		}
		n := 0
		must(dp.RangeAffinity(func(AffinityEntry) bool { n++; return false }))
		if n != 1 {
			t.Errorf("range after false: %d calls, want 1", n)
		}
		must(dp.DeleteAffinity(c1, svcB))
		must(dp.DeleteAffinity(c1, svcB)) // absent: no error
		if _, ok, _ := dp.LookupAffinity(c1, svcB); ok {
			t.Error("deleted entry still there")
		}
	})
	t.Run("expire idle", func(t *testing.T) {
		clk.ns += int64(time.Second)
		// Rewriting a1 restarts its idle time; a2 is now 4s idle.
		must(dp.SetAffinity(Affinity{Client: c1, Service: svcA, Backend: 1, Generation: 1}))
		clk.ns += int64(2 * time.Second)
		n, err := dp.ExpireIdle(5 * time.Second)
		must(err)
		if n != 1 {
			t.Errorf("expired %d, want 1 (a2 idle 6s)", n)
		}
		if _, ok, _ := dp.LookupAffinity(c2, svcA); ok {
			t.Error("idle entry not expired")
		}
		if _, ok, _ := dp.LookupAffinity(c1, svcA); !ok {
			t.Error("fresh entry expired")
		}
	})
	t.Run("counters readable", func(t *testing.T) {
		if _, err := dp.Counters(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestUserspaceContract(t *testing.T) {
	clk := &fakeClock{}
	dp := NewUserspace(clk.now)
	testContract(t, dp, clk)
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	must(dp.Close())
	if err := dp.SetServices(nil); !errors.Is(err, ErrClosed) {
		t.Errorf("after close: %v, want ErrClosed", err)
	}
}
