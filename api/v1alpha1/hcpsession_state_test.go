package v1alpha1

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestDecidedState(t *testing.T) {
	admitted := map[string]string{AnnotationAdmitted: "true"}
	for _, c := range []struct {
		name        string
		annotations map[string]string
		state       SessionState
		want        SessionState
	}{
		{"an undecided claim", nil, "", ""},
		{"a claim written PENDING", nil, SessionPending, SessionPending},
		{"admitted at creation, state not written yet", admitted, "", SessionRunning},
		{"admitted at creation, later states stand", admitted, SessionCompleted, SessionCompleted},
		{"admitted at creation, paused", admitted, SessionPaused, SessionPaused},
		{"decided by its status", nil, SessionRejected, SessionRejected},
		{"an annotation that is not true", map[string]string{AnnotationAdmitted: "yes"}, "", ""},
	} {
		hs := &HCPSession{ObjectMeta: metav1.ObjectMeta{Annotations: c.annotations}, Status: HCPSessionStatus{State: c.state}}
		if got := hs.DecidedState(); got != c.want {
			t.Errorf("%s: DecidedState() = %q, want %q", c.name, got, c.want)
		}
	}
}
