package topology_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

const sess = "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e"

func TestConstants(t *testing.T) {
	for got, want := range map[string]string{
		topology.CommandsExchange:     "hcp.commands",
		topology.CommandsExchangeType: "direct",
		topology.EventsExchange:       "hcp.events",
		topology.EventsExchangeType:   "topic",
		topology.DefaultVhost:         "/hcp",
		topology.IDPattern:            `^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$`,
	} {
		if got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if topology.DefaultEventMessageTTL.Milliseconds() != 86400000 {
		t.Errorf("DefaultEventMessageTTL = %v", topology.DefaultEventMessageTTL)
	}
}

func TestValidateID(t *testing.T) {
	valid := []string{"a", "0", "lab-cvd", "alpha", "a_b", "a-b_c-9", "9lives", strings.Repeat("a", 63), "a" + strings.Repeat("-", 61) + "z"}
	invalid := []string{"", "-a", "a-", "_a", "a_", "A", "Alpha", "a.b", "a*b", "a#b", "a@b", "a b", "a/b", "é", strings.Repeat("a", 64), "a\x00", "a\n"}
	for _, id := range valid {
		if err := topology.ValidateID(id); err != nil {
			t.Errorf("ValidateID(%q) = %v", id, err)
		}
	}
	for _, id := range invalid {
		err := topology.ValidateID(id)
		if !errors.Is(err, topology.ErrInvalidID) {
			t.Errorf("ValidateID(%q) = %v, want ErrInvalidID", id, err)
		}
	}
}

func TestNames(t *testing.T) {
	for _, c := range []struct{ got, want string }{
		{topology.CommandQueue("lab-cvd"), "hcp.cmd.lab-cvd"},
		{topology.EventQueue("alpha"), "hcp.evt.alpha"},
		{topology.CommandRoutingKey("lab-cvd"), "lab-cvd"},
		{topology.EventRoutingKey("alpha", sess, envelope.TypeEvent), "alpha." + sess + ".event"},
		{topology.EventBindingKey("alpha"), "alpha.#"},
		{topology.SessionBindingKey("alpha", sess), "alpha." + sess + ".#"},
		{topology.TypeBindingKey("alpha", envelope.TypeTaskCompleted), "alpha.*.task_completed"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}

// topicMatch is AMQP topic matching ('*' one word, '#' zero or more), so
// the tests can show that keys and bindings route as L1 intends.
func topicMatch(binding, key string) bool {
	var match func(b, k []string) bool
	match = func(b, k []string) bool {
		if len(b) == 0 {
			return len(k) == 0
		}
		switch b[0] {
		case "#":
			for i := 0; i <= len(k); i++ {
				if match(b[1:], k[i:]) {
					return true
				}
			}
			return false
		case "*":
			return len(k) > 0 && match(b[1:], k[1:])
		}
		return len(k) > 0 && b[0] == k[0] && match(b[1:], k[1:])
	}
	return match(strings.Split(binding, "."), strings.Split(key, "."))
}

func TestEventRouting(t *testing.T) {
	other := "0b7c2c2e-5f0e-4f0a-9b1e-2d1f4f1e6c3a"
	key := topology.EventRoutingKey("alpha", sess, envelope.TypeTaskCompleted)
	for _, c := range []struct {
		binding string
		want    bool
	}{
		{topology.EventBindingKey("alpha"), true},
		{topology.EventBindingKey("alpha2"), false},
		{topology.EventBindingKey("alph"), false},
		{topology.SessionBindingKey("alpha", sess), true},
		{topology.SessionBindingKey("alpha", other), false},
		{topology.TypeBindingKey("alpha", envelope.TypeTaskCompleted), true},
		{topology.TypeBindingKey("alpha", envelope.TypeEvent), false},
		{topology.TypeBindingKey("beta", envelope.TypeTaskCompleted), false},
	} {
		if got := topicMatch(c.binding, key); got != c.want {
			t.Errorf("binding %q matches %q: %v, want %v", c.binding, key, got, c.want)
		}
	}
}

func TestParseEventRoutingKey(t *testing.T) {
	for _, typ := range envelope.Types() {
		key := topology.EventRoutingKey("alpha", sess, typ)
		caller, session, mt, err := topology.ParseEventRoutingKey(key)
		if typ.IsCommand() {
			if !errors.Is(err, topology.ErrInvalidRoutingKey) {
				t.Errorf("%s: command type accepted on the event channel: %v", key, err)
			}
			continue
		}
		if err != nil || caller != "alpha" || session != sess || mt != typ {
			t.Errorf("ParseEventRoutingKey(%q) = %q, %q, %q, %v", key, caller, session, mt, err)
		}
	}
	for _, key := range []string{
		"",
		"alpha",
		"alpha." + sess,
		"alpha." + sess + ".event.extra",
		"alpha.#",
		"alpha.*.event",
		"Alpha." + sess + ".event",
		"." + sess + ".event",
		"alpha.session-xyz.event",
		"alpha.550e8400-e29b-11d4-a716-446655440000.event",
		"alpha." + sess + ".progress",
		"alpha." + sess + ".",
		"alpha." + sess + ".EVENT",
	} {
		if _, _, _, err := topology.ParseEventRoutingKey(key); !errors.Is(err, topology.ErrInvalidRoutingKey) {
			t.Errorf("ParseEventRoutingKey(%q) = %v, want ErrInvalidRoutingKey", key, err)
		}
	}
	// The id error is kept in the chain.
	if _, _, _, err := topology.ParseEventRoutingKey("A." + sess + ".event"); !errors.Is(err, topology.ErrInvalidID) {
		t.Errorf("bad caller id: %v does not wrap ErrInvalidID", err)
	}
}

func TestUsername(t *testing.T) {
	for _, c := range []struct {
		role      topology.Role
		vhost, id string
		want      string
	}{
		{topology.RoleCallee, "/hcp", "lab-cvd", "callee.lab-cvd@/hcp"},
		{topology.RoleCaller, "/hcp", "alpha", "caller.alpha@/hcp"},
		{topology.RoleCaller, "/", "a", "caller.a@/"},
		{topology.RoleCallee, "team.a@prod", "x_1", "callee.x_1@team.a@prod"},
		{topology.RoleCaller, "a.b.c", "z", "caller.z@a.b.c"},
		{topology.RoleCallee, "日本", "x", "callee.x@日本"},
	} {
		u := topology.Username(c.role, c.vhost, c.id)
		if u != c.want {
			t.Errorf("Username(%s, %q, %q) = %q, want %q", c.role, c.vhost, c.id, u, c.want)
		}
		role, vhost, id, err := topology.ParseUsername(u)
		if err != nil || role != c.role || vhost != c.vhost || id != c.id {
			t.Errorf("ParseUsername(%q) = %q, %q, %q, %v", u, role, vhost, id, err)
		}
	}
	for _, u := range []string{
		"", "guest", "callee", "callee.", "callee.x", "callee.x@", "callee.@/hcp", "admin.x@/hcp",
		"Callee.x@/hcp", "callee.X@/hcp", ".x@/hcp", "callee.a.b@/hcp", "callee.-x@/hcp",
		"caller@x.y", "callee." + strings.Repeat("a", 64) + "@/hcp",
	} {
		if _, _, _, err := topology.ParseUsername(u); !errors.Is(err, topology.ErrInvalidUsername) {
			t.Errorf("ParseUsername(%q) = %v, want ErrInvalidUsername", u, err)
		}
	}
	if !topology.RoleCallee.Valid() || !topology.RoleCaller.Valid() || topology.Role("admin").Valid() {
		t.Error("Role.Valid")
	}
}

func TestPermissions(t *testing.T) {
	callee := topology.CalleePermissions("lab-cvd")
	if callee != (topology.Permissions{Configure: "^$", Write: `^hcp\.events$`, Read: `^hcp\.cmd\.lab-cvd$`}) {
		t.Errorf("CalleePermissions = %+v", callee)
	}
	caller := topology.CallerPermissions("alpha")
	if caller != (topology.Permissions{Configure: "^$", Write: `^hcp\.commands$`, Read: `^hcp\.evt\.alpha$`}) {
		t.Errorf("CallerPermissions = %+v", caller)
	}
	if topology.PermissionsFor(topology.RoleCallee, "lab-cvd") != callee || topology.PermissionsFor(topology.RoleCaller, "alpha") != caller {
		t.Error("PermissionsFor disagrees")
	}

	// What the regexes admit, as RabbitMQ would evaluate them against
	// resource names.
	type access struct {
		re       string
		resource string
		want     bool
	}
	checks := []access{
		{callee.Configure, "hcp.cmd.lab-cvd", false},
		{callee.Configure, "", true}, // "^$" matches only the empty name: nothing real
		{callee.Write, "hcp.events", true},
		{callee.Write, "hcp.commands", false},
		{callee.Write, "hcpXevents", false},
		{callee.Write, "hcp.events.x", false},
		{callee.Read, "hcp.cmd.lab-cvd", true},
		{callee.Read, "hcp.cmd.lab-cvd2", false},
		{callee.Read, "hcp.cmd.lab", false},
		{callee.Read, "hcpXcmdXlab-cvd", false},
		{callee.Read, "hcp.evt.lab-cvd", false},
		{caller.Write, "hcp.commands", true},
		{caller.Write, "hcp.events", false},
		{caller.Read, "hcp.evt.alpha", true},
		{caller.Read, "hcp.evt.alphabet", false},
		{caller.Read, "hcp.cmd.alpha", false},
	}
	for _, c := range checks {
		if got := regexp.MustCompile(c.re).MatchString(c.resource); got != c.want {
			t.Errorf("%s on %q = %v, want %v", c.re, c.resource, got, c.want)
		}
	}
}

func TestSessionID(t *testing.T) {
	const mid = "550e8400-e29b-41d4-a716-446655440000"
	a := topology.SessionID("lab-cvd", "alpha", mid)
	if !envelope.IsUUIDv4(a) || a != strings.ToLower(a) {
		t.Fatalf("SessionID = %q, not a lowercase UUID v4", a)
	}
	// Pinned (computed independently with Python's hashlib): the
	// derivation names stored objects (HCPSessions), so it must never
	// change silently.
	if want := "9edda22a-ab3f-4e16-abb0-f7dc8c5bd281"; a != want {
		t.Errorf("SessionID(lab-cvd, alpha, %s) = %s, want %s", mid, a, want)
	}
	if want, got := "115fd224-78d5-4721-8612-ab4467c4a51c", topology.LegacySessionID("lab-cvd", mid); got != want {
		t.Errorf("LegacySessionID(lab-cvd, %s) = %s, want %s", mid, got, want)
	}
	if b := topology.SessionID("lab-cvd", "alpha", mid); a != b {
		t.Errorf("not deterministic: %s vs %s", a, b)
	}
	if b := topology.SessionID("lab-cvd", "alpha", strings.ToUpper(mid)); a != b {
		t.Errorf("message id case changes the session: %s vs %s", a, b)
	}
	if b := topology.SessionID("lab-cvd2", "alpha", mid); a == b {
		t.Error("different callees share a session id")
	}
	// Two callers may pick the same message id: their tasks are distinct.
	if b := topology.SessionID("lab-cvd", "beta", mid); a == b {
		t.Error("different callers share a session id")
	}
	if b := topology.SessionID("lab-cvd", "alpha", "650e8400-e29b-41d4-a716-446655440000"); a == b {
		t.Error("different messages share a session id")
	}
	// The separators keep the parts from running together.
	if topology.SessionID("ab", "c", "d") == topology.SessionID("a", "bc", "d") || topology.SessionID("a", "bc", "d") == topology.SessionID("a", "b", "cd") {
		t.Error("ambiguous encoding")
	}
	seen := map[string]bool{}
	for range 10000 {
		s := topology.SessionID("callee", "caller", envelope.NewMessageID())
		if !envelope.IsUUIDv4(s) {
			t.Fatalf("%q is not a UUID v4", s)
		}
		if seen[s] {
			t.Fatalf("collision on %s", s)
		}
		seen[s] = true
	}
}

func TestDeadLetterNames(t *testing.T) {
	for in, want := range map[string]string{
		topology.CommandQueue("lab"): "hcp.dlq.cmd.lab",
		topology.EventQueue("alpha"): "hcp.dlq.evt.alpha",
		"other":                      "",
		"hcp.dlq.evt.alpha":          "",
	} {
		if got := topology.DeadLetterQueue(in); got != want {
			t.Errorf("DeadLetterQueue(%q) = %q, want %q", in, got, want)
		}
	}
	if topology.EventDeadLetterKey("lab") != "lab.*.*" || topology.CommandDeadLetterKey("lab") != "lab" {
		t.Errorf("dead-letter keys %q, %q", topology.EventDeadLetterKey("lab"), topology.CommandDeadLetterKey("lab"))
	}
}
