package cachetrim

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/heapmeter"
)

// session is an HCPSession as a running session's looks: a sentence of
// intent, progress and a checkpoint reported, and the error and positions
// the sidecars read.
func session(i int) *v1alpha1.HCPSession {
	now := metav1.NewTime(time.Now())
	pct := int32(40)
	return &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{
			Name: fmt.Sprintf("s-%06d", i), Namespace: "lab", CreationTimestamp: now, ResourceVersion: "42",
			Labels:        map[string]string{v1alpha1.LabelCalleeID: "lab", v1alpha1.LabelCallerID: "alpha", v1alpha1.LabelSessionState: "RUNNING"},
			Annotations:   map[string]string{v1alpha1.AnnotationAdmitted: "true"},
			ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "hcp-sidecar", Operation: metav1.ManagedFieldsOperationApply}},
		},
		Spec: v1alpha1.HCPSessionSpec{SessionID: fmt.Sprintf("s-%06d", i), CalleeID: "lab", CallerID: "alpha", Capability: "analyze",
			TaskMessageID: "m", RiskLevel: "R1", AbortRequested: true, Intent: strings.Repeat("measure the sample's absorbance ", 10)},
		Status: v1alpha1.HCPSessionStatus{
			State: v1alpha1.SessionRunning, PodName: "lab-0", OwnerEpoch: 2, CallerAckedSequence: 7, LastSequence: 9, StartedAt: &now,
			Progress:       &v1alpha1.SessionProgress{Stage: "scan", Percent: &pct, Message: strings.Repeat("wavelength 540 nm ", 10)},
			LastCheckpoint: &v1alpha1.SessionCheckpoint{ID: "c1", Description: strings.Repeat("plate 3 of 8 read ", 8), Resumable: true},
			Result:         &v1alpha1.SessionResult{Summary: strings.Repeat("ok ", 100)},
			Error:          &v1alpha1.SessionError{Code: "E", Message: "kept"},
		},
	}
}

// TestTransformKeepsWhatSidecarsRead: the cached copy has no managed
// fields, intent, result, progress or checkpoint, and everything else as
// it was.
func TestTransformKeepsWhatSidecarsRead(t *testing.T) {
	in := session(1)
	want := in.DeepCopy()
	want.ManagedFields, want.Spec.Intent = nil, ""
	want.Status.Result, want.Status.Progress, want.Status.LastCheckpoint = nil, nil, nil
	out, err := Transform(in)
	if err != nil {
		t.Fatal(err)
	}
	if got := out.(*v1alpha1.HCPSession); !reflect.DeepEqual(got, want) {
		t.Errorf("cached copy:\n%+v\nwant\n%+v", got, want)
	}
	cm := &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: "x", ManagedFields: in.ManagedFields}}
	if out, err := Transform(cm); err != nil || len(out.(*metav1.PartialObjectMetadata).ManagedFields) != 0 {
		t.Errorf("another kind: managed fields %v, error %v; want none", out, err)
	}
}

// TestCallerSessionKeepsWhatTheCallerReads: a caller's cached copy keeps
// every field internal/sidecar/caller reads (lookups, adoption, seeding,
// the fenced status write) and nothing else.
func TestCallerSessionKeepsWhatTheCallerReads(t *testing.T) {
	in := session(1)
	in.UID, in.Generation = "u-1", 3
	in.Annotations["hcp.io/terminal-record"] = strings.Repeat(`{"rk":"alpha.s.event","seq":3}`, 40)
	in.OwnerReferences = []metav1.OwnerReference{{Name: "lab", UID: "o"}}
	in.Status.Conditions = []metav1.Condition{{Type: "Recorded", Status: metav1.ConditionTrue, Reason: "Created", Message: "recorded"}}
	out, err := CallerSession(in.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	got := out.(*v1alpha1.HCPSession)
	want := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: in.Name, Namespace: in.Namespace, UID: in.UID, ResourceVersion: in.ResourceVersion,
			CreationTimestamp: in.CreationTimestamp},
		Spec: v1alpha1.HCPSessionSpec{SessionID: in.Spec.SessionID, CalleeID: "lab", CallerID: "alpha", Capability: "analyze",
			TaskMessageID: "m", RiskLevel: "R1"},
		Status: v1alpha1.HCPSessionStatus{State: v1alpha1.SessionRunning, OwnerEpoch: 2, CallerAckedSequence: 7, Error: in.Status.Error},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cached copy:\n%+v\nwant\n%+v", got, want)
	}
	// Admitted, not yet RUNNING: the cached copy says what was decided.
	in.Status.State = v1alpha1.SessionPending
	if out, _ := CallerSession(in.DeepCopy()); out.(*v1alpha1.HCPSession).Status.State != v1alpha1.SessionRunning {
		t.Errorf("an admitted PENDING session cached as %q; want RUNNING", out.(*v1alpha1.HCPSession).Status.State)
	}
	delete(in.Annotations, v1alpha1.AnnotationAdmitted)
	if out, _ := CallerSession(in); out.(*v1alpha1.HCPSession).Status.State != v1alpha1.SessionPending {
		t.Errorf("a PENDING session cached as %q", out.(*v1alpha1.HCPSession).Status.State)
	}
	if out, err := CallerSession(&v1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{ManagedFields: in.ManagedFields}}); err != nil ||
		len(out.(*v1alpha1.Caller).ManagedFields) != 0 {
		t.Errorf("a Caller: %v, %v; want Transform's", out, err)
	}
}

// TestCallerCacheIsSmall: a caller sidecar caches one HCPSession per live
// session; its copy must hold at most 60 % of what Transform's does (a
// running session's: 1,415 bytes against 2,540 untrimmed).
func TestCallerCacheIsSmall(t *testing.T) {
	trimmed, caller := cachedBytes(Transform), cachedBytes(CallerSession)
	for range 2 { // the least of three: a GC cycle can land in one
		trimmed, caller = min(trimmed, cachedBytes(Transform)), min(caller, cachedBytes(CallerSession))
	}
	t.Logf("bytes per cached session: Transform %.0f, CallerSession %.0f", trimmed, caller)
	if caller > 0.6*trimmed {
		t.Errorf("a caller's cached session holds %.0f bytes, more than 60 %% of Transform's %.0f", caller, trimmed)
	}
}

// cachedBytes is the heap 1,000 cached HCPSessions like session's hold
// after transform, per session.
func cachedBytes(transform func(any) (any, error)) float64 {
	return heapmeter.PerItem(1000, func(i int) any {
		out, _ := transform(session(i))
		return out
	})
}

// BenchmarkCachedSession is the heap 1,000 cached HCPSessions like
// session's hold, per session: with only their managed fields stripped
// (the sidecars' cache before), trimmed (Transform: the callee's), and a
// caller's (CallerSession).
func BenchmarkCachedSession(b *testing.B) {
	for _, tc := range []struct {
		name      string
		transform func(any) (any, error)
	}{{"untrimmed", stripManagedFields}, {"trimmed", Transform}, {"caller", CallerSession}} {
		b.Run(tc.name, func(b *testing.B) {
			var per float64
			for range b.N {
				per = cachedBytes(tc.transform)
			}
			b.ReportMetric(per, "B/session")
		})
	}
}
