package testbed

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// PollInterval is how often Eventually checks.
const PollInterval = 250 * time.Millisecond

// Poll calls check every PollInterval until it returns nil, the timeout
// passes or ctx ends; it then returns the last error check returned.
func Poll(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(PollInterval)
	defer tick.Stop()
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not after %s: %w", timeout, err)
		case <-tick.C:
		}
	}
}

// Eventually fails the test unless check returns nil within timeout; the
// failure quotes check's last error, so make it say what was seen.
func Eventually(t testing.TB, timeout time.Duration, what string, check func(context.Context) error) {
	t.Helper()
	if err := Poll(t.Context(), timeout, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// TopologyReady reports whether a topology operator object (Vhost, Queue,
// Exchange, Binding, User, Permission, ...) is Ready: its Ready condition is
// True and, where it publishes one, its status.observedGeneration has caught
// up with metadata.generation. The error says what the status shows instead.
func TopologyReady(obj runtime.Object) error {
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return err
	}
	conds, _, _ := unstructured.NestedSlice(u, "status", "conditions")
	gen, _, _ := unstructured.NestedInt64(u, "metadata", "generation")
	if og, found, _ := unstructured.NestedInt64(u, "status", "observedGeneration"); found && og < gen {
		return fmt.Errorf("status.observedGeneration %d < generation %d", og, gen)
	}
	for _, c := range conds {
		m, _ := c.(map[string]any)
		if m["type"] != "Ready" {
			continue
		}
		if m["status"] == "True" {
			return nil
		}
		return fmt.Errorf("condition Ready=%v reason=%v message=%v", m["status"], m["reason"], m["message"])
	}
	return errors.New("no Ready condition yet")
}

// WaitForTopologyReady waits until TopologyReady(obj) holds, reading obj
// from the API server (it is updated in place).
func WaitForTopologyReady(t testing.TB, c client.Client, obj client.Object, timeout time.Duration) {
	t.Helper()
	key := client.ObjectKeyFromObject(obj)
	Eventually(t, timeout, fmt.Sprintf("%T %s Ready", obj, key), func(ctx context.Context) error {
		if err := c.Get(ctx, key, obj); err != nil {
			return err
		}
		return TopologyReady(obj)
	})
}
