package main

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// selfSigned writes a self-signed certificate for 127.0.0.1 and its key
// under dir and returns their paths and a pool trusting it.
func selfSigned(t *testing.T, dir string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "warmpath test"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	pool = x509.NewCertPool()
	pool.AddCert(c)
	return certFile, keyFile, pool
}

// exported runs warmpath serve as an operator would for the dashboard (TLS
// on, the fast path in userspace mode, a simulated vLLM engine), sends a
// few requests, and returns every metric family on /metrics by name.
func exported(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	en := startEngine(t)
	dir := t.TempDir()
	cert, key, pool := selfSigned(t, dir)
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("replicas:\n  - {address: %s, models: [m]}\ntls: {cert_file: %s, key_file: %s}\nfastpath:\n  rebalance_interval: 50ms\n", en.Addr(), cert, key)), 0o644); err != nil {
		t.Fatal(err)
	}
	st := startServe(t, "--config", cfg, "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--log-level", "warn",
		"--fastpath-mode", "userspace", "--fastpath-vip", "10.100.0.1:8000")
	c := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	for i := range 4 {
		body := chatBody("m", fmt.Sprint("q", i))
		if i%2 == 1 {
			body = strings.Replace(body, `"max_tokens":8,`, `"max_tokens":8,"stream":true,"stream_options":{"include_usage":true},`, 1)
		}
		resp, err := c.Post("https://"+st.api+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	// One refused request: rejected_total has a series once a request was refused.
	if resp, err := c.Post("https://"+st.api+"/v1/chat/completions", "application/json", strings.NewReader(chatBody("nope", "x"))); err != nil {
		t.Fatal(err)
	} else if resp.Body.Close(); resp.StatusCode != 404 {
		t.Fatalf("unknown model: %d", resp.StatusCode)
	}
	var mfs map[string]*dto.MetricFamily
	waitForCond(t, "engine signals and fast-path state exported", func() bool {
		p := expfmt.NewTextParser(model.UTF8Validation)
		var err error
		mfs, err = p.TextToMetricFamilies(strings.NewReader(metricsText(t, st.admin)))
		if err != nil {
			t.Fatalf("parse /metrics: %v", err)
		}
		return mfs["warmpath_slowpath_engine_requests_waiting"] != nil && mfs["warmpath_steer_entries"] != nil &&
			mfs["warmpath_slowpath_engine_prefix_cache_hits_tokens_total"] != nil
	})
	return mfs
}

func waitForCond(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for range 400 {
		if cond() {
			return
		}
		time.Sleep(25 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}

var (
	metricRef = regexp.MustCompile(`\bwarmpath_[a-zA-Z0-9_:]*`)
	byClause  = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
)

// queryNames returns the series names a PromQL expression reads (every
// warmpath_* identifier) and the label names its grouping clauses use.
func queryNames(expr string) (names, labels []string) {
	names = metricRef.FindAllString(expr, -1)
	for _, m := range byClause.FindAllStringSubmatch(expr, -1) {
		for l := range strings.SplitSeq(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
	}
	return names, labels
}

// dashboardQueries are the expr of every target of every panel.
func dashboardQueries(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

// ruleQueries are the expr of every rule of a Prometheus rules file
// (single-line `expr: ...` or a `expr: |` block), read as text.
func ruleQueries(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	var block *strings.Builder
	indent := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		trim := strings.TrimLeft(line, " ")
		if block != nil {
			if trim == "" || len(line)-len(trim) > indent {
				block.WriteString(trim + "\n")
				continue
			}
			out = append(out, block.String())
			block = nil
		}
		if v, ok := strings.CutPrefix(trim, "expr:"); ok {
			v = strings.TrimSpace(v)
			if v == "|" || v == ">" {
				block, indent = &strings.Builder{}, len(line)-len(trim)
				continue
			}
			out = append(out, v)
		}
	}
	if block != nil {
		out = append(out, block.String())
	}
	return out
}

// TestDeployQueriesUseExportedMetrics: every query of the Grafana
// dashboard and every alert rule reads only metric names the binary
// exports (scraped from a running serve and parsed with expfmt), groups by
// labels those metrics have, and reads at least one warmpath metric.
func TestDeployQueriesUseExportedMetrics(t *testing.T) {
	mfs := exported(t)
	series := map[string][]string{} // exposed series name -> its label names
	for name, mf := range mfs {
		var labels []string
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !slices.Contains(labels, lp.GetName()) {
					labels = append(labels, lp.GetName())
				}
			}
		}
		series[name] = labels
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			series[name+"_bucket"] = append(slices.Clone(labels), "le")
			series[name+"_sum"], series[name+"_count"] = labels, labels
		}
	}
	// Attached by Prometheus at scrape time, not by the binary.
	scrapeLabels := []string{"instance", "job"}
	check := func(t *testing.T, queries []string) {
		if len(queries) == 0 {
			t.Fatal("no queries found")
		}
		for _, q := range queries {
			names, labels := queryNames(q)
			if len(names) == 0 {
				t.Errorf("query reads no warmpath metric: %s", q)
			}
			var have []string
			for _, n := range names {
				l, ok := series[n]
				if !ok {
					t.Errorf("query reads %s, which the binary does not export: %s", n, q)
				}
				have = append(have, l...)
			}
			for _, l := range labels {
				if !slices.Contains(have, l) && !slices.Contains(scrapeLabels, l) {
					t.Errorf("query groups by %q, a label none of %v has: %s", l, names, q)
				}
			}
		}
	}
	t.Run("grafana", func(t *testing.T) { check(t, dashboardQueries(t, "../../deploy/grafana/warmpath.json")) })
	t.Run("alerts", func(t *testing.T) { check(t, ruleQueries(t, "../../deploy/prometheus/alerts.yaml")) })
	t.Run("no duplicate series", func(t *testing.T) {
		// One series per fact: the router's health, in-flight count and
		// predicted cached tokens are exported by slowpath only.
		for _, gone := range []string{"warmpath_affinity_replica_healthy", "warmpath_affinity_replica_in_flight", "warmpath_affinity_predicted_cached_tokens_total"} {
			if _, ok := series[gone]; ok {
				t.Errorf("%s is exported beside its slowpath twin", gone)
			}
		}
		for _, kept := range []string{"warmpath_slowpath_replica_healthy", "warmpath_slowpath_replica_in_flight", "warmpath_slowpath_cached_tokens_predicted_total",
			"warmpath_slowpath_output_tokens_total", "warmpath_slowpath_inter_token_latency_seconds", "warmpath_slowpath_engine_kv_cache_usage_ratio"} {
			if _, ok := series[kept]; !ok {
				t.Errorf("%s is not exported", kept)
			}
		}
	})
}

// TestQueryNames: the extractor finds metric names and grouping labels, and
// so the check above would fail on a misspelt metric.
func TestQueryNames(t *testing.T) {
	names, labels := queryNames(`sum by (replica, instance) (rate(warmpath_slowpath_requests_totl[5m])) / on(instance) warmpath_x`)
	if !slices.Equal(names, []string{"warmpath_slowpath_requests_totl", "warmpath_x"}) || !slices.Equal(labels, []string{"replica", "instance", "instance"}) {
		t.Fatalf("names %v labels %v", names, labels)
	}
	q := ruleQueries(t, "../../deploy/prometheus/alerts.yaml")
	if len(q) < 4 {
		t.Fatalf("%d alert expressions", len(q))
	}
	for _, e := range q {
		if strings.Contains(e, "for:") || strings.Contains(e, "labels:") {
			t.Fatalf("rule expression ran into the next key: %q", e)
		}
	}
}

// TestAlertRulesPromtool: promtool (Debian package prometheus) accepts the
// rules file (promtool is a test dependency, installed by .ci/run).
func TestAlertRulesPromtool(t *testing.T) {
	bin, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not installed (Debian: apt-get install prometheus; .ci/run installs it)")
	}
	out, err := exec.Command(bin, "check", "rules", "../../deploy/prometheus/alerts.yaml").CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}
