package events

import (
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/scheme"
)

// sink records what the broadcaster would write to the API server.
type sink struct {
	mu      sync.Mutex
	reasons map[string]int
}

func (s *sink) add(e *corev1.Event) (*corev1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reasons[e.Reason]++
	return e, nil
}

func (s *sink) Create(e *corev1.Event) (*corev1.Event, error) { return s.add(e) }
func (s *sink) Update(e *corev1.Event) (*corev1.Event, error) { return s.add(e) }
func (s *sink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	return s.add(e)
}

func (s *sink) count(reason string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reasons[reason]
}

// A flood of one reason on an object (accepted tasks on a busy Callee)
// uses up its own spam budget only: a rejection on the same object after
// it is still written. client-go's default key (no reason) dropped it.
func TestEachReasonHasItsOwnSpamBudget(t *testing.T) {
	s := &sink{reasons: map[string]int{}}
	b := NewBroadcaster()
	defer b.Shutdown()
	b.StartRecordingToSink(s)
	rec := b.NewRecorder(scheme.Scheme, corev1.EventSource{Component: Component, Host: "pod-1"})
	callee := &corev1.ObjectReference{APIVersion: "hcp.io/v1alpha1", Kind: "Callee", Namespace: "lab", Name: "cvd", UID: "u-1"}
	for i := range 100 {
		rec.Eventf(callee, corev1.EventTypeWarning, "SessionFailed", "session %d failed", i)
	}
	rec.Eventf(callee, corev1.EventTypeWarning, "TaskRejected", "rejected task t-1")
	deadline := time.Now().Add(10 * time.Second)
	for s.count("TaskRejected") == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.count("TaskRejected") != 1 {
		t.Fatal("the rejection after a flood of another reason was not written")
	}
	if n := s.count("SessionFailed"); n > 25 {
		t.Fatalf("%d writes for 100 Events of one reason: the spam filter (burst 25) did not hold", n)
	}
}

func TestSpamKeyHasTheReason(t *testing.T) {
	e := &corev1.Event{ObjectMeta: metav1.ObjectMeta{Name: "x"}, Reason: "TaskAccepted", Type: corev1.EventTypeNormal,
		InvolvedObject: corev1.ObjectReference{Kind: "Callee", Name: "cvd"}}
	f := e.DeepCopy()
	f.Reason = "TaskRejected"
	if SpamKey(e) == SpamKey(f) {
		t.Fatal("two reasons share a spam key")
	}
}
