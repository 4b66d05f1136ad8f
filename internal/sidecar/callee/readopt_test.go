package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// isStateChange matches the state_changed event from → to for reason.
func isStateChange(from, to session.State, reason string) func(received) bool {
	return func(m received) bool {
		if m.env.Type != envelope.TypeEvent {
			return false
		}
		e := eventOf(m)
		var d session.StateChangedData
		return e.EventType == session.EventStateChanged && json.Unmarshal(e.Data, &d) == nil &&
			d.FromState == from && d.ToState == to && d.Reason == reason
	}
}

// TestSidecarSIGKILLAfterTakeoverReadoptsTask (issue 34): pod A is
// drained and pod B's sidecar takes the session over; right after it
// handed the task to its harness, B's sidecar is SIGKILLed and restarted
// in the same pod (same state directory), its harness running on. The
// restarted sidecar re-adopts the session from its write-ahead log with
// the task it took over: the harness's checkpoints are accepted (before,
// the log had no task, every checkpoint answered 503 and the harness
// stalled), and when the harness then loses the task, the session is
// resumed from its checkpoint, not failed harness_lost. It completes with
// every step reported once and no gap.
func TestSidecarSIGKILLAfterTakeoverReadoptsTask(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	bin := buildCmds(t, "hcp-sidecar")
	a := b.startReplica("pod-a")
	b.first = a
	const steps = 60
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(fmt.Sprintf(`{"steps":%d,"step_ms":60,"checkpoint_every":1}`, steps))
	}))
	b.waitMessage(sid, 20*time.Second, "the fifth event", func(m received) bool {
		return m.env.Type == envelope.TypeEvent && eventOf(m).Sequence >= 5
	})

	// Pod B: the sidecar binary, and a harness that outlives its restart.
	// The harness's port is bound before the sidecar's are picked.
	hsrv := httptest.NewUnstartedServer(nil)
	t.Cleanup(hsrv.Close)
	addrs := freeAddrs(t, 2)
	p := podAddrs{pod: "pod-b", stateDir: t.TempDir(), api: addrs[0], probe: addrs[1]}
	hb := samplecallee.New("http://"+p.api, harnessLogger(t).WithName("harness-b"))
	hsrv.Config.Handler = hb.Handler()
	hsrv.Start()
	t.Cleanup(hb.Crash)
	p.harnessURL = hsrv.URL
	sc := b.startSidecarProc(bin, p)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	must(t, a.sc.Drain(ctx))
	b.waitMessage(sid, 30*time.Second, "pod B's resumption after the takeover",
		isStateChange(session.StatePaused, session.StateRunning, reasonRecovered))
	if n, running := hb.Starts(sid); n != 1 || !running {
		t.Fatalf("pod B's harness started the session %d times, running %v", n, running)
	}
	sc.kill()
	b.startSidecarProc(bin, p)
	// /readyz can answer before the re-adoption's claim lands (under make
	// test's load a single read saw epoch 2).
	var epoch int64
	testbed.Eventually(t, 30*time.Second, "pod-b re-adopting the session with a new epoch", func(context.Context) error {
		hs := b.hcpSession(sid)
		if hs.Status.PodName != p.pod || hs.Status.OwnerEpoch < 3 {
			return fmt.Errorf("owner %q epoch %d", hs.Status.PodName, hs.Status.OwnerEpoch)
		}
		epoch = hs.Status.OwnerEpoch
		return nil
	})
	b.waitMessage(sid, 20*time.Second, "a checkpoint_created from the restarted sidecar (the harness checkpoints after each step)", func(m received) bool {
		return m.env.Type == envelope.TypeEvent && eventOf(m).EventType == session.EventCheckpointCreated && ownerEpoch(m.d.Headers) == epoch
	})

	// The harness loses the task: the restarted sidecar resumes it from
	// the checkpoint, which it can only read with the session's decision.
	hb.Crash()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	evs := checkStream(t, b, sid, steps)
	want := []string{"PENDING>RUNNING:accepted",
		"RUNNING>PAUSED:harness_moved", "PAUSED>RUNNING:recovered_from_checkpoint",
		"RUNNING>PAUSED:harness_restarted", "PAUSED>RUNNING:recovered_from_checkpoint",
		"RUNNING>COMPLETED:completed"}
	if tr := transitionsOf(evs); !slices.Equal(tr, want) {
		t.Fatalf("transitions %v, want %v", tr, want)
	}
	if n, _ := hb.Starts(sid); n != 2 {
		t.Fatalf("pod B's harness started the session %d times, want 2 (the takeover, the recovery)", n)
	}
	if hs := b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second); hs.Status.PodName != p.pod {
		t.Fatalf("owner %q, want %q", hs.Status.PodName, p.pod)
	}
}

// TestReadoptFromALogWithoutTask: a write-ahead log written by an earlier
// release holds a taken-over session without its task (only its
// messages). The restarted sidecar takes the task from the session's
// checkpoint record, verified as a takeover does, so when its harness no
// longer runs the task the session resumes from the checkpoint instead of
// failing harness_lost ("the stored task cannot be read").
func TestReadoptFromALogWithoutTask(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true, stateDirs: true, timeouts: Timeouts{HarnessCheck: 200 * time.Millisecond}})
	sid := b.orphan(b.pod, v1alpha1.SessionRunning, 7)
	b.saveCheckpoint(sid, orphanTask(t, sid, `{"steps":12,"step_ms":20,"checkpoint_every":1}`),
		checkpoint.Checkpoint{ID: "ckpt-005", Resumable: true, Sequence: 7, State: []byte(`{"step":5}`)})
	l, _, err := wal.Open(b.stateDir(b.pod))
	must(t, err)
	must(t, l.Append(sid, wal.Message{Index: 1, Seq: 7, Key: "step-5", State: string(session.StateRunning),
		RoutingKey: topology.EventRoutingKey(callerID, sid, envelope.TypeEvent)}))
	must(t, l.Confirm(sid, 1))
	must(t, l.Release())

	b.start()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	// Exactly after the log's last sequence, without a gap or a repeat.
	evs := b.events(sid)
	for i, e := range evs {
		if e.Sequence != int64(8+i) {
			t.Fatalf("event %d (%s) has sequence %d, want %d (%s)", i, e.EventType, e.Sequence, 8+i, summary(b.messages(sid)))
		}
	}
	var stages []string
	for _, e := range evs {
		if e.EventType == session.EventProgress {
			var pd session.ProgressData
			must(t, json.Unmarshal(e.Data, &pd))
			stages = append(stages, pd.Stage)
		}
	}
	var want []string
	for s := 6; s <= 12; s++ {
		want = append(want, fmt.Sprintf("step %d/12", s))
	}
	if !slices.Equal(stages, want) {
		t.Fatalf("progress %v, want %v", stages, want)
	}
	wantTr := []string{"RUNNING>PAUSED:harness_restarted", "PAUSED>RUNNING:recovered_from_checkpoint", "RUNNING>COMPLETED:completed"}
	if tr := transitionsOf(evs); !slices.Equal(tr, wantTr) {
		t.Fatalf("transitions %v, want %v", tr, wantTr)
	}
}

// TestReadoptPausedTakeoverResumes: the sidecar took a released session
// over (PAUSED harness_moved, claimed, its task and last sequence in the
// log) and restarted before the task reached its harness. The re-adopted
// session is PAUSED with no harness working on it: the watchdog hands the
// task over with the checkpoint, and it goes on after the last sequence.
func TestReadoptPausedTakeoverResumes(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true, stateDirs: true, timeouts: Timeouts{HarnessCheck: 200 * time.Millisecond}})
	sid := b.orphan(b.pod, v1alpha1.SessionPaused, 7)
	hs := b.hcpSession(sid)
	hs.Status.Reason, hs.Status.OwnerEpoch = reasonHarnessMoved, 2
	must(t, b.env.Client.Status().Update(t.Context(), hs))
	body := orphanTask(t, sid, `{"steps":8,"step_ms":20,"checkpoint_every":1}`)
	b.saveCheckpoint(sid, body, checkpoint.Checkpoint{ID: "drain-005", Resumable: true, Sequence: 7, State: []byte(`{"step":5}`)})
	l, _, err := wal.Open(b.stateDir(b.pod))
	must(t, err)
	must(t, l.Adopt(sid, body, 7))
	must(t, l.Release())

	b.start()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	evs := b.events(sid)
	if evs[0].Sequence != 8 {
		t.Fatalf("the re-adopted session went on at sequence %d, want 8 (%s)", evs[0].Sequence, summary(b.messages(sid)))
	}
	want := []string{"PAUSED>RUNNING:recovered_from_checkpoint", "RUNNING>COMPLETED:completed"}
	if tr := transitionsOf(evs); !slices.Equal(tr, want) {
		t.Fatalf("transitions %v, want %v", tr, want)
	}
	if n, _ := b.harness.Starts(sid); n != 1 {
		t.Fatalf("the harness started the session %d times", n)
	}
}

// TestHarnessRestartWhilePausedResumes: the harness paused its session and
// then lost it (a restart). The watchdog resumes the session from its
// checkpoint as it does a RUNNING one, instead of leaving it PAUSED with
// nobody working on it until its timeout.
func TestHarnessRestartWhilePausedResumes(t *testing.T) {
	b := newBed(t, bedOptions{timeouts: Timeouts{HarnessCheck: 200 * time.Millisecond}})
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) {
		ts.Inputs = json.RawMessage(`{"steps":6,"step_ms":20,"checkpoint_every":1,"pause_at":3,"pause_ms":600000}`)
	}))
	b.waitMessage(sid, 20*time.Second, "the harness's pause", isStateChange(session.StateRunning, session.StatePaused, "pause_at"))
	b.harness.Crash()
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	evs := checkStream(t, b, sid, 6)
	want := []string{"PENDING>RUNNING:accepted", "RUNNING>PAUSED:pause_at", "PAUSED>RUNNING:recovered_from_checkpoint", "RUNNING>COMPLETED:completed"}
	if tr := transitionsOf(evs); !slices.Equal(tr, want) {
		t.Fatalf("transitions %v, want %v", tr, want)
	}
}
