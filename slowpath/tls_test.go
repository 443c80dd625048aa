package slowpath

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/valyala/fasthttp"
)

// testCA is a throw-away certificate authority for TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "warmpath test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	ca := &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pool: x509.NewCertPool()}
	ca.pool.AddCert(cert)
	return ca
}

// leaf issues a server certificate for name (and 127.0.0.1) with serial.
func (ca *testCA) leaf(t testing.TB, name string, serial int64) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", b, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

// tlsRouter starts a router serving TLS with a leaf of ca (serial 1).
func tlsRouter(t *testing.T, ca *testCA, mutate func(*Config)) (s *Server, url, certFile, keyFile string) {
	t.Helper()
	dir := t.TempDir()
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	c, k := ca.leaf(t, "router.test", 1)
	writeFile(t, certFile, c)
	writeFile(t, keyFile, k)
	e := startFakeEngine(t)
	cfg := testConfig(e.addr)
	cfg.TLS = TLSConfig{CertFile: certFile, KeyFile: keyFile}
	if mutate != nil {
		mutate(&cfg)
	}
	s, url = newTestServer(t, cfg)
	return s, strings.Replace(url, "http://", "https://", 1), certFile, keyFile
}

func tlsClient(ca *testCA, tc *tls.Config) *http.Client {
	if tc == nil {
		tc = &tls.Config{}
	}
	tc.RootCAs = ca.pool
	tc.ServerName = "router.test"
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
}

// TestTLSListener: the API is served over TLS to a verifying client
// (streamed and not), TLS 1.1 and plain HTTP are refused, and a swapped
// key pair is served to new connections without a restart; a broken pair
// keeps the running one.
func TestTLSListener(t *testing.T) {
	ca := newTestCA(t)
	s, url, certFile, keyFile := tlsRouter(t, ca, nil)
	c := tlsClient(ca, nil)
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"cached_tokens":7`) || resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Fatalf("https chat: %d %s (tls %+v)", resp.StatusCode, b, resp.TLS)
	}
	if resp.TLS.PeerCertificates[0].SerialNumber.Int64() != 1 {
		t.Fatalf("serial %v, want 1", resp.TLS.PeerCertificates[0].SerialNumber)
	}
	resp, err = c.Post(url+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.HasSuffix(string(b), "data: [DONE]\n\n") {
		t.Fatalf("https stream: %q", b)
	}

	old := tlsClient(ca, &tls.Config{MaxVersion: tls.VersionTLS11})
	if _, err := old.Get(url + "/livez"); err == nil {
		t.Fatal("a TLS 1.1 client was served")
	}
	plain := &http.Client{Timeout: 5 * time.Second}
	if r, err := plain.Get(strings.Replace(url, "https://", "http://", 1) + "/livez"); err == nil && r.StatusCode == 200 {
		r.Body.Close()
		t.Fatal("plain HTTP was served on the TLS listener")
	}

	serial := func() int64 {
		r, err := c.Get(url + "/livez")
		if err != nil {
			t.Fatal(err)
		}
		r.Body.Close()
		return r.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	nc, nk := ca.leaf(t, "router.test", 2)
	writeFile(t, keyFile, nk)
	writeFile(t, certFile, nc)
	waitFor(t, "the swapped certificate", func() bool { return serial() == 2 })

	errs := metricValue(t, s, "warmpath_slowpath_tls_cert_reloads_total", "result", "error")
	writeFile(t, certFile, []byte("not a certificate"))
	waitFor(t, "the refused reload counted", func() bool {
		return metricValue(t, s, "warmpath_slowpath_tls_cert_reloads_total", "result", "error") > errs
	})
	if got := serial(); got != 2 {
		t.Fatalf("after a broken pair: serial %d, want the running 2", got)
	}
	if !strings.Contains(scrapeMetrics(t, s), "warmpath_slowpath_tls_cert_not_after_timestamp_seconds") {
		t.Fatal("no certificate expiry gauge")
	}
}

// tlsEngine is a fake engine behind a TLS listener that refuses every
// request (completions, health, metrics) without `Authorization: Bearer
// key`, and records the Authorization values it saw on completions.
type tlsEngine struct {
	addr    string
	auths   chan string
	refused atomic.Int64
}

func startTLSEngine(t *testing.T, ca *testCA, key string) *tlsEngine {
	t.Helper()
	cp, kp := ca.leaf(t, "engine.test", 10)
	pair, err := tls.X509KeyPair(cp, kp)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &tlsEngine{addr: ln.Addr().String(), auths: make(chan string, 64)}
	srv := &fasthttp.Server{Logger: quietLogger{}, Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Request.Header.Peek("Authorization")) != "Bearer "+key {
			e.refused.Add(1)
			ctx.SetStatusCode(401)
			ctx.SetBodyString(`{"error":{"message":"Unauthorized","type":"x","param":null,"code":null}}`)
			return
		}
		switch string(ctx.Path()) {
		case "/health":
			return
		case "/metrics":
			ctx.SetBodyString("vllm:num_requests_waiting{model_name=\"m\"} 4\nvllm:num_requests_running{model_name=\"m\"} 2\nvllm:kv_cache_usage_perc{model_name=\"m\"} 0.5\nvllm:prefix_cache_queries_total{model_name=\"m\"} 900\nvllm:prefix_cache_hits_total{model_name=\"m\"} 300\n")
			return
		}
		select {
		case e.auths <- string(ctx.Request.Header.Peek("Authorization")):
		default:
		}
		if strings.Contains(string(ctx.PostBody()), `"stream":true`) {
			ctx.SetContentType("text/event-stream")
			ctx.SetBodyStreamWriter(func(w *bufio.Writer) {
				fmt.Fprint(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n")
				fmt.Fprint(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\ndata: [DONE]\n\n")
			})
			return
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[{"index":0,"message":{"role":"assistant","content":"over tls"}}],"usage":{"prompt_tokens":5,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}`)
	}}
	go srv.Serve(tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12})) //nolint:errcheck
	t.Cleanup(func() { _ = srv.Shutdown(); ln.Close() })
	return e
}

// TestEngineTLSAndKey: with engine_tls and engine_auth the router reaches
// an HTTPS engine that requires a bearer key: health checks pass (ready),
// scrapes pass (its signals and prefix-cache counters are exported),
// proxied requests (streamed and not) succeed and carry the engine's key,
// never the client's. A wrong CA keeps the engine out (not ready), and a
// per-replica key overrides the global one.
func TestEngineTLSAndKey(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	caFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "engine.key")
	writeFile(t, caFile, ca.pem)
	writeFile(t, keyFile, []byte("sk-engine-secret\n"))
	e := startTLSEngine(t, ca, "sk-engine-secret")
	cfg := testConfig(e.addr)
	cfg.EngineTLS = EngineTLSConfig{Enabled: true, CAFile: caFile, ServerName: "engine.test"}
	cfg.EngineAuth = EngineAuthConfig{APIKeyFile: keyFile}
	s, url := newTestServer(t, cfg)
	waitFor(t, "ready over TLS", func() bool { ok, _ := s.Ready(); return ok })
	waitFor(t, "engine signals scraped over TLS", func() bool {
		m := scrapeMetrics(t, s)
		return strings.Contains(m, `warmpath_slowpath_engine_requests_waiting{replica="`+e.addr+`"} 4`) &&
			strings.Contains(m, `warmpath_slowpath_engine_prefix_cache_hits_tokens_total{replica="`+e.addr+`"} 300`)
	})
	for _, body := range []string{chatBody, `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`} {
		req, _ := http.NewRequest(http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer sk-client-token")
		resp, err := testClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !(strings.Contains(string(b), "over tls") || strings.Contains(string(b), "[DONE]")) {
			t.Fatalf("via TLS engine: %d %s", resp.StatusCode, b)
		}
		if got := <-e.auths; got != "Bearer sk-engine-secret" {
			t.Fatalf("engine saw Authorization %q", got)
		}
	}
	if n := e.refused.Load(); n != 0 {
		t.Fatalf("engine refused %d requests without its key", n)
	}

	t.Run("wrong CA", func(t *testing.T) {
		other := newTestCA(t)
		bad := filepath.Join(t.TempDir(), "other.pem")
		writeFile(t, bad, other.pem)
		cfg := testConfig(e.addr)
		cfg.EngineTLS = EngineTLSConfig{Enabled: true, CAFile: bad, ServerName: "engine.test"}
		cfg.EngineAuth = EngineAuthConfig{APIKeyFile: keyFile}
		s, url := newTestServer(t, cfg)
		serving(t, url)
		waitFor(t, "not ready", func() bool { ok, why := s.Ready(); return !ok && why == NotReadyNoReplica })
		if st := s.Replicas()[0]; !strings.Contains(st.LastProbeError, "certificate") {
			t.Fatalf("probe error %q, want a certificate error", st.LastProbeError)
		}
	})
	t.Run("per-replica key", func(t *testing.T) {
		cfg := testConfig(e.addr)
		cfg.EngineTLS = EngineTLSConfig{Enabled: true, CAFile: caFile, ServerName: "engine.test"}
		cfg.EngineAuth = EngineAuthConfig{APIKey: "wrong"}
		cfg.Replicas[0].APIKey = "sk-engine-secret"
		s, url := newTestServer(t, cfg)
		serving(t, url)
		waitFor(t, "ready with the replica's key", func() bool { ok, _ := s.Ready(); return ok })
	})
	t.Run("key file readable by others", func(t *testing.T) {
		if err := os.Chmod(keyFile, 0o644); err != nil {
			t.Fatal(err)
		}
		defer os.Chmod(keyFile, 0o600)
		_, err := New(cfg, testLogger(t))
		if err == nil || !strings.Contains(err.Error(), "readable by others") {
			t.Fatalf("New with a world-readable key file: %v", err)
		}
	})
}

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// TestTLSOpenAIClient: the official Go client talks to the router over
// https with a private CA, streamed and not.
func TestTLSOpenAIClient(t *testing.T) {
	ca := newTestCA(t)
	_, url, _, _ := tlsRouter(t, ca, nil)
	hc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.pool, ServerName: "router.test"}}}
	c := openai.NewClient(option.WithBaseURL(url+"/v1/"), option.WithAPIKey("sk-test"), option.WithHTTPClient(hc), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := openai.ChatCompletionNewParams{Model: "m", Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("hello")}}
	resp, err := c.Chat.Completions.New(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Choices) != 1 || resp.Usage.PromptTokensDetails.CachedTokens != 7 {
		t.Fatalf("response %+v", resp)
	}
	st := c.Chat.Completions.NewStreaming(ctx, p)
	var text strings.Builder
	for st.Next() {
		if ch := st.Current(); len(ch.Choices) > 0 {
			text.WriteString(ch.Choices[0].Delta.Content)
		}
	}
	if err := st.Err(); err != nil || text.String() != "t0 t1 t2 " {
		t.Fatalf("stream over https: %q, %v", text.String(), err)
	}
}

// serving waits until the router at url answers (its Serve is accepting):
// a Shutdown that ran before Serve took its listener would leave Serve
// waiting in Accept.
func serving(t *testing.T, url string) {
	t.Helper()
	if st, _ := getStatus(t, testClient, url+"/livez"); st != 200 {
		t.Fatalf("livez %d", st)
	}
}

// TestTLSClientGone: a TLS client that leaves while the engine works on its
// non-streamed request (Close sends close_notify, then FIN) is noticed as
// over plain TCP: the upstream request is cancelled and counted in
// client_gone_total, without waiting for the engine's answer.
func TestTLSClientGone(t *testing.T) {
	release := make(chan struct{})
	var got atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	eng := &fasthttp.Server{Logger: quietLogger{}, Handler: func(ctx *fasthttp.RequestCtx) {
		if string(ctx.Path()) != "/v1/chat/completions" {
			return
		}
		got.Add(1)
		select {
		case <-release:
		case <-time.After(30 * time.Second):
		}
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"choices":[]}`)
	}}
	go eng.Serve(ln) //nolint:errcheck
	t.Cleanup(func() { close(release); _ = eng.Shutdown(); ln.Close() })

	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	c, k := ca.leaf(t, "router.test", 1)
	writeFile(t, certFile, c)
	writeFile(t, keyFile, k)
	cfg := testConfig(ln.Addr().String())
	cfg.Scrape.Interval = 0
	cfg.TLS = TLSConfig{CertFile: certFile, KeyFile: keyFile}
	s, url := newTestServer(t, cfg)
	conn, err := tls.Dial("tcp", strings.TrimPrefix(url, "http://"), &tls.Config{RootCAs: ca.pool, ServerName: "router.test"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the request at the engine", func() bool { return got.Load() == 1 })
	conn.Close()
	waitFor(t, "the client counted gone", func() bool {
		return metricValue(t, s, "warmpath_slowpath_client_gone_total", "", "") == 1
	})
	waitFor(t, "router in-flight back to 0", func() bool { return s.inflight.Load() == 0 })
}
