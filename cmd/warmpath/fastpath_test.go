package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/warmpath/warmpath/bench/enginesim"
	"github.com/warmpath/warmpath/fastpath"
)

// longPrompt is a shared system prompt of ~1,000 estimated tokens: enough
// cached prefix for the promotion rule.
var longPrompt = strings.Repeat("You are a careful assistant who answers in one line. ", 75)

func chatBody(model, user string) string {
	return fmt.Sprintf(`{"model":%q,"max_tokens":8,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
		model, longPrompt, user)
}

func metricsText(t *testing.T, admin string) string {
	t.Helper()
	return scrape(t, "http://"+admin+"/metrics")
}

// The fast path in userspace mode (forced, or auto without BPF): every
// request is served by the slowpath, the control loop still promotes the
// client into the userspace datapath, and auto mode says why in exactly
// one log line.
func TestServeFastpathUserspace(t *testing.T) {
	en := startEngine(t)
	noBPF := func() error { return fmt.Errorf("%w: test: no BPF here", fastpath.ErrUnavailable) }
	tests := []struct {
		name     string
		probe    func() error
		flags    []string
		wantLine string // the one line explaining userspace mode
	}{
		{"forced by flags", nil, []string{"--fastpath-mode", "userspace", "--fastpath-vip", "10.100.0.1:8000"},
			"fastpath in userspace mode (forced)"},
		{"auto without BPF", noBPF, []string{"--fastpath-interface", "eth9", "--fastpath-vip", "10.100.0.1:8000"},
			"test: no BPF here"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := filepath.Join(t.TempDir(), "c.yaml")
			if err := os.WriteFile(cfg, []byte("replicas:\n  - {address: "+en.Addr()+", models: [m]}\nfastpath:\n  rebalance_interval: 50ms\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			st := startServeProbe(t, tc.probe, append([]string{"--config", cfg, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"}, tc.flags...)...)
			for i := range 5 {
				resp, err := testClient.Post("http://"+st.api+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("m", fmt.Sprint("q", i))))
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 || !strings.Contains(string(b), `"choices"`) {
					t.Fatalf("request %d: %d %s", i, resp.StatusCode, b)
				}
			}
			m := metricsText(t, st.admin)
			for _, want := range []string{
				"warmpath_fastpath_kernel_mode 0",
				`warmpath_steer_actions_total{action="promote"} 1`,
				`warmpath_slowpath_requests_total{code="200",model="m",replica="` + en.Addr() + `"} 5`,
			} {
				if !strings.Contains(m, want) {
					t.Errorf("metrics lack %q", want)
				}
			}
			if n := len(regexp.MustCompile(`(?m)^.*userspace mode.*$`).FindAllString(st.stderr.String(), -1)); n != 1 ||
				!strings.Contains(st.stderr.String(), tc.wantLine) {
				t.Errorf("want exactly one userspace-mode line containing %q, got %d:\n%s", tc.wantLine, n, st.stderr.String())
			}
		})
	}
}

func TestServeFastpathBadFlag(t *testing.T) {
	en := startEngine(t)
	cfg := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(cfg, []byte("replicas:\n  - {address: "+en.Addr()+", models: [m]}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct{ name, flag, value, want string }{
		{"mode", "--fastpath-mode", "turbo", `fastpath.mode: must be "auto", "kernel" or "userspace", got "turbo"`},
		{"vip", "--fastpath-vip", "10.100.0.1", `fastpath.services[0]: must be an IPv4 VIP:port with port > 0, got "10.100.0.1"`},
		{"no interface", "--fastpath-vip", "10.100.0.1:8000", "fastpath.interface: required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb syncBuf
			err := run(context.Background(), []string{"serve", "--config", cfg, "--listen", "127.0.0.1:0", "--admin", "", tc.flag, tc.value},
				env{stdout: &out, stderr: &errb})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}

func TestStatusWithoutPinnedState(t *testing.T) {
	var out, errb syncBuf
	pin := filepath.Join(t.TempDir(), "none")
	if err := run(context.Background(), []string{"status", "--pin-path", pin}, env{stdout: &out, stderr: &errb}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "no pinned state at "+pin) || !strings.Contains(out.String(), "userspace mode") {
		t.Fatalf("status said %q", out.String())
	}
}

func startEngine(t *testing.T) *enginesim.Server {
	t.Helper()
	return startEngines(t, 1, func(_ int, c *enginesim.Config) { c.TimeScale = 0.01 })[0]
}

func TestDecapUsage(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no interface", []string{"decap", "--vip", "10.100.0.1:8000"}, "decap: --interface and --vip are required"},
		{"no vip", []string{"decap", "--interface", "eth1"}, "decap: --interface and --vip are required"},
		{"bad vip", []string{"decap", "--interface", "eth1", "--vip", "10.100.0.1"}, `decap: --vip[0]: must be an IPv4 VIP:port with port > 0, got "10.100.0.1"`},
		{"bad source", []string{"decap", "--interface", "eth1", "--vip", "10.100.0.1:8000", "--source", "edge"}, `decap: --source: must be an IPv4 address of the edge, got "edge"`},
		{"bad attach", []string{"decap", "--interface", "eth1", "--vip", "10.100.0.1:8000", "--attach", "skb"}, `decap: --attach: must be "auto", "driver" or "generic", got "skb"`},
		{"duplicate vip", []string{"decap", "--interface", "eth1", "--vip", "10.100.0.1:8000,10.100.0.1:8000"}, `decap: --vip[1]: "10.100.0.1:8000" duplicates --vip[0]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := run(context.Background(), tc.args, env{stdout: io.Discard, stderr: io.Discard})
			if err == nil || err.Error() != tc.want {
				t.Fatalf("err %v, want %q", err, tc.want)
			}
		})
	}
}
