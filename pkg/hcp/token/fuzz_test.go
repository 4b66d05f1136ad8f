package token

import (
	"crypto/ed25519"
	"strings"
	"testing"
	"time"
)

// FuzzVerify checks that Verify never panics and never accepts a token that
// differs from the one issued (the key is fixed, so any accepted input must
// be exactly the issued token).
func FuzzVerify(f *testing.F) {
	priv := ed25519.NewKeyFromSeed(make([]byte, ed25519.SeedSize))
	pub := priv.Public().(ed25519.PublicKey)
	good, err := Issue(priv, testClaims())
	if err != nil {
		f.Fatal(err)
	}
	parts := strings.Split(good, ".")
	f.Add(good)
	f.Add(parts[0] + "." + parts[1] + ".")
	f.Add("eyJhbGciOiJub25lIn0." + parts[1] + ".")
	f.Add("eyJhbGciOiJIUzI1NiJ9." + parts[1] + "." + parts[2])
	f.Add("..")
	f.Add("a.b.c")
	f.Fuzz(func(t *testing.T, tok string) {
		c, err := Verify(pub, tok, expect, t0.Add(time.Minute))
		if err == nil {
			if tok != good {
				t.Fatalf("accepted a token that was never issued: %q", tok)
			}
			if *c != testClaims() {
				t.Fatalf("claims %+v", c)
			}
		}
	})
}
