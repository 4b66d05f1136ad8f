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
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/transport"
)

func TestBackoff(t *testing.T) {
	mid := func() float64 { return 0.5 } // no jitter effect
	for _, tc := range []struct {
		n    int
		want time.Duration
	}{{0, time.Second}, {1, time.Second}, {2, 2 * time.Second}, {3, 4 * time.Second}, {6, 32 * time.Second}, {7, 60 * time.Second}, {100, 60 * time.Second}} {
		if got := transport.Backoff(tc.n, time.Second, time.Minute, 0.2, mid); got != tc.want {
			t.Errorf("Backoff(%d) = %v, want %v", tc.n, got, tc.want)
		}
	}
	if got := transport.Backoff(3, time.Second, time.Minute, 0.2, func() float64 { return 0 }); got != 3200*time.Millisecond {
		t.Errorf("lowest jitter: %v, want 3.2s", got)
	}
	if got := transport.Backoff(7, time.Second, time.Minute, 0.2, func() float64 { return 0.999999 }); got < 71*time.Second || got > 72*time.Second {
		t.Errorf("highest jitter at the cap: %v, want ≈72s", got)
	}
}

func TestDialRejectsBadOptions(t *testing.T) {
	ctx := context.Background()
	if _, err := transport.Dial(ctx, transport.Options{URL: "http://example.com"}); err == nil {
		t.Error("Dial accepted an http URL")
	}
	_, err := transport.Dial(ctx, transport.Options{URL: "amqp://guest:guest@127.0.0.1:5672/", TLS: &tls.Config{}})
	if err == nil || !strings.Contains(err.Error(), "amqps://") {
		t.Errorf("Dial with TLS on amqp://: %v, want an error pointing to amqps://", err)
	}
}

// A broker that refuses the credentials is retried; WaitReady says why.
func TestWaitReadyNamesLastError(t *testing.T) {
	e := newEnv(t)
	url := strings.Replace(e.url, "guest:guest@", "guest:wrong@", 1)
	c, err := transport.Dial(context.Background(), transport.Options{URL: url, Logger: testLogger(t), BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		start := time.Now()
		if err := c.Close(context.Background()); err != nil {
			t.Errorf("Close: %v", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("Close took %v with a dial in progress", d)
		}
	}()
	// RabbitMQ answers a failed login after a few seconds.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = c.WaitReady(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "403") {
		t.Errorf("WaitReady with wrong credentials: %v, want a deadline error naming the 403", err)
	}
	if c.Ready() {
		t.Error("Ready() with wrong credentials")
	}
}

func TestCheckTopology(t *testing.T) {
	e := newEnv(t)
	e.declare("hcp.events", amqp.ExchangeTopic, "hcp.evt.alpha", "alpha.#", nil)
	c := e.dial("topology", nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	err := c.CheckTopology(ctx, map[string]string{"hcp.commands": "direct", "hcp.events": "topic"}, []string{"hcp.cmd.lab-cvd", "hcp.evt.alpha"})
	var te *transport.TopologyError
	if !errors.As(err, &te) || len(te.Problems) != 2 {
		t.Fatalf("CheckTopology with two missing objects: %v", err)
	}
	for _, want := range []string{
		"exchange hcp.commands (direct) not found in vhost " + e.vhost + ": is the Callee's and Caller's topology Ready? kubectl get exchanges.rabbitmq.com -A",
		`queue hcp.cmd.lab-cvd not found in vhost ` + e.vhost + `: is the topology of Callee "lab-cvd" Ready? kubectl get queues.rabbitmq.com -A`,
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q\nlacks %q", err, want)
		}
	}
	var ae *amqp.Error
	if !errors.As(err, &ae) || ae.Code != amqp.NotFound {
		t.Errorf("the broker's 404 is not reachable with errors.As: %v", ae)
	}
	// Failed passive declares closed only their own channels.
	if !c.Ready() {
		t.Fatal("CheckTopology took the connection down")
	}
	e.declare("hcp.commands", amqp.ExchangeDirect, "hcp.cmd.lab-cvd", "lab-cvd", nil)
	if err := c.CheckTopology(ctx, map[string]string{"hcp.commands": "direct", "hcp.events": "topic"}, []string{"hcp.cmd.lab-cvd", "hcp.evt.alpha"}); err != nil {
		t.Errorf("CheckTopology with everything in place: %v", err)
	}
}

func TestTLSConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, data []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, data, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	certPEM, keyPEM := selfSigned(t, "client")
	_, otherKeyPEM := selfSigned(t, "other")
	ca := write("ca.pem", certPEM)
	cert := write("cert.pem", certPEM)
	key := write("key.pem", keyPEM)
	otherKey := write("other-key.pem", otherKeyPEM)
	garbage := write("garbage.pem", []byte("not pem at all"))
	missing := filepath.Join(dir, "missing.pem")

	cfg, err := transport.TLSConfig(ca, cert, key)
	if err != nil {
		t.Fatalf("valid files: %v", err)
	}
	if cfg.RootCAs == nil || len(cfg.Certificates) != 1 || cfg.MinVersion != tls.VersionTLS12 {
		t.Errorf("valid files gave %+v", cfg)
	}
	if cfg, err := transport.TLSConfig("", "", ""); err != nil || cfg.RootCAs != nil || len(cfg.Certificates) != 0 {
		t.Errorf("no files: %+v, %v (want system roots, no client certificate)", cfg, err)
	}

	for _, tc := range []struct {
		name, ca, cert, key, want string
	}{
		{"missing CA", missing, "", "", "reading TLS CA file"},
		{"CA without PEM", garbage, "", "", "holds no PEM certificate"},
		{"cert without key", ca, cert, "", "must be set together"},
		{"key without cert", "", "", key, "must be set together"},
		{"missing cert", "", missing, key, "reading TLS client certificate file"},
		{"garbage key", "", cert, garbage, "TLS client key file"},
		{"mismatched key", "", cert, otherKey, "loading TLS client certificate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := transport.TLSConfig(tc.ca, tc.cert, tc.key)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func selfSigned(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// recordingClock records the delays the supervisor waits for and lets them
// pass at once.
type recordingClock struct {
	clock.RealClock
	mu     sync.Mutex
	delays []time.Duration
}

func (c *recordingClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	c.delays = append(c.delays, d)
	c.mu.Unlock()
	ch := make(chan time.Time, 1)
	ch <- time.Now()
	return ch
}

func (c *recordingClock) recorded() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.delays)
}

// Redials of an unreachable broker back off exponentially to the cap.
func TestRedialBackoffSequence(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close() // nothing listens there now: connection refused
	clk := &recordingClock{}
	c, err := transport.Dial(context.Background(), transport.Options{
		URL: "amqp://guest:guest@" + addr + "/", Logger: testLogger(t), Clock: clk, Rand: func() float64 { return 0.5 },
	})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "eight redials", func() bool { return len(clk.recorded()) >= 8 })
	if err := c.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 60, 60}
	for i, d := range clk.recorded()[:8] {
		if d != want[i]*time.Second {
			t.Errorf("delay %d = %v, want %v", i+1, d, want[i]*time.Second)
		}
	}
	if err := c.LastError(); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("LastError = %v, want connection refused", err)
	}
}

// A rotated password reaches the next dial through URLSource: the broker
// closes the connection, the old password no longer works, and the Conn
// logs in again with the new one. A source that switches user is ignored.
func TestRedialUsesTheRotatedURL(t *testing.T) {
	e := newEnv(t)
	user := "rotating-" + e.vhost
	e.broker.SetUser(t, e.vhost, user, "first")
	var cur atomic.Value
	cur.Store(e.broker.UserURL(e.vhost, user, "first"))
	c := e.dialURL(cur.Load().(string), "rotating", newMetrics(), func(o *transport.Options) {
		o.URLSource = func() string { return cur.Load().(string) }
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e.broker.SetUser(t, e.vhost, user, "second") // the rotation
	cur.Store(e.broker.UserURL(e.vhost, user, "second"))
	if _, err := e.broker.CloseConnections(ctx, e.vhost, "rotating"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "reconnected with the new password", func() bool {
		cs, _ := e.broker.Connections(ctx, e.vhost)
		for _, x := range cs {
			if x.ConnectionName() == "rotating" && x.User == user {
				return c.Ready()
			}
		}
		return false
	})
	// Another user in the source is refused: the Conn keeps dialing with
	// the second password, which still works.
	cur.Store(e.broker.UserURL(e.vhost, "someone-else", "x"))
	if _, err := e.broker.CloseConnections(ctx, e.vhost, "rotating"); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "reconnected as the same user", func() bool {
		cs, _ := e.broker.Connections(ctx, e.vhost)
		for _, x := range cs {
			if x.ConnectionName() == "rotating" {
				return x.User == user && c.Ready()
			}
		}
		return false
	})
}

// L1 "HCP implementations SHOULD configure heartbeats" (30–60 s): the
// default is proposed and agreed with the broker, and so is a configured one.
func TestHeartbeatNegotiated(t *testing.T) {
	e := newEnv(t)
	e.dial("hb-default", newMetrics())
	e.dial("hb-7s", newMetrics(), func(o *transport.Options) { o.Heartbeat = 7 * time.Second })
	want := map[string]int{"hb-default": int(transport.DefaultHeartbeat / time.Second), "hb-7s": 7}
	eventually(t, 20*time.Second, "the broker lists both connections with their heartbeat", func() bool {
		cs, err := e.broker.Connections(context.Background(), e.vhost)
		if err != nil {
			return false
		}
		got := map[string]int{}
		for _, c := range cs {
			got[c.ConnectionName()] = c.Timeout
		}
		for name, hb := range want {
			if got[name] != hb {
				t.Logf("heartbeats %v, want %v", got, want)
				return false
			}
		}
		return true
	})
	if transport.DefaultHeartbeat < 30*time.Second || transport.DefaultHeartbeat > 60*time.Second {
		t.Errorf("DefaultHeartbeat %s is outside the spec's 30–60 s", transport.DefaultHeartbeat)
	}
}
