package slowpath

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"
)

func TestParseConfigDefaults(t *testing.T) {
	cfg, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, Default()) {
		t.Fatalf("empty file should give Default():\n%+v", cfg)
	}
	cfg, err = ParseConfig([]byte(`
listen: "127.0.0.1:8081"
replicas:
  - address: 10.0.0.1:8000
    models: [llama, lora-1]
    weight: 2
  - address: 10.0.0.2:8000
    models: [llama]
    max_in_flight: 64
health:
  interval: 1500ms
routing:
  policy: cost
  hash:
    block_tokens: 16
`))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:8081" || len(cfg.Replicas) != 2 || cfg.Replicas[0].Weight != 2 ||
		cfg.Replicas[1].MaxInFlight != 64 || cfg.Health.Interval != 1500*time.Millisecond ||
		cfg.Routing.Hash.BlockTokens != 16 {
		t.Fatalf("decoded %+v", cfg)
	}
	if cfg.Health.Timeout != time.Second || cfg.Upstream.MaxAttempts != 3 {
		t.Fatalf("omitted fields must keep defaults: %+v", cfg)
	}
}

func TestParseFastpathConfig(t *testing.T) {
	cfg, err := ParseConfig([]byte(`
replicas:
  - {address: 10.2.1.2:8000, models: [m]}
  - {address: gpu2.internal:8000, models: [m], host: 10.2.2.2}
  - {address: gpu3.internal:8000, models: [m]}
fastpath:
  mode: kernel
  interface: eth0
  attach: driver
  services: [10.100.0.1:8000, 10.100.0.2:443]
  encap_source: 10.2.0.1
  sample_every: 50
  rebalance_interval: 250ms
  promoter: {window: 4, max_prefixes: 2, idle_ttl: 2m}
`))
	if err != nil {
		t.Fatal(err)
	}
	f := cfg.Fastpath
	if !f.Enabled() || f.Mode != "kernel" || f.Interface != "eth0" || f.Attach != "driver" || f.EncapSource != "10.2.0.1" ||
		f.SampleEvery != 50 || f.RebalanceInterval != 250*time.Millisecond || f.PinPath != "/sys/fs/bpf/warmpath" ||
		f.Promoter.Window != 4 || f.Promoter.MaxPrefixes != 2 || f.Promoter.IdleTTL != 2*time.Minute {
		t.Fatalf("fastpath = %+v", f)
	}
	if got := f.ServiceAddrs(); len(got) != 2 || got[1].String() != "10.100.0.2:443" {
		t.Fatalf("services = %v", got)
	}
	for i, want := range []string{"10.2.1.2", "10.2.2.2", "invalid IP"} {
		if got := replicaHost(&cfg.Replicas[i]); got.String() != want {
			t.Errorf("replicas[%d] host = %s, want %s", i, got, want)
		}
	}
	def, err := ParseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	if def.Fastpath.Enabled() || def.Fastpath.SampleEvery != 16 || def.Fastpath.Mode != "auto" {
		t.Fatalf("default fastpath = %+v", def.Fastpath)
	}
	// Userspace mode needs no interface.
	if _, err := ParseConfig([]byte("fastpath: {mode: userspace, services: [10.100.0.1:8000]}")); err != nil {
		t.Fatal(err)
	}
}

func TestParseConfigErrors(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"unknown top-level field", "listne: :8080", "line 1: listne: unknown field"},
		{"unknown nested field", "health:\n  intervall: 1s", "line 2: health.intervall: unknown field"},
		{"bad duration", "health:\n  interval: soon", `line 2: health.interval: want a duration such as 30s or 1m30s, got "soon"`},
		{"listen not host:port", "listen: 8080", `listen: must be host:port, got "8080"`},
		{"admin bad port", "admin: 127.0.0.1:99999", `admin: port must be in [0, 65535], got "99999"`},
		{"replica without address", "replicas:\n  - models: [m]", "replicas[0].address: required (host:port)"},
		{"replica without models", "replicas:\n  - address: 127.0.0.1:1", "replicas[0].models: at least one model name required"},
		{"replica empty model", "replicas:\n  - address: 127.0.0.1:1\n    models: [\"\"]", "replicas[0].models[0]: must not be empty"},
		{"duplicate replica", "replicas:\n  - {address: 127.0.0.1:1, models: [m]}\n  - {address: 127.0.0.1:1, models: [m]}", `replicas[1].address: "127.0.0.1:1" duplicates replicas[0]`},
		{"negative weight", "replicas:\n  - {address: 127.0.0.1:1, models: [m], weight: -1}", "replicas[0].weight: must be in [0, 1000] (0 means 1), got -1"},
		{"NaN weight", "replicas:\n  - {address: 127.0.0.1:1, models: [m], weight: .nan}", "replicas[0].weight: must be in [0, 1000] (0 means 1), got NaN"},
		{"negative prefill rate", "replicas:\n  - {address: 127.0.0.1:1, models: [m], prefill_tokens_per_sec: -5}", "replicas[0].prefill_tokens_per_sec: must be >= 0 (0 = routing default), got -5"},
		{"negative batch slots", "replicas:\n  - {address: 127.0.0.1:1, models: [m], batch_slots: -1}", "replicas[0].batch_slots: must be >= 0 (0 = discover from the engine), got -1"},
		{"unknown cache model", "replicas:\n  - {address: 127.0.0.1:1, models: [m], cache_model: paged}", "replicas[0].cache_model: must be auto, shared, slots or none, got \"paged\""},
		{"tiny body limit", "limits:\n  max_body_bytes: 10", "limits.max_body_bytes: must be in [1024, 1073741824], got 10"},
		{"bad on_limit", "limits:\n  on_limit: drop", `limits.on_limit: must be "reject" or "queue", got "drop"`},
		{"max attempts", "upstream:\n  max_attempts: 0", "upstream.max_attempts: must be in [1, 16], got 0"},
		{"retry status", "upstream:\n  retry_statuses: [429]", "upstream.retry_statuses[0]: must be in [500, 599], got 429"},
		{"health timeout > interval", "health:\n  interval: 1s\n  timeout: 2s", "health.timeout: must be in (0, health.interval=1s], got 2s"},
		{"health path", "health:\n  path: health", `health.path: must start with '/', got "health"`},
		{"eject times", "passive:\n  eject_time: 10s\n  max_eject_time: 5s", "passive.max_eject_time: must be >= passive.eject_time=10s, got 5s"},
		{"stale bound", "scrape:\n  interval: 2s\n  timeout: 1s\n  stale_after: 1s", "scrape.stale_after: must be >= scrape.interval=2s, got 1s"},
		{"routing policy", "routing:\n  policy: magic", `routing.policy "magic": want one of`},
		{"routing hash", "routing:\n  hash:\n    block_tokens: 99999", "routing.hash.block_tokens 99999: want 1..4096"},
		{"session header", `session_header: ""`, "session_header: must be a header name, got empty"},
		{"replica host not IPv4", "replicas:\n  - {address: gpu1:8000, models: [m], host: gpu1}", `replicas[0].host: must be an IPv4 address (the GPU host), got "gpu1"`},
		{"fastpath mode", "fastpath:\n  mode: turbo", `fastpath.mode: must be "auto", "kernel" or "userspace", got "turbo"`},
		{"fastpath attach", "fastpath:\n  attach: offload", `fastpath.attach: must be "auto", "driver" or "generic", got "offload"`},
		{"fastpath service not IPv4", "fastpath:\n  services: [\"[::1]:8000\"]", `fastpath.services[0]: must be an IPv4 VIP:port with port > 0, got "[::1]:8000"`},
		{"fastpath service port 0", "fastpath:\n  services: [10.100.0.1:0]", `fastpath.services[0]: must be an IPv4 VIP:port with port > 0, got "10.100.0.1:0"`},
		{"fastpath duplicate service", "fastpath:\n  interface: eth0\n  services: [10.100.0.1:8000, 10.100.0.1:8000]", `fastpath.services[1]: "10.100.0.1:8000" duplicates fastpath.services[0]`},
		{"fastpath interface required", "fastpath:\n  services: [10.100.0.1:8000]", `fastpath.interface: required (the client-facing interface for XDP) when fastpath.services is set and mode is "auto"`},
		{"fastpath encap source", "fastpath:\n  encap_source: edge", `fastpath.encap_source: must be an IPv4 address of the edge, got "edge"`},
		{"fastpath pin path", "fastpath:\n  pin_path: bpf/warmpath", `fastpath.pin_path: must be an absolute path on bpffs, got "bpf/warmpath"`},
		{"fastpath rebalance interval", "fastpath:\n  rebalance_interval: 1ms", "fastpath.rebalance_interval: must be in [10ms, 1m], got 1ms"},
		{"fastpath promoter window", "fastpath:\n  promoter:\n    window: 9", "fastpath.promoter.window 9: want 1..8"},
		{"fastpath promoter unknown field", "fastpath:\n  promoter:\n    windw: 3", "line 3: fastpath.promoter.windw: unknown field"},
		// Non-finite numbers name the field and its line.
		{"NaN load factor", "routing:\n  load_factor: .nan", "line 2: routing.load_factor NaN: want a finite number"},
		{"NaN kv high water", "routing:\n  kv_high_water: .nan", "line 2: routing.kv_high_water NaN: want a finite number"},
		{"Inf load penalty", "routing:\n  load_penalty_seconds: .inf", "line 2: routing.load_penalty_seconds +Inf: want a finite number"},
		{"-Inf kv penalty", "routing:\n  kv_penalty_seconds: -.inf", "line 2: routing.kv_penalty_seconds -Inf: want a finite number"},
		{"NaN default prefill rate", "routing:\n  default_prefill_tokens_per_sec: .nan", "line 2: routing.default_prefill_tokens_per_sec NaN: want a finite number"},
		{"Inf replica prefill rate", "replicas:\n  - {address: 127.0.0.1:1, models: [m]}\n  - {address: 127.0.0.1:2, models: [m], prefill_tokens_per_sec: .inf}", "line 3: replicas[1].prefill_tokens_per_sec: must be >= 0 (0 = routing default), got +Inf"},
		{"NaN promoter share", "fastpath:\n  promoter:\n    max_share: .nan", "line 3: fastpath.promoter.max_share NaN: want (0, 1]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseConfig([]byte(tc.yaml))
			if err == nil {
				t.Fatalf("no error, want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want it to contain %q", err, tc.want)
			}
		})
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("listen: :8080\nreplicas:\n  - {address: 127.0.0.1:1, models: [m]}\n"))
	f.Add([]byte("health: {interval: 1s, timeout: 1s}\nrouting: {policy: cost, hash: {block_tokens: 16}}"))
	f.Add([]byte("limits: {on_limit: queue, queue_timeout: 1s}"))
	f.Add([]byte("replicas: [{address: '[::1]:80', models: [a, b], weight: 1e308}]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := ParseConfig(b)
		if err != nil {
			// Every problem is a FieldError on a line of the input.
			var ces ConfigErrors
			if !errors.As(err, &ces) || len(ces) == 0 {
				t.Fatalf("error %T %v, want ConfigErrors", err, err)
			}
			lines := yamlLines(b)
			for _, fe := range ces {
				if fe.Line < 0 || fe.Line > lines || fe.Err == nil {
					t.Fatalf("error %q: line %d of %d", fe, fe.Line, lines)
				}
			}
			return
		}
		// Whatever parses must validate again identically.
		if err := cfg.Validate(); err != nil {
			t.Fatalf("parsed config fails Validate: %v", err)
		}
	})
}

// yamlLines counts the lines of b as the YAML scanner numbers them: it
// breaks at \n, \r\n, a lone \r, and the Unicode breaks NEL (U+0085),
// LS (U+2028) and PS (U+2029).
func yamlLines(b []byte) int {
	n := 1
	for i := 0; i < len(b); i++ {
		switch {
		case b[i] == '\n':
			n++
		case b[i] == '\r':
			n++
			if i+1 < len(b) && b[i+1] == '\n' {
				i++
			}
		case bytes.HasPrefix(b[i:], []byte("\u0085")), bytes.HasPrefix(b[i:], []byte("\u2028")), bytes.HasPrefix(b[i:], []byte("\u2029")):
			n++
		}
	}
	return n
}

// TestParseConfigEveryError: one file with problems in several sections
// gives one FieldError per problem, each with its field and line.
func TestParseConfigEveryError(t *testing.T) {
	src := "listen: nope\n" + // 1
		"limits:\n" + // 2
		"  read_timeout: soon\n" + // 3
		"  max_body_bytes: 1\n" + // 4
		"health:\n" + // 5
		"  path: health\n" + // 6
		"  bogus: 1\n" + // 7
		"routing:\n" + // 8
		"  kv_high_water: .nan\n" // 9
	_, err := ParseConfig([]byte(src))
	var ces ConfigErrors
	if !errors.As(err, &ces) {
		t.Fatalf("err %T %v, want ConfigErrors", err, err)
	}
	want := []struct {
		field string
		line  int
	}{{"listen", 1}, {"limits.read_timeout", 3}, {"limits.max_body_bytes", 4}, {"health.path", 6}, {"health.bogus", 7}, {"routing.kv_high_water", 9}}
	if len(ces) != len(want) {
		t.Fatalf("got %d errors:\n%v\nwant %d", len(ces), err, len(want))
	}
	for i, w := range want {
		if ces[i].Field != w.field || ces[i].Line != w.line {
			t.Errorf("error %d = %q (field %q line %d), want field %q line %d", i, ces[i], ces[i].Field, ces[i].Line, w.field, w.line)
		}
	}
	var fe *FieldError
	if !errors.As(err, &fe) || fe.Field != "listen" {
		t.Fatalf("errors.As FieldError: %v", fe)
	}
}
