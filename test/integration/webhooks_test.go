package integration

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// The topology operator with its admission webhooks on, as in a cluster:
// the test bed runs it with ENABLE_WEBHOOKS=false (webhooks need TLS and a
// Service). Here it serves them on 127.0.0.1:9443 (controller-runtime's
// default port; the operator has no flag for it) with a certificate made
// for the test, and the API server calls them through its own
// MutatingWebhookConfiguration and ValidatingWebhookConfiguration, read
// from the operator's module (config/webhook/manifests.yaml) with each
// service reference replaced by that URL.

const webhookPort = 9443

// startTopologyOperatorWithWebhooks runs the topology operator against env
// with webhooks on and installs its webhook configurations; it returns
// once the API server refuses, through the webhook, a change of a Queue's
// arguments in namespace ns.
func startTopologyOperatorWithWebhooks(t *testing.T, env *testbed.Env, ns string) {
	t.Helper()
	ctx := t.Context()
	if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", webhookPort)); err != nil {
		t.Fatalf("the topology operator serves its webhooks on port %d, which is taken: %v", webhookPort, err)
	} else {
		_ = l.Close()
	}
	bin, err := testbed.BuildTopologyOperator(ctx)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	caPEM := writeServingCert(t, dir)

	probe, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	probeAddr := probe.Addr().String()
	_ = probe.Close()
	logPath := filepath.Join(dir, "messaging-topology-operator.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--kubeconfig="+env.Kubeconfig, "--health-probe-bind-address="+probeAddr,
		"--metrics-bind-address=0", "--leader-elect=false", "--webhook-cert-path="+dir)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+env.Kubeconfig, "OPERATOR_NAMESPACE="+ns, "ENABLE_WEBHOOKS=true")
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = logFile.Close(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("messaging-topology-operator (webhooks on) log:\n%s", tail(string(b), 64<<10))
		}
	})
	testbed.Eventually(t, time.Minute, "the topology operator ready", func(ctx context.Context) error {
		select {
		case <-done:
			b, _ := os.ReadFile(logPath)
			return fmt.Errorf("exited:\n%s", tail(string(b), 8<<10))
		default:
		}
		resp, err := http.Get("http://" + probeAddr + "/readyz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("readyz %s", resp.Status)
		}
		return nil
	})
	// The webhook server answers TLS with our certificate.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	testbed.Eventually(t, 30*time.Second, "the webhook server serves TLS", func(context.Context) error {
		conn, err := tls.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", webhookPort), &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"})
		if err != nil {
			return err
		}
		return conn.Close()
	})
	installWebhookConfigurations(t, env.Client, caPEM)
}

// writeServingCert writes a CA-signed certificate for 127.0.0.1 as
// tls.crt and tls.key into dir and returns the CA's PEM.
func writeServingCert(t *testing.T, dir string) []byte {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "hcp-test-webhook-ca"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, b []byte) {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: b}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("tls.crt", "CERTIFICATE", der)
	write("tls.key", "EC PRIVATE KEY", keyDER)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
}

// installWebhookConfigurations creates the topology operator's webhook
// configurations, pointed at the local webhook server.
func installWebhookConfigurations(t *testing.T, c client.Client, caPEM []byte) {
	t.Helper()
	dirs, err := testbed.TopologyCRDDirs(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// dirs[0] is the operator's config/crd/bases.
	raw, err := os.ReadFile(filepath.Join(dirs[0], "..", "..", "webhook", "manifests.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	url := func(path *string) *string {
		u := fmt.Sprintf("https://127.0.0.1:%d%s", webhookPort, *path)
		return &u
	}
	n := 0
	for _, doc := range strings.Split(string(raw), "\n---") {
		var meta struct {
			Kind string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatal(err)
		}
		switch meta.Kind {
		case "MutatingWebhookConfiguration":
			m := &admissionregistrationv1.MutatingWebhookConfiguration{}
			if err := yaml.Unmarshal([]byte(doc), m); err != nil {
				t.Fatal(err)
			}
			m.Name = "hcp-test-mto-mutating"
			for i := range m.Webhooks {
				w := &m.Webhooks[i]
				w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: url(w.ClientConfig.Service.Path), CABundle: caPEM}
				n++
			}
			if err := c.Create(t.Context(), m); err != nil {
				t.Fatal(err)
			}
		case "ValidatingWebhookConfiguration":
			v := &admissionregistrationv1.ValidatingWebhookConfiguration{}
			if err := yaml.Unmarshal([]byte(doc), v); err != nil {
				t.Fatal(err)
			}
			v.Name = "hcp-test-mto-validating"
			for i := range v.Webhooks {
				w := &v.Webhooks[i]
				w.ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: url(w.ClientConfig.Service.Path), CABundle: caPEM}
				n++
			}
			if err := c.Create(t.Context(), v); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n == 0 {
		t.Fatal("no webhooks found in the topology operator's config/webhook/manifests.yaml")
	}
	t.Logf("installed %d topology operator webhooks at https://127.0.0.1:%d", n, webhookPort)
}

func tail(s string, n int) string {
	if len(s) > n {
		return "…" + s[len(s)-n:]
	}
	return strings.TrimSpace(s)
}
