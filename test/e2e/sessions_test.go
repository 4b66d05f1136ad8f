//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// finishedAtApp waits until the app has every session's end: the
// session_closed event (and, with terminal set, that message too).
func (r *samplesRun) finishedAtApp(t *testing.T, ids []string, terminal bool) samplecaller.Snapshot {
	t.Helper()
	var snap samplecaller.Snapshot
	eventually(t, sessionTimeout, fmt.Sprintf("%d sessions closed at the app", len(ids)), func(ctx context.Context) error {
		var err error
		if snap, err = r.received(ctx); err != nil {
			return err
		}
		for _, id := range ids {
			s := snap.Sessions[id]
			switch {
			case s == nil:
				return fmt.Errorf("session %s: nothing at the app yet", id)
			case s.FinalState == "" || (terminal && s.Terminal == ""):
				return fmt.Errorf("session %s not closed at the app yet: %d events, last sequence %d, terminal %q", id, s.Events, s.LastSequence, s.Terminal)
			}
		}
		return nil
	})
	return snap
}

// sessionMatches waits until the HCPSession is in state with lastSequence
// and eventCount equal to what the app received, and the caller's
// acknowledged sequence caught up (it is written coalesced, once a second
// at most), then returns it.
func (r *samplesRun) sessionMatches(t *testing.T, s *samplecaller.SessionLog, state hcpv1alpha1.SessionState) *hcpv1alpha1.HCPSession {
	t.Helper()
	var hs *hcpv1alpha1.HCPSession
	eventually(t, 30*time.Second, "HCPSession "+s.SessionID+" "+string(state)+" as the app saw it", func(ctx context.Context) error {
		var err error
		if hs, err = r.session(ctx, s.SessionID); err != nil {
			return err
		}
		st := hs.Status
		if st.State != state || st.LastSequence != s.LastSequence || st.EventCount != int64(s.Events) || st.CallerAckedSequence != st.LastSequence {
			return fmt.Errorf("state %s lastSequence %d eventCount %d callerAckedSequence %d; the app received %d events, last sequence %d",
				st.State, st.LastSequence, st.EventCount, st.CallerAckedSequence, s.Events, s.LastSequence)
		}
		return nil
	})
	return hs
}

// checkStream checks the order a session reached the app in: task_accepted;
// events with sequences 1..n, session_created and state_changed first;
// the terminal message (terminal, or none) just before the last event,
// session_closed with finalState. No duplicates, no gaps, no problems.
func checkStream(t *testing.T, s *samplecaller.SessionLog, terminal, finalState string) {
	t.Helper()
	if s == nil {
		t.Error("session missing at the app")
		return
	}
	var kinds []string
	for _, m := range s.Messages {
		if m.Type == "event" {
			kinds = append(kinds, fmt.Sprintf("%d:%s", m.Sequence, m.EventType))
		} else {
			kinds = append(kinds, m.Type)
		}
	}
	if len(s.Problems) != 0 || s.Duplicates != 0 || s.Deduplicated != 0 {
		t.Errorf("session %s: problems %q duplicates %d deduplicated %d", s.SessionID, s.Problems, s.Duplicates, s.Deduplicated)
	}
	for i, seq := range s.Sequences() {
		if seq != int64(i+1) {
			t.Errorf("session %s: event %d has sequence %d: %v", s.SessionID, i+1, seq, kinds)
			break
		}
	}
	n := len(s.Messages)
	ok := n >= 4 && s.Answer == "task_accepted" && s.Messages[0].Type == "task_accepted" &&
		s.Messages[1].EventType == "session_created" && s.Messages[2].EventType == "state_changed" &&
		s.Messages[n-1].EventType == "session_closed" && s.FinalState == finalState && s.Terminal == terminal &&
		s.LastSequence == int64(s.Events)
	if ok && terminal != "" {
		ok = s.Messages[n-2].Type == terminal
	}
	if !ok {
		t.Errorf("session %s: answer %q terminal %q (want %q) final state %q (want %q), the app received %v",
			s.SessionID, s.Answer, s.Terminal, terminal, s.FinalState, finalState, kinds)
	}
}

// count counts the session's events of one type.
func count(s *samplecaller.SessionLog, eventType string) int {
	n := 0
	for _, m := range s.Messages {
		if m.Type == "event" && m.EventType == eventType {
			n++
		}
	}
	return n
}

// concurrentSessions: several tasks submitted at once through the caller
// sidecar run concurrently on the callee and complete; the app receives
// each session completely, in order, exactly once, with the event count
// the task implies; each HCPSession ends COMPLETED with the same last
// sequence and event count, and went PENDING → RUNNING → COMPLETED.
func (r *samplesRun) concurrentSessions(t *testing.T) {
	const sessions, logEvery, checkpointEvery, stepMS = 5, 3, 4, 200
	type sub struct {
		task  samplecaller.Task
		steps int
	}
	subs := make([]sub, sessions)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range subs {
		steps := 6 + 2*i // different lengths, overlapping runs
		wg.Go(func() {
			in := fmt.Sprintf(`{"recipe":"s3://lab/recipes/e2e-%d.yaml","steps":%d,"step_ms":%d,"log_every":%d,"checkpoint_every":%d}`, i, steps, stepMS, logEvery, checkpointEvery)
			subs[i] = sub{r.submit(t, synthesis, fmt.Sprintf("e2e concurrent session %d", i), in, samplecaller.Constraints{DataClassification: "T2"}), steps}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ids := make([]string, len(subs))
	for i, s := range subs {
		ids[i] = s.task.SessionID
	}
	snap := r.finishedAtApp(t, ids, true)
	t.Logf("%d sessions completed at the app in %s", sessions, time.Since(start).Round(time.Millisecond))

	overlap := maxOverlap(snap, ids)
	for _, sb := range subs {
		s := snap.Sessions[sb.task.SessionID]
		// session_created, state_changed to RUNNING, a progress per step,
		// the logs and checkpoints, state_changed to COMPLETED,
		// session_closed.
		want := 2 + sb.steps + sb.steps/logEvery + sb.steps/checkpointEvery + 2
		checkStream(t, s, "task_completed", string(hcpv1alpha1.SessionCompleted))
		if s.Events != want || count(s, "progress") != sb.steps {
			t.Errorf("session %s (%d steps): %d events (%d progress), want %d (%d progress)", s.SessionID, sb.steps, s.Events, count(s, "progress"), want, sb.steps)
		}
		if s.CalleeID != calleeID || s.TaskMessageID != sb.task.MessageID {
			t.Errorf("session %s: callee %q task %q at the app, want %q %q", s.SessionID, s.CalleeID, s.TaskMessageID, calleeID, sb.task.MessageID)
		}

		hs := r.sessionMatches(t, s, hcpv1alpha1.SessionCompleted)
		st, sp := hs.Status, hs.Spec
		if sp.CallerID != callerID || sp.CalleeID != calleeID || sp.Capability != synthesis || sp.TaskMessageID != sb.task.MessageID || sp.RiskLevel != hcpv1alpha1.RiskR3 {
			t.Errorf("HCPSession %s spec %+v", hs.Name, sp)
		}
		if st.Progress == nil || st.Progress.Percent == nil || *st.Progress.Percent != 100 || st.Result == nil ||
			st.StartedAt == nil || st.CompletedAt == nil || st.PodName != r.calleePod.Name {
			t.Errorf("HCPSession %s status incomplete (want progress 100, a result, times and pod %s): %+v", hs.Name, r.calleePod.Name, st)
		}
		if wantCk := fmt.Sprintf("ckpt-%03d", sb.steps/checkpointEvery*checkpointEvery); st.LastCheckpoint == nil || st.LastCheckpoint.ID != wantCk {
			t.Errorf("HCPSession %s lastCheckpoint %+v, want %s", hs.Name, st.LastCheckpoint, wantCk)
		}

		// The caller sidecar's own records.
		sv, err := r.sidecar.Session(t.Context(), s.SessionID)
		if err != nil || sv.LastSequence != s.LastSequence || !sv.Finished || !sv.Closed || sv.State != string(hcpv1alpha1.SessionCompleted) {
			t.Errorf("caller sidecar GET /hcp/v1/sessions/%s: %+v %v", s.SessionID, sv, err)
		}
		tv, err := r.sidecar.Task(t.Context(), sb.task.MessageID)
		if err != nil || tv.Status != "accepted" || !tv.DeliveredToApp || tv.RiskLevel != string(hcpv1alpha1.RiskR3) {
			t.Errorf("caller sidecar GET /hcp/v1/tasks/%s: %+v %v", sb.task.MessageID, tv, err)
		}

		// The HCPSession's states as a watch saw them.
		var states []hcpv1alpha1.SessionState
		for _, l := range r.history.of(s.SessionID) {
			if len(states) == 0 || states[len(states)-1] != l.State {
				states = append(states, l.State)
			}
		}
		if want := []hcpv1alpha1.SessionState{hcpv1alpha1.SessionPending, hcpv1alpha1.SessionRunning, hcpv1alpha1.SessionCompleted}; !isSubsequence(states, append([]hcpv1alpha1.SessionState{""}, want...)) ||
			len(states) == 0 || states[len(states)-1] != hcpv1alpha1.SessionCompleted {
			t.Errorf("HCPSession %s went through %q, want a subsequence of %q ending COMPLETED", s.SessionID, states, want)
		}
	}
	t.Logf("HCPSession %s as `kubectl get hcps -w` saw it:\n%s", ids[len(ids)-1], indent(formatHistory(r.history.of(ids[len(ids)-1]))))
	t.Logf("up to %d of the %d sessions streamed to the app at once", overlap, sessions)
	if overlap < 2 {
		t.Errorf("the sessions did not run concurrently (their event streams never overlapped at the app)")
	}
	out, _ := r.kubectl(t.Context(), nil, "get", "hcpsessions", "-n", r.ns)
	t.Logf("kubectl get hcpsessions:\n%s", indent(out))
}

// rejections: tasks the L3 gate refuses reach the app as task_rejected
// (and nothing else), with the reason code; the caller sidecar records the
// rejection; nothing is written for it but an Event on the Callee (reason
// TaskRejected) that names the task and the reason: no HCPSession.
func (r *samplesRun) rejections(t *testing.T) {
	cases := []struct {
		name, capability, dataClass string
		want                        task.ReasonCode
	}{
		{"capability not admitted by the policy", bakeout, "T1", task.ReasonNotAuthorized},
		{"data class above the policy", synthesis, "T3", task.ReasonDataClassExceedsPolicy},
		{"unknown capability", "cvd.no-such-thing", "T1", task.ReasonUnknownCapability},
	}
	tasks := make([]samplecaller.Task, len(cases))
	for i, c := range cases {
		tasks[i] = r.submit(t, c.capability, "e2e: "+c.name, `{"recipe":"s3://lab/recipes/never.yaml"}`, samplecaller.Constraints{DataClassification: c.dataClass})
	}
	var snap samplecaller.Snapshot
	eventually(t, sessionTimeout, "the rejections at the app", func(ctx context.Context) error {
		var err error
		if snap, err = r.received(ctx); err != nil {
			return err
		}
		for _, tk := range tasks {
			if s := snap.Sessions[tk.SessionID]; s == nil || s.Answer == "" {
				return fmt.Errorf("task %s (%s): no answer at the app yet", tk.MessageID, tk.Capability)
			}
		}
		return nil
	})
	for i, c := range cases {
		tk := tasks[i]
		s := snap.Sessions[tk.SessionID]
		if s.Answer != "task_rejected" || len(s.Messages) != 1 || s.Events != 0 || s.Terminal != "" || len(s.Problems) != 0 {
			t.Errorf("%s: the app saw %+v, want task_rejected alone", c.name, s)
		}
		tv, err := r.sidecar.Task(t.Context(), tk.MessageID)
		if err != nil || tv.Status != "rejected" || tv.ReasonCode != string(c.want) || !tv.DeliveredToApp {
			t.Errorf("%s: caller sidecar task %+v %v, want rejected %s delivered to the app", c.name, tv, err, c.want)
		}
		eventually(t, 30*time.Second, "Event TaskRejected for "+tk.MessageID, func(ctx context.Context) error {
			var evs corev1.EventList
			if err := r.c.List(ctx, &evs, client.InNamespace(r.ns)); err != nil {
				return err
			}
			for _, e := range evs.Items {
				if e.Reason == "TaskRejected" && e.InvolvedObject.Kind == "Callee" && e.InvolvedObject.Name == calleeID &&
					strings.Contains(e.Message, tk.MessageID) && strings.Contains(e.Message, string(c.want)) {
					return nil
				}
			}
			return fmt.Errorf("%s: no TaskRejected Event names task %s among %d", c.name, tk.MessageID, len(evs.Items))
		})
		if _, err := r.session(t.Context(), tk.SessionID); !apierrors.IsNotFound(err) {
			t.Errorf("%s: the rejected task has an HCPSession (%v); want none", c.name, err)
		}
		t.Logf("%s: task_rejected %s: %s", c.name, tv.ReasonCode, tv.Message)
	}
}

// abort: a long task RUNNING is aborted with `kubectl patch hcps ...
// abortRequested=true`; the callee sidecar tells the harness, the session
// ends ABORTED, and the app receives the events up to the abort and
// session_closed ABORTED, but no task_completed.
func (r *samplesRun) abort(t *testing.T) {
	const steps = 600 // 600 × 100 ms: a minute unless aborted
	tk := r.submit(t, synthesis, "e2e: aborted", fmt.Sprintf(`{"recipe":"s3://lab/recipes/long.yaml","steps":%d,"step_ms":100}`, steps), samplecaller.Constraints{})
	eventually(t, sessionTimeout, "the long session RUNNING with progress", func(ctx context.Context) error {
		hs, err := r.session(ctx, tk.SessionID)
		if err != nil {
			return err
		}
		if hs.Status.State != hcpv1alpha1.SessionRunning || hs.Status.LastSequence < 5 {
			return fmt.Errorf("state %s lastSequence %d", hs.Status.State, hs.Status.LastSequence)
		}
		return nil
	})
	patched := time.Now()
	out, err := r.kubectl(t.Context(), nil, "patch", "hcps", tk.SessionID, "-n", r.ns, "--type", "merge", "-p", `{"spec":{"abortRequested":true}}`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl patch hcps %s --type merge -p '{\"spec\":{\"abortRequested\":true}}': %s", tk.SessionID, strings.TrimSpace(out))

	snap := r.finishedAtApp(t, []string{tk.SessionID}, false)
	s := snap.Sessions[tk.SessionID]
	checkStream(t, s, "", string(hcpv1alpha1.SessionAborted))
	if p := count(s, "progress"); p >= steps {
		t.Errorf("the aborted task ran to its end (%d progress events)", p)
	}
	hs := r.sessionMatches(t, s, hcpv1alpha1.SessionAborted)
	if !meta.IsStatusConditionTrue(hs.Status.Conditions, hcpv1alpha1.ConditionAbortRequested) {
		t.Errorf("HCPSession %s: no AbortRequested=True condition: %s", hs.Name, conditions(hs.Status.Conditions))
	}
	if hs.Status.CompletedAt == nil || hs.Status.CompletedAt.Sub(patched) > 15*time.Second {
		t.Errorf("HCPSession %s ended at %v, more than 15s after the patch (%s)", hs.Name, hs.Status.CompletedAt, patched.Format(time.RFC3339))
	}
	t.Logf("aborted after %d events; HCPSession %s %s (%s: %s)", s.Events, hs.Name, hs.Status.State, hs.Status.Reason, hs.Status.Message)
}

// timeout: a task whose max_duration (PT3S) is shorter than its run
// (about 10 s) ends FAILED with reason timeout when its time is up; the app
// receives task_failed and session_closed FAILED.
func (r *samplesRun) timeout(t *testing.T) {
	const steps = 100 // 100 × 100 ms
	tk := r.submit(t, synthesis, "e2e: too slow", fmt.Sprintf(`{"recipe":"s3://lab/recipes/slow.yaml","steps":%d,"step_ms":100}`, steps),
		samplecaller.Constraints{MaxDuration: "PT3S"})
	snap := r.finishedAtApp(t, []string{tk.SessionID}, true)
	s := snap.Sessions[tk.SessionID]
	checkStream(t, s, "task_failed", string(hcpv1alpha1.SessionFailed))
	if p := count(s, "progress"); p >= steps {
		t.Errorf("the task ran to its end (%d progress events) despite max_duration PT3S", p)
	}
	hs := r.sessionMatches(t, s, hcpv1alpha1.SessionFailed)
	st := hs.Status
	if st.Reason != "timeout" || st.Error == nil || st.Error.Code != "timeout" || hs.Spec.MaxDuration != "PT3S" {
		t.Errorf("HCPSession %s: reason %q error %+v maxDuration %s, want timeout and PT3S", hs.Name, st.Reason, st.Error, hs.Spec.MaxDuration)
	}
	if st.StartedAt == nil || st.CompletedAt == nil {
		t.Fatalf("HCPSession %s: startedAt %v completedAt %v", hs.Name, st.StartedAt, st.CompletedAt)
	}
	// Both are whole seconds; the task would have taken 10 s.
	if d := st.CompletedAt.Sub(st.StartedAt.Time); d < 2*time.Second || d > 8*time.Second {
		t.Errorf("HCPSession %s ran %s (startedAt %s, completedAt %s), want about 3s", hs.Name, d, st.StartedAt, st.CompletedAt)
	}
	t.Logf("timed out after %d progress events: HCPSession %s %s (%s: %s)", count(s, "progress"), hs.Name, st.State, st.Reason, st.Message)
}
