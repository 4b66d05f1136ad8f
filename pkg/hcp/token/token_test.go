package token

import (
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

var (
	t0      = time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	session = "550e8400-e29b-41d4-a716-446655440000"
	expect  = Expectations{Issuer: "lab-cvd", Audience: "alpha", Subject: session}
)

func testClaims() Claims {
	return NewClaims("lab-cvd", "alpha", session, "cvd.grow", task.R3, t0.Add(123*time.Millisecond), 72*time.Hour)
}

func mustKey(t *testing.T) (ed25519.PublicKey, ed25519.PrivateKey) {
	t.Helper()
	pub, priv, err := GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	return pub, priv
}

func TestIssueVerifyRoundTrip(t *testing.T) {
	pub, priv := mustKey(t)
	c := testClaims()
	if !c.IssuedAt.Equal(t0) || !c.ExpiresAt.Equal(t0.Add(72*time.Hour)) {
		t.Fatalf("NewClaims times %v %v", c.IssuedAt, c.ExpiresAt)
	}
	tok, err := Issue(priv, c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := Verify(pub, tok, expect, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if *got != c {
		t.Fatalf("claims = %+v, want %+v", *got, c)
	}
	if err := (&task.TaskAccepted{TaskMessageID: session, SessionID: session, SessionToken: tok,
		RiskLevel: task.R3, ExpiresAt: task.NewTimestamp(c.ExpiresAt)}).Validate(); err != nil {
		t.Fatalf("token not acceptable in task_accepted: %v", err)
	}
	c.ID = "fixed-id"
	tok, _ = Issue(priv, c)
	if got, err := Verify(pub, tok, expect, t0); err != nil || got.ID != "fixed-id" {
		t.Fatalf("with jti: %+v, %v", got, err)
	}
}

func TestIssueDeterministic(t *testing.T) {
	_, priv := mustKey(t)
	a, err := Issue(priv, testClaims())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Issue(priv, testClaims())
	if a != b {
		t.Fatalf("tokens differ:\n%s\n%s", a, b)
	}
	// Sub-second differences vanish; a different second does not.
	c := testClaims()
	c.IssuedAt = c.IssuedAt.Add(500 * time.Millisecond)
	if x, _ := Issue(priv, c); x != a {
		t.Fatal("sub-second iat changed the token")
	}
	c.IssuedAt = c.IssuedAt.Add(time.Second)
	if x, _ := Issue(priv, c); x == a {
		t.Fatal("different iat gave the same token")
	}
	// The wire form is fixed.
	hdr, _ := base64.RawURLEncoding.DecodeString(strings.Split(a, ".")[0])
	if string(hdr) != `{"alg":"EdDSA","kid":"`+KeyID(priv.Public().(ed25519.PublicKey))+`","typ":"JWT"}` {
		t.Errorf("header = %s", hdr)
	}
	body, _ := base64.RawURLEncoding.DecodeString(strings.Split(a, ".")[1])
	want := `{"iss":"lab-cvd","aud":"alpha","sub":"` + session + `","capability":"cvd.grow","risk":"R3","iat":1736929800,"exp":1737189000}`
	if string(body) != want {
		t.Errorf("claims = %s, want %s", body, want)
	}
}

func TestIssueRejects(t *testing.T) {
	_, priv := mustKey(t)
	for name, mutate := range map[string]func(*Claims){
		"no iss":        func(c *Claims) { c.Issuer = "" },
		"no aud":        func(c *Claims) { c.Audience = "" },
		"no sub":        func(c *Claims) { c.Subject = "" },
		"no capability": func(c *Claims) { c.Capability = "" },
		"bad risk":      func(c *Claims) { c.Risk = "R0" },
		"no iat":        func(c *Claims) { c.IssuedAt = time.Time{} },
		"no exp":        func(c *Claims) { c.ExpiresAt = time.Time{} },
		"exp = iat":     func(c *Claims) { c.ExpiresAt = c.IssuedAt.Add(300 * time.Millisecond) },
		"exp < iat":     func(c *Claims) { c.ExpiresAt = c.IssuedAt.Add(-time.Hour) },
	} {
		c := testClaims()
		mutate(&c)
		if _, err := Issue(priv, c); !errors.Is(err, ErrClaims) {
			t.Errorf("%s: Issue = %v, want ErrClaims", name, err)
		}
	}
	if _, err := Issue(priv[:10], testClaims()); !errors.Is(err, ErrKey) {
		t.Errorf("short key: %v", err)
	}
}

// sign signs arbitrary claims with an arbitrary method and key.
func sign(t *testing.T, m jwt.SigningMethod, claims jwt.MapClaims, key any) string {
	t.Helper()
	s, err := jwt.NewWithClaims(m, claims).SignedString(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mapClaims() jwt.MapClaims {
	return jwt.MapClaims{"iss": "lab-cvd", "aud": "alpha", "sub": session, "capability": "cvd.grow",
		"risk": "R3", "iat": t0.Unix(), "exp": t0.Add(time.Hour).Unix()}
}

func b64(s string) string { return base64.RawURLEncoding.EncodeToString([]byte(s)) }

func TestVerifyRejects(t *testing.T) {
	pub, priv := mustKey(t)
	otherPub, otherPriv := mustKey(t)
	good, _ := Issue(priv, testClaims())
	parts := strings.Split(good, ".")
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)

	with := func(mutate func(jwt.MapClaims)) string {
		c := mapClaims()
		mutate(c)
		return sign(t, jwt.SigningMethodEdDSA, c, priv)
	}
	// A payload changed after signing: risk lowered to R1.
	var body map[string]any
	raw, _ := base64.RawURLEncoding.DecodeString(parts[1])
	_ = json.Unmarshal(raw, &body)
	body["risk"] = "R1"
	tamperedBody, _ := json.Marshal(body)

	now := t0.Add(time.Minute)
	cases := []struct {
		name  string
		token string
		exp   Expectations
		now   time.Time
		want  error
	}{
		{"alg none", sign(t, jwt.SigningMethodNone, mapClaims(), jwt.UnsafeAllowNoneSignatureType), expect, now, ErrAlgorithm},
		{"alg none unsigned handcrafted", b64(`{"alg":"none"}`) + "." + parts[1] + ".", expect, now, ErrAlgorithm},
		{"alg None casing", b64(`{"alg":"None","typ":"JWT"}`) + "." + parts[1] + "." + parts[2], expect, now, ErrAlgorithm},
		{"HS256 with public key as secret", sign(t, jwt.SigningMethodHS256, mapClaims(), []byte(pub)), expect, now, ErrAlgorithm},
		{"HS256 header on EdDSA signature", b64(`{"alg":"HS256","typ":"JWT"}`) + "." + parts[1] + "." + parts[2], expect, now, ErrAlgorithm},
		{"ES256", sign(t, jwt.SigningMethodES256, mapClaims(), ecKey), expect, now, ErrAlgorithm},
		{"no alg", b64(`{"typ":"JWT"}`) + "." + parts[1] + "." + parts[2], expect, now, ErrAlgorithm},
		{"wrong key", sign(t, jwt.SigningMethodEdDSA, mapClaims(), otherPriv), expect, now, ErrSignature},
		{"tampered payload", parts[0] + "." + b64(string(tamperedBody)) + "." + parts[2], expect, now, ErrSignature},
		{"tampered signature", parts[0] + "." + parts[1] + "." + b64("x"+strings.Repeat("y", 63)), expect, now, ErrSignature},
		{"no signature", parts[0] + "." + parts[1] + ".", expect, now, ErrSignature},
		{"expired", good, expect, t0.Add(72 * time.Hour), ErrExpired},
		{"expired long ago", good, expect, t0.Add(1000 * time.Hour), ErrExpired},
		{"issued in the future", good, expect, t0.Add(-time.Minute), ErrNotYetValid},
		{"wrong audience", good, Expectations{Issuer: "lab-cvd", Audience: "beta", Subject: session}, now, ErrAudience},
		{"wrong issuer", good, Expectations{Issuer: "other", Audience: "alpha", Subject: session}, now, ErrIssuer},
		{"wrong subject", good, Expectations{Issuer: "lab-cvd", Audience: "alpha", Subject: "6ba7b810-9dad-41d1-80b4-00c04fd430c8"}, now, ErrSubject},
		{"aud as array", with(func(c jwt.MapClaims) { c["aud"] = []string{"alpha"} }), expect, now, ErrMalformed},
		{"missing capability", with(func(c jwt.MapClaims) { delete(c, "capability") }), expect, now, ErrClaims},
		{"bad risk", with(func(c jwt.MapClaims) { c["risk"] = "R9" }), expect, now, ErrClaims},
		{"missing exp", with(func(c jwt.MapClaims) { delete(c, "exp") }), expect, now, ErrClaims},
		{"missing iat", with(func(c jwt.MapClaims) { delete(c, "iat") }), expect, now, ErrClaims},
		{"exp before iat", with(func(c jwt.MapClaims) { c["exp"] = t0.Add(-time.Hour).Unix() }), expect, now, ErrClaims},
		{"fractional exp", with(func(c jwt.MapClaims) { c["exp"] = float64(t0.Add(time.Hour).Unix()) + 0.5 }), expect, now, ErrMalformed},
		{"crit header", b64(`{"alg":"EdDSA","crit":["exp"]}`) + "." + parts[1] + "." + parts[2], expect, now, ErrMalformed},
		{"typ not JWT", b64(`{"alg":"EdDSA","typ":"JOSE+JSON"}`) + "." + parts[1] + "." + parts[2], expect, now, ErrMalformed},
		{"two segments", parts[0] + "." + parts[1], expect, now, ErrMalformed},
		{"four segments", good + ".x", expect, now, ErrMalformed},
		{"empty", "", expect, now, ErrMalformed},
		{"padded header", parts[0] + "=." + parts[1] + "." + parts[2], expect, now, ErrMalformed},
		{"header not JSON", b64("hello") + "." + parts[1] + "." + parts[2], expect, now, ErrMalformed},
		{"body not JSON", parts[0] + "." + b64("hello") + "." + parts[2], expect, now, ErrMalformed},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Verify(pub, tc.token, tc.exp, tc.now)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Verify = %+v, %v; want %v", c, err, tc.want)
			}
			if c != nil {
				t.Fatal("claims returned with an error")
			}
		})
	}
	// The wrong-key token verifies with its own key: the failure above was
	// the key, not the token.
	if _, err := Verify(otherPub, sign(t, jwt.SigningMethodEdDSA, mapClaims(), otherPriv), expect, now); err != nil {
		t.Fatalf("control: %v", err)
	}
}

func TestVerifyLeewayAndBoundaries(t *testing.T) {
	pub, priv := mustKey(t)
	tok, _ := Issue(priv, testClaims())
	exp := t0.Add(72 * time.Hour)
	if _, err := Verify(pub, tok, expect, exp.Add(-time.Nanosecond)); err != nil {
		t.Fatalf("just before exp: %v", err)
	}
	if _, err := Verify(pub, tok, expect, exp); !errors.Is(err, ErrExpired) {
		t.Fatalf("at exp: %v", err)
	}
	if _, err := Verify(pub, tok, expect, t0); err != nil {
		t.Fatalf("at iat: %v", err)
	}
	lenient := expect
	lenient.Leeway = 30 * time.Second
	if _, err := Verify(pub, tok, lenient, exp.Add(29*time.Second)); err != nil {
		t.Fatalf("within leeway after exp: %v", err)
	}
	if _, err := Verify(pub, tok, lenient, t0.Add(-29*time.Second)); err != nil {
		t.Fatalf("within leeway before iat: %v", err)
	}
	if _, err := Verify(pub, tok, lenient, exp.Add(30*time.Second)); !errors.Is(err, ErrExpired) {
		t.Fatalf("beyond leeway: %v", err)
	}
}

func TestVerifyRequiresExpectations(t *testing.T) {
	pub, priv := mustKey(t)
	tok, _ := Issue(priv, testClaims())
	for _, e := range []Expectations{
		{Audience: "alpha", Subject: session},
		{Issuer: "lab-cvd", Subject: session},
		{Issuer: "lab-cvd", Audience: "alpha"},
	} {
		if _, err := Verify(pub, tok, e, t0); err == nil {
			t.Errorf("Verify with %+v succeeded", e)
		}
	}
	if _, err := Verify(pub[:5], tok, expect, t0); !errors.Is(err, ErrKey) {
		t.Errorf("short public key: %v", err)
	}
}

func TestKeysPEM(t *testing.T) {
	pub, priv := mustKey(t)
	privPEM, err := MarshalPrivateKeyPEM(priv)
	if err != nil {
		t.Fatal(err)
	}
	pubPEM, err := MarshalPublicKeyPEM(pub)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(privPEM), "-----BEGIN PRIVATE KEY-----\n") || !strings.HasPrefix(string(pubPEM), "-----BEGIN PUBLIC KEY-----\n") {
		t.Fatalf("PEM:\n%s\n%s", privPEM, pubPEM)
	}
	priv2, err := ParsePrivateKeyPEM(privPEM)
	if err != nil || !priv2.Equal(priv) {
		t.Fatalf("private round trip: %v", err)
	}
	pub2, err := ParsePublicKeyPEM(pubPEM)
	if err != nil || !pub2.Equal(pub) {
		t.Fatalf("public round trip: %v", err)
	}
	// A token signed with the decoded private key verifies with the decoded
	// public key.
	tok, _ := Issue(priv2, testClaims())
	if _, err := Verify(pub2, tok, expect, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := ParsePrivateKeyPEM(append(privPEM, "\n\n"...)); err != nil {
		t.Fatalf("trailing whitespace: %v", err)
	}

	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ecPrivDER, _ := x509.MarshalPKCS8PrivateKey(ecKey)
	ecPubDER, _ := x509.MarshalPKIXPublicKey(&ecKey.PublicKey)
	ecPriv := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: ecPrivDER})
	ecPub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: ecPubDER})
	withHeader := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Headers: map[string]string{"Proc-Type": "4,ENCRYPTED"}, Bytes: ecPrivDER})

	for name, in := range map[string][]byte{
		"garbage":        []byte("not pem"),
		"empty":          nil,
		"public as priv": pubPEM,
		"ecdsa":          ecPriv,
		"bad DER":        pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: []byte{1, 2, 3}}),
		"trailing data":  append(append([]byte{}, privPEM...), pubPEM...),
		"encrypted":      withHeader,
	} {
		if _, err := ParsePrivateKeyPEM(in); !errors.Is(err, ErrKey) {
			t.Errorf("ParsePrivateKeyPEM(%s) = %v", name, err)
		}
	}
	for name, in := range map[string][]byte{
		"garbage":        []byte("-----BEGIN PUBLIC KEY-----\n!!!\n-----END PUBLIC KEY-----\n"),
		"priv as public": privPEM,
		"ecdsa":          ecPub,
		"bad DER":        pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: []byte{1, 2, 3}}),
	} {
		if _, err := ParsePublicKeyPEM(in); !errors.Is(err, ErrKey) {
			t.Errorf("ParsePublicKeyPEM(%s) = %v", name, err)
		}
	}
	if _, err := MarshalPrivateKeyPEM(priv[:3]); !errors.Is(err, ErrKey) {
		t.Errorf("MarshalPrivateKeyPEM(short) = %v", err)
	}
	if _, err := MarshalPublicKeyPEM(pub[:3]); !errors.Is(err, ErrKey) {
		t.Errorf("MarshalPublicKeyPEM(short) = %v", err)
	}
}
