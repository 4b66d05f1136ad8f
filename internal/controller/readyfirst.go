package controller

import (
	"context"
	"time"

	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/priorityqueue"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
)

// readyChildPriority is the queue priority of an owner whose topology
// child just became Ready (new objects' events have priority 0).
const readyChildPriority = 1

// readyFirst wraps h, the owner's handler of a topology child kind, so that
// a child becoming Ready puts its owner ahead of the objects the manager
// has not reconciled yet: the owner's next step waits on that reconcile (a
// Binding is created once its Queue is Ready, a Permission once its
// User is: children.go). Behind the first reconciles of a thousand new
// objects it waited minutes (bench-scale, 1,000 Callees + 1,000 Callers:
// no Binding was created in the first three minutes, while the topology
// operator had Ready queues waiting for them). It also calls onReady (nil:
// none): the topology operator is making progress (statusPace.progress).
func readyFirst(h handler.EventHandler, onReady func()) handler.EventHandler {
	return handler.Funcs{
		CreateFunc:  h.Create,
		DeleteFunc:  h.Delete,
		GenericFunc: h.Generic,
		UpdateFunc: func(ctx context.Context, e event.UpdateEvent, q workqueue.TypedRateLimitingInterface[reconcile.Request]) {
			if becameReady(e.ObjectOld, e.ObjectNew) {
				if onReady != nil {
					onReady()
				}
				if pq, ok := q.(priorityqueue.PriorityQueue[reconcile.Request]); ok {
					q = withPriority{PriorityQueue: pq, priority: readyChildPriority}
				}
			}
			h.Update(ctx, e, q)
		},
	}
}

// becameReady: a topology object that was not Ready for the topology
// operator now is.
func becameReady(old, cur client.Object) bool {
	if old == nil || cur == nil {
		return false
	}
	was, _ := topologyObjectReady(old)
	is, _ := topologyObjectReady(cur)
	return is && !was
}

// withPriority adds with priority unless told otherwise.
type withPriority struct {
	priorityqueue.PriorityQueue[reconcile.Request]
	priority int
}

func (w withPriority) Add(r reconcile.Request) {
	w.AddWithOpts(priorityqueue.AddOpts{}, r)
}

func (w withPriority) AddAfter(r reconcile.Request, after time.Duration) {
	w.AddWithOpts(priorityqueue.AddOpts{After: after}, r)
}

func (w withPriority) AddRateLimited(r reconcile.Request) {
	w.AddWithOpts(priorityqueue.AddOpts{RateLimited: true}, r)
}

func (w withPriority) AddWithOpts(o priorityqueue.AddOpts, rs ...reconcile.Request) {
	if o.Priority == nil {
		p := w.priority
		o.Priority = &p
	}
	w.PriorityQueue.AddWithOpts(o, rs...)
}
