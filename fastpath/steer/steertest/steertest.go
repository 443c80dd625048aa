// Package steertest drives a steer.Controller in tests: a fake slowpath
// (a real affinity.Router, a replica list with hosts and health, a manual
// clock) and a userspace datapath, with helpers that send requests and
// read entries and backends back.
package steertest

import (
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/fastpath"
	"github.com/warmpath/warmpath/fastpath/steer"
)

// VIP is the one service of a Rig.
var VIP = netip.MustParseAddrPort("10.100.0.1:8000")

// Hosts are the GPU hosts of a Rig's three replicas (host:8000 each).
var Hosts = []string{"10.2.1.2", "10.2.2.2", "10.2.3.2"}

// Source is a slowpath stand-in (steer.Source): a real affinity.Router
// (loads, prefill rates), a replica list with hosts and health, and a
// clock that only Advance moves. Safe for concurrent use.
type Source struct {
	mu     sync.Mutex
	Reps   []steer.Replica // read by tests without the lock; change with SetHealthy, Remove
	router *affinity.Router
	now    int64
}

func (f *Source) Replicas() []steer.Replica {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]steer.Replica(nil), f.Reps...)
}
func (f *Source) Router() *affinity.Router { return f.router }
func (f *Source) Now() int64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// SetHealthy sets replica i's health, in the list and in the router.
func (f *Source) SetHealthy(i int, ok bool) {
	f.mu.Lock()
	f.Reps[i].Healthy = ok
	id := f.Reps[i].ID
	f.mu.Unlock()
	f.router.SetHealthy(affinity.ReplicaID(id), ok)
}

// Remove removes replica i, from the list and from the router.
func (f *Source) Remove(i int) {
	f.mu.Lock()
	id := f.Reps[i].ID
	f.Reps = append(f.Reps[:i:i], f.Reps[i+1:]...)
	f.mu.Unlock()
	f.router.RemoveReplica(affinity.ReplicaID(id))
}

// Advance moves the clock (the router's and the datapath's) by d.
func (f *Source) Advance(d time.Duration) {
	f.mu.Lock()
	f.now += int64(d)
	f.mu.Unlock()
}

// KernelMode makes the userspace datapath report kernel mode, so the
// controller applies sample scaling as it would with XDP.
type KernelMode struct{ *fastpath.Userspace }

func (KernelMode) Mode() fastpath.Mode { return fastpath.ModeKernel }

// Rig is one controller on a Source and a userspace datapath.
type Rig struct {
	T   testing.TB
	Src *Source
	DP  fastpath.Datapath   // US, or KernelMode{US}
	US  *fastpath.Userspace // the datapath's state
	C   *steer.Controller
	Reg *prometheus.Registry // the controller's metrics
}

// New builds a Rig with three healthy replicas on Hosts, VIP as the one
// service, sample as SampleEvery and an idle TTL of one minute; kernel
// makes the datapath report kernel mode.
func New(t testing.TB, kernel bool, sample uint32) *Rig {
	t.Helper()
	router, err := affinity.NewRouter(affinity.Config{})
	if err != nil {
		t.Fatal(err)
	}
	src := &Source{router: router, now: int64(time.Hour)}
	for _, host := range Hosts {
		id, err := router.AddReplica(affinity.ReplicaSpec{Name: host + ":8000", Models: []string{"m"}})
		if err != nil {
			t.Fatal(err)
		}
		src.Reps = append(src.Reps, steer.Replica{ID: int(id), Host: host, Healthy: true})
	}
	us := fastpath.NewUserspace(src.Now)
	var dp fastpath.Datapath = us
	if kernel {
		dp = KernelMode{us}
	}
	reg := prometheus.NewRegistry()
	c, err := steer.New(steer.Options{Datapath: dp, Source: src, Services: []fastpath.Service{VIP}, SampleEvery: sample,
		Promoter: affinity.PromoterConfig{IdleTTL: time.Minute}, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	return &Rig{T: t, Src: src, DP: dp, US: us, C: c, Reg: reg}
}

// Advance moves the clock by d.
func (r *Rig) Advance(d time.Duration) { r.Src.Advance(d) }

// Send observes one completed request of client (addr:port) on replica i
// with a prompt of 1000 tokens, cached of them predicted cached, 100 ms
// after the previous one.
func (r *Rig) Send(client string, port uint16, i int, first uint64, cached int) {
	r.T.Helper()
	r.Advance(100 * time.Millisecond)
	ev := &steer.Routed{
		Client:     netip.AddrPortFrom(netip.MustParseAddr(client), port),
		ReplicaID:  affinity.ReplicaID(r.Src.Reps[i].ID),
		FirstBlock: first, PromptTokens: 1000, PredictedCachedTokens: cached,
		OK: true, End: r.Src.Now(),
	}
	r.C.ObserveRouted(ev)
}

// Entry is client's affinity entry for VIP.
func (r *Rig) Entry(client string) (fastpath.AffinityEntry, bool) {
	r.T.Helper()
	e, ok, err := r.DP.LookupAffinity(netip.MustParseAddr(client), VIP)
	if err != nil {
		r.T.Fatal(err)
	}
	return e, ok
}

// Backend is the datapath's backend of replica i's host.
func (r *Rig) Backend(i int) fastpath.Backend {
	r.T.Helper()
	bs, err := r.DP.Backends()
	if err != nil {
		r.T.Fatal(err)
	}
	host := netip.MustParseAddr(r.Src.Reps[i].Host)
	for _, b := range bs {
		if b.Addr == host {
			return b
		}
	}
	r.T.Fatalf("no backend for %s in %+v", host, bs)
	return fastpath.Backend{}
}

// Sync runs one control-loop step.
func (r *Rig) Sync() {
	r.T.Helper()
	if err := r.C.Sync(); err != nil {
		r.T.Fatal(err)
	}
}

// Promote sends the three consistent cached requests that promote client
// to replica i and checks the entry.
func (r *Rig) Promote(client string, i int) {
	r.T.Helper()
	for range 3 {
		r.Send(client, 40000, i, 7, 900)
	}
	e, ok := r.Entry(client)
	if b := r.Backend(i); !ok || e.Backend != b.ID || e.Generation != b.Generation {
		r.T.Fatalf("entry of %s = %+v (present %v), want backend %+v", client, e, ok, b)
	}
}

// Counter is the value of the controller's counter name (without the
// warmpath_steer_ prefix) with the given label value ("" for none).
func (r *Rig) Counter(name, label string) float64 {
	r.T.Helper()
	mfs, err := r.Reg.Gather()
	if err != nil {
		r.T.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "warmpath_steer_"+name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label == "" || (len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == label) {
				return m.GetCounter().GetValue()
			}
		}
	}
	r.T.Fatalf("no counter warmpath_steer_%s{%q}", name, label)
	return 0
}

var _ steer.Source = (*Source)(nil)
