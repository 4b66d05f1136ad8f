package topology

import (
	"crypto/sha256"
	"fmt"
	"strings"

	"github.com/google/uuid"
)

// Role is a harness's side of the protocol.
type Role string

const (
	RoleCallee Role = "callee"
	RoleCaller Role = "caller"
)

// Valid reports whether r is RoleCallee or RoleCaller.
func (r Role) Valid() bool { return r == RoleCallee || r == RoleCaller }

// Username is the broker username of a harness: {role}.{id}@{vhost}. Broker
// users are global while ids are unique only per vhost, so the vhost is part
// of the name; see the package documentation for why the scheme is
// reversible. id must satisfy ValidateID and vhost must be non-empty.
func Username(role Role, vhost, id string) string {
	return string(role) + "." + id + "@" + vhost
}

// ParseUsername reverses Username: the role is everything before the first
// '.', the id everything between it and the first '@' after it, the vhost
// the rest (which may itself contain '.' and '@'). Errors wrap
// ErrInvalidUsername.
func ParseUsername(u string) (role Role, vhost, id string, err error) {
	dot := strings.IndexByte(u, '.')
	if dot < 0 {
		return "", "", "", fmt.Errorf("%w %q: want {role}.{id}@{vhost}", ErrInvalidUsername, truncate(u))
	}
	role = Role(u[:dot])
	if !role.Valid() {
		return "", "", "", fmt.Errorf("%w %q: role must be %q or %q", ErrInvalidUsername, truncate(u), RoleCallee, RoleCaller)
	}
	rest := u[dot+1:]
	at := strings.IndexByte(rest, '@')
	if at < 0 {
		return "", "", "", fmt.Errorf("%w %q: want {role}.{id}@{vhost}", ErrInvalidUsername, truncate(u))
	}
	id, vhost = rest[:at], rest[at+1:]
	if err := ValidateID(id); err != nil {
		return "", "", "", fmt.Errorf("%w %q: %w", ErrInvalidUsername, truncate(u), err)
	}
	if vhost == "" {
		return "", "", "", fmt.Errorf("%w %q: empty vhost", ErrInvalidUsername, truncate(u))
	}
	return role, vhost, id, nil
}

// Domains separate these hashes from any other SHA-256 use.
const (
	sessionIDDomain       = "hcp.io/session-id/v2"
	legacySessionIDDomain = "hcp.io/session-id/v1"
)

// SessionID derives the session id for the task_submit with message id
// taskMessageID that caller callerID (the broker-validated user_id) sent
// to callee calleeID: the first 16 bytes of
//
//	SHA-256("hcp.io/session-id/v2" 0x00 calleeID 0x00 callerID 0x00 lowercase(taskMessageID))
//
// with the version nibble set to 4 and the variant bits to RFC 4122, in
// canonical lowercase form. It is a UUID v4 in form, not random: every
// duplicate of a task_submit (republished by the caller, or delivered to
// another replica of the callee) yields the same id, so the HCPSession named
// after it is the deduplication record. The caller is part of the key: two
// callers may pick the same message id, and one must neither be taken for a
// duplicate of the other nor be refused. The message id is lowercased
// because UUIDs are case-insensitive; ids never contain 0x00, so the
// encoding is unambiguous.
func SessionID(calleeID, callerID, taskMessageID string) string {
	return hashID(sessionIDDomain, calleeID, callerID, strings.ToLower(taskMessageID))
}

// LegacySessionID is the session id releases before the caller joined the
// key derived (SHA-256 of "hcp.io/session-id/v1", calleeID and the message
// id). A callee still looks it up for a task_submit it has no session for,
// so a task decided by an older sidecar and redelivered to a newer one is
// answered as the duplicate it is, never run twice; a caller recognises its
// sessions under either id while callees are upgraded.
func LegacySessionID(calleeID, taskMessageID string) string {
	return hashID(legacySessionIDDomain, calleeID, strings.ToLower(taskMessageID))
}

func hashID(domain string, parts ...string) string {
	h := sha256.New()
	h.Write([]byte(domain))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	var u uuid.UUID
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10xx (RFC 4122)
	return u.String()
}
