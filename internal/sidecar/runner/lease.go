package runner

import (
	"context"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/lease"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// podLease acquires the Lease of this sidecar's pod, owned by the pod. c
// must be uncached: the sidecar's Role lets it get, create and update
// Leases, not list or watch them.
func podLease(ctx context.Context, cfg *config.Config, c client.Client, log logr.Logger) (*lease.Keeper, error) {
	var pod metav1.PartialObjectMetadata
	pod.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "Pod"})
	uid := ""
	if err := c.Get(ctx, client.ObjectKey{Namespace: cfg.Namespace, Name: cfg.PodName}, &pod); err == nil {
		uid = string(pod.UID)
	}
	d := leaseDuration(ctx, cfg, c, log)
	k := lease.New(lease.Options{
		Client: c, Namespace: cfg.Namespace, Pod: cfg.PodName, PodUID: uid,
		Holder: cfg.PodName + "/" + uuid.NewString(), Log: log.WithName("lease"),
		Duration: d, Renew: d / 6, Margin: d / 6,
	})
	if err := k.Acquire(ctx); err != nil {
		return nil, err
	}
	return k, nil
}

// minLeaseDuration bounds spec.sessions.ownerLeaseDuration from below: a
// shorter Lease would fence a sidecar for an API server hiccup.
const minLeaseDuration = 15 * time.Second

// leaseDuration is the Callee's spec.sessions.ownerLeaseDuration (read at
// start), else lease.DefaultDuration.
func leaseDuration(ctx context.Context, cfg *config.Config, r client.Reader, log logr.Logger) time.Duration {
	var cl hcpv1alpha1.Callee
	if err := r.Get(ctx, client.ObjectKey{Namespace: cfg.Namespace, Name: cfg.ObjectName}, &cl); err != nil {
		log.Error(err, "Failed to read the Callee; using the default owner Lease duration", "duration", lease.DefaultDuration.String())
		return lease.DefaultDuration
	}
	d, problem := ownerLeaseDuration(cl.Spec.Sessions.OwnerLeaseDuration)
	if problem != "" {
		log.Info("spec.sessions.ownerLeaseDuration: "+problem, "value", string(cl.Spec.Sessions.OwnerLeaseDuration), "using", d.String())
	}
	return d
}

// ownerLeaseDuration turns spec.sessions.ownerLeaseDuration into the Lease
// duration, with what was wrong with it, if anything.
func ownerLeaseDuration(v hcpv1alpha1.ISO8601Duration) (time.Duration, string) {
	if v == "" {
		return lease.DefaultDuration, ""
	}
	d, err := task.ParseDuration(string(v))
	switch {
	case err != nil:
		return lease.DefaultDuration, err.Error()
	case d < minLeaseDuration:
		return minLeaseDuration, "below the minimum " + minLeaseDuration.String()
	}
	return d, ""
}
