package cachetrim

import (
	"fmt"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
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

// BenchmarkCachedSession is the heap 1,000 cached HCPSessions like
// session's hold, per session: trimmed (Transform), and with only their
// managed fields stripped (the sidecars' cache before).
func BenchmarkCachedSession(b *testing.B) {
	for _, trim := range []bool{false, true} {
		b.Run(fmt.Sprintf("trimmed=%v", trim), func(b *testing.B) {
			transform := stripManagedFields
			if trim {
				transform = Transform
			}
			var per float64
			for range b.N {
				held := make([]any, 1000)
				runtime.GC()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				for i := range held {
					held[i], _ = transform(session(i))
				}
				runtime.GC()
				runtime.ReadMemStats(&m1)
				per = float64(m1.HeapAlloc-m0.HeapAlloc) / float64(len(held))
				runtime.KeepAlive(held)
			}
			b.ReportMetric(per, "B/session")
		})
	}
}
