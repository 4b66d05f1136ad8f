package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// TestDuplicateCannotExtendToken: whoever can write hcpsessions/status (the
// sidecar's ServiceAccount does) cannot get a longer-lived session token
// out of a duplicate task_submit. The token's iat is the HCPSession's
// creationTimestamp and its exp adds spec.maxDuration, both immutable; the
// status fields are for display only.
func TestDuplicateCannotExtendToken(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, sid, pub := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`)
		ts.Constraints.MaxDuration = task.Duration(10 * time.Minute)
	}))
	first := b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	acc := acceptedOf(t, first)
	expect := token.Expectations{Issuer: calleeID, Audience: callerID, Subject: sid}
	claims, err := token.Verify(b.key.Public().(ed25519PublicKey), acc.SessionToken, expect, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	hs := b.waitState(sid, v1alpha1.SessionRunning, 5*time.Second)
	created := hs.CreationTimestamp.UTC()
	if !claims.IssuedAt.Equal(created) || !claims.ExpiresAt.Equal(created.Add(10*time.Minute)) || hs.Spec.MaxDuration != "PT10M" {
		t.Fatalf("claims iat %s exp %s; HCPSession created %s with maxDuration %s", claims.IssuedAt, claims.ExpiresAt, created, hs.Spec.MaxDuration)
	}
	if hs.Status.StartedAt == nil || !hs.Status.StartedAt.Equal(&hs.CreationTimestamp) || hs.Status.TokenExpiresAt == nil || !hs.Status.TokenExpiresAt.UTC().Equal(claims.ExpiresAt) {
		t.Fatalf("status startedAt %v tokenExpiresAt %v: want the token's times, for display", hs.Status.StartedAt, hs.Status.TokenExpiresAt)
	}

	// Someone holding the ServiceAccount's permissions rewrites the
	// status times, then replays the task_submit to get a fresh reply.
	tamper := client.RawPatch(types.MergePatchType, []byte(`{"status":{"startedAt":"2099-01-01T00:00:00Z","tokenExpiresAt":"2100-01-01T00:00:00Z"}}`))
	if err := b.env.Client.Status().Patch(t.Context(), hs, tamper); err != nil {
		t.Fatal(err)
	}
	b.publish(pub)
	testEventually(t, 20*time.Second, func() error {
		if n := countType(b.messages(sid), envelope.TypeTaskAccepted); n != 2 {
			return fmt.Errorf("%d task_accepted, want 2", n)
		}
		return nil
	})
	var replies []received
	for _, m := range b.messages(sid) {
		if m.env.Type == envelope.TypeTaskAccepted {
			replies = append(replies, m)
		}
	}
	if string(replies[1].d.Body) != string(first.d.Body) {
		t.Fatalf("the duplicate's reply differs from the original:\n%s\n%s", first.d.Body, replies[1].d.Body)
	}
	again, err := token.Verify(b.key.Public().(ed25519PublicKey), acceptedOf(t, replies[1]).SessionToken, expect, time.Now())
	if err != nil || !again.ExpiresAt.Equal(claims.ExpiresAt) {
		t.Fatalf("re-issued token: exp %v (%v), want %s", again.ExpiresAt, err, claims.ExpiresAt)
	}
	b.abort(sid, acc.SessionToken, "done")
	closedOf(t, b, sid)
}

// TestStateLabel: HCPSessions carry hcp.io/state equal to status.state, so
// `kubectl get hcps -l hcp.io/state=RUNNING` works, at the cost of one
// label write per state change the sidecar writes.
func TestStateLabel(t *testing.T) {
	b := newBed(t, bedOptions{})
	labelOf := func(sid string) string { return b.hcpSession(sid).Labels[v1alpha1.LabelSessionState] }
	selected := func(state v1alpha1.SessionState) map[string]bool {
		var list v1alpha1.HCPSessionList
		must(t, b.env.Client.List(t.Context(), &list, client.InNamespace(b.ns), client.MatchingLabels{v1alpha1.LabelSessionState: string(state)}))
		out := map[string]bool{}
		for _, hs := range list.Items {
			out[hs.Name] = true
		}
		return out
	}

	_, running, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":300,"step_ms":100}`) }))
	_, done, _ := b.submit(newSubmit(nil))
	_, rejected, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Capability = "teleport" }))
	closedOf(t, b, done)
	b.waitMessage(rejected, 20*time.Second, "task_rejected", isType(envelope.TypeTaskRejected))
	testbed.Eventually(t, 10*time.Second, "state labels", func(context.Context) error {
		for sid, want := range map[string]v1alpha1.SessionState{running: v1alpha1.SessionRunning, done: v1alpha1.SessionCompleted, rejected: v1alpha1.SessionRejected} {
			hs := b.hcpSession(sid)
			if got := hs.Labels[v1alpha1.LabelSessionState]; got != string(want) || hs.Status.State != want {
				return fmt.Errorf("session %s: label %q, state %q; want %s", sid, got, hs.Status.State, want)
			}
		}
		return nil
	})
	if s := selected(v1alpha1.SessionRunning); len(s) != 1 || !s[running] {
		t.Fatalf("-l hcp.io/state=RUNNING selects %v, want only %s", s, running)
	}
	// PENDING→RUNNING, RUNNING→COMPLETED, PENDING→RUNNING, PENDING→REJECTED
	// (PENDING is set at creation).
	if n := testutil.ToFloat64(b.metrics.LabelWrites.WithLabelValues("ok")); n != 4 {
		t.Fatalf("%v label writes, want 4 (one per state change after creation)", n)
	}

	// Abort the running one: it ends ABORTED, labelled so.
	acc := acceptedOf(t, b.waitMessage(running, time.Second, "task_accepted", isType(envelope.TypeTaskAccepted)))
	b.abort(running, acc.SessionToken, "stop")
	closedOf(t, b, running)
	testbed.Eventually(t, 10*time.Second, "ABORTED label", func(context.Context) error {
		if got := labelOf(running); got != string(v1alpha1.SessionAborted) {
			return fmt.Errorf("label %q", got)
		}
		return nil
	})
	if n := testutil.ToFloat64(b.metrics.LabelWrites.WithLabelValues("ok")); n < 5 || n > 6 {
		t.Fatalf("%v label writes after the abort, want 5 or 6 (ABORTING may be coalesced away)", n)
	}
	if n := testutil.ToFloat64(b.metrics.LabelWrites.WithLabelValues("error")); n != 0 {
		t.Fatalf("%v failed label writes", n)
	}
}
