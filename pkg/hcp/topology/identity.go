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

// sessionIDDomain separates this hash from any other SHA-256 use.
const sessionIDDomain = "hcp.io/session-id/v1"

// SessionID derives the session id for the task_submit with message id
// taskMessageID received by callee calleeID: the first 16 bytes of
//
//	SHA-256("hcp.io/session-id/v1" 0x00 calleeID 0x00 lowercase(taskMessageID))
//
// with the version nibble set to 4 and the variant bits to RFC 4122, in
// canonical lowercase form. It is a UUID v4 in form, not random: every
// duplicate of a task_submit (republished by the caller, or delivered to
// another replica of the callee) yields the same id, so the HCPSession named
// after it is the deduplication record. The message id is lowercased
// because UUIDs are case-insensitive; ids never contain 0x00, so the
// encoding is unambiguous.
func SessionID(calleeID, taskMessageID string) string {
	h := sha256.New()
	h.Write([]byte(sessionIDDomain))
	h.Write([]byte{0})
	h.Write([]byte(calleeID))
	h.Write([]byte{0})
	h.Write([]byte(strings.ToLower(taskMessageID)))
	var u uuid.UUID
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x40 // version 4
	u[8] = (u[8] & 0x3f) | 0x80 // variant 10xx (RFC 4122)
	return u.String()
}
