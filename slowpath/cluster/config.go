package cluster

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Defaults for Config; each field's doc says what its zero value means.
const (
	DefaultSubjectPrefix     = "warmpath"
	DefaultFlushInterval     = 5 * time.Millisecond
	DefaultMaxBatchBytes     = 64 << 10
	DefaultMaxAge            = 2 * time.Second
	DefaultHeartbeat         = time.Second
	DefaultSnapshotMaxBlocks = 4096
	DefaultReconnectWait     = 250 * time.Millisecond
)

// Config is the `cluster:` block of the slowpath config. Without NATSURL
// the instance runs alone, exactly as without the block. Not reloaded: a
// change needs a restart.
type Config struct {
	// NATSURL lists the NATS servers (nats://host:port), as a YAML list or
	// one comma-separated string. Empty: no cluster (default).
	NATSURL URLs `yaml:"nats_url" secret:"url"`
	// SubjectPrefix prefixes every subject (<prefix>.u.<instance>,
	// <prefix>.snapshot). Instances share state only under the same prefix.
	// "" means "warmpath".
	SubjectPrefix string `yaml:"subject_prefix"`
	// Instance names this warmpath instance; unique in the fleet. "" means
	// the hostname, its dots replaced by '_' (ip-10-0-0-1.ec2.internal
	// becomes ip-10-0-0-1_ec2_internal).
	Instance string `yaml:"instance"`
	// FlushInterval: an update waits at most this long before its batch is
	// published (an idle node publishes only heartbeats). 0 means 5ms.
	FlushInterval time.Duration `yaml:"flush_interval"`
	// MaxBatchBytes: a batch is published as soon as it reaches this size;
	// updates that find it full (NATS slow or down) are dropped and counted.
	// 0 means 65536; at most 524288 (NATS's default max payload is 1 MiB).
	MaxBatchBytes int `yaml:"max_batch_bytes"`
	// MaxAge: batches older than this (send time by the sender's clock to
	// receive time by ours) are dropped. Assumes NTP-synced clocks. 0 means 2s.
	MaxAge time.Duration `yaml:"max_age"`
	// Heartbeat: an instance with nothing to send still publishes this
	// often. 0 means 1s.
	Heartbeat time.Duration `yaml:"heartbeat"`
	// PeerTimeout: a peer silent this long has its load withdrawn. 0 means
	// 3 heartbeats.
	PeerTimeout time.Duration `yaml:"peer_timeout"`
	// SnapshotMaxBlocks bounds, per replica, the index blocks a peer sends
	// a starting instance (warm-up). 0 means 4096; -1 disables warm-up.
	SnapshotMaxBlocks int `yaml:"snapshot_max_blocks"`
	// ReconnectWait is the pause between reconnect attempts (forever).
	// 0 means 250ms.
	ReconnectWait time.Duration `yaml:"reconnect_wait"`
	// TLSCAFile is a PEM bundle of the CAs that sign the NATS servers'
	// certificates (tls:// URLs). "" means the system roots.
	TLSCAFile string `yaml:"tls_ca_file"`
	// NkeySeedFile authenticates with an NKEY whose seed is in this file.
	// "" means none.
	NkeySeedFile string `yaml:"nkey_seed_file"`
	// CredsFile authenticates with NATS user credentials (a JWT and its
	// NKEY seed, as `nsc` writes them). "" means none.
	CredsFile string `yaml:"creds_file"`
}

// URLs is a list of NATS server URLs. In YAML it is a list or a string of
// comma-separated URLs.
type URLs []string

// UnmarshalYAML accepts a scalar (comma-separated) or a sequence.
func (u *URLs) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*u = nil
		for s := range strings.SplitSeq(n.Value, ",") {
			if s = strings.TrimSpace(s); s != "" {
				*u = append(*u, s)
			}
		}
		return nil
	case yaml.SequenceNode:
		var l []string
		if err := n.Decode(&l); err != nil {
			return err
		}
		*u = l
		return nil
	}
	return fmt.Errorf("line %d: want a URL, a comma-separated string or a list", n.Line)
}

// Enabled reports whether a NATS server is configured.
func (c Config) Enabled() bool { return len(c.NATSURL) > 0 }

// WithDefaults returns c with zero fields replaced by their defaults
// (Instance by the hostname).
func (c Config) WithDefaults() Config {
	if c.SubjectPrefix == "" {
		c.SubjectPrefix = DefaultSubjectPrefix
	}
	if c.Instance == "" {
		if h, err := os.Hostname(); err == nil {
			c.Instance = hostInstance(h)
		}
	}
	if c.FlushInterval == 0 {
		c.FlushInterval = DefaultFlushInterval
	}
	if c.MaxBatchBytes == 0 {
		c.MaxBatchBytes = DefaultMaxBatchBytes
	}
	if c.MaxAge == 0 {
		c.MaxAge = DefaultMaxAge
	}
	if c.Heartbeat == 0 {
		c.Heartbeat = DefaultHeartbeat
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = 3 * c.Heartbeat
	}
	if c.SnapshotMaxBlocks == 0 {
		c.SnapshotMaxBlocks = DefaultSnapshotMaxBlocks
	}
	if c.ReconnectWait == 0 {
		c.ReconnectWait = DefaultReconnectWait
	}
	return c
}

// hostInstance is the default instance name for hostname h: its dots
// (an FQDN) become '_', as a NATS subject token has none.
func hostInstance(h string) string { return strings.ReplaceAll(h, ".", "_") }

// Validate checks c after defaults and returns every problem (an
// errors.Join); errors name the field (prefixed "cluster." by the slowpath
// config).
func (c Config) Validate() error {
	if !c.Enabled() {
		return nil
	}
	d := c.WithDefaults()
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	for i, s := range c.NATSURL {
		u, err := url.Parse(s)
		if err != nil || u.Host == "" {
			add(fmt.Errorf("nats_url[%d]: want nats://host:port, got %q", i, s))
			continue
		}
		switch u.Scheme {
		case "nats", "tls", "ws", "wss":
		default:
			add(fmt.Errorf("nats_url[%d]: scheme must be nats, tls, ws or wss, got %q", i, u.Scheme))
		}
	}
	add(checkToken("subject_prefix", d.SubjectPrefix, true))
	if d.Instance == "" {
		add(errors.New("instance: required (the hostname is unknown)"))
	} else {
		add(checkToken("instance", d.Instance, false))
	}
	if d.FlushInterval < 100*time.Microsecond || d.FlushInterval > time.Second {
		add(fmt.Errorf("flush_interval: must be in [100us, 1s], got %s", d.FlushInterval))
	}
	if d.MaxBatchBytes < 1024 || d.MaxBatchBytes > 512<<10 {
		add(fmt.Errorf("max_batch_bytes: must be in [1024, 524288], got %d", d.MaxBatchBytes))
	}
	if d.MaxAge < 10*time.Millisecond {
		add(fmt.Errorf("max_age: must be >= 10ms, got %s", d.MaxAge))
	}
	if d.Heartbeat < 10*time.Millisecond || d.Heartbeat > time.Minute {
		add(fmt.Errorf("heartbeat: must be in [10ms, 1m], got %s", d.Heartbeat))
	} else if d.PeerTimeout <= d.Heartbeat {
		add(fmt.Errorf("peer_timeout: must be > heartbeat=%s, got %s", d.Heartbeat, d.PeerTimeout))
	}
	if d.SnapshotMaxBlocks < -1 || d.SnapshotMaxBlocks > 1<<20 {
		add(fmt.Errorf("snapshot_max_blocks: must be in [-1, 1048576] (-1 = no warm-up), got %d", d.SnapshotMaxBlocks))
	}
	if d.ReconnectWait < time.Millisecond || d.ReconnectWait > time.Minute {
		add(fmt.Errorf("reconnect_wait: must be in [1ms, 1m], got %s", d.ReconnectWait))
	}
	if d.NkeySeedFile != "" && d.CredsFile != "" {
		add(errors.New("nkey_seed_file, creds_file: set at most one"))
	}
	for _, f := range []struct{ name, path string }{{"tls_ca_file", d.TLSCAFile}, {"nkey_seed_file", d.NkeySeedFile}, {"creds_file", d.CredsFile}} {
		if f.path == "" {
			continue
		}
		if st, err := os.Stat(f.path); err != nil || !st.Mode().IsRegular() {
			add(fmt.Errorf("%s: %q must be a readable file", f.name, f.path))
		}
	}
	return errors.Join(errs...)
}

// checkToken accepts a NATS subject token (dots allowed only when dots is
// set): printable ASCII without space, '*' or '>', at most 128 bytes.
func checkToken(field, s string, dots bool) error {
	if len(s) == 0 || len(s) > 128 {
		return fmt.Errorf("%s: must be 1..128 bytes, got %d", field, len(s))
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		if ch <= ' ' || ch >= 0x7f || ch == '*' || ch == '>' || (ch == '.' && !dots) {
			return fmt.Errorf("%s: %q: only printable ASCII without spaces, '*', '>'%s", field, s, map[bool]string{false: " or '.'", true: ""}[dots])
		}
	}
	if dots && (s[0] == '.' || s[len(s)-1] == '.' || strings.Contains(s, "..")) {
		return fmt.Errorf("%s: %q: empty subject token", field, s)
	}
	return nil
}
