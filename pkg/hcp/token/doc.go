// Package token issues and verifies HCP session tokens: JWTs (RFC 7519)
// signed with the callee's Ed25519 key, algorithm EdDSA (RFC 8037) and
// nothing else.
//
// A token names the callee (iss), the caller (aud), the session (sub), the
// capability and the assessed risk level, with iat and exp (iat plus the
// session's maximum duration). The callee issues it in task_accepted and
// checks it on abort; anyone with the callee's public key (published in the
// Callee status) can verify it.
//
// Issuing is deterministic: identical claims give an identical token
// (Ed25519 signatures are deterministic and the encoding is fixed; there is
// no random jti). A callee answering a duplicate task_submit re-issues the
// same token from the same claims, including the same IssuedAt (take it
// from the stored session, not the clock).
//
// Verification refuses every algorithm but EdDSA — "none", HS256 with the
// public key as the HMAC secret, RS256, ES256 — before any key is used, and
// refuses tokens with a "crit" header. Verify requires all of issuer,
// audience and subject to be expected, so a check cannot be skipped by
// leaving an expectation empty. Errors match the sentinel errors of this
// package with errors.Is.
package token
