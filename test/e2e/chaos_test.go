//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// The chaos step: faults injected while sessions stream, and what each
// cost. HCP_CHAOS picks the faults: "smoke" (the default; a sidecar kill,
// a sidecar OOM kill, a pod move, for make test), "full" (every fault; make chaos) or
// "off"; HCP_CHAOS_ONLY, a regular expression, narrows them to the faults
// it matches. HCP_CHAOS_REPORT names a file for the result table
// (docs/reliability.md shows the last one).
//
// Each fault runs against chaosSessions fresh sessions, injected once every
// session has streamed chaosWarmSteps progress events. Then every session
// must end COMPLETED at the app and in its HCPSession, and the stream the
// app received is measured:
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

const (
	chaosSessions  = 3
	chaosSteps     = 60
	chaosStepMS    = 250
	chaosWarmSteps = 4
	// chaosTimeout bounds one fault's sessions: a lost pod's sessions wait
	// for its Lease to expire (60 s) before another replica takes them.
	chaosTimeout = 4 * time.Minute
)

type fault struct {
	name string
	// smoke faults run in make test too.
	smoke bool
	// replicas of the Callee the fault needs.
	replicas int32
	// localOnly faults need the local stack's processes.
	localOnly bool
	// callerMoves: the fault replaces the caller pod, and with it the sample
	// app's record; what the old app received is joined to the new one's.
	callerMoves bool
	// minRecovery: no session may go on sooner (fencing: a lost owner must
	// have stopped itself before another replica resumes its sessions).
	minRecovery time.Duration
	inject      func(t *testing.T, r *samplesRun, owner *corev1.Pod)
}

var faults = []fault{
	{name: "callee sidecar SIGKILL", smoke: true, replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod) {
		r.stack(t, "kill", owner.Namespace+"/"+owner.Name, "hcp-sidecar", "KILL")
	}},
	{name: "callee sidecar OOM-killed at its memory limit", smoke: true, replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod) {
		r.stack(t, "oom", owner.Namespace+"/"+owner.Name, "hcp-sidecar")
		r.waitOOMKilled(t, owner, "hcp-sidecar")
	}},
	{name: "callee app SIGKILL", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod) {
		r.stack(t, "kill", owner.Namespace+"/"+owner.Name, owner.Spec.Containers[0].Name, "KILL")
	}},
	{name: "callee pod deleted (2 replicas)", smoke: true, replicas: 2, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod) {
		if err := r.c.Delete(t.Context(), owner); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "callee pod lost: frozen, then force-deleted (2 replicas)", replicas: 2, localOnly: true, minRecovery: 50 * time.Second, inject: func(t *testing.T, r *samplesRun, owner *corev1.Pod) {
		// As a node that vanished: the pod's processes stop at once (no
		// drain, no last status write), then the pod object goes.
		ref := owner.Namespace + "/" + owner.Name
		r.stack(t, "kill", ref, "hcp-sidecar", "STOP")
		r.stack(t, "kill", ref, owner.Spec.Containers[0].Name, "STOP")
		if err := r.c.Delete(t.Context(), owner, client.GracePeriodSeconds(0)); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "Callee rolling update (template change, 2 replicas)", replicas: 2, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod) {
		r.patchCallee(t, fmt.Sprintf(`{"spec":{"harness":{"template":{"metadata":{"annotations":{"chaos.hcp.io/rollout":%q}}}}}}`, time.Now().Format(time.RFC3339Nano)))
	}},
	{name: "operator upgrade changing the sidecar (2 replicas)", replicas: 2, localOnly: true, callerMoves: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod) {
		r.upgradeSidecarImage(t)
	}},
	{name: "caller sidecar SIGKILL", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod) {
		r.stack(t, "kill", r.callerPod.Namespace+"/"+r.callerPod.Name, "hcp-sidecar", "KILL")
	}},
	{name: "caller pod moved", replicas: 1, callerMoves: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod) {
		if err := r.c.Delete(t.Context(), r.callerPod); err != nil {
			t.Fatal(err)
		}
	}},
	{name: "broker restart", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod) {
		for _, args := range [][]string{{"stop_app"}, {"start_app"}} {
			if out, err := exec.CommandContext(t.Context(), "rabbitmqctl", args...).CombinedOutput(); err != nil {
				t.Fatalf("rabbitmqctl %s: %v\n%s", args[0], err, out)
			}
		}
	}},
	{name: "API server unavailable for 30 s", replicas: 1, localOnly: true, inject: func(t *testing.T, r *samplesRun, _ *corev1.Pod) {
		r.stack(t, "freeze", "kube-apiserver", "30")
	}},
}

// chaosResult is one fault's row.
type chaosResult struct {
	fault                                          string
	lost, renumbered, dups, deduped, twice, failed int
	// violations are the independent checker's (test/checker).
	violations int
	recovery   time.Duration
	notes      []string
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
	var results []chaosResult
	tp := r.startTap(t)
	for _, f := range faults {
		if (mode != "full" && !f.smoke) || (only != nil && !only.MatchString(f.name)) {
			continue
		}
		if f.localOnly && r.cfg.existing {
			t.Logf("%s: needs the local stack's processes; skipped on an existing cluster", f.name)
			continue
		}
		t.Run(f.name, func(t *testing.T) {
			res := r.runFault(t, f, tp)
			results = append(results, res)
			t.Logf("%s: lost %d, renumbered %d, duplicates %d (deduplicated %d), executed twice %d, failed %d, recovery %s %s",
				f.name, res.lost, res.renumbered, res.dups, res.deduped, res.twice, res.failed, res.recovery.Round(100*time.Millisecond), strings.Join(res.notes, "; "))
		})
	}
	r.setCalleeReplicas(t, 1)
	r.calleePod = r.readyPod(t, "hcp.io/callee="+calleeID)
	table := chaosTable(results)
	t.Logf("chaos (%s):\n%s", mode, table)
	if path := os.Getenv("HCP_CHAOS_REPORT"); path != "" {
		_ = os.MkdirAll(filepath.Dir(path), 0o755)
		if err := os.WriteFile(path, []byte(table), 0o644); err != nil {
			t.Error(err)
		}
	}
}

func chaosTable(results []chaosResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "| fault | sessions | checker violations | lost | renumbered | duplicates (deduplicated) | executed twice | failed | recovery |\n")
	fmt.Fprintf(&b, "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, x := range results {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %d (%d) | %d | %d | %.1f s |\n",
			x.fault, chaosSessions, x.violations, x.lost, x.renumbered, x.dups, x.deduped, x.twice, x.failed, x.recovery.Seconds())
	}
	return b.String()
}

// runFault runs sessions, injects the fault, waits for the sessions and
// measures them. The fault must cost nothing: no loss, no duplicate, no
// second execution, no failure.
func (r *samplesRun) runFault(t *testing.T, f fault, tp *tap) chaosResult {
	r.setCalleeReplicas(t, f.replicas)
	// The fault hits the pod running the first session.
	ids := r.streamingSessions(t, "chaos: "+f.name, chaosSteps)
	owner := &corev1.Pod{}
	eventually(t, 30*time.Second, "the pod running session "+ids[0], func(ctx context.Context) error {
		hs, err := r.session(ctx, ids[0])
		if err != nil {
			return err
		}
		return r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: hs.Status.PodName}, owner)
	})
	var old <-chan samplecaller.Snapshot
	if f.callerMoves {
		old = r.recordUntilGone(t)
	}
	at := time.Now()
	t.Logf("injecting %q (sessions %v, pod %s)", f.name, ids, owner.Name)
	f.inject(t, r, owner)

	// A session may end at the old caller app (the new pod is Ready only
	// after it): what each app received counts, joined.
	var before samplecaller.Snapshot
	if f.callerMoves {
		before = <-old
		r.refreshCaller(t)
	}
	snap := r.finishedWithin(t, ids, chaosTimeout, before)
	res := r.judgeSessions(t, f.name, ids, snap, at)
	res.violations = r.judge(t, tp, ids, snap, chaosSteps)
	if f.minRecovery > 0 && res.recovery < f.minRecovery {
		t.Errorf("%s: sessions went on after %s; a lost owner fences itself only %s after its last renewal, so no replica may resume its sessions sooner",
			f.name, res.recovery.Round(100*time.Millisecond), f.minRecovery)
	}
	// The next fault starts from a settled Caller.
	r.refreshCaller(t)
	return res
}

// streamingSessions submits chaosSessions tasks of steps steps each and
// waits until every session has streamed chaosWarmSteps progress events.
func (r *samplesRun) streamingSessions(t *testing.T, intent string, steps int) []string {
	t.Helper()
	ids := make([]string, chaosSessions)
	for i := range ids {
		in := fmt.Sprintf(`{"recipe":"s3://lab/recipes/chaos-%d.yaml","steps":%d,"step_ms":%d,"log_every":5,"checkpoint_every":2}`, i, steps, chaosStepMS)
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

// streamMeasure is what one session's stream shows.
type streamMeasure struct {
	lost, renumbered, twice int
	pause                   time.Duration
	notes                   []string
}

var stepRE = regexp.MustCompile(`^step (\d+)/`)

func measure(s *samplecaller.SessionLog, fault time.Time) streamMeasure {
	var m streamMeasure
	seqs := map[int64]string{} // sequence → event type
	var last time.Time
	maxStep, ckpt, resumed := 0, false, false
	for _, msg := range s.Messages {
		if msg.Type != "event" {
			continue
		}
		seqs[msg.Sequence] = msg.EventType
		if !last.IsZero() && msg.At.After(fault) {
			from := last
			if from.Before(fault) {
				from = fault
			}
			m.pause = max(m.pause, msg.At.Sub(from))
		}
		last = msg.At
		switch msg.EventType {
		case "checkpoint":
			ckpt = true
		case "state_changed":
			var sc struct {
				To     string `json:"to_state"`
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(msg.Data, &sc)
			if sc.To == string(hcpv1alpha1.SessionRunning) && sc.Reason == "recovered_from_checkpoint" {
				resumed = true
			}
			if sc.To == string(hcpv1alpha1.SessionPaused) {
				m.notes = append(m.notes, "PAUSED "+sc.Reason)
			}
		case "progress":
			var p struct{ Stage string }
			_ = json.Unmarshal(msg.Data, &p)
			sm := stepRE.FindStringSubmatch(p.Stage)
			if sm == nil {
				continue
			}
			step, _ := strconv.Atoi(sm[1])
			switch {
			case resumed:
				// A resumed run repeats the steps after its checkpoint.
				if step == 1 && ckpt && maxStep > 1 {
					m.twice++ // resumed from scratch although checkpointed
				}
				resumed, maxStep = false, step
			case step <= maxStep:
				m.twice++ // another run of the same task at the same time
			default:
				maxStep = step
			}
		}
	}
	// A gap closed by a state change is a renumbering the new owner
	// announced (a lost pod's last numbers are unknown; L2 lets a recovery
	// skip them); any other gap is lost events.
	for seq := int64(1); seq <= s.LastSequence; seq++ {
		if _, ok := seqs[seq]; ok {
			continue
		}
		next := seq + 1
		for ; next <= s.LastSequence; next++ {
			if _, ok := seqs[next]; ok {
				break
			}
		}
		if seqs[next] == "state_changed" {
			m.renumbered += int(next - seq)
		} else {
			m.lost += int(next - seq)
		}
		seq = next
	}
	return m
}

// gapProblem is how the sample app reports a sequence gap.
var gapProblem = regexp.MustCompile(`^event sequence \d+ after \d+ \(want \d+\)$`)

// unexplained drops the sample app's gap reports when the gaps are an
// announced renumbering.
func unexplained(problems []string, renumbered int) []string {
	var out []string
	for _, p := range problems {
		if renumbered > 0 && gapProblem.MatchString(p) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func describeStream(s *samplecaller.SessionLog) string {
	var parts []string
	for _, m := range s.Messages {
		p := m.Type
		if m.Type == "event" {
			p = fmt.Sprintf("%d:%s", m.Sequence, m.EventType)
			if m.EventType == "state_changed" || m.EventType == "progress" {
				p += string(m.Data)
			}
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}

// finishedWithin waits up to d for every session to be closed at the app,
// with before (what an earlier caller app received) joined to its record.
func (r *samplesRun) finishedWithin(t *testing.T, ids []string, d time.Duration, before samplecaller.Snapshot) samplecaller.Snapshot {
	t.Helper()
	var snap samplecaller.Snapshot
	eventually(t, d, fmt.Sprintf("%d sessions closed at the app", len(ids)), func(ctx context.Context) error {
		after, err := r.received(ctx)
		if err != nil {
			return err
		}
		snap = joinRecords(before, after)
		for _, id := range ids {
			if s := snap.Sessions[id]; s == nil || s.FinalState == "" {
				return fmt.Errorf("session %s not closed at the app yet", id)
			}
		}
		return nil
	})
	return snap
}

// recordUntilGone reads the caller app's record every 50 ms until its app
// container no longer runs (or its pod is gone) and sends the last one. The
// caller sidecar drains before the app is stopped, so nothing reaches the
// app after the last read that answered.
func (r *samplesRun) recordUntilGone(t *testing.T) <-chan samplecaller.Snapshot {
	out := make(chan samplecaller.Snapshot, 1)
	app, pod := r.app, r.callerPod.DeepCopy()
	url := fmt.Sprintf("http://127.0.0.1:%d/received", appPort)
	go func() {
		var last samplecaller.Snapshot
		defer func() { out <- last }()
		stop := func() {}
		defer func() { stop() }()
		for deadline := time.Now().Add(chaosTimeout); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			var snap samplecaller.Snapshot
			err := getJSON(ctx, app, url, &snap)
			cancel()
			if err == nil {
				last = snap
				continue
			}
			// Gone only when its app container is: a failed request may be
			// the port-forward ending (kubectl's ends with the first broken
			// connection), then a new one reaches the app again.
			if !r.appRunning(pod) {
				return
			}
			stop()
			if hc, s, err := r.openPodHTTP(pod, appPort); err == nil {
				app, stop = hc, s
			}
		}
	}()
	return out
}

// appRunning: the pod exists and its app container runs.
func (r *samplesRun) appRunning(pod *corev1.Pod) bool {
	p := &corev1.Pod{}
	if err := r.c.Get(context.Background(), client.ObjectKeyFromObject(pod), p); err != nil {
		return !apierrors.IsNotFound(err)
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.Name == pod.Spec.Containers[0].Name {
			return cs.State.Running != nil
		}
	}
	return false
}

// joinRecords replays what the old and then the new caller app received
// through one recorder, so duplicates and gaps across the move count. Each
// message keeps the time it was received (its n-th copy the n-th time).
func joinRecords(before, after samplecaller.Snapshot) samplecaller.Snapshot {
	rec := samplecaller.NewRecorder()
	at := map[string][]time.Time{}
	for _, snap := range []samplecaller.Snapshot{before, after} {
		for id, s := range snap.Sessions {
			all := append(append([]samplecaller.Received(nil), s.Messages...), s.Repeated...)
			sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
			for _, m := range all {
				at[m.MessageID] = append(at[m.MessageID], m.At)
				rec.Record(samplecaller.Message{
					SessionID: id, CalleeID: s.CalleeID, TaskMessageID: s.TaskMessageID, MessageID: m.MessageID, Type: m.Type,
					Sequence: m.Sequence, EventType: m.EventType, Data: m.Data, Redelivered: m.Redelivered, Lost: m.Lost, Payload: m.Payload,
				})
			}
		}
	}
	joined := rec.Snapshot()
	for _, s := range joined.Sessions {
		seen := map[string]int{}
		stamp := func(r *samplecaller.Received) {
			if ts := at[r.MessageID]; seen[r.MessageID] < len(ts) {
				r.At = ts[seen[r.MessageID]]
			}
			seen[r.MessageID]++
		}
		for i := range s.Messages {
			stamp(&s.Messages[i])
		}
		for i := range s.Repeated {
			stamp(&s.Repeated[i])
		}
	}
	return joined
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

// stack runs hack/local-stack.sh with args.
func (r *samplesRun) stack(t *testing.T, args ...string) {
	t.Helper()
	out, err := output(t.Context(), filepath.Join(r.cfg.root, "hack", "local-stack.sh"), args...)
	if err != nil {
		t.Fatalf("hack/local-stack.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

// waitOOMKilled waits until the kubelet reports that the pod's container
// (a native sidecar: an init container) was OOM-killed and restarted in
// place: the same pod, a higher restart count, last state OOMKilled.
func (r *samplesRun) waitOOMKilled(t *testing.T, pod *corev1.Pod, container string) {
	t.Helper()
	status := func(p *corev1.Pod) *corev1.ContainerStatus {
		for _, cs := range append(slices.Clone(p.Status.InitContainerStatuses), p.Status.ContainerStatuses...) {
			if cs.Name == container {
				return &cs
			}
		}
		return nil
	}
	var before int32
	if cs := status(pod); cs != nil {
		before = cs.RestartCount
	}
	eventually(t, time.Minute, fmt.Sprintf("pod %s container %s restarted after an OOM kill", pod.Name, container), func(ctx context.Context) error {
		p := &corev1.Pod{}
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(pod), p); err != nil {
			return err
		}
		cs := status(p)
		if cs == nil {
			return fmt.Errorf("no status of container %s", container)
		}
		if cs.RestartCount <= before || cs.LastTerminationState.Terminated == nil {
			return fmt.Errorf("restart count %d (was %d), last state %+v", cs.RestartCount, before, cs.LastTerminationState)
		}
		if reason := cs.LastTerminationState.Terminated.Reason; reason != "OOMKilled" {
			t.Fatalf("container %s ended with reason %q (exit %d), want OOMKilled", container, reason, cs.LastTerminationState.Terminated.ExitCode)
		}
		return nil
	})
	t.Logf("pod %s: container %s was OOMKilled by the kernel and restarted in place", pod.Name, container)
}

func (r *samplesRun) patchCallee(t *testing.T, patch string) {
	t.Helper()
	cl := &hcpv1alpha1.Callee{ObjectMeta: metav1.ObjectMeta{Namespace: r.ns, Name: calleeID}}
	if err := r.c.Patch(t.Context(), cl, client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
		t.Fatalf("patching Callee %s with %s: %v", calleeID, patch, err)
	}
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
func (r *samplesRun) refreshCaller(t *testing.T) {
	t.Helper()
	p := r.readyPod(t, "hcp.io/caller="+callerID)
	if r.callerPod != nil && p.UID == r.callerPod.UID {
		return
	}
	r.callerPod = p
	hc := r.podHTTP(r.parent, p, sidecarPort, appPort)
	r.sidecar = samplecaller.NewClient(fmt.Sprintf("http://127.0.0.1:%d", sidecarPort))
	r.sidecar.HTTP = hc
	r.app = hc
}

// upgradeSidecarImage does what an operator upgrade that changes the
// injected sidecar does: the manager restarts with another --sidecar-image
// (the local stack maps every tag to the same binary) and rolls the
// harness pods.
func (r *samplesRun) upgradeSidecarImage(t *testing.T) {
	t.Helper()
	var deps appsv1.DeploymentList
	if err := r.c.List(t.Context(), &deps, client.InNamespace(r.opNS)); err != nil {
		t.Fatal(err)
	}
	for i := range deps.Items {
		d := &deps.Items[i]
		if !isManager(d) {
			continue
		}
		args := d.Spec.Template.Spec.Containers[0].Args
		for j, a := range args {
			if img, ok := strings.CutPrefix(a, "--sidecar-image="); ok {
				repo, _, _ := strings.Cut(img, "@")
				if k := strings.LastIndex(repo, ":"); k > strings.LastIndex(repo, "/") {
					repo = repo[:k]
				}
				next := repo + ":chaos-" + strconv.FormatInt(time.Now().Unix(), 10)
				// The same image under a new tag, as a release would push
				// it: the node has no registry, so it is tagged there.
				r.stack(t, "ctr", "images", "tag", img, next)
				args[j] = "--sidecar-image=" + next
				t.Logf("manager %s: %s → %s", d.Name, a, args[j])
			}
		}
		if err := r.c.Update(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Fatalf("no manager Deployment in %s", r.opNS)
}
