package callee

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

const durableInputs = `{"steps":30,"step_ms":60,"checkpoint_every":1}`

// checkStream asserts what a caller would: the distinct sequences are
// 1..n without a gap, a repeated sequence carries the identical message
// (a republish), and every step's progress event came exactly once.
func checkStream(t *testing.T, b *bed, sid string, steps int) []session.EventPayload {
	t.Helper()
	bySeq := map[int64]string{}
	var evs []session.EventPayload
	for _, m := range b.messages(sid) {
		if m.env.Type != "event" {
			continue
		}
		e := eventOf(m)
		if prev, ok := bySeq[e.Sequence]; ok {
			if prev != string(m.d.Body) {
				t.Fatalf("sequence %d was used for two different events:\n%s\n%s\n(%s)", e.Sequence, prev, m.d.Body, summary(b.messages(sid)))
			}
			continue
		}
		bySeq[e.Sequence] = string(m.d.Body)
		evs = append(evs, e)
	}
	slices.SortFunc(evs, func(a, b session.EventPayload) int { return int(a.Sequence - b.Sequence) })
	stages := map[string]int{}
	for i, e := range evs {
		if e.Sequence != int64(i+1) {
			t.Fatalf("gap: event %d has sequence %d (%s)", i+1, e.Sequence, summary(b.messages(sid)))
		}
		if e.EventType == session.EventProgress {
			var p session.ProgressData
			must(t, json.Unmarshal(e.Data, &p))
			stages[p.Stage]++
		}
	}
	for s := 1; s <= steps; s++ {
		if n := stages[fmt.Sprintf("step %d/%d", s, steps)]; n != 1 {
			t.Fatalf("step %d reported %d times (%v)", s, n, stages)
		}
	}
	return evs
}

func transitionsOf(evs []session.EventPayload) []string {
	var out []string
	for _, e := range evs {
		if e.EventType == session.EventStateChanged {
			var d session.StateChangedData
			_ = json.Unmarshal(e.Data, &d)
			out = append(out, fmt.Sprintf("%s>%s:%s", d.FromState, d.ToState, d.Reason))
		}
	}
	return out
}

// TestDrainHandsSessionToAnotherReplica: the replica running a session is
// drained (its pod is being deleted); the other replica resumes the
// session from the checkpoint the harness returned, with contiguous
// sequences, every step once, and the task never running on two harnesses
// at once.
func TestDrainHandsSessionToAnotherReplica(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	a := b.startReplica("pod-a")
	b.first = a
	bb := b.startReplica("pod-b")
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(durableInputs) }))
	b.waitMessage(sid, 20*time.Second, "the fifth event", func(m received) bool {
		return m.env.Type == "event" && eventOf(m).Sequence >= 5
	})
	owner, other := a, bb
	if hs := b.hcpSession(sid); hs.Status.PodName == "pod-b" {
		owner, other = bb, a
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	must(t, owner.sc.Drain(ctx))
	if _, running := owner.harness.Starts(sid); running {
		t.Fatal("the drained replica's harness still runs the task")
	}
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	evs := checkStream(t, b, sid, 30)
	tr := transitionsOf(evs)
	if !slices.Contains(tr, "RUNNING>PAUSED:harness_moved") || !slices.Contains(tr, "PAUSED>RUNNING:recovered_from_checkpoint") {
		t.Fatalf("transitions %v", tr)
	}
	if n, _ := other.harness.Starts(sid); n != 1 {
		t.Fatalf("the new replica's harness started the session %d times", n)
	}
	hs := b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second)
	if hs.Status.PodName != other.pod {
		t.Fatalf("owner %q, want %q", hs.Status.PodName, other.pod)
	}
}

// TestSidecarSIGKILLReadoptsSessions runs the real hcp-sidecar binary,
// SIGKILLs it in the middle of a session and starts it again in the same
// "pod" (same name, same state directory): the session goes on with the
// next sequence number, no event is lost or reported twice, and it
// completes without harness_lost.
func TestSidecarSIGKILLReadoptsSessions(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	bin := buildCmds(t, "hcp-sidecar", "sample-callee")
	a := freeAddrs(t, 3)
	p := podAddrs{pod: b.pod, stateDir: t.TempDir(), api: a[0], probe: a[1], harnessURL: "http://" + a[2]}
	harness := exec.Command(filepath.Join(bin, "sample-callee"), "--listen", strings.TrimPrefix(p.harnessURL, "http://"), "--sidecar", "http://"+p.api)
	harness.Stdout, harness.Stderr = testWriter{t, "sample-callee"}, testWriter{t, "sample-callee"}
	must(t, harness.Start())
	t.Cleanup(func() { _ = harness.Process.Kill(); _ = harness.Wait() })
	sc := b.startSidecarProc(bin, p)
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(durableInputs) }))
	b.waitMessage(sid, 20*time.Second, "the eighth event", func(m received) bool {
		return m.env.Type == "event" && eventOf(m).Sequence >= 8
	})
	sc.kill()
	b.startSidecarProc(bin, p)
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v (%s)", closed, summary(b.messages(sid)))
	}
	evs := checkStream(t, b, sid, 30)
	if tr := transitionsOf(evs); !slices.Equal(tr, []string{"PENDING>RUNNING:accepted", "RUNNING>COMPLETED:completed"}) {
		t.Fatalf("transitions %v: the restart must not show", tr)
	}
	hs := b.waitState(sid, v1alpha1.SessionCompleted, 10*time.Second)
	if hs.Status.LastSequence != evs[len(evs)-1].Sequence || hs.Status.EventCount != int64(len(evs)) {
		t.Fatalf("status.lastSequence %d eventCount %d, want the last event's %d and the %d events published",
			hs.Status.LastSequence, hs.Status.EventCount, evs[len(evs)-1].Sequence, len(evs))
	}
}

// TestTwoReplicasRaceForALostSession: the replica running a session is gone
// (no Lease, no pod) and its checkpoint is stored; two replicas start at
// once and both find it: exactly one claims it and resumes it (the task
// runs on one harness only), the other publishes nothing for it.
func TestTwoReplicasRaceForALostSession(t *testing.T) {
	b := newBed(t, bedOptions{noStart: true})
	sid := b.orphan("vanished-pod", v1alpha1.SessionRunning, 7)
	b.saveCheckpoint(sid, orphanTask(t, sid, `{"steps":12,"step_ms":20,"checkpoint_every":1}`),
		checkpoint.Checkpoint{ID: "ckpt-005", Resumable: true, Sequence: 7, State: []byte(`{"step":5}`)})

	var wg sync.WaitGroup
	rs := make([]*replica, 2)
	for i, pod := range []string{"pod-a", "pod-b"} {
		wg.Go(func() { rs[i] = b.startReplica(pod) })
	}
	wg.Wait()
	b.first = rs[0]
	if closed := closedOf(t, b, sid); closed.FinalState != session.StateCompleted {
		t.Fatalf("session_closed = %+v", closed)
	}
	n0, _ := rs[0].harness.Starts(sid)
	n1, _ := rs[1].harness.Starts(sid)
	if n0+n1 != 1 {
		t.Fatalf("the task was started %d and %d times on the two harnesses", n0, n1)
	}
	// Steps 6..12 come after the checkpoint of step 5, each once; the
	// numbers continue after the reserved ceiling (the lost replica's last
	// numbers are unknown).
	var stages []string
	for _, m := range b.messages(sid) {
		if m.env.Type == "event" {
			e := eventOf(m)
			if e.Sequence <= 1000 {
				t.Fatalf("sequence %d reuses a reserved number", e.Sequence)
			}
			if e.EventType == session.EventProgress {
				var p session.ProgressData
				must(t, json.Unmarshal(e.Data, &p))
				stages = append(stages, p.Stage)
			}
		}
	}
	want := []string{}
	for s := 6; s <= 12; s++ {
		want = append(want, fmt.Sprintf("step %d/12", s))
	}
	if !slices.Equal(stages, want) {
		t.Fatalf("progress %v, want %v", stages, want)
	}
	if tr := transitionsOf(checkStreamFrom(b, sid)); !slices.Equal(tr, []string{"RUNNING>PAUSED:harness_moved", "PAUSED>RUNNING:recovered_from_checkpoint", "RUNNING>COMPLETED:completed"}) {
		t.Fatalf("transitions %v", tr)
	}
}

func checkStreamFrom(b *bed, sid string) []session.EventPayload {
	var evs []session.EventPayload
	for _, m := range b.messages(sid) {
		if m.env.Type == "event" {
			evs = append(evs, eventOf(m))
		}
	}
	return evs
}
