package lease

import (
	"context"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Observer judges other replicas' Leases as client-go's leader election
// does: a Lease is expired once it has not changed for its duration,
// measured on this process's own monotonic clock from the moment this
// process last saw it change (observedTime), never from the renewTime its
// holder wrote with its own wall clock. So a holder whose clock is skewed
// (by any amount) cannot make its Lease look expired early: it fences
// itself Duration - Margin after its last renewal on its clock, and others
// wait at least Duration after they saw that renewal on theirs.
type Observer struct {
	clk clock.PassiveClock
	mu  sync.Mutex
	obs map[string]observed
}

type observed struct {
	record string
	at     time.Time
}

// NewObserver returns an Observer timing with clk (nil: the real clock).
func NewObserver(clk clock.PassiveClock) *Observer {
	if clk == nil {
		clk = clock.RealClock{}
	}
	return &Observer{clk: clk, obs: map[string]observed{}}
}

// Alive reports whether the sidecar of pod may still hold its Lease: it
// changed less than its duration ago on this Observer's clock (a Lease seen
// for the first time counts as changed now). known is false when the pod
// has no Lease (a sidecar of a version before leases, or a pod deleted with
// it): the caller then decides from the pod's existence.
func (o *Observer) Alive(ctx context.Context, r client.Reader, ns, pod string) (alive, known bool, err error) {
	var l coordinationv1.Lease
	if err := r.Get(ctx, client.ObjectKey{Namespace: ns, Name: Name(pod)}, &l); err != nil {
		if apierrors.IsNotFound(err) {
			o.mu.Lock()
			delete(o.obs, ns+"/"+pod)
			o.mu.Unlock()
			return false, false, nil
		}
		return true, false, err
	}
	if l.Spec.LeaseDurationSeconds == nil {
		return false, true, nil
	}
	d := time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second
	rec := l.ResourceVersion + "|" + ptrString(l.Spec.HolderIdentity)
	if l.Spec.RenewTime != nil {
		rec += "|" + l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	now := o.clk.Now()
	o.mu.Lock()
	defer o.mu.Unlock()
	key := ns + "/" + pod
	seen, ok := o.obs[key]
	if !ok || seen.record != rec {
		seen = observed{record: rec, at: now}
		o.obs[key] = seen
	}
	return now.Sub(seen.at) <= d, true, nil
}

func ptrString(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
