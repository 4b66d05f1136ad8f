//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// tsCallerID is the external Caller (no harness, so no caller sidecar
// consumes its event queue) the Timestamps step publishes raw task_submits
// as. The step admits it in the sample policy and removes both again, so
// the later steps find the namespace as they expect (DeleteCaller waits
// for the vhost to go with its last user).
const tsCallerID = "e2e-timestamps"

// timestamps: L1 asks for "ISO 8601 format in UTC" and shows
// 2025-01-15T08:30:00.000Z; the callee accepts any fractional precision
// (envelope.ParseTimestamp, issue 36). Raw task_submits whose envelope
// timestamp and constraints.deadline are written without a fraction
// (…T08:30:00Z) and with microseconds (…T08:30:00.123456Z) are published
// to the sample Callee over the broker, as a foreign caller would: each is
// answered task_accepted, and its HCPSession goes RUNNING and ends
// COMPLETED.
func (r *samplesRun) timestamps(t *testing.T) {
	ctx := t.Context()
	defer r.removeTimestampsCaller(t)
	r.admitTimestampsCaller(t, true)
	kit := &hcpv1alpha1.Caller{
		ObjectMeta: metav1.ObjectMeta{Name: tsCallerID, Namespace: r.ns},
		Spec:       hcpv1alpha1.CallerSpec{Broker: r.caller.Spec.Broker},
	}
	if err := r.c.Create(ctx, kit); err != nil {
		t.Fatalf("create Caller %s: %v", tsCallerID, err)
	}
	eventually(t, readyTimeout, "Caller "+tsCallerID+" Ready", func(ctx context.Context) error {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(kit), kit); err != nil {
			return err
		}
		if !meta.IsStatusConditionTrue(kit.Status.Conditions, hcpv1alpha1.ConditionReady) {
			return fmt.Errorf("%s", conditions(kit.Status.Conditions))
		}
		return nil
	})
	secret := &corev1.Secret{}
	if err := r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: kit.Status.CredentialsSecret}, secret); err != nil {
		t.Fatalf("the Caller's credentials Secret %q: %v", kit.Status.CredentialsSecret, err)
	}
	user := string(secret.Data[resource.CredentialsUsernameKey])
	conn, err := amqp.Dial(reachable(t, string(secret.Data[resource.CredentialsURIKey])))
	if err != nil {
		t.Fatalf("AMQP as %s: %v", user, err)
	}
	defer func() { _ = conn.Close() }()
	replies := consumeReplies(t, conn)
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}

	for _, form := range []struct{ name, layout string }{
		{"no fraction", "2006-01-02T15:04:05Z"},
		{"microseconds", "2006-01-02T15:04:05.000000Z"},
	} {
		now := time.Now().UTC().Truncate(time.Second).Add(123456789 * time.Nanosecond)
		ts := &task.TaskSubmit{
			CallerID: tsCallerID, CalleeID: calleeID, Capability: synthesis, Intent: "e2e: timestamp " + form.name,
			Inputs:      json.RawMessage(`{"recipe":"s3://lab/recipes/timestamps.yaml","steps":2,"step_ms":50}`),
			Constraints: task.Constraints{DataClassification: task.T1, Deadline: task.TimestampPtr(now.Add(time.Hour))},
		}
		p, stamp := rawTaskSubmit(t, now, form.layout, ts, user)
		if err := pub.PublishWithContext(ctx, topology.CommandsExchange, calleeID, false, false, p); err != nil {
			t.Fatalf("publish: %v", err)
		}
		sid := topology.SessionID(calleeID, tsCallerID, p.MessageId)
		t.Logf("%s: task_submit %s stamped %s (deadline %s), session %s", form.name, p.MessageId, stamp, ts.Constraints.Deadline.Time.Format(form.layout), sid)
		var answer *envelope.Envelope
		eventually(t, sessionTimeout, form.name+": the task's answer", func(context.Context) error {
			answer = replies.answer(sid)
			if answer == nil {
				return errors.New("no task_accepted or task_rejected yet")
			}
			return nil
		})
		if answer.Type != envelope.TypeTaskAccepted {
			t.Fatalf("%s: a task_submit stamped %s was answered %s: %s", form.name, stamp, answer.Type, answer.Payload)
		}
		var seen []hcpv1alpha1.SessionState
		eventually(t, sessionTimeout, form.name+": HCPSession "+sid+" COMPLETED", func(ctx context.Context) error {
			hs, err := r.session(ctx, sid)
			if err != nil {
				return err
			}
			if st := hs.Status.State; len(seen) == 0 || seen[len(seen)-1] != st {
				seen = append(seen, st)
			}
			if hs.Status.State != hcpv1alpha1.SessionCompleted {
				return fmt.Errorf("state %q (%s)", hs.Status.State, hs.Status.Message)
			}
			return nil
		})
		t.Logf("%s: task_accepted; HCPSession states seen %v", form.name, seen)
		if slices.Contains(seen, hcpv1alpha1.SessionRejected) || slices.Contains(seen, hcpv1alpha1.SessionFailed) {
			t.Errorf("%s: the session passed through %v", form.name, seen)
		}
	}
}

// rawTaskSubmit encodes ts as a task_submit at now and rewrites its
// envelope timestamp and constraints.deadline with layout, as a foreign
// caller might write them (this project writes milliseconds).
func rawTaskSubmit(t *testing.T, now time.Time, layout string, ts *task.TaskSubmit, userID string) (amqp.Publishing, string) {
	t.Helper()
	env, err := envelope.NewAt(now, envelope.TypeTaskSubmit, "", ts)
	if err != nil {
		t.Fatal(err)
	}
	body, err := envelope.Encode(env)
	if err != nil {
		t.Fatal(err)
	}
	stamp := now.Format(layout)
	for old, new := range map[string]string{
		`"timestamp":"` + envelope.FormatTimestamp(now) + `"`:                         `"timestamp":"` + stamp + `"`,
		`"deadline":"` + envelope.FormatTimestamp(ts.Constraints.Deadline.Time) + `"`: `"deadline":"` + ts.Constraints.Deadline.Time.Format(layout) + `"`,
	} {
		if bytes.Count(body, []byte(old)) != 1 {
			t.Fatalf("%s is not in the encoded task_submit once: %s", old, body)
		}
		body = bytes.Replace(body, []byte(old), []byte(new), 1)
	}
	return envelope.ToPublishing(env, body, userID), stamp
}

// replyLog is what arrived on the Caller's event queue, by session.
type replyLog struct {
	mu       sync.Mutex
	answers  map[string]*envelope.Envelope
	problems []string
}

func (l *replyLog) answer(sid string) *envelope.Envelope {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers[sid]
}

// consumeReplies consumes the Caller's event queue, acknowledging every
// message, and keeps each session's task_accepted or task_rejected.
func consumeReplies(t *testing.T, conn *amqp.Connection) *replyLog {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ch.Consume(topology.EventQueue(tsCallerID), "e2e-timestamps", false, false, false, false, nil)
	if err != nil {
		t.Fatalf("consume %s: %v", topology.EventQueue(tsCallerID), err)
	}
	l := &replyLog{answers: map[string]*envelope.Envelope{}}
	go func() {
		for d := range ds {
			_ = d.Ack(false)
			env, err := envelope.FromDelivery(d, 0)
			l.mu.Lock()
			switch {
			case err != nil:
				l.problems = append(l.problems, err.Error())
			case env.Type == envelope.TypeTaskAccepted || env.Type == envelope.TypeTaskRejected:
				l.answers[env.Session()] = env
			}
			l.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.mu.Lock()
		defer l.mu.Unlock()
		if len(l.problems) > 0 {
			t.Errorf("invalid messages on %s: %q", topology.EventQueue(tsCallerID), l.problems)
		}
	})
	return l
}

// admitTimestampsCaller adds tsCallerID to (or removes it from) the ids
// of every rule of the sample policy.
func (r *samplesRun) admitTimestampsCaller(t *testing.T, admit bool) {
	t.Helper()
	eventually(t, 30*time.Second, "the sample policy updated", func(ctx context.Context) error {
		p := &hcpv1alpha1.CapabilityPolicy{}
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.policy), p); err != nil {
			return err
		}
		for i := range p.Spec.Rules {
			ids := slices.DeleteFunc(p.Spec.Rules[i].Callers.IDs, func(id string) bool { return id == tsCallerID })
			if admit {
				ids = append(ids, tsCallerID)
			}
			p.Spec.Rules[i].Callers.IDs = ids
		}
		return r.c.Update(ctx, p)
	})
}

// removeTimestampsCaller deletes the step's Caller and waits until it and
// its broker user are gone, then takes it out of the policy again.
func (r *samplesRun) removeTimestampsCaller(t *testing.T) {
	t.Helper()
	kit := &hcpv1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: tsCallerID, Namespace: r.ns}}
	if err := r.c.Delete(t.Context(), kit); err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("delete Caller %s: %v", tsCallerID, err)
	}
	user := topology.Username(topology.RoleCaller, r.vhost, tsCallerID)
	eventually(t, deleteTimeout, "Caller "+tsCallerID+" and its broker user gone", func(ctx context.Context) error {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(kit), &hcpv1alpha1.Caller{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Caller still there (%v)", err)
		}
		if _, err := r.broker.API.GetUser(user); !testbed.IsNotFound(err) {
			return fmt.Errorf("user %s still there (%v)", user, err)
		}
		return nil
	})
	r.admitTimestampsCaller(t, false)
}
