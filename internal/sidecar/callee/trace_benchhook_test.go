package callee

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// benchTrace gives a session a trace context as admitting it would.
func benchTrace(ss *sess, traceparent string) {
	ss.startTrace(&v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: ss.id,
		Annotations: map[string]string{AnnotationTraceparent: traceparent}}}, false)
}
