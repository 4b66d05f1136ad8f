package controller

import (
	"reflect"
	"testing"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// topologyKinds are one object of each topology kind the operator
// declares, each with conditions and an observed generation.
func topologyKinds() []client.Object {
	conds := []topologyv1beta1.Condition{{Type: "Ready", Status: corev1.ConditionFalse, Reason: "FailedCreateOrUpdate", Message: "broker refused"}}
	return []client.Object{
		&topologyv1beta1.Queue{Status: topologyv1beta1.QueueStatus{Conditions: conds, ObservedGeneration: 2}},
		&topologyv1beta1.Binding{Status: topologyv1beta1.BindingStatus{Conditions: conds, ObservedGeneration: 3}},
		&topologyv1beta1.User{Status: topologyv1beta1.UserStatus{Conditions: conds, ObservedGeneration: 4}},
		&topologyv1beta1.Permission{Status: topologyv1beta1.PermissionStatus{Conditions: conds, ObservedGeneration: 5}},
		&topologyv1beta1.Policy{Status: topologyv1beta1.PolicyStatus{Conditions: conds, ObservedGeneration: 6}},
		&topologyv1beta1.Exchange{Status: topologyv1beta1.ExchangeStatus{Conditions: conds, ObservedGeneration: 7}},
		&topologyv1beta1.Vhost{Status: topologyv1beta1.VhostStatus{Conditions: conds, ObservedGeneration: 8}},
	}
}

// Each declared kind reads the same status as the same object converted
// field by field, and an object of another type (unstructured) still reads.
func TestTopologyStatusOfEveryKind(t *testing.T) {
	for _, o := range topologyKinds() {
		name := reflect.TypeOf(o).Elem().Name()
		conds, gen := topologyStatus(o)
		wantConds, wantGen := convertedTopologyStatus(o)
		if gen == 0 || len(conds) != 1 || gen != wantGen || !reflect.DeepEqual(conds, wantConds) {
			t.Errorf("%s: read %v at %d, converted %v at %d", name, conds, gen, wantConds, wantGen)
		}
		m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(o)
		if err != nil {
			t.Fatal(err)
		}
		if uc, ugen := topologyStatus(&unstructured.Unstructured{Object: m}); ugen != gen || !reflect.DeepEqual(uc, conds) {
			t.Errorf("%s as unstructured: read %v at %d, want %v at %d", name, uc, ugen, conds, gen)
		}
	}
}

// BenchmarkTopologyStatus: the status read as the object is, against the
// conversion every read made before (the baseline, in the same run).
func BenchmarkTopologyStatus(b *testing.B) {
	q := topologyKinds()[0].(*topologyv1beta1.Queue)
	q.Spec = topologyv1beta1.QueueSpec{Name: "hcp.cmd.lab", Type: "quorum", Durable: ptr.To(true),
		Arguments: &runtime.RawExtension{Raw: []byte(`{"x-max-length":10000,"x-delivery-limit":5,"x-dead-letter-exchange":"hcp.dlx"}`)}}
	for _, bc := range []struct {
		name string
		read func(client.Object) ([]topologyv1beta1.Condition, int64)
	}{{"converted", convertedTopologyStatus}, {"typed", topologyStatus}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, gen := bc.read(q); gen != 2 {
					b.Fatal(gen)
				}
			}
		})
	}
}
