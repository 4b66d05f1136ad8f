package controller

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"slices"
	"strings"
	"testing"
	"time"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// selfSignedPEM is a throw-away certificate and its key.
func selfSignedPEM(t *testing.T, cn string) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
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

func labelled() map[string]string { return map[string]string{resource.LabelTopologyOperator: "true"} }

// TestBrokerTLS: spec.broker.tls switches the sidecar to amqps, its
// Secrets are checked with a condition that says what to fix, mounted into
// the sidecar when they are usable, watched (a renewal rolls the pods),
// and the field may change although the rest of spec.broker may not.
func TestBrokerTLS(t *testing.T) {
	ns := newNamespace(t, "tls-")
	dumpOnFailure(t, ns)
	callee := newCallee(ns, "secure", func(c *hcpv1alpha1.Callee) {
		c.Spec.Broker.TLS = &hcpv1alpha1.BrokerTLS{CASecret: "rmq-ca", ClientCertSecret: "secure-amqp"}
	})
	create(t, callee)
	base, credsName, _ := childNames("callee", "secure")
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}

	// Missing CA Secret: the topology goes ahead, the harness waits, and
	// Ready names the fix rather than the pending topology.
	eventually(t, "missing CA Secret", all(
		calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTLSSecretNotFound,
			fmt.Sprintf("spec.broker.tls.caSecret: Secret %s/rmq-ca not found: create it (cert-manager can) with the label rabbitmq.com/topology-operator=true", ns)),
		calleeCondition(callee, hcpv1alpha1.ConditionReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTLSSecretNotFound, "HarnessReady: spec.broker.tls.caSecret"),
		exists(&topologyv1beta1.Queue{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: base}}, callee),
	))
	if err := gone(dep)(t.Context()); err != nil {
		t.Fatalf("a Deployment was created without its TLS Secrets: %v", err)
	}
	eventually(t, "Warning Event", func(ctx context.Context) error {
		if typ := eventReasons(ctx, ns, "Callee", "secure")[hcpv1alpha1.ReasonTLSSecretNotFound]; typ != corev1.EventTypeWarning {
			return fmt.Errorf("no Warning %s event", hcpv1alpha1.ReasonTLSSecretNotFound)
		}
		return nil
	})
	// The credentials Secret's uri is amqps on 5671 already.
	eventually(t, "amqps uri", func(ctx context.Context) error {
		s := &corev1.Secret{}
		if err := k8sClient.Get(ctx, key(ns, credsName), s); err != nil {
			return err
		}
		if u := string(s.Data["uri"]); !strings.HasPrefix(u, "amqps://") || !strings.HasSuffix(u, "@rabbitmq.hcp-system.svc:5671/%2F"+ns) {
			return fmt.Errorf("uri %s", redact(s.Data["uri"]))
		}
		return nil
	})

	// An unlabelled CA Secret: readable, not watchable; the fix is named.
	caPEM, _ := selfSignedPEM(t, "rmq CA")
	ca := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "rmq-ca"}, Data: map[string][]byte{"ca.crt": caPEM}}
	create(t, ca)
	// Such a Secret raises no event the manager sees (the backstop is a
	// requeue after a minute); any change of the Callee re-checks at once.
	update(t, callee, func(c *hcpv1alpha1.Callee) { c.Annotations = map[string]string{"poke": "1"} })
	eventually(t, "unlabelled CA Secret", calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTLSSecretUnlabeled,
		fmt.Sprintf("fix: kubectl label secret -n %s rmq-ca rabbitmq.com/topology-operator=true", ns)))

	// Labelled (noticed at once); now the client Secret is missing.
	update(t, ca, func(s *corev1.Secret) { s.Labels = labelled() })
	eventually(t, "missing client Secret", calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTLSSecretNotFound,
		fmt.Sprintf("spec.broker.tls.clientCertSecret: Secret %s/secure-amqp not found", ns)))

	// A certificate with the wrong key.
	certPEM, keyPEM := selfSignedPEM(t, "callee.secure")
	_, otherKey := selfSignedPEM(t, "other")
	client := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "secure-amqp", Labels: labelled()},
		Type:       corev1.SecretTypeTLS,
		Data:       map[string][]byte{"tls.crt": certPEM, "tls.key": otherKey},
	}
	create(t, client)
	eventually(t, "mismatched client key", calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonTLSSecretInvalid,
		"spec.broker.tls.clientCertSecret: Secret secure-amqp: tls.crt and tls.key are not a usable certificate and key"))

	// Fixed: the Deployment mounts both Secrets into the sidecar only.
	update(t, client, func(s *corev1.Secret) { s.Data["tls.key"] = keyPEM })
	eventually(t, "harness deployed with TLS", all(
		calleeCondition(callee, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionFalse, hcpv1alpha1.ReasonDeploymentProgressing, ""),
		exists(dep, callee),
	))
	side, vols := sidecarOf(t, dep)
	env := map[string]string{}
	for _, e := range side.Env {
		env[e.Name] = e.Value
	}
	if env[config.EnvTLSCAFile] != "/etc/hcp/tls/ca/ca.crt" || env[config.EnvTLSCertFile] != "/etc/hcp/tls/client/tls.crt" || env[config.EnvTLSKeyFile] != "/etc/hcp/tls/client/tls.key" {
		t.Errorf("sidecar TLS env %v", env)
	}
	if vols[resource.TLSCAVolumeName] != "rmq-ca" || vols[resource.TLSClientVolumeName] != "secure-amqp" {
		t.Errorf("Secret volumes %v", vols)
	}
	hash := dep.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]

	// A renewed CA rolls the pods; so does a renewed client certificate.
	newCA, _ := selfSignedPEM(t, "rmq CA 2")
	update(t, ca, func(s *corev1.Secret) { s.Data["ca.crt"] = newCA })
	hash = waitHashChange(t, dep, hash, "CA renewal")
	newCert, newKey := selfSignedPEM(t, "callee.secure 2")
	update(t, client, func(s *corev1.Secret) { s.Data["tls.crt"], s.Data["tls.key"] = newCert, newKey })
	hash = waitHashChange(t, dep, hash, "client certificate renewal")

	// spec.broker.tls may change (the rest of spec.broker may not): drop the
	// client certificate.
	update(t, callee, func(c *hcpv1alpha1.Callee) { c.Spec.Broker.TLS.ClientCertSecret = "" })
	waitHashChange(t, dep, hash, "dropping the client certificate")
	side, vols = sidecarOf(t, dep)
	if _, ok := vols[resource.TLSClientVolumeName]; ok || slices.ContainsFunc(side.Env, func(e corev1.EnvVar) bool { return e.Name == config.EnvTLSCertFile }) {
		t.Errorf("client certificate still mounted: volumes %v", vols)
	}
	eventually(t, "the vhost stays immutable", func(ctx context.Context) error {
		bad := &hcpv1alpha1.Callee{}
		if err := k8sClient.Get(ctx, key(ns, "secure"), bad); err != nil {
			return err
		}
		bad.Spec.Broker.Vhost = "/elsewhere"
		if err := k8sClient.Update(ctx, bad); err == nil || !strings.Contains(err.Error(), "spec.broker is immutable except spec.broker.tls") {
			return fmt.Errorf("changing the vhost: %v, want the immutability error", err)
		}
		return nil
	})

	// An external Caller: tls only switches its uri to amqps; nothing is
	// mounted, so its Secrets are not required.
	ext := newCaller(ns, "outside", func(c *hcpv1alpha1.Caller) {
		c.Spec.Broker.TLS = &hcpv1alpha1.BrokerTLS{CASecret: "not-here"}
	})
	create(t, ext)
	_, extCreds, _ := childNames("caller", "outside")
	eventually(t, "external caller with tls", all(
		callerCondition(ext, hcpv1alpha1.ConditionHarnessReady, metav1.ConditionTrue, hcpv1alpha1.ReasonNoHarness, ""),
		func(ctx context.Context) error {
			s := &corev1.Secret{}
			if err := k8sClient.Get(ctx, key(ns, extCreds), s); err != nil {
				return err
			}
			if !strings.HasPrefix(string(s.Data["uri"]), "amqps://") {
				return fmt.Errorf("uri %s", redact(s.Data["uri"]))
			}
			return nil
		},
	))
}

// sidecarOf re-reads d and returns its sidecar container and its Secret
// volumes (volume name to Secret name).
func sidecarOf(t *testing.T, d *appsv1.Deployment) (corev1.Container, map[string]string) {
	t.Helper()
	if err := k8sClient.Get(t.Context(), key(d.Namespace, d.Name), d); err != nil {
		t.Fatal(err)
	}
	ps := d.Spec.Template.Spec
	vols := map[string]string{}
	for _, v := range ps.Volumes {
		if v.Secret != nil {
			vols[v.Name] = v.Secret.SecretName
		}
	}
	for _, c := range ps.InitContainers {
		if c.Name == resource.SidecarContainerName {
			return c, vols
		}
	}
	t.Fatal("no sidecar container")
	return corev1.Container{}, nil
}

// waitHashChange waits for the pod template's config hash to differ from
// old and returns the new one.
func waitHashChange(t *testing.T, d *appsv1.Deployment, old, what string) string {
	t.Helper()
	var cur string
	eventually(t, what+" changes the config hash", func(ctx context.Context) error {
		if err := k8sClient.Get(ctx, key(d.Namespace, d.Name), d); err != nil {
			return err
		}
		if cur = d.Spec.Template.Annotations[hcpv1alpha1.AnnotationConfigHash]; cur == old {
			return fmt.Errorf("config hash still %s", old)
		}
		return nil
	})
	return cur
}
