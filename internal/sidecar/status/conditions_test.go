package status

import (
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	kstatus "sigs.k8s.io/cli-utils/pkg/kstatus/status"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// computeKstatus is what Flux and kpt compute for the session.
func computeKstatus(t *testing.T, hs *v1alpha1.HCPSession) *kstatus.Result {
	t.Helper()
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(hs)
	if err != nil {
		t.Fatal(err)
	}
	res, err := kstatus.Compute(&unstructured.Unstructured{Object: m})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// TestSetConditionsKstatus walks a session through its states, as the
// callee sidecar does, and checks what kstatus makes of each.
func TestSetConditionsKstatus(t *testing.T) {
	t0 := time.Date(2026, 11, 25, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		path  []v1alpha1.SessionState
		want  kstatus.Status
		ready metav1.ConditionStatus
		// abnormal is the kstatus condition present, "" for none.
		abnormal, reason string
	}{
		{[]v1alpha1.SessionState{v1alpha1.SessionPending}, kstatus.InProgressStatus, metav1.ConditionFalse, v1alpha1.ConditionReconciling, v1alpha1.ReasonSessionPending},
		{[]v1alpha1.SessionState{v1alpha1.SessionRunning}, kstatus.InProgressStatus, metav1.ConditionFalse, v1alpha1.ConditionReconciling, v1alpha1.ReasonSessionRunning},
		{[]v1alpha1.SessionState{v1alpha1.SessionRunning, v1alpha1.SessionPaused}, kstatus.InProgressStatus, metav1.ConditionFalse, v1alpha1.ConditionReconciling, v1alpha1.ReasonSessionPaused},
		{[]v1alpha1.SessionState{v1alpha1.SessionRunning, v1alpha1.SessionAborting}, kstatus.InProgressStatus, metav1.ConditionFalse, v1alpha1.ConditionReconciling, v1alpha1.ReasonSessionAborting},
		{[]v1alpha1.SessionState{v1alpha1.SessionRunning, v1alpha1.SessionCompleted}, kstatus.CurrentStatus, metav1.ConditionTrue, "", v1alpha1.ReasonSessionCompleted},
		{[]v1alpha1.SessionState{v1alpha1.SessionRunning, v1alpha1.SessionFailed}, kstatus.FailedStatus, metav1.ConditionFalse, v1alpha1.ConditionStalled, v1alpha1.ReasonSessionFailed},
		{[]v1alpha1.SessionState{v1alpha1.SessionRunning, v1alpha1.SessionAborting, v1alpha1.SessionAborted}, kstatus.FailedStatus, metav1.ConditionFalse, v1alpha1.ConditionStalled, v1alpha1.ReasonSessionAborted},
		{[]v1alpha1.SessionState{v1alpha1.SessionRejected}, kstatus.FailedStatus, metav1.ConditionFalse, v1alpha1.ConditionStalled, v1alpha1.ReasonSessionRejected},
	} {
		last := tc.path[len(tc.path)-1]
		t.Run(string(last), func(t *testing.T) {
			hs := &v1alpha1.HCPSession{
				TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.GroupVersion.String(), Kind: "HCPSession"},
				ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns", Generation: 1},
			}
			// Another condition is kept as it is.
			hs.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionHandover, Status: metav1.ConditionTrue, Reason: "Released", LastTransitionTime: metav1.NewTime(t0)}}
			now := t0
			for _, st := range tc.path {
				now = now.Add(time.Minute)
				hs.Status.State, hs.Status.Reason, hs.Status.Message = st, "why", "detail of "+string(st)
				SetConditions(&hs.Status, now)
			}
			res := computeKstatus(t, hs)
			if res.Status != tc.want {
				t.Fatalf("kstatus %s (%s), want %s; conditions %+v", res.Status, res.Message, tc.want, hs.Status.Conditions)
			}
			ready := meta.FindStatusCondition(hs.Status.Conditions, v1alpha1.ConditionReady)
			if ready == nil || ready.Status != tc.ready || ready.Reason != tc.reason || ready.Message != "why: detail of "+string(last) {
				t.Errorf("Ready = %+v", ready)
			}
			for _, typ := range []string{v1alpha1.ConditionReconciling, v1alpha1.ConditionStalled} {
				c := meta.FindStatusCondition(hs.Status.Conditions, typ)
				if (typ == tc.abnormal) != (c != nil) || c != nil && (c.Status != metav1.ConditionTrue || c.Reason != tc.reason) {
					t.Errorf("%s = %+v", typ, c)
				}
			}
			if h := meta.FindStatusCondition(hs.Status.Conditions, v1alpha1.ConditionHandover); h == nil || !h.LastTransitionTime.Time.Equal(t0) {
				t.Errorf("Handover changed: %+v", h)
			}
			// Ready's transition time is the last change of its status:
			// PENDING > RUNNING > PAUSED keeps the first one.
			wantLTT := t0.Add(time.Minute)
			if tc.ready == metav1.ConditionTrue {
				wantLTT = now
			}
			if !ready.LastTransitionTime.Time.Equal(wantLTT) {
				t.Errorf("Ready lastTransitionTime %v, want %v", ready.LastTransitionTime, wantLTT)
			}

			// Deriving again, later, changes nothing: no extra write.
			before := hs.Status.DeepCopy()
			SetConditions(&hs.Status, now.Add(time.Hour))
			if !equality.Semantic.DeepEqual(*before, hs.Status) {
				t.Errorf("second derivation changed the status:\n%+v\n%+v", before.Conditions, hs.Status.Conditions)
			}
		})
	}
}

// TestSetConditionsWithoutState: the caller sidecar's writes and the
// undecided claim carry no state; nothing is derived.
func TestSetConditionsWithoutState(t *testing.T) {
	st := v1alpha1.HCPSessionStatus{CallerAckedSequence: 7}
	SetConditions(&st, time.Now())
	if st.Conditions != nil {
		t.Fatalf("conditions %+v", st.Conditions)
	}
}

// TestWriterDerivesConditions: with SetDeriveConditions the conditions
// travel in the write that changes the state, and updates that leave the
// state alone (progress, a later clock) cost no extra write.
func TestWriterDerivesConditions(t *testing.T) {
	w, cc, clk, _ := newFixture(t, time.Second, session("s1"))
	w.SetDeriveConditions(true)
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.Reason = "accepted" })
	settle(t, cc, 1)
	st := get(t, cc, "s1")
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionReconciling); c == nil || c.Reason != v1alpha1.ReasonSessionRunning {
		t.Fatalf("after RUNNING: %+v", st.Conditions)
	}
	for range 20 {
		clk.Step(100 * time.Millisecond)
		w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning; s.Reason = "accepted" })
	}
	clk.Step(2 * time.Second)
	settle(t, cc, 1)
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionCompleted; s.Reason = "completed" })
	settle(t, cc, 2)
	hs := session("s1")
	hs.Status = get(t, cc, "s1")
	if res := computeKstatus(t, hs); res.Status != kstatus.CurrentStatus {
		t.Fatalf("kstatus %s; conditions %+v", res.Status, hs.Status.Conditions)
	}
	if meta.FindStatusCondition(hs.Status.Conditions, v1alpha1.ConditionReconciling) != nil {
		t.Fatalf("Reconciling left after COMPLETED: %+v", hs.Status.Conditions)
	}
}

// TestWriterWithoutDerivation: the caller sidecar's writer writes no
// conditions.
func TestWriterWithoutDerivation(t *testing.T) {
	w, cc, _, _ := newFixture(t, time.Second, session("s1"))
	w.Update("s1", func(s *v1alpha1.HCPSessionStatus) { s.State = v1alpha1.SessionRunning })
	settle(t, cc, 1)
	if st := get(t, cc, "s1"); len(st.Conditions) != 0 {
		t.Fatalf("conditions %+v", st.Conditions)
	}
}
