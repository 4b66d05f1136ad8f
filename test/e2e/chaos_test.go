//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// The chaos step: faults injected while sessions stream, and what each
// cost. HCP_CHAOS picks the faults (faults_test.go): "smoke" (the default;
// those marked smoke, for make test), "full" (every fault; make chaos) or
// "off"; HCP_CHAOS_ONLY, a regular expression, narrows them to the faults
// it matches. HCP_CHAOS_RUNS (default 1; make chaos: 5) runs each selected
// fault that many times, each run with fresh sessions. HCP_CHAOS_REPORT
// names a file for the result table (docs/reliability.md shows the last
// one).
//
// Each run of a fault starts chaosSessions fresh sessions and injects the
// fault once every session has streamed chaosWarmSteps progress events.
// Then every session must end COMPLETED at the app and in its HCPSession,
// the independent checker (observe_test.go, test/checker) must find no
// violation in the history, and the stream the app received is measured:
//   - lost: sequence numbers missing from 1..last;
//   - duplicates: events the app received twice without redelivered=true
//     (deduplicated: with it, which an app recognises; counted apart);
//   - executed twice: a progress step that went backwards without a
//     recovered_from_checkpoint just before it (two runs of the task at
//     once), or a resume that started over from step 1 although a
//     checkpoint had been taken;
//   - failed: sessions that did not complete;
//   - recovery: the longest pause between two events of a session after
//     the fault, the slowest session's.
//
// The table has one row per fault: the runs, their sessions, the sums of
// violations and counts, and the median and the longest of the runs'
// recoveries.

const (
	chaosSessions  = 3
	chaosWarmSteps = 4
	// chaosTimeout bounds the wait for one run's sessions once the
	// injection returned: a lost pod's sessions wait for its Lease to
	// expire (60 s) before another replica takes them. A fault that lasts
	// (a pause, an outage) returns when it is over, so its length does not
	// count.
	chaosTimeout = 4 * time.Minute
)

// chaosTask is the sample task each session runs.
type chaosTask struct {
	steps, stepMS, checkpointEvery int
}

// defaultTask: 60 steps of 250 ms (15 s), a checkpoint every 2 steps.
var defaultTask = chaosTask{steps: 60, stepMS: 250, checkpointEvery: 2}

type fault struct {
	name string
	// smoke faults run in make test too.
	smoke bool
	// replicas of the Callee the fault needs.
	replicas int32
	// localOnly faults need the local stack's processes.
	localOnly bool
	// cluster faults need the three-node broker (HCP_E2E_RABBITMQ_CLUSTER=1).
	cluster bool
	// callerMoves: the fault replaces the caller pod, and with it the sample
	// app's record; what the old app received is joined to the new one's.
	callerMoves bool
	// minRecovery: no session may go on sooner (fencing: a lost owner must
	// have stopped itself before another replica resumes its sessions).
	minRecovery time.Duration
	// settle: once the sessions ended, the run waits this long before the
	// checker reads the history, so that an owner that came back (a
	// partition healed, a process resumed) has the time to publish what it
	// still would, and the checker sees it.
	settle time.Duration
	// task is what the sessions run (defaultTask when zero).
	task chaosTask
	// inject injects the fault; owner is the pod running the first of
	// the sessions ids. It may return while the fault lasts, or after.
	inject func(t *testing.T, r *samplesRun, owner *corev1.Pod, ids []string)
}

func (f fault) sessionTask() chaosTask {
	if f.task == (chaosTask{}) {
		return defaultTask
	}
	return f.task
}

// chaosResult is what one run of a fault cost.
type chaosResult struct {
	fault                                          string
	lost, renumbered, dups, deduped, twice, failed int
	// violations are the independent checker's (test/checker).
	violations int
	recovery   time.Duration
	notes      []string
}

// faultRow is a fault's row of the table: its runs summed up.
type faultRow struct {
	fault                                  string
	runs, sessions, violations, failed     int
	lost, renumbered, dups, deduped, twice int
	recoveries                             []time.Duration
	notes                                  []string
}

// add counts one run; judged is false when the run stopped before its
// sessions were judged (an error), and then all of them count as failed.
func (w *faultRow) add(run int, res chaosResult, judged bool) {
	w.runs++
	w.sessions += chaosSessions
	if !judged {
		w.failed += chaosSessions
		w.notes = append(w.notes, fmt.Sprintf("run %d stopped before its sessions were judged", run))
		return
	}
	w.violations += res.violations
	w.failed += res.failed
	w.lost += res.lost
	w.renumbered += res.renumbered
	w.dups += res.dups
	w.deduped += res.deduped
	w.twice += res.twice
	w.recoveries = append(w.recoveries, res.recovery)
	for _, n := range res.notes {
		w.notes = append(w.notes, fmt.Sprintf("run %d: %s", run, n))
	}
}

// recovery is the median (the lower middle one of an even count) and the
// longest of the judged runs' recoveries.
func (w *faultRow) recovery() (p50, maxRec time.Duration) {
	if len(w.recoveries) == 0 {
		return 0, 0
	}
	s := slices.Sorted(slices.Values(w.recoveries))
	return s[(len(s)-1)/2], s[len(s)-1]
}

// chaosRuns is HCP_CHAOS_RUNS: how many times each fault runs.
func chaosRuns(t *testing.T) int {
	v := envOr("HCP_CHAOS_RUNS", "1")
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("HCP_CHAOS_RUNS=%q: want a whole number of runs, at least 1", v)
	}
	return n
}

func (r *samplesRun) chaos(t *testing.T) {
	mode := envOr("HCP_CHAOS", "smoke")
	if mode == "off" {
		t.Skip("HCP_CHAOS=off")
	}
	var only *regexp.Regexp
	if o := os.Getenv("HCP_CHAOS_ONLY"); o != "" {
		only = regexp.MustCompile(o)
	}
	runs := chaosRuns(t)
	var rows []faultRow
	tp := r.startTap(t)
	for _, f := range faults {
		if (mode != "full" && !f.smoke) || (only != nil && !only.MatchString(f.name)) {
			continue
		}
		if f.localOnly && r.cfg.existing {
			t.Logf("%s: needs the local stack's processes; skipped on an existing cluster", f.name)
			continue
		}
		if f.cluster && r.cfg.rmqNodes == nil {
			t.Logf("%s: needs the three-node broker (HCP_E2E_RABBITMQ_CLUSTER=1); skipped", f.name)
			continue
		}
		row := faultRow{fault: f.name}
		t.Run(f.name, func(t *testing.T) {
			for i := 1; i <= runs; i++ {
				var res chaosResult
				judged := false
				t.Run(fmt.Sprintf("run %d", i), func(t *testing.T) {
					res = r.runFault(t, f, tp)
					judged = true
					t.Logf("%s, run %d: checker violations %d, lost %d, renumbered %d, duplicates %d (deduplicated %d), executed twice %d, failed %d, recovery %s %s",
						f.name, i, res.violations, res.lost, res.renumbered, res.dups, res.deduped, res.twice, res.failed, res.recovery.Round(100*time.Millisecond), strings.Join(res.notes, "; "))
				})
				row.add(i, res, judged)
			}
		})
		rows = append(rows, row)
	}
	r.setCalleeReplicas(t, 1)
	r.calleePod = r.readyPod(t, "hcp.io/callee="+calleeID)
	table := chaosTable(rows)
	t.Logf("chaos (%s, %d runs per fault):\n%s", mode, runs, table)
	for _, w := range rows {
		if len(w.notes) > 0 {
			t.Logf("%s: %s", w.fault, strings.Join(w.notes, "; "))
		}
	}
	if path := os.Getenv("HCP_CHAOS_REPORT"); path != "" {
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// chaosTableHeader is the table's header, as docs/reliability.md has it.
const chaosTableHeader = "| fault | runs | sessions | checker violations | failed | lost | renumbered | duplicates (deduplicated) | executed twice | recovery p50 | recovery max |\n" +
	"| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"

func chaosTable(rows []faultRow) string {
	var b strings.Builder
	b.WriteString(chaosTableHeader)
	for _, x := range rows {
		p50, longest := x.recovery()
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d | %d | %d (%d) | %d | %.1f s | %.1f s |\n",
			x.fault, x.runs, x.sessions, x.violations, x.failed, x.lost, x.renumbered, x.dups, x.deduped, x.twice, p50.Seconds(), longest.Seconds())
	}
	return b.String()
}

// runFault runs one run of f: fresh sessions, the fault, the wait for the
// sessions, and the judgement. The fault must cost nothing: no violation,
// no loss, no duplicate, no second execution, no failure.
func (r *samplesRun) runFault(t *testing.T, f fault, tp *tap) chaosResult {
	r.setCalleeReplicas(t, f.replicas)
	r.freshPods(t, f.replicas)
	defer func() {
		if t.Failed() {
			r.logPods(t)
		}
	}()
	task := f.sessionTask()
	// The fault hits the pod running the first session.
	ids := r.streamingSessions(t, "chaos: "+f.name, task)
	owner := &corev1.Pod{}
	eventually(t, 30*time.Second, "the pod running session "+ids[0], func(ctx context.Context) error {
		hs, err := r.session(ctx, ids[0])
		if err != nil {
			return err
		}
		return r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: hs.Status.PodName}, owner)
	})
	var old <-chan samplecaller.Snapshot
	if f.callerMoves && r.receiptLog == "" {
		old = r.recordUntilGone(t)
	}
	at := time.Now()
	t.Logf("injecting %q (sessions %v, pod %s)", f.name, ids, owner.Name)
	f.inject(t, r, owner, ids)

	// A session may end at the old caller app (the new pod is Ready only
	// after it): what each app received counts, joined.
	var before samplecaller.Snapshot
	if old != nil {
		before = <-old
	}
	if f.callerMoves {
		r.refreshCaller(t)
	}
	snap := r.finishedWithin(t, ids, chaosTimeout, before)
	if f.settle > 0 {
		// Not a wait for something to happen: the window in which a
		// returned zombie would publish, for the checker to see it.
		t.Logf("sessions closed; watching %s more for late messages of pod %s", f.settle, owner.Name)
		time.Sleep(f.settle)
	}
	res := r.judgeSessions(t, f.name, ids, snap, at)
	if f.cluster && res.recovery > slowRecovery {
		// A slow recovery passes, but where it waited shows only in the
		// sidecars' logs, gone with the next run's pods.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		r.dumpLogs(t, ctx, r.ns)
		cancel()
	}
	res.violations = r.judge(t, tp, ids, snap, task.steps)
	res.notes = append(res.notes, r.endedOn(t, ids, owner.Name))
	if f.minRecovery > 0 && res.recovery < f.minRecovery {
		t.Errorf("%s: sessions went on after %s; a lost owner fences itself only %s after its last renewal, so no replica may resume its sessions sooner",
			f.name, res.recovery.Round(100*time.Millisecond), f.minRecovery)
	}
	// The next run starts from a settled Caller.
	r.refreshCaller(t)
	return res
}

// endedOn says which pod each session ended on, relative to the pod the
// fault hit (a note of the table: whether the fault moved the sessions).
func (r *samplesRun) endedOn(t *testing.T, ids []string, owner string) string {
	t.Helper()
	var parts []string
	for _, id := range ids {
		hs, err := r.session(t.Context(), id)
		switch {
		case err != nil:
			parts = append(parts, id+" ?")
		case hs.Status.PodName == owner:
			parts = append(parts, id+" on the pod hit")
		default:
			parts = append(parts, id+" moved to "+hs.Status.PodName)
		}
	}
	return "ended " + strings.Join(parts, ", ")
}

// streamingSessions submits chaosSessions tasks and waits until every
// session has streamed chaosWarmSteps progress events.
func (r *samplesRun) streamingSessions(t *testing.T, intent string, task chaosTask) []string {
	t.Helper()
	ids := make([]string, chaosSessions)
	for i := range ids {
		in := fmt.Sprintf(`{"recipe":"s3://lab/recipes/chaos-%d.yaml","steps":%d,"step_ms":%d,"log_every":5,"checkpoint_every":%d}`, i, task.steps, task.stepMS, task.checkpointEvery)
		ids[i] = r.submit(t, synthesis, intent, in, samplecaller.Constraints{DataClassification: "T2"}).SessionID
	}
	eventually(t, sessionTimeout, "every session streams", func(ctx context.Context) error {
		snap, err := r.received(ctx)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if s := snap.Sessions[id]; s == nil || count(s, "progress") < chaosWarmSteps {
				return fmt.Errorf("session %s has not streamed %d steps yet", id, chaosWarmSteps)
			}
		}
		return nil
	})
	return ids
}

// slowRecovery: a longer pause is logged with its bounds (judgeSessions),
// and after a broker node fault with the containers' logs.
const slowRecovery = 10 * time.Second

// judgeSessions measures the sessions ids in what the app received (snap)
// after a fault at `at`, checks each against its HCPSession, and fails
// unless the fault cost nothing: no loss, no duplicate, no second
// execution, no failure.
func (r *samplesRun) judgeSessions(t *testing.T, fault string, ids []string, snap samplecaller.Snapshot, at time.Time) chaosResult {
	t.Helper()
	res := chaosResult{fault: fault}
	for _, id := range ids {
		s := snap.Sessions[id]
		m := measure(s, at)
		res.lost += m.lost
		res.renumbered += m.renumbered
		res.dups += s.Duplicates
		res.deduped += s.Deduplicated
		res.twice += m.twice
		if m.twice > 0 {
			t.Logf("session %s ran steps twice: %s", id, describeStream(s))
		}
		res.recovery = max(res.recovery, m.pause)
		if m.pause > slowRecovery {
			t.Logf("session %s paused %s, from %s to %s (the app's clock)", id, m.pause.Round(100*time.Millisecond),
				m.pauseFrom.UTC().Format("15:04:05.000"), m.pauseTo.UTC().Format("15:04:05.000"))
		}
		res.notes = append(res.notes, m.notes...)
		if s.FinalState != string(hcpv1alpha1.SessionCompleted) {
			res.failed++
			t.Errorf("session %s ended %s, want COMPLETED; events: %s", id, s.FinalState, describeStream(s))
			continue
		}
		if p := unexplained(s.Problems, m.renumbered); len(p) != 0 {
			t.Errorf("session %s: the app saw %q", id, p)
		}
		r.chaosSessionMatches(t, s, m.renumbered == 0)
	}
	if res.lost+res.dups+res.twice+res.failed != 0 {
		t.Errorf("%s cost lost %d, duplicates %d, executed twice %d, failed %d; want 0", fault, res.lost, res.dups, res.twice, res.failed)
	}
	return res
}

// finishedWithin waits up to d for every session to be closed at the app,
// with before (what an earlier caller app received) joined to its record.
func (r *samplesRun) finishedWithin(t *testing.T, ids []string, d time.Duration, before samplecaller.Snapshot) samplecaller.Snapshot {
	t.Helper()
	var snap samplecaller.Snapshot
	eventually(t, d, fmt.Sprintf("%d sessions closed at the app", len(ids)), func(ctx context.Context) error {
		var err error
		if snap, err = r.appReceived(ctx, ids, before); err != nil {
			return err
		}
		for _, id := range ids {
			if s := snap.Sessions[id]; s == nil || s.FinalState == "" {
				return fmt.Errorf("session %s not closed at the app yet", id)
			}
		}
		return nil
	})
	return snap
}

// chaosSessionMatches waits until the HCPSession is COMPLETED with the
// last sequence the app received and the caller's position caught up;
// with exactCount, its eventCount is what the app received too (after a
// renumbering the new owner cannot know how many events the lost pod
// published after its last status write).
func (r *samplesRun) chaosSessionMatches(t *testing.T, s *samplecaller.SessionLog, exactCount bool) {
	t.Helper()
	eventually(t, 30*time.Second, "HCPSession "+s.SessionID+" COMPLETED as the app saw it", func(ctx context.Context) error {
		hs, err := r.session(ctx, s.SessionID)
		if err != nil {
			return err
		}
		st := hs.Status
		if st.State != hcpv1alpha1.SessionCompleted || st.LastSequence != s.LastSequence || st.CallerAckedSequence != st.LastSequence ||
			(exactCount && st.EventCount != int64(s.Events)) {
			return fmt.Errorf("state %s lastSequence %d eventCount %d callerAckedSequence %d; the app received %d events, last sequence %d",
				st.State, st.LastSequence, st.EventCount, st.CallerAckedSequence, s.Events, s.LastSequence)
		}
		return nil
	})
}

// setCalleeReplicas scales the Callee and waits until exactly n pods are
// Ready and none is terminating.
func (r *samplesRun) setCalleeReplicas(t *testing.T, n int32) {
	t.Helper()
	r.patchCallee(t, fmt.Sprintf(`{"spec":{"harness":{"replicas":%d}}}`, n))
	eventually(t, readyTimeout, fmt.Sprintf("%d Ready callee pods, none terminating", n), func(ctx context.Context) error {
		pods := &corev1.PodList{}
		if err := r.c.List(ctx, pods, client.InNamespace(r.ns), client.MatchingLabels{"hcp.io/callee": calleeID}); err != nil {
			return err
		}
		ready := int32(0)
		for _, p := range pods.Items {
			if p.DeletionTimestamp != nil {
				return fmt.Errorf("pod %s is terminating", p.Name)
			}
			for _, c := range p.Status.Conditions {
				if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
					ready++
				}
			}
		}
		if ready != n || int32(len(pods.Items)) != n {
			return fmt.Errorf("%d pods, %d Ready: %s", len(pods.Items), ready, r.podsSummary(ctx, r.ns))
		}
		return nil
	})
}

// refreshCaller points the suite's clients at the caller's Ready pod (a
// fault may have replaced it).
func (r *samplesRun) refreshCaller(t *testing.T) { r.connectCaller(t, false) }

// reconnectCaller opens a new port-forward to the caller's Ready pod, the
// same pod too: kubectl port-forward runs through the API server and the
// kubelet, and one that was frozen may have ended it.
func (r *samplesRun) reconnectCaller(t *testing.T) { r.connectCaller(t, true) }

func (r *samplesRun) connectCaller(t *testing.T, always bool) {
	t.Helper()
	p := r.readyPod(t, "hcp.io/caller="+callerID)
	if !always && r.callerPod != nil && p.UID == r.callerPod.UID {
		return
	}
	hc, stop, err := r.openPodHTTP(p, sidecarPort, appPort)
	if err != nil {
		t.Fatal(err)
	}
	r.parent.Cleanup(stop)
	if r.stopCallerForward != nil {
		r.stopCallerForward()
	}
	r.stopCallerForward = stop
	r.callerPod = p
	r.sidecar = samplecaller.NewClient(fmt.Sprintf("http://127.0.0.1:%d", sidecarPort))
	r.sidecar.HTTP = hc
	r.app = hc
}
