// Package lease is the liveness record of one hcp-sidecar process: a
// coordination.k8s.io Lease per pod, renewed by the sidecar running in it.
// The sessions a callee sidecar owns name its pod (HCPSession
// status.podName); another replica may take a session over only once the
// owner's Lease has expired (or the owner released the session). The owner
// fences itself: it stops emitting once it could not renew for
// Duration - Margin, so by the time anyone may take over, it has stopped.
package lease

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Defaults.
const (
	DefaultDuration = 60 * time.Second
	DefaultRenew    = 10 * time.Second
	DefaultMargin   = 10 * time.Second
)

// Name is the Lease of a sidecar's pod.
func Name(pod string) string { return "hcp-sidecar-" + pod }

// Options configure a Keeper.
type Options struct {
	Client    client.Client
	Namespace string
	Pod       string
	// PodUID makes the Lease owned by the pod (deleted with it); optional.
	PodUID string
	// Holder identifies this process (pod name plus a per-start id).
	Holder   string
	Duration time.Duration
	Renew    time.Duration
	Margin   time.Duration
	Clock    clock.WithTicker
	Log      logr.Logger
}

// Keeper holds the Lease of this sidecar's pod.
type Keeper struct {
	o Options
	// validUntil is a reading of the Keeper's clock (nil: never
	// acquired). Compared with later readings of the same clock, never
	// as wall time: a real clock's readings carry a monotonic part,
	// which a step of the system clock does not move.
	validUntil atomic.Pointer[time.Time]
	// gen counts the renewals that made the Keeper valid again after it
	// had lapsed (the first acquisition included). A sidecar vouches for
	// a session only under the generation in which it last read the
	// session's HCPSession (see Generation).
	gen      atomic.Int64
	regained chan struct{}
}

// New returns a Keeper; Acquire takes the Lease, Run renews it.
func New(o Options) *Keeper {
	if o.Duration <= 0 {
		o.Duration = DefaultDuration
	}
	if o.Renew <= 0 {
		o.Renew = DefaultRenew
	}
	if o.Margin <= 0 || o.Margin >= o.Duration {
		o.Margin = min(DefaultMargin, o.Duration/4)
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	return &Keeper{o: o, regained: make(chan struct{}, 1)}
}

// Generation counts the times the Keeper became valid after having lapsed
// (a partition healed, a frozen process resumed). A renewal proves only
// that this pod is alive, not that it still owns what it owned before the
// lapse: meanwhile another replica may have taken its sessions over. So a
// sidecar records the generation under which it last read each session's
// HCPSession and acts for the session only while Generation is the same;
// after a lapse it re-reads every session first (Regained tells it when).
func (k *Keeper) Generation() int64 { return k.gen.Load() }

// Regained is signalled (it holds at most one signal) each time
// Generation increments.
func (k *Keeper) Regained() <-chan struct{} { return k.regained }

// Duration is the Lease duration others wait for.
func (k *Keeper) Duration() time.Duration { return k.o.Duration }

// Valid reports whether this sidecar may act as the owner of its sessions:
// its last renewal is younger than Duration - Margin.
func (k *Keeper) Valid() bool {
	u := k.validUntil.Load()
	return u != nil && k.o.Clock.Now().Before(*u)
}

// Acquire creates or takes the pod's Lease (a restarted sidecar in the same
// pod takes its predecessor's at once: that process is gone).
func (k *Keeper) Acquire(ctx context.Context) error {
	return k.renew(ctx)
}

// Run renews the Lease until ctx ends; failures are logged and retried.
func (k *Keeper) Run(ctx context.Context) {
	t := k.o.Clock.NewTicker(k.o.Renew)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		if err := k.renew(ctx); err != nil {
			if !failing {
				var validFor time.Duration
				if u := k.validUntil.Load(); u != nil {
					validFor = max(0, u.Sub(k.o.Clock.Now()))
				}
				k.o.Log.Error(err, "Failed to renew the sidecar's Lease; sessions stop emitting if it lapses", "validFor", validFor.Round(time.Second))
			}
			failing = true
			continue
		}
		if failing {
			k.o.Log.Info("Renewed the sidecar's Lease again")
		}
		failing = false
	}
}

func (k *Keeper) renew(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, k.o.Renew)
	defer cancel()
	start := k.o.Clock.Now()
	now := metav1.NewMicroTime(start)
	secs := ptr.To(int32(k.o.Duration / time.Second))
	var l coordinationv1.Lease
	err := k.o.Client.Get(ctx, client.ObjectKey{Namespace: k.o.Namespace, Name: Name(k.o.Pod)}, &l)
	switch {
	case apierrors.IsNotFound(err):
		l = coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Namespace: k.o.Namespace, Name: Name(k.o.Pod)},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(k.o.Holder), LeaseDurationSeconds: secs,
				AcquireTime: &now, RenewTime: &now,
			},
		}
		if k.o.PodUID != "" {
			l.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: k.o.Pod, UID: types.UID(k.o.PodUID)}}
		}
		err = k.o.Client.Create(ctx, &l)
	case err == nil:
		if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != k.o.Holder {
			l.Spec.AcquireTime = &now
			l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
		}
		l.Spec.HolderIdentity = ptr.To(k.o.Holder)
		l.Spec.LeaseDurationSeconds = secs
		l.Spec.RenewTime = &now
		err = k.o.Client.Update(ctx, &l)
	}
	if err != nil {
		return fmt.Errorf("lease %s/%s: %w", k.o.Namespace, Name(k.o.Pod), err)
	}
	// Lapsed at any moment before this renewal lands: a new generation,
	// counted before the Keeper turns valid, so no session can pass the
	// fence under the old one in between.
	lapsed := !k.Valid()
	if lapsed {
		k.gen.Add(1)
	}
	// Measured from before the request: the API server may have stored a
	// renewal time later than start, never earlier.
	until := start.Add(k.o.Duration - k.o.Margin)
	k.validUntil.Store(&until)
	if lapsed {
		select {
		case k.regained <- struct{}{}:
		default:
		}
	}
	return nil
}
