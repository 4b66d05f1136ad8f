package callee

import (
	"bytes"
	"encoding/json"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The kill points of a takeover of a released session (adopt.go takeOver:
// the claim on the HCPSession, then the log's open record, then the task
// to the harness, then PAUSED -> RUNNING in the log), as a restart of the
// sidecar in the same pod finds them. The log records no owner epoch: a
// restart claims the session again (reclaim: the stored epoch + 1), so
// nothing it writes afterwards may fail the epoch check and lose the
// session while the HCPSession still names this pod.

// TestRestartAfterClaimBeforeLogResumes: the sidecar wrote its claim (pod
// and epoch on the HCPSession) and was SIGKILLed before the log's open
// record. The restarted sidecar finds the session naming its pod and not in
// its log: the startup sweep takes it over again (a higher epoch) and
// resumes it from its checkpoint, rather than leaving it to wait for the
// pod's Lease to expire.
func TestRestartAfterClaimBeforeLogResumes(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true, stateDirs: true})
	sid, _ := b.handedOverOrphan(`{"steps":6,"step_ms":20,"checkpoint_every":1}`, 3)
	_ = b.stateDir(b.pod) // an empty log: the open record was never written

	b.start()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	want := []string{"PAUSED>RUNNING:recovered_from_checkpoint", "RUNNING>COMPLETED:completed"}
	if tr := transitionsOf(b.events(sid)); !slices.Equal(tr, want) {
		t.Fatalf("transitions %v, want %v (%s)", tr, want, summary(b.messages(sid)))
	}
	if hs := b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second); hs.Status.PodName != b.pod || hs.Status.OwnerEpoch != 3 {
		t.Fatalf("owner %q epoch %d, want %q at epoch 3", hs.Status.PodName, hs.Status.OwnerEpoch, b.pod)
	}
	for _, m := range b.messages(sid) {
		if e := ownerEpoch(m.d.Headers); e != 3 {
			t.Fatalf("a %s was published at epoch %d, want 3", m.env.Type, e)
		}
	}
}

// TestReadoptAfterTakeoverWritesUnderTheNewEpoch: the sidecar took the
// session over at epoch 5 (its claim on the HCPSession, its checkpoint
// record of that epoch), logged it, handed the task to its harness and went
// RUNNING, then was SIGKILLed; its harness runs on. The restarted sidecar
// re-adopts it at epoch 6 and every conditional write it makes passes the
// epoch check: the status, the checkpoints (over the record of epoch 5),
// the sequence ceiling (reserved one event ahead, so the second event
// raises it). The session completes here; the harness is never told
// ownership_lost and is not started again.
func TestReadoptAfterTakeoverWritesUnderTheNewEpoch(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true, stateDirs: true})
	sid := b.orphan(b.pod, v1alpha1.SessionRunning, 7)
	hs := b.hcpSession(sid)
	hs.Annotations[AnnotationSequenceCeiling] = "8"
	must(t, b.env.Client.Update(t.Context(), hs))
	hs.Status.Reason, hs.Status.OwnerEpoch = reasonRecovered, 5
	must(t, b.env.Client.Status().Update(t.Context(), hs))
	body := orphanTask(t, sid, `{"steps":10,"step_ms":40,"checkpoint_every":1}`)
	b.saveCheckpoint(sid, body, checkpoint.Checkpoint{ID: "drain-004", Resumable: true, Sequence: 6, State: []byte(`{"step":4}`)})
	l, _, err := wal.Open(b.stateDir(b.pod))
	must(t, err)
	must(t, l.Adopt(sid, body, 6))
	must(t, l.Append(sid, wal.Message{Index: 1, Seq: 7, State: string(session.StateRunning),
		RoutingKey: topology.EventRoutingKey(callerID, sid, envelope.TypeEvent)}))
	must(t, l.Confirm(sid, 1))
	must(t, l.Release())

	b.start()
	// The killed sidecar's hand-over reached the harness.
	var ht harnessTask
	must(t, json.Unmarshal(body, &ht))
	ht.Resume = &resumeInfo{CheckpointID: "drain-004", State: []byte(`{"step":4}`), Sequence: 6, Reason: reasonHarnessMoved}
	raw, _ := json.Marshal(ht)
	resp, err := http.Post(b.first.harnessSrv.URL+"/hcp/v1/tasks", "application/json", bytes.NewReader(raw))
	must(t, err)
	_ = resp.Body.Close()

	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	if stops := b.harness.Stops(sid); slices.Contains(stops, codeOwnershipLost) {
		t.Fatalf("the harness was told %v: the restarted sidecar lost its own session", stops)
	}
	if n, _ := b.harness.Starts(sid); n != 1 {
		t.Fatalf("the harness started the session %d times, want 1 (the hand-over it had already)", n)
	}
	hs = b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second)
	if hs.Status.PodName != b.pod || hs.Status.OwnerEpoch != 6 {
		t.Fatalf("owner %q epoch %d, want %q at epoch 6", hs.Status.PodName, hs.Status.OwnerEpoch, b.pod)
	}
	if c := storedCeiling(hs); c <= 8 {
		t.Fatalf("sequence ceiling %d: never raised past the one reserved before the restart", c)
	}
	evs := b.events(sid)
	for i, e := range evs {
		if e.Sequence != int64(8+i) {
			t.Fatalf("event %d (%s) has sequence %d, want %d (%s)", i, e.EventType, e.Sequence, 8+i, summary(b.messages(sid)))
		}
	}
	for _, m := range b.messages(sid) {
		if e := ownerEpoch(m.d.Headers); e != 6 {
			t.Fatalf("a %s was published at epoch %d, want 6", m.env.Type, e)
		}
	}
}
