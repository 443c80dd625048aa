package slowpath

import (
	"fmt"
	"time"
)

// ShutdownConfig orders a graceful stop (SIGTERM): readiness (/readyz)
// fails first, the API listener keeps accepting and serving for DrainDelay
// so a load balancer polling /readyz stops sending new connections, then it
// stops accepting and in-flight requests get drain_timeout to finish.
type ShutdownConfig struct {
	// DrainDelay is how long the listener stays open after readiness fails.
	// Set it above the load balancer's health-check interval times its
	// unhealthy threshold. Default 5s; 0 = stop accepting at once.
	DrainDelay time.Duration `yaml:"drain_delay"`
}

// TLSConfig serves the API over TLS (HTTPS), TLS 1.2 at least. Both files
// empty (default) = plain HTTP. The pair is re-read when either file
// changes (checked every reload_interval, and on SIGHUP): new connections
// get the new certificate, open ones keep theirs; a pair that does not
// load keeps the running one (logged).
type TLSConfig struct {
	// CertFile is the PEM certificate chain (leaf first).
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM private key of the leaf.
	KeyFile string `yaml:"key_file"`
}

// Enabled reports whether the API is served over TLS.
func (t *TLSConfig) Enabled() bool { return t.CertFile != "" || t.KeyFile != "" }

// EngineTLSConfig is TLS towards engines (an engine served over HTTPS):
// proxied requests, health checks and scrapes alike.
type EngineTLSConfig struct {
	// Enabled turns TLS on. Default false (plain HTTP).
	Enabled bool `yaml:"enabled"`
	// CAFile is a PEM bundle of the CAs that sign the engines'
	// certificates; "" = the system roots.
	CAFile string `yaml:"ca_file"`
	// ServerName is the name verified in the engine's certificate (and sent
	// as SNI); "" = the host of the replica's address.
	ServerName string `yaml:"server_name"`
	// InsecureSkipVerify accepts any certificate. For tests only: it makes
	// TLS worthless against an active attacker.
	InsecureSkipVerify bool `yaml:"insecure_skip_verify"`
}

// EngineAuthConfig is the bearer token engines require (vLLM --api-key,
// SGLang --api-key, llama.cpp --api-key). When set, proxied requests carry
// `Authorization: Bearer <key>` towards the engine instead of the client's
// Authorization header (tenancy salt_from api_key still reads the
// client's), and health checks and scrapes carry it too.
type EngineAuthConfig struct {
	// APIKeyFile names a file holding the key (surrounding white space
	// trimmed); it must not be readable by others. Read when the replica is
	// added (start, reload). Preferred over APIKey.
	APIKeyFile string `yaml:"api_key_file"`
	// APIKey is the key inline. At most one of the two.
	APIKey string `yaml:"api_key"`
}

// LogConfig sets the log format and the access log.
type LogConfig struct {
	// Format is "text" (default) or "json" (one JSON object per line);
	// `serve --log-format` overrides it.
	Format string `yaml:"format"`
	// Access is the access log: one line per request (time, client, model,
	// replica, status, TTFT, prompt/output/cached tokens, duration; never
	// the prompt or any header). "" or "false" (default) = off; "true" or
	// "stderr" = standard error; "stdout"; anything else is a file path
	// (appended, created 0600). Lines a slow disk cannot take are dropped
	// (counted in access_log_dropped_total), never waited for. In Format.
	Access string `yaml:"access"`
}

// Log format values.
const (
	LogFormatText = "text"
	LogFormatJSON = "json"
)

// AccessOn reports whether the access log is on.
func (l *LogConfig) AccessOn() bool { return l.Access != "" && l.Access != "false" }

// validateOps checks the shutdown, tls, engine_tls, engine_auth and log
// blocks (and the replicas' own tls and auth).
func (c *Config) validateOps() error {
	if c.Shutdown.DrainDelay < 0 {
		return fieldErrorf("shutdown.drain_delay", "must be >= 0 (0 = stop accepting at once), got %s", c.Shutdown.DrainDelay)
	}
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		return fieldErrorf("tls.cert_file", "cert_file and key_file must be set together")
	}
	if err := c.EngineAuth.validate("engine_auth"); err != nil {
		return err
	}
	for i := range c.Replicas {
		r := &c.Replicas[i]
		f := fmt.Sprintf("replicas[%d]", i)
		if r.APIKey != "" && r.APIKeyFile != "" {
			return fieldErrorf(f+".api_key", "set api_key or api_key_file, not both")
		}
	}
	switch c.Log.Format {
	case LogFormatText, LogFormatJSON:
	default:
		return fieldErrorf("log.format", "must be %q or %q, got %q", LogFormatText, LogFormatJSON, c.Log.Format)
	}
	return nil
}

func (a *EngineAuthConfig) validate(field string) error {
	if a.APIKey != "" && a.APIKeyFile != "" {
		return fieldErrorf(field+".api_key", "set api_key or api_key_file, not both")
	}
	return nil
}
