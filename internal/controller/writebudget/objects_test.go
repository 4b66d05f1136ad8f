package writebudget_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

func harness(image string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "harness"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "harness", Image: image}}},
	}
}

// newCallee is a Callee with one capability and a harness scaled to zero.
func newCallee(ns, name, vhost string) *hcpv1alpha1.Callee {
	return &hcpv1alpha1.Callee{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hcpv1alpha1.CalleeSpec{
			Broker:       hcpv1alpha1.BrokerSpec{Vhost: vhost},
			Capabilities: []hcpv1alpha1.Capability{{Name: "cvd.run", RiskLevel: hcpv1alpha1.RiskR2, DataClassification: hcpv1alpha1.DataT2}},
			Harness:      hcpv1alpha1.HarnessSpec{Template: harness("example.com/harness:1"), Replicas: new(int32(0))},
		},
	}
}

// newCaller is a Caller with a harness scaled to zero.
func newCaller(ns, name, vhost string) *hcpv1alpha1.Caller {
	return &hcpv1alpha1.Caller{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: hcpv1alpha1.CallerSpec{
			Broker:  hcpv1alpha1.BrokerSpec{Vhost: vhost},
			Harness: &hcpv1alpha1.HarnessSpec{Template: harness("example.com/caller:1"), Replicas: new(int32(0))},
		},
	}
}

// get reads o from the API server as served (defaults included).
func get(ctx context.Context, c client.Client, o client.Object) (*unstructured.Unstructured, error) {
	gvk, err := apiutil.GVKForObject(o, c.Scheme())
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	return u, c.Get(ctx, client.ObjectKeyFromObject(o), u)
}

// topologyKinds are the topology operator's kinds the manager creates.
var topologyKinds = []string{"Queue", "Binding", "User", "Permission", "Policy", "Exchange", "Vhost"}

// playTopologyOperator plays the topology operator until the returned
// function is called: every topology object in namespaces (and those of
// the vhost key in home) is Ready for its generation as soon as it exists.
func playTopologyOperator(t *testing.T, c client.Client, key string, namespaces ...string) (stop func()) {
	ctx := t.Context()
	var stopped atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Stopped between rounds, not by cancelling a request.
		for !stopped.Load() && ctx.Err() == nil {
			for _, ns := range namespaces {
				declare(ctx, c, client.InNamespace(ns))
			}
			declare(ctx, c, client.InNamespace(home), client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key})
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() { stopped.Store(true); <-done }
}

// declare sets Ready on every topology object matching opts that lacks it
// for its generation (errors, conflicts with the manager's writes among
// them, are left to the next round).
func declare(ctx context.Context, c client.Client, opts ...client.ListOption) {
	for _, kind := range topologyKinds {
		l := &unstructured.UnstructuredList{}
		l.SetGroupVersionKind(schema.GroupVersionKind{Group: "rabbitmq.com", Version: "v1beta1", Kind: kind + "List"})
		if err := c.List(ctx, l, opts...); err != nil {
			continue
		}
		for i := range l.Items {
			o := &l.Items[i]
			if testbed.TopologyReady(o) == nil {
				continue
			}
			st := map[string]any{
				"observedGeneration": o.GetGeneration(),
				"conditions": []any{map[string]any{
					"type": "Ready", "status": "True", "reason": "SuccessfulCreateOrUpdate",
					"lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
				}},
			}
			if kind == "User" {
				st["username"] = "set-by-test"
			}
			o.Object["status"] = st
			_ = c.Status().Update(ctx, o)
		}
	}
}
