// Over 500 lines: the config schema, its defaults and Validate stay in
// one file, the one place a field is added.

package slowpath

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/warmpath/warmpath/affinity"
	"github.com/warmpath/warmpath/slowpath/cluster"
	"go.yaml.in/yaml/v3"
)

// Config is the router's whole configuration: one YAML file, decoded
// strictly (unknown fields are errors) over Default(), then Validate()d.
// Every field and its default is documented in slowpath/README.md.
type Config struct {
	// Listen is the OpenAI-compatible API address. Default ":8080".
	Listen string `yaml:"listen" reload:"restart"`
	// Admin serves /metrics, /debug/replicas and /health. Default
	// "127.0.0.1:9090". Empty disables the admin listener.
	Admin string `yaml:"admin" reload:"restart"`
	// Replicas is the static replica list. Reloaded on SIGHUP and on file
	// change, like every field tagged reload:"live" (reload.go); a change
	// to any other field is named in the reload warning and needs a
	// restart.
	Replicas []ReplicaConfig `yaml:"replicas" reload:"live"`
	Limits   LimitsConfig    `yaml:"limits" reload:"restart"`
	Upstream UpstreamConfig  `yaml:"upstream" reload:"restart"`
	Health   HealthConfig    `yaml:"health" reload:"live"`
	Passive  PassiveConfig   `yaml:"passive" reload:"live"`
	Scrape   ScrapeConfig    `yaml:"scrape" reload:"live"`
	// Routing is the affinity router's configuration (policy, hashing,
	// cost-model knobs); see affinity.Config. Zero fields take affinity's
	// defaults.
	Routing affinity.Config `yaml:"routing" reload:"restart"`
	// TrustedProxies lists the addresses or CIDR prefixes of proxies in
	// front of the router whose forwarding headers are believed. A request
	// from one of them keeps its X-Forwarded-For chain (every line, joined)
	// with the proxy's address appended, and its X-Real-IP and Forwarded.
	// From anyone else those three headers are replaced by what the router
	// saw: X-Forwarded-For and X-Real-IP set to the peer address, Forwarded
	// dropped. Default none.
	TrustedProxies []string `yaml:"trusted_proxies" reload:"restart"`
	// HashKeyFile names a file holding a per-deployment secret (at least 16
	// bytes, not readable by others). The prefix hashes are keyed with it,
	// so those that leave the process (the cluster's NATS messages) cannot be
	// matched against guessed prompts; every instance of a fleet must use the
	// same file. Empty (default): unkeyed, and a cluster warns at start.
	// (--record files are keyed with a random key of their own either way.)
	HashKeyFile string `yaml:"hash_key_file" reload:"restart"`
	// SessionHeader: when a request carries this header its value is the
	// session key (else the OpenAI `user` field is). Default "X-Session-ID".
	SessionHeader string `yaml:"session_header" reload:"restart"`
	// ReloadInterval is how often the config file's content is checked for
	// changes (0 disables watching; SIGHUP still reloads). Default 1s.
	ReloadInterval time.Duration `yaml:"reload_interval" reload:"restart"`
	// DrainTimeout bounds graceful shutdown: in-flight streams get this long
	// to finish before their connections are closed. Default 30s.
	DrainTimeout time.Duration `yaml:"drain_timeout" reload:"restart"`
	// Fastpath configures in-kernel steering of promoted clients (XDP on
	// the edge, package fastpath, control loop in fastpath/steer). Off unless
	// Fastpath.Services lists a VIP. Not reloaded.
	Fastpath FastpathConfig `yaml:"fastpath" reload:"restart"`
	// Tenancy isolates tenants' KV caches (see TenancyConfig). Off by default.
	Tenancy TenancyConfig `yaml:"tenancy" reload:"restart"`
	// Tenants: API keys, per-tenant token budgets, priority classes and
	// the fair queue (see TenantsConfig, tenants.go). Off by default. The
	// keys file's content reloads on its own (tenants.go).
	Tenants TenantsConfig `yaml:"tenants" reload:"restart"`
	// Cluster shares routing state with other warmpath instances over NATS
	// (see slowpath/cluster). Off unless cluster.nats_url is set. Not
	// reloaded.
	Cluster cluster.Config `yaml:"cluster" reload:"restart"`

	// Operations (ops_config.go): graceful-stop order, TLS on the API
	// listener, TLS and a bearer token towards engines, log format and the
	// access log. None is reloaded except the TLS key pair's content.
	Shutdown   ShutdownConfig   `yaml:"shutdown" reload:"restart"`
	TLS        TLSConfig        `yaml:"tls" reload:"restart"`
	EngineTLS  EngineTLSConfig  `yaml:"engine_tls" reload:"restart"`
	EngineAuth EngineAuthConfig `yaml:"engine_auth" reload:"restart"`
	Log        LogConfig        `yaml:"log" reload:"restart"`
	// CORS answers browsers' cross-origin requests (see CORSConfig). Off
	// unless cors.allowed_origins is set. Not reloaded.
	CORS CORSConfig `yaml:"cors" reload:"restart"`
}

// CORSConfig lets browser clients on other origins call the API, as vLLM's
// --allowed-origins does: a request whose Origin is allowed gets
// Access-Control-Allow-Origin (and the engine's own CORS headers are
// replaced), and a preflight OPTIONS is answered by the router (204).
type CORSConfig struct {
	// AllowedOrigins lists origins (scheme://host[:port], no path) or "*"
	// for any. Empty (default): CORS off, OPTIONS gets 405.
	AllowedOrigins []string `yaml:"allowed_origins"`
	// AllowCredentials sends Access-Control-Allow-Credentials: true (the
	// request's origin is echoed even with "*"). Default false.
	AllowCredentials bool `yaml:"allow_credentials"`
	// MaxAge is how long a browser may cache a preflight answer. Default 10m;
	// [0, 24h].
	MaxAge time.Duration `yaml:"max_age"`
}

// TenancyConfig derives a per-tenant cache salt: with SaltFrom "api_key" the
// salt is a hash of the Authorization header value, with "header" of the
// Header's value. The salt seeds the prefix hashes (tenants never share
// index entries) and, when the body has no cache_salt, is injected into it as
// vLLM's `cache_salt` (the body is then not forwarded byte for byte).
type TenancyConfig struct {
	// SaltFrom: "none" (default), "api_key" or "header".
	SaltFrom string `yaml:"salt_from"`
	// Header names the tenant header for SaltFrom "header". Default "X-Tenant".
	Header string `yaml:"header"`
}

// Tenancy SaltFrom values.
const (
	SaltFromNone   = "none"
	SaltFromAPIKey = "api_key"
	SaltFromHeader = "header"
)

// ReplicaConfig is one engine replica.
type ReplicaConfig struct {
	// Address is host:port of the engine's HTTP server; it is also the
	// replica's unique name. Required.
	Address string `yaml:"address"`
	// Models lists the served model (and LoRA adapter) names. Required.
	Models []string `yaml:"models"`
	// Weight scales capacity relative to other replicas. 0 means 1.
	Weight float64 `yaml:"weight"`
	// KVCapacityTokens bounds the router's prefix index for this replica;
	// 0 = learn it from the engine's /metrics (cache_config_info).
	KVCapacityTokens int `yaml:"kv_capacity_tokens"`
	// MaxInFlight caps router-local concurrent requests to this replica;
	// 0 = Limits.MaxInFlightPerReplica.
	MaxInFlight int `yaml:"max_in_flight"`
	// PrefillTokensPerSec seeds the replica's prefill-rate estimate (measured
	// rates replace it); 0 = routing.default_prefill_tokens_per_sec.
	PrefillTokensPerSec float64 `yaml:"prefill_tokens_per_sec"`
	// BatchSlots is how many requests the engine runs at once (vLLM
	// --max-num-seqs, SGLang --max-running-requests, llama.cpp -np); the
	// cost policy prices the wait for a slot beyond them. 0 = discover it:
	// llama.cpp's /props total_slots, SGLang's /get_server_info
	// max_running_requests, else learned from scrapes that show a full
	// batch (running with requests waiting).
	BatchSlots int `yaml:"batch_slots"`
	// CacheModel is how the engine keeps prompts: "auto" (or empty)
	// discovers it (llama.cpp, seen from its /metrics and /props: slots),
	// "shared" (one prefix cache for every request: vLLM, SGLang), "slots"
	// (each batch slot keeps only its own last prompt and the engine picks
	// the slot: llama.cpp; the router replays that choice to predict hits),
	// "none" (no prefix caching: vLLM --no-enable-prefix-caching, SGLang
	// --disable-radix-cache; no hit is predicted, so the replica is
	// weighed by load alone). auto also finds "none" where vLLM's
	// cache_config_info says enable_prefix_caching="False" or SGLang's
	// /get_server_info says disable_radix_cache.
	CacheModel string `yaml:"cache_model"`
	// Host is the IPv4 address of the GPU host the fast path steers this
	// replica's promoted clients to (the engine listens there on the VIP
	// port). Empty: Address's host when it is an IPv4 literal; otherwise
	// the replica is never a fast-path target.
	Host string `yaml:"host"`
	// TLS, when set, replaces engine_tls for this replica (the whole block).
	TLS *EngineTLSConfig `yaml:"tls"`
	// APIKeyFile / APIKey replace engine_auth for this replica (see
	// EngineAuthConfig); at most one of the two.
	APIKeyFile string `yaml:"api_key_file"`
	APIKey     string `yaml:"api_key"`
}

// LimitsConfig bounds what clients can make the router do.
type LimitsConfig struct {
	// MaxBodyBytes is the largest accepted request body. Default 8 MiB.
	MaxBodyBytes int `yaml:"max_body_bytes"`
	// MaxResponseBytes bounds a non-streamed engine answer, which the router
	// holds whole before answering (streams are relayed as they come and not
	// bounded). An answer over it is a 502 (code response_too_large), not
	// retried: the engine did the work. Default 128 MiB; [1024, 4 GiB].
	MaxResponseBytes int `yaml:"max_response_bytes" reload:"live"`
	// ReadTimeout bounds reading one request (headers and body). Default 30s.
	ReadTimeout time.Duration `yaml:"read_timeout"`
	// WriteTimeout bounds writing one response; 0 = none (default), because
	// a stream lives as long as its generation.
	WriteTimeout time.Duration `yaml:"write_timeout"`
	// IdleTimeout closes keep-alive connections idle this long. Default 120s.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// StallTimeout closes a client connection when one write to it makes no
	// progress for this long: a client that stops reading its stream would
	// otherwise hold a replica slot and the engine's generation for as long
	// as the stream lasts. Every write that moves bytes restarts the clock,
	// so long streams read at any pace are unaffected (the deadline moves
	// only by more than 1/16 of it: a stalled client is cut after between
	// 15/16 of it and all of it). Default 60s; > 0.
	StallTimeout time.Duration `yaml:"stall_timeout"`
	// MaxConnections caps open client connections on the API listener; one
	// over it is answered 503 (code too_many_connections) and closed. 0
	// (default) = half the soft fd limit at start (warmpath serve raises the
	// soft limit to the hard one first), -1 = no cap.
	MaxConnections int `yaml:"max_connections"`
	// MaxConnectionsPerClient caps open connections from one client IP
	// address (as the router sees it; every client behind one NAT or proxy
	// shares it); one over it is answered 503 and closed. 0 (default) = no
	// cap.
	MaxConnectionsPerClient int `yaml:"max_connections_per_client"`
	// MaxInFlight caps concurrent proxied requests in total; 0 = unlimited
	// (default).
	MaxInFlight int `yaml:"max_in_flight" reload:"live"`
	// MaxInFlightPerReplica is the default per-replica cap; 0 = unlimited
	// (default).
	MaxInFlightPerReplica int `yaml:"max_in_flight_per_replica" reload:"live"`
	// OnLimit is what happens to a request over a limit: "reject" (429,
	// default) or "queue" (wait up to QueueTimeout, then 429).
	OnLimit string `yaml:"on_limit" reload:"live"`
	// QueueTimeout bounds the wait when OnLimit is "queue". Default 5s.
	QueueTimeout time.Duration `yaml:"queue_timeout" reload:"live"`
}

// UpstreamConfig tunes the pooled connections to replicas.
type UpstreamConfig struct {
	// DialTimeout bounds connecting to a replica. Default 2s.
	DialTimeout time.Duration `yaml:"dial_timeout"`
	// ResponseTimeout bounds a whole upstream response, stream included.
	// Default 10m.
	ResponseTimeout time.Duration `yaml:"response_timeout" reload:"live"`
	// IdleTimeout bounds the wait for each next byte of an upstream
	// response once its first byte (the headers) has arrived, stream or not.
	// A stream idle this long ends with an SSE error event, counts as a
	// broken stream against the replica (passive ejection) and frees its
	// slot; a buffered answer idle this long is retried like any failure
	// before the first byte reached the client. It also bounds a stream's
	// wait from headers to first token (engine queueing plus prefill): keep
	// it above that. Default 60s; > 0.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnsPerReplica caps pooled connections per replica. Default 1024.
	MaxConnsPerReplica int `yaml:"max_conns_per_replica"`
	// MaxIdleConnDuration closes pooled idle connections. Default 4s: below
	// the 5s keep-alive timeout of uvicorn (vLLM's and SGLang's HTTP server),
	// so the router closes an idle connection before the engine does.
	MaxIdleConnDuration time.Duration `yaml:"max_idle_conn_duration"`
	// MaxAttempts is how many ranked replicas one request may try (1 = no
	// retry). Retries happen only before any byte reached the client.
	// Default 3.
	MaxAttempts int `yaml:"max_attempts" reload:"live"`
	// RetryStatuses are upstream statuses retried on the next replica (the
	// replica answered but could not serve). Default [502, 503, 504].
	RetryStatuses []int `yaml:"retry_statuses" reload:"live"`
}

// HealthConfig drives active health checks.
type HealthConfig struct {
	// Path is probed with GET; 2xx is healthy. Default "/health".
	Path string `yaml:"path"`
	// Interval between probes. Default 2s.
	Interval time.Duration `yaml:"interval"`
	// Timeout per probe. Default 1s.
	Timeout time.Duration `yaml:"timeout"`
	// HealthyThreshold consecutive successes re-admit a replica. Default 2.
	HealthyThreshold int `yaml:"healthy_threshold"`
	// UnhealthyThreshold consecutive failures take it out. Default 2.
	UnhealthyThreshold int `yaml:"unhealthy_threshold"`
}

// PassiveConfig drives ejection from proxied traffic.
type PassiveConfig struct {
	// ConsecutiveFailures (connect errors, resets, RetryStatuses) eject a
	// replica. Default 3.
	ConsecutiveFailures int `yaml:"consecutive_failures"`
	// EjectTime is the first ejection's length; each further ejection
	// doubles it up to MaxEjectTime. After it, the replica still needs
	// Health.HealthyThreshold good probes. Default 5s.
	EjectTime time.Duration `yaml:"eject_time"`
	// MaxEjectTime caps the doubling. Default 60s.
	MaxEjectTime time.Duration `yaml:"max_eject_time"`
}

// ScrapeConfig drives engine /metrics scraping.
type ScrapeConfig struct {
	// Path of the engine's Prometheus endpoint. Default "/metrics".
	Path string `yaml:"path"`
	// Interval between scrapes; 0 disables scraping. Default 1s.
	Interval time.Duration `yaml:"interval"`
	// Timeout per scrape. Default 1s.
	Timeout time.Duration `yaml:"timeout"`
	// StaleAfter: signals older than this are cleared, so routing falls back
	// to router-local in-flight counts. Default 5s.
	StaleAfter time.Duration `yaml:"stale_after"`
	// BodySizeLimit bounds an engine's /metrics (and /health) body, like
	// Prometheus' body_size_limit: a larger one fails the scrape (counted in
	// scrape_body_too_large_total, logged once until a scrape succeeds).
	// Default 16 MiB; [4096, 1 GiB].
	BodySizeLimit int `yaml:"body_size_limit" reload:"restart"`
}

// Default returns the configuration used for every field the file omits.
func Default() Config {
	return Config{
		Listen:         ":8080",
		Admin:          "127.0.0.1:9090",
		ReloadInterval: time.Second,
		DrainTimeout:   30 * time.Second,
		Limits: LimitsConfig{
			MaxBodyBytes:     8 << 20,
			MaxResponseBytes: 128 << 20,
			ReadTimeout:      30 * time.Second,
			IdleTimeout:      120 * time.Second,
			StallTimeout:     60 * time.Second,
			OnLimit:          OnLimitReject,
			QueueTimeout:     5 * time.Second,
		},
		Upstream: UpstreamConfig{
			DialTimeout:         2 * time.Second,
			ResponseTimeout:     10 * time.Minute,
			IdleTimeout:         60 * time.Second,
			MaxConnsPerReplica:  1024,
			MaxIdleConnDuration: 4 * time.Second,
			MaxAttempts:         3,
			RetryStatuses:       []int{502, 503, 504},
		},
		Health: HealthConfig{
			Path:               "/health",
			Interval:           2 * time.Second,
			Timeout:            time.Second,
			HealthyThreshold:   2,
			UnhealthyThreshold: 2,
		},
		Passive: PassiveConfig{
			ConsecutiveFailures: 3,
			EjectTime:           5 * time.Second,
			MaxEjectTime:        60 * time.Second,
		},
		Scrape: ScrapeConfig{
			Path:          "/metrics",
			Interval:      time.Second,
			Timeout:       time.Second,
			StaleAfter:    5 * time.Second,
			BodySizeLimit: 16 << 20,
		},
		SessionHeader: "X-Session-ID",
		Fastpath:      DefaultFastpath(),
		Tenancy:       TenancyConfig{SaltFrom: SaltFromNone, Header: "X-Tenant"},
		Tenants:       DefaultTenants(),
		CORS:          CORSConfig{MaxAge: 10 * time.Minute},
		Shutdown:      ShutdownConfig{DrainDelay: 5 * time.Second},
		Log:           LogConfig{Format: LogFormatText},
	}
}

// OnLimit values.
const (
	OnLimitReject = "reject"
	OnLimitQueue  = "queue"
)

// CheckConfigPerms refuses a config file that anyone could rewrite: one that
// is world-writable, or whose directory is world-writable without the sticky
// bit (anyone could replace it). The error names the file and the fix.
func CheckConfigPerms(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("config permissions: %w", err)
	}
	if fi.Mode().Perm()&0o002 != 0 {
		return fmt.Errorf("config %s is world-writable (mode %v): anyone could rewrite the replica list; fix: chmod o-w %s", path, fi.Mode().Perm(), path)
	}
	dir := filepath.Dir(path)
	di, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("config permissions: %w", err)
	}
	if di.Mode().Perm()&0o002 != 0 && di.Mode()&os.ModeSticky == 0 {
		return fmt.Errorf("config %s is in world-writable directory %s (mode %v, no sticky bit): anyone could replace it; fix: chmod o-w %s", path, dir, di.Mode().Perm(), dir)
	}
	return nil
}

// ParseConfig strictly decodes YAML over Default() and validates it. Its
// error is a ConfigErrors: every problem in the file at once, each with its
// field path and line (configerr.go).
func ParseConfig(b []byte) (Config, error) {
	cfg := Default()
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var errs ConfigErrors
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return Config{}, ConfigErrors{syntaxError(b, err)}
		}
		errs = decodeErrors(b, te)
	}
	if errs = append(errs, validationErrors(b, cfg.Validate(), errs)...); len(errs) > 0 {
		errs.sort()
		return Config{}, errs
	}
	return cfg, nil
}

// Validate checks every field and returns every problem at once (an
// errors.Join, one error per field, each naming the field and its allowed
// range).
func (c *Config) Validate() error {
	var v fieldErrs
	if c.Listen == "" {
		v.addf("listen", "must be a host:port address, got empty")
	} else {
		v.add(checkAddr("listen", c.Listen))
	}
	if c.Admin != "" {
		v.add(checkAddr("admin", c.Admin))
	}
	seen := make(map[string]int, len(c.Replicas))
	for i := range c.Replicas {
		r := &c.Replicas[i]
		f := "replicas[" + strconv.Itoa(i) + "]"
		if r.Address == "" {
			v.addf(f+".address", "required (host:port)")
		} else if err := checkAddr(f+".address", r.Address); err != nil {
			v.add(err)
		} else if j, dup := seen[r.Address]; dup {
			v.addf(f+".address", "%q duplicates replicas[%d]", r.Address, j)
		} else {
			seen[r.Address] = i
		}
		if len(r.Models) == 0 {
			v.addf(f+".models", "at least one model name required")
		}
		for j, m := range r.Models {
			if m == "" {
				v.addf(f+".models["+strconv.Itoa(j)+"]", "must not be empty")
			}
		}
		if !(r.Weight >= 0 && r.Weight <= 1000) { // also rejects NaN
			v.addf(f+".weight", "must be in [0, 1000] (0 means 1), got %g", r.Weight)
		}
		if r.BatchSlots < 0 {
			v.addf(f+".batch_slots", "must be >= 0 (0 = discover from the engine), got %d", r.BatchSlots)
		}
		if _, ok := cacheModels[r.CacheModel]; !ok {
			v.addf(f+".cache_model", "must be auto, shared, slots or none, got %q", r.CacheModel)
		}
		if r.KVCapacityTokens < 0 {
			v.addf(f+".kv_capacity_tokens", "must be >= 0 (0 = from engine metrics), got %d", r.KVCapacityTokens)
		}
		if !(r.PrefillTokensPerSec >= 0) || math.IsInf(r.PrefillTokensPerSec, 0) {
			v.addf(f+".prefill_tokens_per_sec", "must be >= 0 (0 = routing default), got %g", r.PrefillTokensPerSec)
		}
		if r.MaxInFlight < 0 {
			v.addf(f+".max_in_flight", "must be >= 0 (0 = limits.max_in_flight_per_replica), got %d", r.MaxInFlight)
		}
		if r.Host != "" {
			if a, err := netip.ParseAddr(r.Host); err != nil || !a.Is4() {
				v.addf(f+".host", "must be an IPv4 address (the GPU host), got %q", r.Host)
			}
		}
	}
	l := &c.Limits
	if l.MaxBodyBytes < 1024 || l.MaxBodyBytes > 1<<30 {
		v.addf("limits.max_body_bytes", "must be in [1024, 1073741824], got %d", l.MaxBodyBytes)
	}
	if l.MaxResponseBytes < 1024 || l.MaxResponseBytes > 4<<30 {
		v.addf("limits.max_response_bytes", "must be in [1024, 4294967296], got %d", l.MaxResponseBytes)
	}
	if l.ReadTimeout <= 0 {
		v.addf("limits.read_timeout", "must be > 0, got %s", l.ReadTimeout)
	}
	if l.WriteTimeout < 0 {
		v.addf("limits.write_timeout", "must be >= 0 (0 = none), got %s", l.WriteTimeout)
	}
	if l.StallTimeout <= 0 {
		v.addf("limits.stall_timeout", "must be > 0, got %s", l.StallTimeout)
	}
	if l.IdleTimeout <= 0 {
		v.addf("limits.idle_timeout", "must be > 0, got %s", l.IdleTimeout)
	}
	if l.MaxConnections < -1 {
		v.addf("limits.max_connections", "must be >= -1 (0 = half the fd limit, -1 = no cap), got %d", l.MaxConnections)
	}
	if l.MaxConnectionsPerClient < 0 {
		v.addf("limits.max_connections_per_client", "must be >= 0 (0 = no cap), got %d", l.MaxConnectionsPerClient)
	}
	if l.MaxInFlight < 0 {
		v.addf("limits.max_in_flight", "must be >= 0 (0 = unlimited), got %d", l.MaxInFlight)
	}
	if l.MaxInFlightPerReplica < 0 {
		v.addf("limits.max_in_flight_per_replica", "must be >= 0 (0 = unlimited), got %d", l.MaxInFlightPerReplica)
	}
	if l.OnLimit != OnLimitReject && l.OnLimit != OnLimitQueue {
		v.addf("limits.on_limit", "must be %q or %q, got %q", OnLimitReject, OnLimitQueue, l.OnLimit)
	}
	if l.OnLimit == OnLimitQueue && l.QueueTimeout <= 0 {
		v.addf("limits.queue_timeout", "must be > 0 when on_limit is queue, got %s", l.QueueTimeout)
	}
	u := &c.Upstream
	if u.DialTimeout <= 0 {
		v.addf("upstream.dial_timeout", "must be > 0, got %s", u.DialTimeout)
	}
	if u.ResponseTimeout <= 0 {
		v.addf("upstream.response_timeout", "must be > 0, got %s", u.ResponseTimeout)
	}
	if u.IdleTimeout <= 0 {
		v.addf("upstream.idle_timeout", "must be > 0, got %s", u.IdleTimeout)
	}
	if u.MaxConnsPerReplica < 1 {
		v.addf("upstream.max_conns_per_replica", "must be >= 1, got %d", u.MaxConnsPerReplica)
	}
	if u.MaxIdleConnDuration <= 0 {
		v.addf("upstream.max_idle_conn_duration", "must be > 0, got %s", u.MaxIdleConnDuration)
	}
	if u.MaxAttempts < 1 || u.MaxAttempts > 16 {
		v.addf("upstream.max_attempts", "must be in [1, 16], got %d", u.MaxAttempts)
	}
	for i, st := range u.RetryStatuses {
		if st < 500 || st > 599 {
			v.addf("upstream.retry_statuses["+strconv.Itoa(i)+"]", "must be in [500, 599], got %d", st)
		}
	}
	h := &c.Health
	if h.Path == "" || h.Path[0] != '/' {
		v.addf("health.path", "must start with '/', got %q", h.Path)
	}
	if h.Interval <= 0 {
		v.addf("health.interval", "must be > 0, got %s", h.Interval)
	} else if h.Timeout <= 0 || h.Timeout > h.Interval {
		v.addf("health.timeout", "must be in (0, health.interval=%s], got %s", h.Interval, h.Timeout)
	}
	if h.HealthyThreshold < 1 || h.HealthyThreshold > 100 {
		v.addf("health.healthy_threshold", "must be in [1, 100], got %d", h.HealthyThreshold)
	}
	if h.UnhealthyThreshold < 1 || h.UnhealthyThreshold > 100 {
		v.addf("health.unhealthy_threshold", "must be in [1, 100], got %d", h.UnhealthyThreshold)
	}
	p := &c.Passive
	if p.ConsecutiveFailures < 0 {
		v.addf("passive.consecutive_failures", "must be >= 0 (0 = never eject), got %d", p.ConsecutiveFailures)
	}
	if p.EjectTime <= 0 {
		v.addf("passive.eject_time", "must be > 0, got %s", p.EjectTime)
	} else if p.MaxEjectTime < p.EjectTime {
		v.addf("passive.max_eject_time", "must be >= passive.eject_time=%s, got %s", p.EjectTime, p.MaxEjectTime)
	}
	s := &c.Scrape
	if s.Path == "" || s.Path[0] != '/' {
		v.addf("scrape.path", "must start with '/', got %q", s.Path)
	}
	if s.Interval < 0 {
		v.addf("scrape.interval", "must be >= 0 (0 = off), got %s", s.Interval)
	}
	if s.Interval > 0 && (s.Timeout <= 0 || s.Timeout > s.Interval) {
		v.addf("scrape.timeout", "must be in (0, scrape.interval=%s], got %s", s.Interval, s.Timeout)
	}
	if s.Interval > 0 && s.StaleAfter < s.Interval {
		v.addf("scrape.stale_after", "must be >= scrape.interval=%s, got %s", s.Interval, s.StaleAfter)
	}
	if s.BodySizeLimit < 4096 || s.BodySizeLimit > 1<<30 {
		v.addf("scrape.body_size_limit", "must be in [4096, 1073741824], got %d", s.BodySizeLimit)
	}
	v.addPrefixed("routing.", c.Routing.Validate())
	v.add(checkTrusted(c.TrustedProxies))
	if c.SessionHeader == "" {
		v.addf("session_header", "must be a header name, got empty")
	}
	if c.ReloadInterval < 0 {
		v.addf("reload_interval", "must be >= 0 (0 = no file watch), got %s", c.ReloadInterval)
	}
	if c.DrainTimeout < 0 {
		v.addf("drain_timeout", "must be >= 0, got %s", c.DrainTimeout)
	}
	switch c.Tenancy.SaltFrom {
	case SaltFromNone, SaltFromAPIKey:
	case SaltFromHeader:
		if c.Tenancy.Header == "" {
			v.addf("tenancy.header", "must be set when salt_from is header")
		}
	default:
		v.addf("tenancy.salt_from", "must be none, api_key or header, got %q", c.Tenancy.SaltFrom)
	}
	v.add(c.Tenants.validate(c))
	v.add(c.CORS.Validate())
	v.add(c.validateOps())
	v.addPrefixed("cluster.", c.Cluster.Validate())
	v.add(c.Fastpath.Validate())
	return errors.Join(v...)
}

// LoadHashKey reads hash_key_file: the parser's key and an id of it (a
// different one-way digest, safe to send to peers). Zero values without a
// file.
func LoadHashKey(path string) (key, id uint64, err error) {
	if path == "" {
		return 0, 0, nil
	}
	fi, err := os.Stat(path)
	if err != nil {
		return 0, 0, fieldErrorf("hash_key_file", "%w", err)
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return 0, 0, fieldErrorf("hash_key_file", "%s is readable by others (mode %v): fix: chmod o-r %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, 0, fieldErrorf("hash_key_file", "%w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) < 16 {
		return 0, 0, fieldErrorf("hash_key_file", "%s holds %d bytes, want at least 16 (e.g. head -c 32 /dev/urandom | base64 > %s)", path, len(b), path)
	}
	k := sha256.Sum256(append([]byte("warmpath hash key\x00"), b...))
	i := sha256.Sum256(append([]byte("warmpath hash key id\x00"), b...))
	return binary.LittleEndian.Uint64(k[:8]) | 1, binary.LittleEndian.Uint64(i[:8]), nil
}

// parseTrusted parses trusted_proxies entries: an address is a prefix of
// its full length.
func parseTrusted(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for i, v := range list {
		p, err := netip.ParsePrefix(v)
		if err != nil {
			a, aerr := netip.ParseAddr(v)
			if aerr != nil {
				return nil, fieldErrorf("trusted_proxies["+strconv.Itoa(i)+"]", "must be an IP address or CIDR prefix, got %q", v)
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// checkTrusted reports every bad trusted_proxies entry.
func checkTrusted(list []string) error {
	var v fieldErrs
	for i, e := range list {
		if _, err := parseTrusted([]string{e}); err != nil {
			v.addf("trusted_proxies["+strconv.Itoa(i)+"]", "must be an IP address or CIDR prefix, got %q", e)
		}
	}
	return errors.Join(v...)
}

func checkAddr(field, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fieldErrorf(field, "must be host:port, got %q", addr)
	}
	_ = host
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return fieldErrorf(field, "port must be in [0, 65535], got %q", port)
	}
	return nil
}

// cacheModels maps ReplicaConfig.CacheModel to the router's.
var cacheModels = map[string]affinity.CacheModel{
	"": affinity.CacheAuto, "auto": affinity.CacheAuto,
	"shared": affinity.CacheShared, "slots": affinity.CacheSlots, "none": affinity.CacheNone,
}
