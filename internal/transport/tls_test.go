package transport_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

// testCA issues certificates for the TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T, cn string) *testCA {
	t.Helper()
	key := ecKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue returns a leaf certificate and key (PEM) for 127.0.0.1.
func (ca *testCA) issue(t *testing.T, cn string, usage x509.ExtKeyUsage) (certPEM, keyPEM []byte) {
	t.Helper()
	key := ecKey(t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

func ecKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// tlsTerminator plays a broker's TLS listener (the test bed's RabbitMQ has
// none): it terminates TLS, requiring a client certificate signed by
// clientCA, and relays the bytes to the broker's plaintext AMQP port.
type tlsTerminator struct {
	addr string
	mu   sync.Mutex
	// clients are the subjects of the verified client certificates.
	clients []string
}

func startTLSTerminator(t *testing.T, server tls.Certificate, clientCA *testCA, backend string) *tlsTerminator {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(clientCA.cert)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{server},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	})
	if err != nil {
		t.Fatal(err)
	}
	tt := &tlsTerminator{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { tt.relay(c.(*tls.Conn), backend) })
		}
	})
	return tt
}

func (tt *tlsTerminator) relay(c *tls.Conn, backend string) {
	defer func() { _ = c.Close() }()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.HandshakeContext(ctx); err != nil {
		return
	}
	if peers := c.ConnectionState().PeerCertificates; len(peers) > 0 {
		tt.mu.Lock()
		tt.clients = append(tt.clients, peers[0].Subject.CommonName)
		tt.mu.Unlock()
	}
	b, err := net.Dial("tcp", backend)
	if err != nil {
		return
	}
	defer func() { _ = b.Close() }()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, c); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, b); done <- struct{}{} }()
	<-done
}

func (tt *tlsTerminator) verifiedClients() []string {
	tt.mu.Lock()
	defer tt.mu.Unlock()
	return append([]string(nil), tt.clients...)
}

// TestDialOverTLS: a Conn built as the sidecar builds it (TLSConfig from
// PEM files, an amqps:// URL) reaches the real broker through a TLS
// listener that verifies both sides, and fails with a clear error when the
// broker's certificate does not chain to the configured CA or no client
// certificate is given.
func TestDialOverTLS(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.tls", "tls", nil)
	serverCA, clientCA := newTestCA(t, "broker CA"), newTestCA(t, "client CA")
	srvCert, srvKey := serverCA.issue(t, "broker", x509.ExtKeyUsageServerAuth)
	server, err := tls.X509KeyPair(srvCert, srvKey)
	if err != nil {
		t.Fatal(err)
	}
	term := startTLSTerminator(t, server, clientCA, e.broker.AMQPAddr)

	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cliCert, cliKey := clientCA.issue(t, "callee.tls@/hcp", x509.ExtKeyUsageClientAuth)
	caFile, certFile, keyFile := write("ca.crt", serverCA.pem), write("tls.crt", cliCert), write("tls.key", cliKey)
	otherCAFile := write("other-ca.crt", newTestCA(t, "someone else").pem)

	u, err := url.Parse(e.url)
	if err != nil {
		t.Fatal(err)
	}
	u.Scheme, u.Host = "amqps", term.addr
	amqps := u.String()

	dial := func(t *testing.T, cfg *tls.Config) *transport.Conn {
		t.Helper()
		c, err := transport.Dial(t.Context(), transport.Options{URL: amqps, TLS: cfg, BackoffMin: 50 * time.Millisecond, BackoffMax: 200 * time.Millisecond, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = c.Close(ctx)
		})
		return c
	}

	t.Run("verified both ways", func(t *testing.T) {
		cfg, err := transport.TLSConfig(caFile, certFile, keyFile)
		if err != nil {
			t.Fatal(err)
		}
		c := dial(t, cfg)
		ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
		defer cancel()
		if err := c.WaitReady(ctx); err != nil {
			t.Fatalf("no connection over TLS: %v", err)
		}
		// AMQP works through it: channels, passive declares.
		if err := c.CheckTopology(ctx, map[string]string{"hcp.commands": "direct"}, []string{"hcp.cmd.tls"}); err != nil {
			t.Fatalf("CheckTopology over TLS: %v", err)
		}
		if got := term.verifiedClients(); len(got) == 0 || got[0] != "callee.tls@/hcp" {
			t.Errorf("the listener verified client certificates %v", got)
		}
	})

	for _, tc := range []struct {
		name, ca, cert, key, want string
	}{
		{"broker certificate from another CA", otherCAFile, certFile, keyFile, "certificate signed by unknown authority"},
		{"no client certificate", caFile, "", "", "tls: certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := transport.TLSConfig(tc.ca, tc.cert, tc.key)
			if err != nil {
				t.Fatal(err)
			}
			c := dial(t, cfg)
			ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
			defer cancel()
			err = c.WaitReady(ctx)
			if err == nil || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("WaitReady: %v; want a timeout naming %q", err, tc.want)
			}
			if c.Ready() {
				t.Fatal("connected anyway")
			}
			t.Logf("WaitReady: %v", err)
		})
	}
}
