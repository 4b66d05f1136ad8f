package resource

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

func keyGen(t *testing.T) (func() (ed25519.PrivateKey, error), *int) {
	n := 0
	return func() (ed25519.PrivateKey, error) {
		n++
		_, k, err := token.GenerateKey()
		if err != nil {
			t.Fatal(err)
		}
		return k, nil
	}, &n
}

func verifyIDs(t *testing.T, k TokenKeys) []string {
	t.Helper()
	set, err := token.ParseKeySetPEM(k.VerifyPEM)
	if err != nil {
		t.Fatalf("VerifyPEM: %v", err)
	}
	return set.IDs()
}

func kidOf(t *testing.T, k TokenKeys) string {
	t.Helper()
	pub, err := token.ParsePublicKeyPEM(k.PublicPEM)
	if err != nil {
		t.Fatal(err)
	}
	return token.KeyID(pub)
}

// A key is made once, kept across reconciles, replaced once per new
// rotation value, and the retired keys stay verifiable (at most
// TokenRetiredKeysKept of them).
func TestNextTokenKeysRotation(t *testing.T) {
	gen, made := keyGen(t)
	k0, err := NextTokenKeys(TokenKeys{}, "", gen)
	if err != nil {
		t.Fatal(err)
	}
	if *made != 1 || len(verifyIDs(t, k0)) != 1 || verifyIDs(t, k0)[0] != kidOf(t, k0) {
		t.Fatalf("first key: %d generated, verify %v", *made, verifyIDs(t, k0))
	}
	again, _ := NextTokenKeys(k0, "", gen)
	if *made != 1 || string(again.PrivatePEM) != string(k0.PrivatePEM) || string(again.VerifyPEM) != string(k0.VerifyPEM) {
		t.Fatal("a reconcile without a rotation changed the key")
	}
	k1, _ := NextTokenKeys(k0, "r1", gen)
	if *made != 2 || k1.Rotation != "r1" {
		t.Fatalf("rotation r1: %d generated, rotation %q", *made, k1.Rotation)
	}
	if ids := verifyIDs(t, k1); len(ids) != 2 || ids[0] != kidOf(t, k1) || ids[1] != kidOf(t, k0) {
		t.Fatalf("after r1 verify = %v, want [new, old]", ids)
	}
	if same, _ := NextTokenKeys(k1, "r1", gen); *made != 2 || string(same.PrivatePEM) != string(k1.PrivatePEM) {
		t.Fatal("the same rotation value rotated twice")
	}
	k2, _ := NextTokenKeys(k1, "r2", gen)
	k3, _ := NextTokenKeys(k2, "r3", gen)
	ids := verifyIDs(t, k3)
	want := []string{kidOf(t, k3), kidOf(t, k2), kidOf(t, k1)}
	if len(ids) != len(want) || ids[0] != want[0] || ids[1] != want[1] || ids[2] != want[2] {
		t.Fatalf("after three rotations verify = %v, want %v (k0 dropped)", ids, want)
	}
}

// A Secret written by an older version has no verification keys (nor,
// when edited by hand, a public key): both are derived, the key kept.
func TestNextTokenKeysUpgradesOldSecrets(t *testing.T) {
	gen, made := keyGen(t)
	k0, _ := NextTokenKeys(TokenKeys{}, "", gen)
	old := TokenKeys{PrivatePEM: k0.PrivatePEM}
	up, err := NextTokenKeys(old, "", gen)
	if err != nil {
		t.Fatal(err)
	}
	if *made != 1 || string(up.PublicPEM) != string(k0.PublicPEM) || string(up.VerifyPEM) != string(k0.VerifyPEM) {
		t.Fatalf("upgrade: %d generated; public/verify derived: %v/%v", *made,
			string(up.PublicPEM) == string(k0.PublicPEM), string(up.VerifyPEM) == string(k0.VerifyPEM))
	}
	if _, err := NextTokenKeys(TokenKeys{PrivatePEM: []byte("garbage")}, "", gen); !errors.Is(err, token.ErrKey) {
		t.Fatalf("an unusable key is reported, not replaced: %v", err)
	}
}

// A callee's token keys live in its credentials Secret: TokenKeysOf reads
// back what WithTokenKeys wrote, and the pod mounts them from that Secret
// as a volume of their own, apart from the broker URL's.
func TestTokenKeysInCredentialsSecret(t *testing.T) {
	c := sampleCallee()
	b := sampleBroker(t, c.Spec.Broker)
	s := ForCallee(c)
	creds, err := CredentialsSecret(s, b, "pw")
	if err != nil {
		t.Fatal(err)
	}
	keys := TokenKeys{PrivatePEM: []byte("PRIV"), PublicPEM: []byte("PUB"), VerifyPEM: []byte("SET"), Rotation: "r1"}
	sec := WithTokenKeys(creds, keys)
	if got := TokenKeysOf(sec); string(got.PrivatePEM) != "PRIV" || string(got.PublicPEM) != "PUB" || string(got.VerifyPEM) != "SET" || got.Rotation != "r1" {
		t.Errorf("TokenKeysOf(WithTokenKeys) = %+v", got)
	}
	if string(sec.Data[CredentialsPasswordKey]) != "pw" || sec.Labels[LabelTopologyOperator] != TopologyOperatorLabelValue {
		t.Errorf("the credentials are gone or the Secret lost its label: %v %v", sec.Labels, sec.Data)
	}
	if got := TokenKeysOf(nil); len(got.PrivatePEM) != 0 {
		t.Errorf("TokenKeysOf(nil) = %+v", got)
	}
	items := map[string][]string{}
	for _, v := range Deployment(HarnessParams{Subject: s, Harness: c.Spec.Harness, Vhost: b.Vhost}).Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		if v.Secret.SecretName != s.CredentialsSecretName() {
			t.Errorf("volume %s mounts Secret %s", v.Name, v.Secret.SecretName)
		}
		for _, it := range v.Secret.Items {
			items[v.Name] = append(items[v.Name], it.Key)
		}
	}
	if got, want := fmt.Sprint(items), fmt.Sprint(map[string][]string{
		CredentialsVolumeName: {CredentialsURIKey}, TokenVolumeName: {TokenPrivateKeyKey, TokenVerifyKeysKey},
	}); got != want {
		t.Errorf("Secret volumes %s, want %s", got, want)
	}
}
