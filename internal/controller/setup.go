package controller

import (
	"context"
	"fmt"

	ctrl "sigs.k8s.io/controller-runtime"
)

// EventRecorderName is the source of the Events the operator records.
const EventRecorderName = "hcp-operator"

// Setup registers the field indexes and every reconciler with mgr; the
// manager binary and the envtest suite share it.
func Setup(ctx context.Context, mgr ctrl.Manager, o Options) error {
	if err := SetupIndexes(ctx, mgr, o); err != nil {
		return fmt.Errorf("field indexes: %w", err)
	}
	rec := mgr.GetEventRecorder(EventRecorderName)
	// The two kinds share one claim log: a finalizer of either may trust
	// the API server's "no other user of the vhost" until either claims.
	claims := &claimLog{}
	for name, r := range map[string]interface{ SetupWithManager(ctrl.Manager) error }{
		calleeKind: &CalleeReconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Recorder: rec, Options: o, claims: claims,
		},
		"Caller": &CallerReconciler{
			Client: mgr.GetClient(), APIReader: mgr.GetAPIReader(), Scheme: mgr.GetScheme(), Recorder: rec, Options: o, claims: claims,
		},
		"HCPSession":       &HCPSessionReconciler{Client: mgr.GetClient()},
		"CapabilityPolicy": &CapabilityPolicyReconciler{Client: mgr.GetClient(), Scheme: mgr.GetScheme(), Recorder: rec},
	} {
		if err := r.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("%s controller: %w", name, err)
		}
	}
	return nil
}
