package callee

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// apiDown fails HCPSession creates while down is set, as an API server
// that is unreachable would.
type apiDown struct {
	client.Client
	down *atomic.Bool
}

func (c apiDown) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if _, ok := obj.(*v1alpha1.HCPSession); ok && c.down.Load() {
		return apierrors.NewServiceUnavailable("test: the API server is down")
	}
	return c.Client.Create(ctx, obj, opts...)
}

// A task_submit that cannot be decided (the API server is down; under a
// concurrency limit the record comes before the answer) is retried
// through the queue, and at the queue's delivery limit, where the broker
// would drop it without a word, it is rejected to its caller instead.
// Once the API server is back, tasks are accepted again. (Without a
// limit the answer comes first: TestUnrecordableSessionFailsAfterRecordWait.)
func TestSubmitRejectedNotDroppedAtTheDeliveryLimit(t *testing.T) {
	var down atomic.Bool
	down.Store(true)
	b := newBed(t, bedOptions{
		sessions:     v1alpha1.SessionsSpec{MaxConcurrent: new(int32(5))},
		commandQueue: v1alpha1.CommandQueueSpec{DeliveryLimit: new(int32(2))},
		wrapClient:   func(c client.Client) client.Client { return apiDown{Client: c, down: &down} },
	})
	_, sid, _ := b.submit(newSubmit(nil))
	rej := rejectedOf(t, b.waitMessage(sid, 30*time.Second, "task_rejected at the delivery limit", isType(envelope.TypeTaskRejected)))
	if rej.ReasonCode != task.ReasonInternal {
		t.Fatalf("task_rejected %+v, want reason internal", rej)
	}
	if n := b.queueDepth(topology.CommandQueue(calleeID)); n != 0 {
		t.Errorf("%d commands left in the queue", n)
	}
	down.Store(false)
	_, sid2, _ := b.submit(newSubmit(nil))
	b.waitMessage(sid2, 20*time.Second, "task_accepted after the API server is back", isType(envelope.TypeTaskAccepted))
}
