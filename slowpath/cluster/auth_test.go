package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"

	"github.com/warmpath/warmpath/affinity"
)

// TestNkeyAuth: a server that requires an NKEY admits the node given the
// seed file and not one without it.
func TestNkeyAuth(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	seedFile := filepath.Join(t.TempDir(), "edge.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	ns := startNATSWith(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	anon := startNode(t, testCfg(natsURL(ns), "anon"), newRouter(t, affinity.Config{}))
	cfg := testCfg(natsURL(ns), "edge")
	cfg.NkeySeedFile = seedFile
	n := startNode(t, cfg, newRouter(t, affinity.Config{}))
	waitFor(t, "nkey node connected", n.Connected)
	// Watch over several of anon's attempts (reconnect_wait 20ms). The
	// server lists a connection while its CONNECT is pending, so count the
	// authenticated ones rather than all clients.
	for range 10 {
		time.Sleep(10 * time.Millisecond)
		if anon.Connected() {
			t.Fatal("node without the nkey connected")
		}
	}
	cz, err := ns.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	var authed []string
	for _, c := range cz.Conns {
		if c.AuthorizedUser != "" {
			authed = append(authed, c.AuthorizedUser)
		}
	}
	if len(authed) != 1 || authed[0] != pub {
		t.Fatalf("authenticated connections %q, want only %s", authed, pub)
	}
}

// TestTLSCAFile: a node verifies a TLS NATS server signed by a private CA
// given in tls_ca_file, and refuses it without.
func TestTLSCAFile(t *testing.T) {
	caFile, srvCert := testPKI(t)
	ns := startNATSWith(t, &server.Options{TLS: true, TLSTimeout: 2,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{srvCert}, MinVersion: tls.VersionTLS12}})
	url := "tls://" + ns.Addr().(*net.TCPAddr).String()
	plain := startNode(t, testCfg(url, "plain"), newRouter(t, affinity.Config{}))
	cfg := testCfg(url, "edge")
	cfg.TLSCAFile = caFile
	n := startNode(t, cfg, newRouter(t, affinity.Config{}))
	waitFor(t, "tls node connected", n.Connected)
	time.Sleep(100 * time.Millisecond)
	if plain.Connected() {
		t.Fatal("node without the CA trusted the server")
	}
}

// testPKI writes a CA certificate file and returns it with a server
// certificate for 127.0.0.1 signed by it.
func testPKI(t *testing.T) (caFile string, srv tls.Certificate) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "nats"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return caFile, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}
