package callee

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// startSlow submits a task that runs for a while and waits for its first
// progress event.
func (b *bed) startSlow(inputs string) string {
	b.t.Helper()
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(inputs)
		ts.Constraints.MaxDuration = task.Duration(10 * time.Minute)
	}))
	b.waitMessage(sid, 20*time.Second, "a progress event", isEvent(session.EventProgress))
	return sid
}

// claimAs writes a claim of sid by another replica, as a takeover does:
// the next owner epoch, and pod as the owner.
func (b *bed) claimAs(sid, pod string, epoch int64) {
	b.t.Helper()
	patch := fmt.Appendf(nil, `{"status":{"ownerEpoch":%d,"podName":%q}}`, epoch, pod)
	must(b.t, b.env.Client.Status().Patch(b.t.Context(), &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Namespace: b.ns, Name: sid}}, client.RawPatch(types.MergePatchType, patch)))
}

// waitEpoch waits until the session's stored owner epoch is epoch.
func (b *bed) waitEpoch(sid string, epoch int64) {
	b.t.Helper()
	testEventually(b.t, 10*time.Second, func() error {
		if hs := b.hcpSession(sid); hs.Status.OwnerEpoch != epoch {
			return fmt.Errorf("status.ownerEpoch %d, want %d", hs.Status.OwnerEpoch, epoch)
		}
		return nil
	})
}

// Every message a replica publishes for a session carries the owner epoch
// it claimed the session with; the decision is the first claim.
func TestMessagesCarryTheOwnerEpoch(t *testing.T) {
	b := newBed(t, bedOptions{})
	sid := b.startSlow(`{"steps":3,"step_ms":50}`)
	b.waitMessage(sid, 30*time.Second, "session_closed", isEvent(session.EventSessionClosed))
	for _, m := range b.messages(sid) {
		if got := ownerEpoch(m.d.Headers); got != 1 {
			t.Fatalf("%s carries owner epoch %d (headers %v), want 1", m.env.Type, got, m.d.Headers)
		}
	}
	if hs := b.waitState(sid, v1alpha1.SessionCompleted, 20*time.Second); hs.Status.OwnerEpoch != 1 {
		t.Fatalf("status.ownerEpoch = %d, want 1", hs.Status.OwnerEpoch)
	}
}

// A replica that sees a higher owner epoch for its session (here the same
// pod name, as a StatefulSet's replacement pod has, so the pod name alone
// cannot tell) stops publishing, tells its harness to stop with
// ownership_lost, and answers the harness's calls 409 ownership_lost.
func TestHigherEpochStopsTheZombie(t *testing.T) {
	b := newBed(t, bedOptions{})
	sid := b.startSlow(`{"steps":400,"step_ms":50}`)
	b.waitEpoch(sid, 1)
	b.claimAs(sid, b.pod, 2)
	testEventually(t, 10*time.Second, func() error {
		if !slices.Contains(b.harness.Stops(sid), samplecallee.OwnershipLost) {
			return fmt.Errorf("the harness got stop requests %v, want %s", b.harness.Stops(sid), samplecallee.OwnershipLost)
		}
		return nil
	})
	time.Sleep(300 * time.Millisecond) // what was in flight arrives
	n := len(b.messages(sid))
	time.Sleep(time.Second)
	if ms := b.messages(sid); len(ms) != n {
		t.Fatalf("the replica published after it lost the session: %s", summary(ms[n:]))
	}
	a := b.call("POST", "/hcp/v1/sessions/"+sid+"/events", "application/json", `{"event_type":"log","data":{"level":"info","message":"late"}}`)
	if a.status != 409 || errCode(a) != codeOwnershipLost {
		t.Fatalf("a late event got %d %v, want 409 %s", a.status, a.body, codeOwnershipLost)
	}
	if hs := b.hcpSession(sid); hs.Status.OwnerEpoch != 2 || hs.Status.State != v1alpha1.SessionRunning {
		t.Fatalf("the zombie wrote the session: epoch %d, state %s", hs.Status.OwnerEpoch, hs.Status.State)
	}
}
