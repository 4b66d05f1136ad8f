package topology_test

import (
	"errors"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

func FuzzParseUsername(f *testing.F) {
	for _, s := range []string{
		"callee.lab-cvd@/hcp", "caller.alpha@/hcp", "callee.x@team.a@prod", "caller.a@/", "guest",
		"callee.@/hcp", "callee.x@", "caller..x@/hcp", "callee.a@b.c@d", "caller.A@/hcp", "\xff.x@/hcp", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		role, vhost, id, err := topology.ParseUsername(u)
		if err != nil {
			if !errors.Is(err, topology.ErrInvalidUsername) {
				t.Fatalf("error %v does not wrap ErrInvalidUsername", err)
			}
		} else {
			if !role.Valid() || vhost == "" || topology.ValidateID(id) != nil {
				t.Fatalf("ParseUsername(%q) accepted role %q, vhost %q, id %q", u, role, vhost, id)
			}
			if back := topology.Username(role, vhost, id); back != u {
				t.Fatalf("Username(ParseUsername(%q)) = %q", u, back)
			}
		}
		// Any non-empty string works as a vhost: the scheme stays
		// reversible whatever it contains.
		if u != "" {
			for _, r := range []topology.Role{topology.RoleCallee, topology.RoleCaller} {
				name := topology.Username(r, u, "x-1")
				r2, v2, id2, err := topology.ParseUsername(name)
				if err != nil || r2 != r || v2 != u || id2 != "x-1" {
					t.Fatalf("round trip of vhost %q: %q, %q, %q, %v", u, r2, v2, id2, err)
				}
			}
		}
	})
}

func FuzzParseEventRoutingKey(f *testing.F) {
	for _, s := range []string{
		"alpha." + sess + ".event", "alpha." + sess + ".task_completed", "alpha." + sess + ".task_submit",
		"alpha.#", "alpha.*.event", "a.b.c", "..", "alpha." + sess + ".event.x", "", "Alpha." + sess + ".event",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		caller, session, mt, err := topology.ParseEventRoutingKey(key)
		if err != nil {
			if !errors.Is(err, topology.ErrInvalidRoutingKey) {
				t.Fatalf("error %v does not wrap ErrInvalidRoutingKey", err)
			}
			return
		}
		if topology.ValidateID(caller) != nil || !envelope.IsUUIDv4(session) || !mt.IsEvent() {
			t.Fatalf("ParseEventRoutingKey(%q) accepted %q, %q, %q", key, caller, session, mt)
		}
		if back := topology.EventRoutingKey(caller, session, mt); back != key {
			t.Fatalf("EventRoutingKey(ParseEventRoutingKey(%q)) = %q", key, back)
		}
		// A parsed key reaches the caller's queue, and only the caller's.
		if !topicMatch(topology.EventBindingKey(caller), key) ||
			!topicMatch(topology.SessionBindingKey(caller, session), key) ||
			!topicMatch(topology.TypeBindingKey(caller, mt), key) ||
			topicMatch(topology.EventBindingKey(caller+"x"), key) {
			t.Fatalf("bindings do not route %q as intended", key)
		}
	})
}

func FuzzValidateID(f *testing.F) {
	for _, s := range []string{"a", "lab-cvd", "-a", "a.b", "A", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := topology.ValidateID(id)
		if err != nil && !errors.Is(err, topology.ErrInvalidID) {
			t.Fatalf("error %v does not wrap ErrInvalidID", err)
		}
		if err != nil {
			return
		}
		// A valid id is one routing-key word and a safe name part.
		for i := 0; i < len(id); i++ {
			switch c := id[i]; {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-', c == '_':
			default:
				t.Fatalf("ValidateID accepted %q", id)
			}
		}
		if len(id) > topology.MaxIDLength {
			t.Fatalf("ValidateID accepted %d characters", len(id))
		}
	})
}
