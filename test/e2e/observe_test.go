//go:build e2e

package e2e

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/test/checker"
)

// The chaos suite's independent observers (test/checker): a tap queue on
// the run's events exchange records the wire, with each message's
// broker-validated user-id and owner epoch; the sample caller app's record
// is what the app received; the sample harness's step log (a file on the
// node) is what ran where; the HCPSessions are the callee's view. None of
// them is a sidecar's own count.

// recordOnNode, on the local stack, mounts a directory of the node into the
// sample Callee's harness and the sample Caller's app, and points
// HCP_SAMPLE_STEP_LOG (samplecallee.StepLog) and HCP_SAMPLE_RECEIPT_LOG
// (samplecaller.ReceiptLog) at files in it. Every harness and app pod of
// the run appends to them, so what each did outlives its pod.
func (r *samplesRun) recordOnNode(t *testing.T) {
	if r.cfg.existing {
		return
	}
	dir := filepath.Join("/var/lib/hcp-e2e", r.id)
	if err := os.MkdirAll(dir, 0o777); err != nil {
		t.Fatalf("records on the node: %v", err)
	}
	// The apps run as non-root users; the umask took write from others.
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatalf("records on the node: %v", err)
	}
	r.parent.Cleanup(func() { _ = os.RemoveAll(dir) })
	mount := func(spec *corev1.PodSpec, env, file string) {
		spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "hcp-e2e-records",
			VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: dir}}})
		c := &spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "hcp-e2e-records", MountPath: "/var/run/hcp-e2e-records"})
		c.Env = append(c.Env, corev1.EnvVar{Name: env, Value: "/var/run/hcp-e2e-records/" + file})
	}
	r.stepLog = filepath.Join(dir, "steps.jsonl")
	mount(&r.callee.Spec.Harness.Template.Spec, "HCP_SAMPLE_STEP_LOG", "steps.jsonl")
	if r.caller.Spec.Harness != nil {
		r.receiptLog = filepath.Join(dir, "receipts.jsonl")
		mount(&r.caller.Spec.Harness.Template.Spec, "HCP_SAMPLE_RECEIPT_LOG", "receipts.jsonl")
	}
}

// appReceived is what the caller apps received of the sessions ids: every
// app pod's, from the receipt log (one stream per session, so a message
// both an old and a new app got is a duplicate), or, on an existing
// cluster, the current app's record joined to before (what an app it
// replaced had received).
func (r *samplesRun) appReceived(ctx context.Context, ids []string, before samplecaller.Snapshot) (samplecaller.Snapshot, error) {
	if r.receiptLog == "" {
		after, err := r.received(ctx)
		return joinRecords(before, after), err
	}
	f, err := os.Open(r.receiptLog)
	if err != nil {
		return samplecaller.Snapshot{}, err
	}
	defer f.Close()
	return samplecaller.ReadReceipts(f, func(id string) bool { return slices.Contains(ids, id) })
}

// steps reads the step log for the sessions ids; nothing on an existing
// cluster.
func (r *samplesRun) steps(t *testing.T, ids []string) ([]checker.Step, []checker.Recovery) {
	t.Helper()
	if r.stepLog == "" {
		return nil, nil
	}
	f, err := os.Open(r.stepLog)
	if errors.Is(err, fs.ErrNotExist) {
		t.Errorf("checker: the harness wrote no step log (%s)", r.stepLog)
		return nil, nil
	}
	if err != nil {
		t.Fatalf("checker: %v", err)
	}
	defer f.Close()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	steps, recs, err := checker.ReadHarnessLog(f, want)
	if err != nil {
		t.Errorf("checker: %v", err)
	}
	return steps, recs
}

// of returns what the tap recorded for the sessions ids, and the messages
// it could not read.
func (tp *tap) of(ids []string) ([]checker.Message, []string) {
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []checker.Message
	for _, m := range tp.msgs {
		if want[m.Session] {
			out = append(out, m)
		}
	}
	return out, append([]string(nil), tp.bad...)
}

// delivered is what the app received of the sessions ids, in the order it
// received them, duplicates included.
func delivered(t *testing.T, snap samplecaller.Snapshot, ids []string) []checker.Message {
	t.Helper()
	var out []checker.Message
	for _, id := range ids {
		s := snap.Sessions[id]
		if s == nil {
			continue
		}
		all := append(append([]samplecaller.Received(nil), s.Messages...), s.Repeated...)
		sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
		for _, r := range all {
			m, err := checker.FromApp(id, r.MessageID, r.Type, r.Payload, r.At)
			if err != nil {
				t.Errorf("checker: the app's record of session %s: %v", id, err)
				continue
			}
			out = append(out, m)
		}
	}
	return out
}

// judge runs the checker over the sessions ids: the tap's wire, the app's
// stream and each observer's view of how the session ended. It fails t on
// any violation and returns how many there were.
func (r *samplesRun) judge(t *testing.T, tp *tap, ids []string, snap samplecaller.Snapshot, taskSteps int) int {
	t.Helper()
	// The tap sees a message when the broker routes it; give the last ones
	// a moment to arrive.
	time.Sleep(time.Second)
	pub, bad := tp.of(ids)
	for _, b := range bad {
		t.Errorf("checker: the tap could not read a message: %s", b)
	}
	views := map[string]map[string]string{"app": {}, "hcpsession": {}}
	for _, id := range ids {
		if s := snap.Sessions[id]; s != nil {
			views["app"][id] = s.FinalState
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		hs, err := r.session(ctx, id)
		cancel()
		if err != nil {
			t.Errorf("checker: HCPSession %s: %v", id, err)
			continue
		}
		views["hcpsession"][id] = string(hs.Status.State)
	}
	steps, recs := r.steps(t, ids)
	completed := map[string]int{}
	if r.stepLog != "" {
		for _, id := range ids {
			if views["app"][id] == "COMPLETED" {
				completed[id] = taskSteps
			}
		}
	}
	v := checker.Check(checker.History{Published: pub, Delivered: delivered(t, snap, ids), Terminal: views,
		Steps: steps, Recoveries: recs, Completed: completed})
	for _, x := range v {
		t.Errorf("checker: %s", x)
	}
	tp.mu.Lock()
	reconnects := tp.reconnects
	tp.mu.Unlock()
	t.Logf("checker: %d messages on the wire (the tap reconnected %d times), %d step executions, %d resumptions, %d violations",
		len(pub), reconnects, len(steps), len(recs), len(v))
	return len(v)
}
