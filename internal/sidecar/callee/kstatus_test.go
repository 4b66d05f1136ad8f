package callee

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

func kstatusOf(t *testing.T, hs *v1alpha1.HCPSession) *kstatus.Result {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(hs)
	must(t, err)
	res, err := kstatus.Compute(&unstructured.Unstructured{Object: m})
	must(t, err)
	return res
}

// TestSessionKstatus: HCPSessions as the real sidecar writes them, read
// from the API server, computed with kstatus: a paused session is
// InProgress, a completed one Current, a failed one Failed with the
// harness's reason in the message.
func TestSessionKstatus(t *testing.T) {
	b := newBed(t, bedOptions{})
	_, ok, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":4,"step_ms":50,"pause_at":2,"pause_ms":1500}`)
	}))
	_, bad, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":5,"step_ms":20,"fail_at":2}`) }))

	if res := kstatusOf(t, b.waitState(ok, v1alpha1.SessionPaused, 20*time.Second)); res.Status != kstatus.InProgressStatus {
		t.Errorf("PAUSED: kstatus %s %q", res.Status, res.Message)
	}
	if res := kstatusOf(t, b.waitState(ok, v1alpha1.SessionCompleted, 20*time.Second)); res.Status != kstatus.CurrentStatus {
		t.Errorf("COMPLETED: kstatus %s %q", res.Status, res.Message)
	}
	res := kstatusOf(t, b.waitState(bad, v1alpha1.SessionFailed, 20*time.Second))
	if res.Status != kstatus.FailedStatus || !strings.Contains(res.Message, "simulated_failure") {
		t.Errorf("FAILED: kstatus %s %q", res.Status, res.Message)
	}
}
