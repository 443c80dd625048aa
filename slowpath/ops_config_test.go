package slowpath

import (
	"strings"
	"testing"
	"time"
)

// TestOpsConfig: the shutdown, tls, engine_tls, engine_auth and log blocks
// decode with their defaults, and bad values name the field and its line.
func TestOpsConfig(t *testing.T) {
	const reps = "replicas:\n  - {address: 127.0.0.1:9, models: [m]}\n"
	cfg, err := ParseConfig([]byte(reps))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Shutdown.DrainDelay != 5*time.Second || cfg.Log.Format != LogFormatText || cfg.Log.AccessOn() || cfg.TLS.Enabled() || cfg.EngineTLS.Enabled {
		t.Fatalf("defaults: %+v %+v %+v %+v", cfg.Shutdown, cfg.Log, cfg.TLS, cfg.EngineTLS)
	}
	cfg, err = ParseConfig([]byte("shutdown: {drain_delay: 0s}\nlog: {format: json, access: true}\n" +
		"engine_tls: {enabled: true, ca_file: /etc/ca.pem, server_name: e}\nengine_auth: {api_key_file: /k}\n" + reps +
		"  - {address: 127.0.0.1:10, models: [m], tls: {enabled: false}, api_key: x}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Shutdown.DrainDelay != 0 || cfg.Log.Access != "true" || !cfg.Log.AccessOn() || cfg.Log.Format != LogFormatJSON ||
		cfg.EngineTLS.CAFile != "/etc/ca.pem" || cfg.Replicas[1].TLS == nil || cfg.Replicas[1].TLS.Enabled || cfg.Replicas[1].APIKey != "x" {
		t.Fatalf("decoded %+v %+v %+v %+v", cfg.Shutdown, cfg.Log, cfg.EngineTLS, cfg.Replicas[1])
	}
	if c, _ := ParseConfig([]byte("log: {access: false}\n" + reps)); c.Log.AccessOn() {
		t.Fatal("access: false turned the access log on")
	}
	for _, tc := range []struct{ name, yaml, want string }{
		{"negative delay", "shutdown:\n  drain_delay: -1s\n" + reps, "line 2: shutdown.drain_delay: must be >= 0"},
		{"cert without key", "tls:\n  cert_file: /c.pem\n" + reps, "tls.cert_file: cert_file and key_file must be set together"},
		{"log format", "log:\n  format: xml\n" + reps, `line 2: log.format: must be "text" or "json", got "xml"`},
		{"two keys", "engine_auth:\n  api_key: a\n  api_key_file: /k\n" + reps, "engine_auth.api_key: set api_key or api_key_file, not both"},
		{"two replica keys", reps + "  - {address: 127.0.0.1:10, models: [m], api_key: a, api_key_file: /k}\n", "line 3: replicas[1].api_key: set api_key or api_key_file, not both"},
		{"unknown field", "tls:\n  cert: x\n" + reps, "line 2: tls.cert: unknown field"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}
