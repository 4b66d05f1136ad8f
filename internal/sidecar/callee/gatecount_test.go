package callee

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// listCounter counts the HCPSession lists read through a replica's client.
type listCounter struct {
	client.Client
	lists *atomic.Int32
}

func (c listCounter) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*v1alpha1.HCPSessionList); ok {
		c.lists.Add(1)
	}
	return c.Client.List(ctx, list, opts...)
}

// Where no concurrency limit exists (no maxConcurrentSessions in the
// namespace's policies, no spec.sessions.maxConcurrent), the gate decides
// without counting the callee's sessions: the count lists every session
// still cached, a day of finished ones by default, once per task. With a
// limit it counts, and the limit holds (limits_test.go).
func TestGateCountsSessionsOnlyUnderALimit(t *testing.T) {
	var lists atomic.Int32
	b := newBed(t, bedOptions{wrapClient: func(c client.Client) client.Client { return listCounter{Client: c, lists: &lists} }})
	time.Sleep(200 * time.Millisecond) // the sidecar's start-up reads are not the gate's
	before := lists.Load()
	_, sid, _ := b.submit(newSubmit(nil))
	b.waitMessage(sid, 20*time.Second, "task_accepted", isType(envelope.TypeTaskAccepted))
	if n := lists.Load() - before; n != 0 {
		t.Fatalf("the gate listed HCPSessions %d times for a task no limit applies to; want none", n)
	}
}
