package token

import (
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// Algorithm is the only JWS algorithm issued and accepted.
const Algorithm = "EdDSA"

// Errors returned (wrapped) by Verify and Issue; match with errors.Is.
var (
	ErrMalformed   = errors.New("session token is malformed")
	ErrAlgorithm   = errors.New("session token algorithm not allowed (only EdDSA)")
	ErrSignature   = errors.New("session token signature is invalid")
	ErrExpired     = errors.New("session token is expired")
	ErrNotYetValid = errors.New("session token is not valid yet")
	ErrIssuer      = errors.New("session token has the wrong issuer")
	ErrAudience    = errors.New("session token has the wrong audience")
	ErrSubject     = errors.New("session token has the wrong subject")
	ErrClaims      = errors.New("session token claims are invalid")
	ErrKey         = errors.New("invalid Ed25519 key")
)

// Claims are the claims of a session token.
type Claims struct {
	// Issuer (iss) is the callee id.
	Issuer string
	// Audience (aud) is the caller id.
	Audience string
	// Subject (sub) is the session id.
	Subject string
	// Capability is the capability the session runs.
	Capability string
	// Risk is the L3-assessed risk level.
	Risk task.RiskLevel
	// IssuedAt (iat) and ExpiresAt (exp) have one-second precision on the
	// wire; Issue truncates them.
	IssuedAt  time.Time
	ExpiresAt time.Time
	// ID (jti) is optional and, when set, must be deterministic for
	// deterministic tokens.
	ID string
}

// NewClaims returns the claims of a session: exp is issuedAt plus
// maxDuration, both truncated to the second.
func NewClaims(calleeID, callerID, sessionID, capability string, risk task.RiskLevel, issuedAt time.Time, maxDuration time.Duration) Claims {
	iat := issuedAt.UTC().Truncate(time.Second)
	return Claims{
		Issuer: calleeID, Audience: callerID, Subject: sessionID,
		Capability: capability, Risk: risk,
		IssuedAt: iat, ExpiresAt: iat.Add(maxDuration).Truncate(time.Second),
	}
}

// Validate checks the claims on their own: iss, aud, sub and capability
// present, risk R1..R5, iat set and exp after iat.
func (c *Claims) Validate() error {
	var missing []string
	for _, f := range []struct{ name, v string }{
		{"iss", c.Issuer}, {"aud", c.Audience}, {"sub", c.Subject}, {"capability", c.Capability},
	} {
		if f.v == "" {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: missing %s", ErrClaims, strings.Join(missing, ", "))
	}
	if !c.Risk.Valid() {
		return fmt.Errorf("%w: risk %q is not one of R1..R5", ErrClaims, c.Risk)
	}
	if c.IssuedAt.IsZero() || c.ExpiresAt.IsZero() {
		return fmt.Errorf("%w: iat and exp are required", ErrClaims)
	}
	if !c.ExpiresAt.Truncate(time.Second).After(c.IssuedAt.Truncate(time.Second)) {
		return fmt.Errorf("%w: exp %s is not after iat %s", ErrClaims, c.ExpiresAt.UTC().Format(time.RFC3339), c.IssuedAt.UTC().Format(time.RFC3339))
	}
	return nil
}

// wireClaims is the JSON form. Fields are in a fixed order, aud is a single
// string and times are integer seconds, independent of the jwt package's
// global settings (MarshalSingleStringAsArray, TimePrecision), so the
// encoding, and with it the token, is deterministic.
type wireClaims struct {
	Issuer     string `json:"iss"`
	Audience   string `json:"aud"`
	Subject    string `json:"sub"`
	Capability string `json:"capability"`
	Risk       string `json:"risk"`
	IssuedAt   int64  `json:"iat"`
	ExpiresAt  int64  `json:"exp"`
	ID         string `json:"jti,omitempty"`
}

// wireClaims implements jwt.Claims for the parser; claim validation is done
// by Verify itself.
func (w *wireClaims) GetExpirationTime() (*jwt.NumericDate, error) {
	return jwt.NewNumericDate(time.Unix(w.ExpiresAt, 0)), nil
}
func (w *wireClaims) GetIssuedAt() (*jwt.NumericDate, error) {
	return jwt.NewNumericDate(time.Unix(w.IssuedAt, 0)), nil
}
func (w *wireClaims) GetNotBefore() (*jwt.NumericDate, error) { return nil, nil }
func (w *wireClaims) GetIssuer() (string, error)              { return w.Issuer, nil }
func (w *wireClaims) GetSubject() (string, error)             { return w.Subject, nil }
func (w *wireClaims) GetAudience() (jwt.ClaimStrings, error) {
	return jwt.ClaimStrings{w.Audience}, nil
}

// Issue signs the claims with the callee's private key; the header names
// the key by its KeyID ("kid"), so that verifiers holding several keys
// (after a rotation) pick the right one. Identical claims and key give an
// identical token.
func Issue(priv ed25519.PrivateKey, c Claims) (string, error) {
	if len(priv) != ed25519.PrivateKeySize {
		return "", fmt.Errorf("issue session token: %w: private key is %d bytes, want %d", ErrKey, len(priv), ed25519.PrivateKeySize)
	}
	if err := c.Validate(); err != nil {
		return "", fmt.Errorf("issue session token: %w", err)
	}
	w := &wireClaims{
		Issuer: c.Issuer, Audience: c.Audience, Subject: c.Subject,
		Capability: c.Capability, Risk: string(c.Risk),
		IssuedAt: c.IssuedAt.Unix(), ExpiresAt: c.ExpiresAt.Unix(), ID: c.ID,
	}
	t := jwt.NewWithClaims(jwt.SigningMethodEdDSA, w)
	t.Header["kid"] = KeyID(priv.Public().(ed25519.PublicKey))
	s, err := t.SignedString(priv)
	if err != nil {
		return "", fmt.Errorf("issue session token: %w", err)
	}
	return s, nil
}

// Expectations are what the verifier knows independently of the token.
type Expectations struct {
	// Issuer is the callee id (required).
	Issuer string
	// Audience is the caller id (required): for an abort, the caller the
	// broker authenticated.
	Audience string
	// Subject is the session id (required).
	Subject string
	// Leeway tolerates clock skew on exp and iat.
	Leeway time.Duration
}

// Verify checks the token's algorithm and signature with pub, then its
// claims against expect at time now, and returns the claims. The token must
// be unexpired (now < exp + leeway) and not issued in the future
// (iat <= now + leeway).
func Verify(pub ed25519.PublicKey, token string, expect Expectations, now time.Time) (*Claims, error) {
	if len(pub) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("%w: public key is %d bytes, want %d", ErrKey, len(pub), ed25519.PublicKeySize)
	}
	set, err := NewKeySet(pub)
	if err != nil {
		return nil, err
	}
	return VerifySet(set, token, expect, now)
}

// VerifySet is Verify with a key set: the token's kid selects the key (a
// kid not in the set is ErrSignature); a token without kid, issued before
// key ids, is checked against every key.
func VerifySet(keys KeySet, token string, expect Expectations, now time.Time) (*Claims, error) {
	if keys.Len() == 0 {
		return nil, fmt.Errorf("%w: the key set is empty", ErrKey)
	}
	if expect.Issuer == "" || expect.Audience == "" || expect.Subject == "" {
		return nil, errors.New("verify session token: expected issuer, audience and subject are all required")
	}
	kid, err := checkHeader(token)
	if err != nil {
		return nil, err
	}
	candidates, err := keys.lookup(kid)
	if err != nil {
		return nil, err
	}
	var w wireClaims
	for _, pub := range candidates {
		w = wireClaims{}
		_, err = jwt.NewParser(
			jwt.WithValidMethods([]string{Algorithm}),
			jwt.WithStrictDecoding(),
			jwt.WithoutClaimsValidation(),
		).ParseWithClaims(token, &w, func(t *jwt.Token) (any, error) {
			if _, ok := t.Method.(*jwt.SigningMethodEd25519); !ok {
				return nil, fmt.Errorf("%w: %v", ErrAlgorithm, t.Header["alg"])
			}
			return pub, nil
		})
		if !errors.Is(err, jwt.ErrTokenSignatureInvalid) {
			break
		}
	}
	switch {
	case err == nil:
	case errors.Is(err, ErrAlgorithm):
		return nil, err
	case errors.Is(err, jwt.ErrTokenMalformed):
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return nil, fmt.Errorf("%w: %w", ErrSignature, err)
	default:
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}

	c := &Claims{
		Issuer: w.Issuer, Audience: w.Audience, Subject: w.Subject,
		Capability: w.Capability, Risk: task.RiskLevel(w.Risk),
		IssuedAt: time.Unix(w.IssuedAt, 0).UTC(), ExpiresAt: time.Unix(w.ExpiresAt, 0).UTC(), ID: w.ID,
	}
	if w.IssuedAt == 0 || w.ExpiresAt == 0 {
		return nil, fmt.Errorf("%w: iat and exp are required", ErrClaims)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch {
	case c.Issuer != expect.Issuer:
		return nil, fmt.Errorf("%w: %q, want %q", ErrIssuer, c.Issuer, expect.Issuer)
	case c.Audience != expect.Audience:
		return nil, fmt.Errorf("%w: %q, want %q", ErrAudience, c.Audience, expect.Audience)
	case c.Subject != expect.Subject:
		return nil, fmt.Errorf("%w: %q, want %q", ErrSubject, c.Subject, expect.Subject)
	case !now.Before(c.ExpiresAt.Add(expect.Leeway)):
		return nil, fmt.Errorf("%w: expired at %s, now %s", ErrExpired, c.ExpiresAt.Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	case c.IssuedAt.After(now.Add(expect.Leeway)):
		return nil, fmt.Errorf("%w: issued at %s, now %s", ErrNotYetValid, c.IssuedAt.Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return c, nil
}

// checkHeader rejects anything but {"alg":"EdDSA"} (with optional typ JWT
// and kid) before the jwt package sees the token, so that the error says
// why. It returns the kid ("" when absent).
func checkHeader(token string) (string, error) {
	seg, _, ok := strings.Cut(token, ".")
	if !ok {
		return "", fmt.Errorf("%w: not a compact JWS", ErrMalformed)
	}
	b, err := base64.RawURLEncoding.Strict().DecodeString(seg)
	if err != nil {
		return "", fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	var h map[string]any
	if err := json.Unmarshal(b, &h); err != nil {
		return "", fmt.Errorf("%w: header: %w", ErrMalformed, err)
	}
	if alg, _ := h["alg"].(string); alg != Algorithm {
		return "", fmt.Errorf("%w: alg %v", ErrAlgorithm, h["alg"])
	}
	if typ, ok := h["typ"]; ok && typ != "JWT" {
		return "", fmt.Errorf("%w: typ %v", ErrMalformed, typ)
	}
	if _, ok := h["crit"]; ok {
		return "", fmt.Errorf("%w: crit header not supported", ErrMalformed)
	}
	kid, isString := h["kid"].(string)
	if _, present := h["kid"]; present && (!isString || kid == "") {
		return "", fmt.Errorf("%w: kid %v is not a non-empty string", ErrMalformed, h["kid"])
	}
	return kid, nil
}
