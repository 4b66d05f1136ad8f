package caller

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/cachetrim"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// TestAdoptFromTheTrimmedCache: a task submitted by an earlier pod is
// adopted from the caller's cached HCPSession as the runner caches it
// (cachetrim.CallerSession: no labels, the decided state), by its id alone
// (GET /hcp/v1/tasks/{id}: the cache listed) and by its callee (a repeated
// submit: the name derived), with its callee, capability, risk and state.
func TestAdoptFromTheTrimmedCache(t *testing.T) {
	const tid = "6f1c2a4e-8b3d-4c5e-9f60-7a8b9c0d1e2f"
	stored := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{Name: topology.SessionID("lab", "alpha", tid), Namespace: "default",
			CreationTimestamp: metav1.NewTime(time.Now().Truncate(time.Second)),
			Labels:            map[string]string{v1alpha1.LabelCallerID: "alpha", v1alpha1.LabelCalleeID: "lab"},
			Annotations:       map[string]string{v1alpha1.AnnotationAdmitted: "true"}},
		Spec:   v1alpha1.HCPSessionSpec{CalleeID: "lab", CallerID: "alpha", Capability: "analyze", TaskMessageID: tid, RiskLevel: "R2"},
		Status: v1alpha1.HCPSessionStatus{State: v1alpha1.SessionPending},
	}
	stored.Spec.SessionID = stored.Name
	other := stored.DeepCopy() // another caller's session of the same task id
	other.Name, other.Spec.SessionID, other.Spec.CallerID = topology.SessionID("lab", "beta", tid), topology.SessionID("lab", "beta", tid), "beta"
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	for _, calleeID := range []string{"", "lab"} {
		cached := fake.NewClientBuilder().WithScheme(scheme)
		for _, hs := range []*v1alpha1.HCPSession{other, stored} {
			c, err := cachetrim.CallerSession(hs.DeepCopy())
			if err != nil {
				t.Fatal(err)
			}
			cached = cached.WithObjects(c.(*v1alpha1.HCPSession))
		}
		sc, _ := newIdleSidecar(t, nil)
		sc.o.Client = cached.Build()
		rec, ok := sc.adoptTaskByID(context.Background(), tid, calleeID)
		if !ok || rec.CalleeID != "lab" || rec.Capability != "analyze" || rec.RiskLevel != "R2" || rec.State != TaskAccepted ||
			rec.SessionID != stored.Name || !rec.Adopted {
			t.Errorf("callee %q: adopted %v, %+v; want the task accepted, from %s", calleeID, ok, rec, stored.Name)
		}
	}
}
