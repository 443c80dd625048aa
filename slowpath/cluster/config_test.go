package cluster_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/warmpath/warmpath/slowpath"
	"github.com/warmpath/warmpath/slowpath/cluster"
)

// TestClusterConfig parses the cluster block through the slowpath's strict
// config: accepted forms and defaults, and errors that name the field.
func TestClusterConfig(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		urls    []string
		wantErr string
	}{
		{name: "absent: off", yaml: "", urls: nil},
		{name: "one url", yaml: "cluster: {nats_url: nats://127.0.0.1:4222, instance: edge-1}", urls: []string{"nats://127.0.0.1:4222"}},
		{name: "comma-separated", yaml: "cluster: {nats_url: 'nats://a:4222, nats://b:4222', instance: e}", urls: []string{"nats://a:4222", "nats://b:4222"}},
		{name: "list", yaml: "cluster:\n  nats_url: [nats://a:4222, tls://b:4222]\n  instance: e", urls: []string{"nats://a:4222", "tls://b:4222"}},
		{name: "unknown field", yaml: "cluster: {nats_url: nats://a:1, bogus: 1}", wantErr: "line 1: cluster.bogus: unknown field"},
		{name: "bad scheme", yaml: "cluster: {nats_url: http://a:4222}", wantErr: "cluster.nats_url[0]: scheme"},
		{name: "no host", yaml: "cluster: {nats_url: 'nats://'}", wantErr: "cluster.nats_url[0]: want nats://host:port"},
		{name: "instance with a dot", yaml: "cluster: {nats_url: nats://a:1, instance: a.b}", wantErr: "cluster.instance:"},
		{name: "instance with a wildcard", yaml: "cluster: {nats_url: nats://a:1, instance: 'a*'}", wantErr: "cluster.instance:"},
		{name: "prefix empty token", yaml: "cluster: {nats_url: nats://a:1, subject_prefix: a..b}", wantErr: "cluster.subject_prefix:"},
		{name: "flush too slow", yaml: "cluster: {nats_url: nats://a:1, flush_interval: 2s}", wantErr: "cluster.flush_interval: must be in [100us, 1s]"},
		{name: "batch too big", yaml: "cluster: {nats_url: nats://a:1, max_batch_bytes: 2000000}", wantErr: "cluster.max_batch_bytes: must be in [1024, 524288]"},
		{name: "timeout below heartbeat", yaml: "cluster: {nats_url: nats://a:1, heartbeat: 1s, peer_timeout: 500ms}", wantErr: "cluster.peer_timeout: must be > heartbeat=1s"},
		{name: "snapshot", yaml: "cluster: {nats_url: nats://a:1, snapshot_max_blocks: -2}", wantErr: "cluster.snapshot_max_blocks"},
		{name: "invalid but off", yaml: "cluster: {flush_interval: 2s}", urls: nil},
		{name: "missing ca file", yaml: "cluster: {nats_url: tls://a:1, tls_ca_file: /nonexistent/ca.pem}", wantErr: "cluster.tls_ca_file: \"/nonexistent/ca.pem\" must be a readable file"},
		{name: "nkey and creds", yaml: "cluster: {nats_url: nats://a:1, nkey_seed_file: /etc/hostname, creds_file: /etc/hostname}", wantErr: "cluster.nkey_seed_file, creds_file: set at most one"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := slowpath.ParseConfig([]byte(tt.yaml))
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(cfg.Cluster.NATSURL, tt.urls) || cfg.Cluster.Enabled() != (len(tt.urls) > 0) {
				t.Fatalf("nats_url = %q (enabled %v), want %q", cfg.Cluster.NATSURL, cfg.Cluster.Enabled(), tt.urls)
			}
		})
	}
}

func TestClusterDefaults(t *testing.T) {
	d := cluster.Config{NATSURL: cluster.URLs{"nats://a:1"}}.WithDefaults()
	if d.SubjectPrefix != "warmpath" || d.FlushInterval != 5*time.Millisecond || d.MaxBatchBytes != 64<<10 ||
		d.MaxAge != 2*time.Second || d.Heartbeat != time.Second || d.PeerTimeout != 3*time.Second ||
		d.SnapshotMaxBlocks != 4096 || d.Instance == "" {
		t.Fatalf("defaults = %+v", d)
	}
}

// TestSingleInstanceUnchanged: without nats_url the Server has no node.
func TestSingleInstanceUnchanged(t *testing.T) {
	cfg := slowpath.Default()
	cfg.Listen, cfg.Admin = "127.0.0.1:0", ""
	s, err := slowpath.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Shutdown(t.Context())
	if s.Cluster() != nil {
		t.Fatal("a cluster node without cluster.nats_url")
	}
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "warmpath_cluster_") {
			t.Fatalf("cluster metric %s registered without a cluster", mf.GetName())
		}
	}
}
