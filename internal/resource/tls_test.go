package resource

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
	"slices"
	"strings"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

// testPKI is a CA with a server and a client certificate, generated per test.
type testPKI struct {
	caPEM, clientCertPEM, clientKeyPEM, otherKeyPEM []byte
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	caKey := genKey(t)
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	clientKey := genKey(t)
	clientTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "callee.lab-cvd@/hcp"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	clientDER, err := x509.CreateCertificate(rand.Reader, clientTmpl, ca, &clientKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return testPKI{
		caPEM:         pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}),
		clientCertPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: clientDER}),
		clientKeyPEM:  keyPEM(t, clientKey),
		otherKeyPEM:   keyPEM(t, genKey(t)),
	}
}

func genKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func keyPEM(t *testing.T, k *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
}

func secretWith(name string, typ corev1.SecretType, data map[string][]byte) *corev1.Secret {
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "labs"}, Type: typ, Data: data}
}

func TestBrokerTLSSelectsAMQPS(t *testing.T) {
	tlsSpec := hcpv1alpha1.BrokerSpec{Vhost: "/hcp", TLS: &hcpv1alpha1.BrokerTLS{CASecret: "ca"}}
	ref := topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: "rmq"}}
	conn := func(kv ...string) *corev1.Secret {
		s := secretWith("rmq", corev1.SecretTypeOpaque, map[string][]byte{"username": []byte("u"), "password": []byte("p")})
		for i := 0; i < len(kv); i += 2 {
			s.Data[kv[i]] = []byte(kv[i+1])
		}
		return s
	}
	for _, tc := range []struct {
		name, wantAMQP, wantErr string
		secret                  *corev1.Secret
	}{
		{name: "http management: amqps on its host, 5671", secret: conn("uri", "http://rabbit.ns.svc:15672"), wantAMQP: "amqps://rabbit.ns.svc:5671"},
		{name: "https management", secret: conn("uri", "https://rabbit.example.com"), wantAMQP: "amqps://rabbit.example.com:5671"},
		{name: "amqps amqpURL with its port", secret: conn("uri", "http://mgmt:15672", "amqpURL", "amqps://broker:25671"), wantAMQP: "amqps://broker:25671"},
		{name: "amqps amqpURL, default port", secret: conn("uri", "http://mgmt:15672", "amqpURL", "amqps://broker"), wantAMQP: "amqps://broker:5671"},
		{name: "plaintext amqpURL conflicts", secret: conn("uri", "http://mgmt:15672", "amqpURL", "amqp://broker:5672"), wantErr: "spec.broker.tls is set, but the connection Secret labs/rmq gives a plaintext endpoint (amqpURL: amqp://broker:5672); set amqpURL to amqps://HOST[:PORT], or remove spec.broker.tls"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := BrokerFromConnectionSecret(ref, tlsSpec, tc.secret)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Fatalf("err = %v\nwant %s", err, tc.wantErr)
				}
				return
			}
			if err != nil || b.AMQPURL != tc.wantAMQP {
				t.Fatalf("AMQPURL %q, err %v; want %q", b.AMQPURL, err, tc.wantAMQP)
			}
			// TLS does not move the broker: same identity, same vhost key.
			plain, err := BrokerFromConnectionSecret(ref, hcpv1alpha1.BrokerSpec{Vhost: "/hcp"}, conn("uri", string(tc.secret.Data["uri"])))
			if err != nil || plain.Key() != b.Key() {
				t.Errorf("vhost key %s with TLS, %s without (%v)", b.Key(), plain.Key(), err)
			}
		})
	}
	cl := BrokerFromCluster(topologyv1beta1.RabbitmqClusterReference{Name: "rmq"}, hcpv1alpha1.BrokerSpec{Vhost: "/hcp", TLS: &hcpv1alpha1.BrokerTLS{}}, "team")
	if cl.AMQPURL != "amqps://rmq.team.svc:5671" {
		t.Errorf("RabbitmqCluster with tls: %s", cl.AMQPURL)
	}
	creds, err := CredentialsSecret(ForCallee(sampleCallee()), cl, "pw")
	if err != nil || !strings.HasPrefix(string(creds.Data["uri"]), "amqps://") || !strings.HasSuffix(string(creds.Data["uri"]), "@rmq.team.svc:5671/%2Fhcp") {
		t.Errorf("credentials uri %q (%v)", creds.Data["uri"], err)
	}
}

func TestCheckTLSSecrets(t *testing.T) {
	pki := newTestPKI(t)
	for _, tc := range []struct {
		name    string
		data    map[string][]byte
		wantErr string
	}{
		{"CA bundle", map[string][]byte{"ca.crt": pki.caPEM}, ""},
		{"CA bundle with a key block and two certificates", map[string][]byte{"ca.crt": slices.Concat(pki.otherKeyPEM, pki.caPEM, pki.clientCertPEM)}, ""},
		{"no ca.crt", map[string][]byte{"tls.crt": pki.caPEM}, "spec.broker.tls.caSecret: Secret s has no key ca.crt"},
		{"not PEM", map[string][]byte{"ca.crt": []byte("hello")}, "holds no PEM CERTIFICATE block"},
		{"garbage certificate", map[string][]byte{"ca.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("junk")})}, "certificate 1 does not parse"},
	} {
		t.Run("ca/"+tc.name, func(t *testing.T) {
			checkErr(t, CheckTLSCASecret(secretWith("s", corev1.SecretTypeOpaque, tc.data)), tc.wantErr)
		})
	}
	for _, tc := range []struct {
		name    string
		data    map[string][]byte
		wantErr string
	}{
		{"certificate and key", map[string][]byte{"tls.crt": pki.clientCertPEM, "tls.key": pki.clientKeyPEM}, ""},
		{"no key", map[string][]byte{"tls.crt": pki.clientCertPEM}, "spec.broker.tls.clientCertSecret: Secret s lacks key(s) tls.key; it must be a kubernetes.io/tls Secret"},
		{"nothing", nil, "lacks key(s) tls.crt, tls.key"},
		{"mismatched key", map[string][]byte{"tls.crt": pki.clientCertPEM, "tls.key": pki.otherKeyPEM}, "tls.crt and tls.key are not a usable certificate and key"},
	} {
		t.Run("client/"+tc.name, func(t *testing.T) {
			err := CheckTLSClientSecret(secretWith("s", corev1.SecretTypeTLS, tc.data))
			checkErr(t, err, tc.wantErr)
			if err != nil && strings.Contains(err.Error(), "PRIVATE KEY") {
				t.Errorf("the error quotes key material: %v", err)
			}
		})
	}
}

func checkErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("unexpected error: %v", err)
	case want != "" && (err == nil || !strings.Contains(err.Error(), want)):
		t.Errorf("error %v, want one containing %q", err, want)
	}
}

// TestSidecarTLSMounts plays the kubelet: it projects the TLS Secrets into
// a directory as the Deployment's volumes and mounts say, resolves the
// sidecar's env, parses it with the sidecar's own config parser, and loads
// the files with the transport's TLSConfig, as the sidecar does at start.
// So the env names, mount paths, Secret keys and file formats all agree.
func TestSidecarTLSMounts(t *testing.T) {
	pki := newTestPKI(t)
	c := sampleCallee()
	c.Spec.Broker.TLS = &hcpv1alpha1.BrokerTLS{CASecret: "rabbitmq-ca", ClientCertSecret: "lab-cvd-amqp"}
	ca := secretWith("rabbitmq-ca", corev1.SecretTypeOpaque, map[string][]byte{"ca.crt": pki.caPEM, "unrelated": []byte("not mounted")})
	client := secretWith("lab-cvd-amqp", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": pki.clientCertPEM, "tls.key": pki.clientKeyPEM, "ca.crt": pki.caPEM})
	s := ForCallee(c)
	b := sampleBroker(t, c.Spec.Broker)
	creds, err := CredentialsSecret(s, b, "pw")
	if err != nil {
		t.Fatal(err)
	}
	tok := WithTokenKeys(creds, TokenKeys{PrivatePEM: []byte("-----BEGIN PRIVATE KEY-----"), PublicPEM: []byte("pub"), VerifyPEM: []byte("pub")})
	dep := Deployment(HarnessParams{Subject: s, Harness: c.Spec.Harness, Sidecar: c.Spec.Sidecar, Vhost: b.Vhost, Prefetch: 4, TLS: c.Spec.Broker.TLS})
	ps := dep.Spec.Template.Spec
	secrets := map[string]*corev1.Secret{ca.Name: ca, client.Name: client, creds.Name: creds, tok.Name: tok}

	root := t.TempDir()
	var side *corev1.Container
	all := append(slices.Clone(ps.InitContainers), ps.Containers...)
	for i := range all {
		ctr := &all[i]
		if ctr.Name == SidecarContainerName {
			side = ctr
			continue
		}
		for _, m := range ctr.VolumeMounts {
			if slices.Contains(reservedVolumes, m.Name) {
				t.Errorf("container %s mounts the sidecar's volume %s", ctr.Name, m.Name)
			}
		}
	}
	if side == nil {
		t.Fatal("no sidecar")
	}
	for _, m := range side.VolumeMounts {
		i := slices.IndexFunc(ps.Volumes, func(v corev1.Volume) bool { return v.Name == m.Name })
		if i < 0 {
			t.Fatalf("mount %s: no volume", m.Name)
		}
		vol := ps.Volumes[i]
		if vol.Secret == nil {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("Secret volume %s mounted writable", m.Name)
		}
		sec := secrets[vol.Secret.SecretName]
		if sec == nil {
			t.Fatalf("volume %s names Secret %s", vol.Name, vol.Secret.SecretName)
		}
		dir := filepath.Join(root, m.MountPath)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if len(vol.Secret.Items) == 0 {
			t.Errorf("volume %s projects every key of %s; want only what the sidecar reads", vol.Name, sec.Name)
		}
		for _, it := range vol.Secret.Items {
			if err := os.WriteFile(filepath.Join(dir, it.Path), sec.Data[it.Key], 0o444); err != nil {
				t.Fatal(err)
			}
		}
	}
	env := resolveEnv(t, *side, map[string]map[string][]byte{creds.Name: creds.Data, tok.Name: tok.Data})
	cfg, err := config.FromEnv(func(k string) (string, bool) { v, ok := env[k]; return v, ok })
	if err != nil {
		t.Fatalf("the sidecar would refuse this env: %v", err)
	}
	if cfg.TLSCAFile != "/etc/hcp/tls/ca/ca.crt" || cfg.TLSCertFile != "/etc/hcp/tls/client/tls.crt" || cfg.TLSKeyFile != "/etc/hcp/tls/client/tls.key" {
		t.Errorf("TLS files %q %q %q", cfg.TLSCAFile, cfg.TLSCertFile, cfg.TLSKeyFile)
	}
	amqpURL, err := os.ReadFile(filepath.Join(root, cfg.AMQPURLFile))
	if err != nil {
		t.Fatalf("the AMQP URL file: %v", err)
	}
	if !strings.HasPrefix(string(amqpURL), "amqps://") || !strings.Contains(string(amqpURL), ":5671/") {
		t.Errorf("AMQP URL %s, want amqps on 5671", amqpURL)
	}
	tc, err := transport.TLSConfig(filepath.Join(root, cfg.TLSCAFile), filepath.Join(root, cfg.TLSCertFile), filepath.Join(root, cfg.TLSKeyFile))
	if err != nil {
		t.Fatalf("the sidecar could not load the mounted files: %v", err)
	}
	if tc.RootCAs == nil || len(tc.Certificates) != 1 || tc.MinVersion < tls.VersionTLS12 {
		t.Errorf("TLS config %+v", tc)
	}

	// Only the CA: no client files; neither: no TLS env and no volumes.
	caOnly := SidecarContainer(HarnessParams{Subject: s, TLS: &hcpv1alpha1.BrokerTLS{CASecret: "rabbitmq-ca"}})
	none := SidecarContainer(HarnessParams{Subject: s})
	for _, tc := range []struct {
		name string
		c    corev1.Container
		want []string
	}{{"CA only", caOnly, []string{config.EnvTLSCAFile}}, {"no TLS", none, nil}} {
		var got []string
		for _, e := range tc.c.Env {
			if strings.HasPrefix(e.Name, "HCP_TLS_") {
				got = append(got, e.Name)
			}
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%s: TLS env %v, want %v", tc.name, got, tc.want)
		}
	}
	if vols := injectedVolumes(ForCaller(sampleCaller()), nil); len(vols) != 3 {
		t.Errorf("without TLS: volumes %+v", vols)
	}
}

// TestAPICredentialsOnlyInTheSidecar: the pod mounts no ServiceAccount
// token by default; the sidecar gets one where client-go's in-cluster
// config looks, the harness containers get none.
func TestAPICredentialsOnlyInTheSidecar(t *testing.T) {
	c := sampleCallee()
	c.Spec.Harness.Template.Spec.AutomountServiceAccountToken = new(true) // the user's wish is overridden
	c.Spec.Harness.Template.Spec.Volumes = []corev1.Volume{{Name: APIAccessVolumeName}, {Name: TLSCAVolumeName}, {Name: "data"}}
	d := Deployment(HarnessParams{Subject: ForCallee(c), Harness: c.Spec.Harness})
	ps := d.Spec.Template.Spec
	if ps.AutomountServiceAccountToken == nil || *ps.AutomountServiceAccountToken {
		t.Fatalf("automountServiceAccountToken %v, want false", ps.AutomountServiceAccountToken)
	}
	names := make([]string, 0, len(ps.Volumes))
	for _, v := range ps.Volumes {
		names = append(names, v.Name)
	}
	if !slices.Equal(names, []string{"data", StateVolumeName, APIAccessVolumeName, CredentialsVolumeName, TokenVolumeName}) {
		t.Errorf("volumes %v (user volumes with reserved names are replaced; no TLS volumes without spec.broker.tls)", names)
	}
	api := ps.Volumes[2].Projected
	if api == nil || len(api.Sources) != 3 || api.Sources[0].ServiceAccountToken == nil || api.Sources[0].ServiceAccountToken.Path != "token" ||
		api.Sources[0].ServiceAccountToken.Audience != "" || api.Sources[1].ConfigMap == nil || api.Sources[1].ConfigMap.Name != "kube-root-ca.crt" ||
		api.Sources[1].ConfigMap.Items[0].Path != "ca.crt" || api.Sources[2].DownwardAPI == nil || api.Sources[2].DownwardAPI.Items[0].Path != "namespace" {
		t.Errorf("API access volume %+v: want token (API server audience), ca.crt and namespace, as the kubelet's kube-api-access", api)
	}
	for _, ctr := range ps.Containers {
		var at []string
		for _, m := range ctr.VolumeMounts {
			if m.MountPath == ServiceAccountMountPath {
				at = append(at, m.Name)
				if !m.ReadOnly {
					t.Errorf("%s: API access mounted writable", ctr.Name)
				}
			}
		}
		want := []string(nil)
		if ctr.Name == SidecarContainerName {
			want = []string{APIAccessVolumeName}
		}
		if !slices.Equal(at, want) {
			t.Errorf("container %s: mounts at %s: %v, want %v", ctr.Name, ServiceAccountMountPath, at, want)
		}
	}
}

func TestTLSSecretsHash(t *testing.T) {
	pki := newTestPKI(t)
	ca := secretWith("ca", corev1.SecretTypeOpaque, map[string][]byte{"ca.crt": pki.caPEM})
	client := secretWith("c", corev1.SecretTypeTLS, map[string][]byte{"tls.crt": pki.clientCertPEM, "tls.key": pki.clientKeyPEM})
	h := TLSSecretsHash(ca, client)
	if TLSSecretsHash(nil, nil) != "" || h == "" || TLSSecretsHash(ca, client) != h {
		t.Fatal("hash empty or unstable")
	}
	renewed := client.DeepCopy()
	renewed.Data["tls.key"] = pki.otherKeyPEM
	unrelated := ca.DeepCopy()
	unrelated.Data["other"] = []byte("x")
	unrelated.Labels = map[string]string{"a": "b"}
	if TLSSecretsHash(ca, renewed) == h || TLSSecretsHash(nil, client) == h {
		t.Error("a renewed key or a dropped CA does not change the hash")
	}
	if TLSSecretsHash(unrelated, client) != h {
		t.Error("keys the sidecar does not read, or metadata, change the hash")
	}
}
