package relay

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestRelayFullFlow: tasks submitted through the caller sidecar's local API
// run on the sample callee harness behind the callee sidecar, and the
// sample caller app receives, for several concurrent sessions,
// task_accepted, every event once and in order, task_completed and
// session_closed; a task for a capability the policy does not admit
// reaches the app as task_rejected (and leaves no HCPSession). The
// HCPSessions end COMPLETED with lastSequence and eventCount matching what the app
// received, and callerAckedSequence catches up with the last sequence.
func TestRelayFullFlow(t *testing.T) {
	app := samplecaller.NewRecorder()
	b := newBed(t, bedOptions{
		Harness: func(url string, log logr.Logger) http.Handler { return samplecallee.New(url, log).Handler() },
		App:     app.Handler(),
	})
	ctx := t.Context()
	hist := watchSessions(t, b)

	const sessions = 5
	const steps, logEvery, checkpointEvery = 12, 4, 5
	inputs := fmt.Sprintf(`{"steps":%d,"step_ms":15,"log_every":%d,"checkpoint_every":%d}`, steps, logEvery, checkpointEvery)
	// session_created, state_changed PENDING→RUNNING, per step a progress,
	// the logs and checkpoints, state_changed RUNNING→COMPLETED,
	// session_closed.
	wantEvents := 2 + steps + steps/logEvery + steps/checkpointEvery + 2

	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		accepted []caller.TaskView
	)
	for i := range sessions {
		wg.Go(func() {
			req := caller.SubmitRequest{
				CalleeID: calleeID, Capability: "analyze", Intent: fmt.Sprintf("relay flow %d", i),
				Inputs: json.RawMessage(inputs), Constraints: task.Constraints{DataClassification: task.T1},
			}
			var v caller.TaskView
			if code := call(ctx, http.MethodPost, b.CallerAPI+"/hcp/v1/tasks", req, &v); code != http.StatusAccepted {
				t.Errorf("POST /hcp/v1/tasks: HTTP %d (%+v)", code, v)
				return
			}
			mu.Lock()
			accepted = append(accepted, v)
			mu.Unlock()
		})
	}
	var rejected caller.TaskView
	wg.Go(func() {
		req := caller.SubmitRequest{
			CalleeID: calleeID, Capability: "restricted", Intent: "not admitted by the policy",
			Constraints: task.Constraints{DataClassification: task.T1},
		}
		if code := call(ctx, http.MethodPost, b.CallerAPI+"/hcp/v1/tasks", req, &rejected); code != http.StatusAccepted {
			t.Errorf("POST /hcp/v1/tasks (restricted): HTTP %d (%+v)", code, rejected)
		}
	})
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	for _, v := range append(slices.Clone(accepted), rejected) {
		if want := topology.SessionID(calleeID, callerID, v.MessageID); v.SessionID != want || v.Status != caller.TaskPending {
			t.Fatalf("submit answered %+v, want status pending and session_id %s", v, want)
		}
	}

	// The app receives every session completely.
	testbed.Eventually(t, 60*time.Second, "every session complete at the app", func(context.Context) error {
		for _, v := range accepted {
			s, ok := app.Session(v.SessionID)
			if !ok || s.Terminal == "" || s.FinalState == "" {
				return fmt.Errorf("session %s not finished at the app yet (%+v)", v.SessionID, s.Messages)
			}
		}
		if s, ok := app.Session(rejected.SessionID); !ok || s.Answer == "" {
			return fmt.Errorf("the rejected task's answer has not reached the app yet")
		}
		return nil
	})

	snap := app.Snapshot()
	if snap.Duplicates != 0 || snap.Deduplicated != 0 || snap.Problems != 0 || snap.Failed != 0 {
		t.Errorf("app saw duplicates=%d deduplicated=%d problems=%d failed=%d", snap.Duplicates, snap.Deduplicated, snap.Problems, snap.Failed)
	}
	for _, v := range accepted {
		s := snap.Sessions[v.SessionID]
		checkAcceptedStream(t, s, wantEvents, steps)
		if s.CalleeID != calleeID || s.TaskMessageID != v.MessageID {
			t.Errorf("session %s: callee %q task %q, want %q and %q", v.SessionID, s.CalleeID, s.TaskMessageID, calleeID, v.MessageID)
		}

		// The status writer is asynchronous (coalesced): the app can have the
		// last event before the terminal status lands.
		var hs *v1alpha1.HCPSession
		testbed.Eventually(t, 10*time.Second, "HCPSession "+v.SessionID+" COMPLETED", func(ctx context.Context) error {
			var err error
			if hs, err = b.hcpSession(ctx, v.SessionID); err != nil {
				return err
			}
			if hs.Status.State != v1alpha1.SessionCompleted {
				return fmt.Errorf("state %s", hs.Status.State)
			}
			return nil
		})
		st := hs.Status
		if st.State != v1alpha1.SessionCompleted || st.LastSequence != s.LastSequence || st.EventCount != int64(s.Events) {
			t.Errorf("HCPSession %s: state %s lastSequence %d eventCount %d; the app received %d events, last sequence %d",
				v.SessionID, st.State, st.LastSequence, st.EventCount, s.Events, s.LastSequence)
		}
		if st.Progress == nil || st.Progress.Percent == nil || *st.Progress.Percent != 100 || st.Result == nil || st.StartedAt == nil || st.CompletedAt == nil || st.PodName != "lab-0" {
			t.Errorf("HCPSession %s status incomplete: %+v", v.SessionID, st)
		}
		if st.LastCheckpoint == nil || st.LastCheckpoint.ID != fmt.Sprintf("ckpt-%03d", steps/checkpointEvery*checkpointEvery) {
			t.Errorf("HCPSession %s: lastCheckpoint %+v", v.SessionID, st.LastCheckpoint)
		}

		// The caller sidecar's own view, and the task record.
		var sv caller.SessionView
		if code := call(ctx, http.MethodGet, b.CallerAPI+"/hcp/v1/sessions/"+v.SessionID, nil, &sv); code != http.StatusOK ||
			sv.LastSequence != s.LastSequence || !sv.Finished || !sv.Closed || sv.State != string(v1alpha1.SessionCompleted) || sv.CalleeID != calleeID {
			t.Errorf("GET caller session %s: HTTP %d %+v", v.SessionID, code, sv)
		}
		var tv caller.TaskView
		if code := call(ctx, http.MethodGet, b.CallerAPI+"/hcp/v1/tasks/"+v.MessageID, nil, &tv); code != http.StatusOK ||
			tv.Status != caller.TaskAccepted || !tv.DeliveredToApp || tv.Attempts != 1 {
			t.Errorf("GET caller task %s: HTTP %d %+v", v.MessageID, code, tv)
		}
	}

	// The rejected task: task_rejected and nothing else.
	rs := snap.Sessions[rejected.SessionID]
	if rs.Answer != "task_rejected" || rs.Events != 0 || rs.Terminal != "" || len(rs.Messages) != 1 || len(rs.Problems) != 0 {
		t.Errorf("rejected task: the app saw %+v", rs)
	}
	var tv caller.TaskView
	if code := call(ctx, http.MethodGet, b.CallerAPI+"/hcp/v1/tasks/"+rejected.MessageID, nil, &tv); code != http.StatusOK ||
		tv.Status != caller.TaskRejected || tv.ReasonCode != string(task.ReasonNotAuthorized) || !tv.DeliveredToApp {
		t.Errorf("GET caller task %s: HTTP %d %+v", rejected.MessageID, code, tv)
	}
	if hs, err := b.hcpSession(ctx, rejected.SessionID); !apierrors.IsNotFound(err) {
		t.Errorf("the rejected task has an HCPSession (%v): %+v; a gate rejection writes nothing", err, hs.Status)
	}

	// callerAckedSequence is written coalesced (at most once per second),
	// so it catches up shortly after the last event.
	testbed.Eventually(t, 15*time.Second, "callerAckedSequence = lastSequence", func(ctx context.Context) error {
		for _, v := range accepted {
			hs, err := b.hcpSession(ctx, v.SessionID)
			if err != nil {
				return err
			}
			if hs.Status.CallerAckedSequence != hs.Status.LastSequence {
				return fmt.Errorf("HCPSession %s: callerAckedSequence %d, lastSequence %d", v.SessionID, hs.Status.CallerAckedSequence, hs.Status.LastSequence)
			}
		}
		return nil
	})

	// Every accepted session's HCPSession went PENDING → RUNNING →
	// COMPLETED, never back; print one as `kubectl get hcps -w` would.
	for i, v := range accepted {
		lines := hist.of(v.SessionID)
		var states []v1alpha1.SessionState
		for _, l := range lines {
			if len(states) == 0 || states[len(states)-1] != l.State {
				states = append(states, l.State)
			}
		}
		if want := []v1alpha1.SessionState{"", v1alpha1.SessionPending, v1alpha1.SessionRunning, v1alpha1.SessionCompleted}; !isSubsequence(states, want) || states[len(states)-1] != v1alpha1.SessionCompleted {
			t.Errorf("HCPSession %s went through %q, want a subsequence of %q ending COMPLETED", v.SessionID, states, want)
		}
		if i == 0 {
			t.Logf("HCPSession %s as `kubectl get hcps -w` shows it:\n%s", v.SessionID, formatHistory(lines))
		}
	}
	// Deliveries per sidecar, for the record.
	t.Logf("app: %d messages in %d sessions; caller sidecar: %v redeliveries, %v duplicates skipped",
		snap.Total, len(snap.Sessions), testutil.ToFloat64(b.CallerMetrics.Redeliveries), sumCounter(b.CallerMetrics.Duplicates))
}

// checkAcceptedStream checks the order the app received a session in:
// task_accepted; events 1..n (session_created, state_changed to RUNNING,
// the harness's progress/log/checkpoint events in step order);
// task_completed; session_closed COMPLETED as the last event.
func checkAcceptedStream(t *testing.T, s *samplecaller.SessionLog, wantEvents, steps int) {
	t.Helper()
	if s == nil {
		t.Error("session missing at the app")
		return
	}
	if len(s.Problems) != 0 || s.Duplicates != 0 || s.Deduplicated != 0 {
		t.Errorf("session %s: problems %q duplicates %d deduplicated %d", s.SessionID, s.Problems, s.Duplicates, s.Deduplicated)
	}
	if s.Answer != "task_accepted" || s.Terminal != "task_completed" || s.FinalState != "COMPLETED" || s.Events != wantEvents || s.LastSequence != int64(wantEvents) {
		t.Errorf("session %s: answer %q terminal %q final %q events %d last %d, want task_accepted task_completed COMPLETED %d %d",
			s.SessionID, s.Answer, s.Terminal, s.FinalState, s.Events, s.LastSequence, wantEvents, wantEvents)
	}
	var kinds []string
	for _, m := range s.Messages {
		if m.Type == "event" {
			kinds = append(kinds, fmt.Sprintf("%d:%s", m.Sequence, m.EventType))
		} else {
			kinds = append(kinds, m.Type)
		}
	}
	n := len(s.Messages)
	if n != wantEvents+2 || s.Messages[0].Type != "task_accepted" || s.Messages[n-2].Type != "task_completed" ||
		s.Messages[n-1].EventType != "session_closed" || s.Messages[1].EventType != "session_created" || s.Messages[2].EventType != "state_changed" {
		t.Errorf("session %s: the app received %v", s.SessionID, kinds)
	}
	progress := 0
	for i, seq := range s.Sequences() {
		if seq != int64(i+1) {
			t.Errorf("session %s: event %d has sequence %d: %v", s.SessionID, i, seq, kinds)
			break
		}
	}
	for _, m := range s.Messages {
		if m.EventType == "progress" {
			progress++
		}
	}
	if progress != steps {
		t.Errorf("session %s: %d progress events, want %d", s.SessionID, progress, steps)
	}
}

// history records every version of the bed's HCPSessions a watch sees.
type history struct {
	mu    sync.Mutex
	lines map[string][]histLine
}

type histLine struct {
	At          time.Time
	State       v1alpha1.SessionState
	Progress    string
	LastSeq     int64
	Events      int64
	CallerAcked int64
}

func watchSessions(t testing.TB, b *bed) *history {
	wc, err := client.NewWithWatch(b.env.Config, client.Options{Scheme: b.env.Scheme})
	must(t, err)
	w, err := wc.Watch(context.Background(), &v1alpha1.HCPSessionList{}, client.InNamespace(b.ns))
	must(t, err)
	h := &history{lines: map[string][]histLine{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			hs, ok := ev.Object.(*v1alpha1.HCPSession)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			l := histLine{At: time.Now(), State: hs.Status.State, LastSeq: hs.Status.LastSequence, Events: hs.Status.EventCount, CallerAcked: hs.Status.CallerAckedSequence}
			if p := hs.Status.Progress; p != nil && p.Percent != nil {
				l.Progress = fmt.Sprint(*p.Percent)
			}
			h.mu.Lock()
			h.lines[hs.Name] = append(h.lines[hs.Name], l)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return h
}

func (h *history) of(name string) []histLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines[name])
}

func formatHistory(lines []histLine) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-12s  %-10s  %-8s  %-4s  %-6s  %s\n", "TIME", "STATE", "PROGRESS", "SEQ", "EVENTS", "CALLER-ACKED")
	for _, l := range lines {
		state := string(l.State)
		if state == "" {
			state = "<none>"
		}
		fmt.Fprintf(&sb, "%-12s  %-10s  %-8s  %-4d  %-6d  %d\n", l.At.Format("15:04:05.000"), state, l.Progress, l.LastSeq, l.Events, l.CallerAcked)
	}
	return sb.String()
}

func isSubsequence[T comparable](got, want []T) bool {
	i := 0
	for _, g := range got {
		for i < len(want) && want[i] != g {
			i++
		}
		if i == len(want) {
			return false
		}
	}
	return true
}

// call does one local API request with a JSON body and decodes the answer.
func call(ctx context.Context, method, url string, in, out any) int {
	var body io.Reader
	if in != nil {
		js, _ := json.Marshal(in)
		body = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return -1
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return -1
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		_ = json.Unmarshal(data, out)
	}
	return resp.StatusCode
}

// sumCounter adds up every series of a counter vector.
func sumCounter(c *prometheus.CounterVec) float64 {
	ch := make(chan prometheus.Metric, 64)
	go func() { c.Collect(ch); close(ch) }()
	var sum float64
	for m := range ch {
		var pb dto.Metric
		if m.Write(&pb) == nil && pb.Counter != nil {
			sum += pb.Counter.GetValue()
		}
	}
	return sum
}
