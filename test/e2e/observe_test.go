//go:build e2e

package e2e

import (
	"context"
	"net/http"
	"sort"
	"sync"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
	"github.com/hcp-io/hcp-operator/test/checker"
)

// The chaos suite's independent observers (test/checker): a tap queue on
// the run's events exchange records the wire, with each message's
// broker-validated user-id and owner epoch; the sample caller app's record
// is what the app received; the HCPSessions are the callee's view. None
// of them is a sidecar's own count.

// tap records every message published to the run's hcp.events exchange.
type tap struct {
	mu   sync.Mutex
	msgs []checker.Message
	bad  []string
}

// startTap binds a queue of its own user to hcp.events with "#" and
// records until t ends.
func (s *suite) startTap(t *testing.T) *tap {
	t.Helper()
	user, pass := "hcp-tap-"+s.id, testbed.RandomName("")
	mgmt := func(_ *http.Response, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("tap: %v", err)
		}
	}
	mgmt(s.broker.API.PutUser(user, rabbithole.UserSettings{Password: pass, Tags: rabbithole.UserTags{}}))
	t.Cleanup(func() { _ = s.broker.DeleteUsers(user) })
	mgmt(s.broker.API.UpdatePermissionsIn(s.vhost, user, rabbithole.Permissions{
		Configure: `^hcp-tap\.`, Write: `^hcp-tap\.`, Read: `^(hcp-tap\..*|` + topology.EventsExchange + `)$`,
	}))
	conn, err := amqp.Dial(s.broker.AMQPURI(user, pass, s.vhost))
	if err != nil {
		t.Fatalf("tap: %v", err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatalf("tap: %v", err)
	}
	q := "hcp-tap." + s.id
	if _, err := ch.QueueDeclare(q, false, true, true, false, nil); err != nil {
		t.Fatalf("tap: declare %s: %v", q, err)
	}
	if err := ch.QueueBind(q, "#", topology.EventsExchange, false, nil); err != nil {
		t.Fatalf("tap: bind %s: %v", q, err)
	}
	deliveries, err := ch.Consume(q, "", true, true, false, false, nil)
	if err != nil {
		t.Fatalf("tap: consume: %v", err)
	}
	tp := &tap{}
	go func() {
		for d := range deliveries {
			m, err := checker.FromWire(d.Body, d.Headers, d.UserId, time.Now())
			tp.mu.Lock()
			if err != nil {
				tp.bad = append(tp.bad, err.Error())
			} else {
				tp.msgs = append(tp.msgs, m)
			}
			tp.mu.Unlock()
		}
	}()
	return tp
}

// of returns what the tap recorded for the sessions ids, and the messages
// it could not read.
func (tp *tap) of(ids []string) ([]checker.Message, []string) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []checker.Message
	for _, m := range tp.msgs {
		if want[m.Session] {
			out = append(out, m)
		}
	}
	return out, append([]string(nil), tp.bad...)
}

// delivered is what the app received of the sessions ids, in the order it
// received them, duplicates included.
func delivered(t *testing.T, snap samplecaller.Snapshot, ids []string) []checker.Message {
	t.Helper()
	var out []checker.Message
	for _, id := range ids {
		s := snap.Sessions[id]
		if s == nil {
			continue
		}
		all := append(append([]samplecaller.Received(nil), s.Messages...), s.Repeated...)
		sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
		for _, r := range all {
			m, err := checker.FromApp(id, r.MessageID, r.Type, r.Payload, r.At)
			if err != nil {
				t.Errorf("checker: the app's record of session %s: %v", id, err)
				continue
			}
			out = append(out, m)
		}
	}
	return out
}

// judge runs the checker over the sessions ids: the tap's wire, the app's
// stream and each observer's view of how the session ended. It fails t on
// any violation and returns how many there were.
func (r *samplesRun) judge(t *testing.T, tp *tap, ids []string, snap samplecaller.Snapshot) int {
	t.Helper()
	// The tap sees a message when the broker routes it; give the last ones
	// a moment to arrive.
	time.Sleep(time.Second)
	pub, bad := tp.of(ids)
	for _, b := range bad {
		t.Errorf("checker: the tap could not read a message: %s", b)
	}
	views := map[string]map[string]string{"app": {}, "hcpsession": {}}
	for _, id := range ids {
		if s := snap.Sessions[id]; s != nil {
			views["app"][id] = s.FinalState
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		hs, err := r.session(ctx, id)
		cancel()
		if err != nil {
			t.Errorf("checker: HCPSession %s: %v", id, err)
			continue
		}
		views["hcpsession"][id] = string(hs.Status.State)
	}
	v := checker.Check(checker.History{Published: pub, Delivered: delivered(t, snap, ids), Terminal: views})
	for _, x := range v {
		t.Errorf("checker: %s", x)
	}
	t.Logf("checker: %d messages on the wire, %d violations", len(pub), len(v))
	return len(v)
}
