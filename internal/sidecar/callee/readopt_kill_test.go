package callee

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// TestReadoptPausedTakeoverHarnessRunning: the sidecar took a released
// session over, handed the task with its checkpoint to its harness, and
// was SIGKILLed before it logged PAUSED -> RUNNING (the chaos suite's
// kill of the receiver of a hand-over lands there now and then). The
// restarted sidecar re-adopts the session PAUSED while its harness runs
// it: it resumes the session at once (the harness answers that it has
// it). Before, the whole run was reported into the PAUSED session, its
// completion was refused (409, no PAUSED -> COMPLETED), and the watchdog
// restarted the task from its checkpoint, once or more.
func TestReadoptPausedTakeoverHarnessRunning(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true, stateDirs: true})
	sid, body := b.handedOverOrphan(`{"steps":20,"step_ms":50,"checkpoint_every":2}`, 6)
	l, _, err := wal.Open(b.stateDir(b.pod))
	must(t, err)
	must(t, l.Adopt(sid, body, 7))
	must(t, l.Release())

	b.start()
	// The killed sidecar's hand-over reached the harness.
	var ht harnessTask
	must(t, json.Unmarshal(body, &ht))
	ht.Resume = &resumeInfo{CheckpointID: "drain-006", State: []byte(`{"step":6}`), Sequence: 7, Reason: reasonHarnessMoved}
	raw, _ := json.Marshal(ht)
	resp, err := http.Post(b.first.harnessSrv.URL+"/hcp/v1/tasks", "application/json", bytes.NewReader(raw))
	must(t, err)
	_ = resp.Body.Close()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	want := []string{"PAUSED>RUNNING:recovered_from_checkpoint", "RUNNING>COMPLETED:completed"}
	if tr := transitionsOf(b.events(sid)); !slices.Equal(tr, want) {
		t.Fatalf("transitions %v, want %v (%s)", tr, want, summary(b.messages(sid)))
	}
	if n, _ := b.harness.Starts(sid); n != 1 {
		t.Fatalf("the harness started the session %d times, want 1 (the hand-over it had already)", n)
	}
}

// handedOverOrphan is a session this pod claimed from a drain (PAUSED,
// harness_moved, owner epoch 2, sequence 7) with its task's inputs and a
// checkpoint at step, as a sidecar SIGKILLed in the middle of the
// takeover leaves it; it returns the session and its task body.
func (b *bed) handedOverOrphan(inputs string, step int) (string, []byte) {
	b.t.Helper()
	sid := b.orphan(b.pod, v1alpha1.SessionPaused, 7)
	hs := b.hcpSession(sid)
	hs.Status.Reason, hs.Status.OwnerEpoch = reasonHarnessMoved, 2
	must(b.t, b.env.Client.Status().Update(b.t.Context(), hs))
	body := orphanTask(b.t, sid, inputs)
	b.saveCheckpoint(sid, body, checkpoint.Checkpoint{ID: fmt.Sprintf("drain-%03d", step), Resumable: true, Sequence: 7, State: []byte(fmt.Sprintf(`{"step":%d}`, step))})
	return sid, body
}
