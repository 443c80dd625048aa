package slowpath

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/slowpath/cluster"
	"github.com/warmpath/warmpath/slowpath/cluster/natstest"
)

// TestTenantBudgetSharedOverNATS: two instances on one embedded NATS
// server enforce one budget: what a tenant spent on the first counts on
// the second (429 there), another tenant is served on both, and the
// spend stops counting once the first instance is gone (peer TTL).
func TestTenantBudgetSharedOverNATS(t *testing.T) {
	ns := natstest.Start(t, nil)
	e := startTenantEngine(t)
	e.PromptTokens.Store(-1) // no usage reported: the estimates stand
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	writeKeys(t, keys, `tenants:
  acme:
    input_tokens_per_minute: 1500
keys:
`+keyEntry("sk-acme", "acme", "")+keyEntry("sk-other", "other", ""))
	start := func(name string) (*Server, string) {
		cfg := testConfig(e.addr)
		cfg.Tenants.KeysFile = keys
		cfg.Cluster = cluster.Config{NATSURL: cluster.URLs{natstest.URL(ns)}, Instance: name,
			FlushInterval: time.Millisecond, Heartbeat: 50 * time.Millisecond, PeerTimeout: 300 * time.Millisecond, ReconnectWait: 20 * time.Millisecond}
		return newTestServer(t, cfg)
	}
	a, baseA := start("edge-a-tenants")
	b, baseB := start("edge-b-tenants")
	waitFor(t, "both connected", func() bool { return a.Cluster().Connected() && b.Cluster().Connected() })

	if r := tpost(t, baseA, "sk-acme", tbody("tag-a1", 4000)); r.status != 200 {
		t.Fatalf("first on A: %d %s", r.status, r.body)
	}
	spentA, _ := a.ten.ledger.Used("acme", a.now())
	waitFor(t, "B hears A's usage", func() bool {
		_, p := b.ten.ledger.Used("acme", b.now())
		return p.In == spentA.In
	})
	r := tpost(t, baseB, "sk-acme", tbody("tag-b1", 4000))
	if r.status != 429 || !strings.Contains(r.body, "input_tokens_per_minute") || r.hdr.Get("Retry-After") == "" {
		t.Fatalf("B let the tenant spend its budget twice: %d %s", r.status, r.body)
	}
	if r := tpost(t, baseB, "sk-other", tbody("tag-b2", 4000)); r.status != 200 {
		t.Fatalf("other tenant on B: %d %s", r.status, r.body)
	}
	// A leaves the fleet: after the peer TTL B counts only its own spend.
	a.Cluster().Close()
	waitFor(t, "A's usage expired on B", func() bool {
		return tpost(t, baseB, "sk-acme", tbody("tag-b3", 4000)).status == 200
	})
}
