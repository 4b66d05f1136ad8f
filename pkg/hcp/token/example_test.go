package token_test

import (
	"fmt"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

func Example() {
	pub, priv, _ := token.GenerateKey()
	issuedAt := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	claims := token.NewClaims("lab-cvd", "alpha", "550e8400-e29b-41d4-a716-446655440000",
		"cvd.grow", task.R3, issuedAt, 72*time.Hour)
	tok, _ := token.Issue(priv, claims)

	expect := token.Expectations{Issuer: "lab-cvd", Audience: "alpha", Subject: "550e8400-e29b-41d4-a716-446655440000"}
	c, err := token.Verify(pub, tok, expect, issuedAt.Add(time.Hour))
	fmt.Println(c.Capability, c.Risk, c.ExpiresAt, err)

	expect.Audience = "mallory"
	_, err = token.Verify(pub, tok, expect, issuedAt.Add(time.Hour))
	fmt.Println(err)
	// Output:
	// cvd.grow R3 2025-01-18 08:30:00 +0000 UTC <nil>
	// session token has the wrong audience: "alpha", want "mallory"
}
