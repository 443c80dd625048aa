package slowpath

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// certReloader holds the API listener's key pair and re-reads it from its
// files when their content changes. GetCertificate hands each new TLS
// connection the pair loaded last, so a renewed certificate (certbot,
// cert-manager) is served without a restart. Safe for concurrent use.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger
	cur               atomic.Pointer[tls.Certificate]
	notAfter          atomic.Int64 // unix seconds of the leaf's expiry

	mu              sync.Mutex // reload
	certPEM, keyPEM []byte     // the content cur came from, or the last refused
}

func newCertReloader(certFile, keyFile string, log *slog.Logger) (*certReloader, error) {
	c := &certReloader{certFile: certFile, keyFile: keyFile, log: log}
	if _, err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload reads both files and, when their content differs from what was
// last seen, loads the pair. A pair that does not load is an error and the
// running pair stays; it is not retried until the content changes again.
func (c *certReloader) reload() (changed bool, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	cb, err := os.ReadFile(c.certFile)
	if err != nil {
		return false, fieldErrorf("tls.cert_file", "%w", err)
	}
	kb, err := os.ReadFile(c.keyFile)
	if err != nil {
		return false, fieldErrorf("tls.key_file", "%w", err)
	}
	if c.cur.Load() != nil && bytes.Equal(cb, c.certPEM) && bytes.Equal(kb, c.keyPEM) {
		return false, nil
	}
	c.certPEM, c.keyPEM = cb, kb
	pair, err := tls.X509KeyPair(cb, kb)
	if err != nil {
		return false, fmt.Errorf("tls: key pair %s, %s: %w", c.certFile, c.keyFile, err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return false, fieldErrorf("tls.cert_file", "%s: %w", c.certFile, err)
	}
	pair.Leaf = leaf
	c.cur.Store(&pair)
	c.notAfter.Store(leaf.NotAfter.Unix())
	return true, nil
}

func (c *certReloader) getCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return c.cur.Load(), nil
}

// listenerTLS is the API listener's TLS configuration: TLS 1.2 at least,
// HTTP/1.1 only (fasthttp does not speak HTTP/2).
func (c *certReloader) listenerTLS() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: c.getCertificate,
		NextProtos:     []string{"http/1.1"},
	}
}

// ReloadTLS re-reads tls.cert_file and tls.key_file now (SIGHUP does, and
// the reload_interval poll). Without tls it does nothing.
func (s *Server) ReloadTLS() error {
	c := s.ops.cert
	if c == nil {
		return nil
	}
	changed, err := c.reload()
	switch {
	case err != nil:
		s.m.ops.certReloads.WithLabelValues("error").Inc()
		s.log.Error("tls key pair reload rejected; serving the running one", "err", err)
	case changed:
		s.m.ops.certReloads.WithLabelValues("ok").Inc()
		s.log.Info("tls key pair reloaded", "cert", c.certFile, "not_after", time.Unix(c.notAfter.Load(), 0).UTC())
	}
	return err
}

// watchCert polls the key pair's files every reload_interval.
func (s *Server) watchCert() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.ReloadInterval)
	defer t.Stop()
	for {
		select {
		case <-s.closing:
			return
		case <-t.C:
			_ = s.ReloadTLS()
		}
	}
}

// engineConn is how the router reaches one engine: TLS (nil = plain) and
// the Authorization value it sends (nil = the client's passes through).
type engineConn struct {
	tls  *tls.Config
	auth []byte
}

// engineConn resolves a replica's engine TLS and key (its own, else the
// global engine_tls / engine_auth), reading their files.
func (s *Server) engineConn(rc *ReplicaConfig) (engineConn, error) {
	var ec engineConn
	t := &s.cfg.EngineTLS
	if rc.TLS != nil {
		t = rc.TLS
	}
	if t.Enabled {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName,
			InsecureSkipVerify: t.InsecureSkipVerify, ClientSessionCache: tls.NewLRUClientSessionCache(8)} //nolint:gosec // documented as tests only
		if tc.ServerName == "" {
			if h, _, err := net.SplitHostPort(rc.Address); err == nil {
				tc.ServerName = h
			}
		}
		if t.CAFile != "" {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return ec, fmt.Errorf("engine tls ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return ec, fmt.Errorf("engine tls ca_file: %s holds no PEM certificate", t.CAFile)
			}
			tc.RootCAs = pool
		}
		ec.tls = tc
	}
	file, key := s.cfg.EngineAuth.APIKeyFile, s.cfg.EngineAuth.APIKey
	if rc.APIKeyFile != "" || rc.APIKey != "" {
		file, key = rc.APIKeyFile, rc.APIKey
	}
	if file != "" {
		b, err := readSecretFile(file)
		if err != nil {
			return ec, fmt.Errorf("api_key_file: %w", err)
		}
		key = string(b)
	}
	if key != "" {
		ec.auth = []byte("Bearer " + key)
	}
	return ec, nil
}

// readSecretFile reads a key file that must not be readable by others,
// trimmed of surrounding white space.
func readSecretFile(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if fi.Mode().Perm()&0o004 != 0 {
		return nil, fmt.Errorf("%s is readable by others (mode %v): fix: chmod o-r %s", path, fi.Mode().Perm(), path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("%s is empty", path)
	}
	return b, nil
}

// sameEngineConn reports whether two replica configs reach the engine the
// same way (a change re-adds the replica with fresh connections).
func sameEngineConn(a, b *ReplicaConfig) bool {
	if a.APIKey != b.APIKey || a.APIKeyFile != b.APIKeyFile || (a.TLS == nil) != (b.TLS == nil) {
		return false
	}
	return a.TLS == nil || *a.TLS == *b.TLS
}

// tlsDial wraps dial with a TLS client handshake bounded by timeout;
// cfg nil returns dial itself.
func tlsDial(cfg *tls.Config, dial fasthttp.DialFunc, timeout time.Duration) fasthttp.DialFunc {
	if cfg == nil {
		return dial
	}
	return func(addr string) (net.Conn, error) {
		c, err := dial(addr)
		if err != nil {
			return nil, err
		}
		tc := tls.Client(c, cfg)
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err = tc.HandshakeContext(ctx)
		cancel()
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("tls handshake with %s: %w", addr, err)
		}
		return tc, nil
	}
}

var hdrAuthorization = []byte(fasthttp.HeaderAuthorization)

// setEngineAuth sets the Authorization an attempt to r sends: r's engine
// key, or the client's own header when r has none (a retry may follow an
// attempt to a keyed replica).
func (s *Server) setEngineAuth(ctx *fasthttp.RequestCtx, h *fasthttp.RequestHeader, r *replica) {
	if !s.ops.anyAuth.Load() {
		return
	}
	if r.auth != nil {
		h.SetBytesKV(hdrAuthorization, r.auth)
		return
	}
	if v := ctx.Request.Header.PeekBytes(hdrAuthorization); v != nil {
		h.SetBytesKV(hdrAuthorization, v)
	} else {
		h.DelBytes(hdrAuthorization)
	}
}
