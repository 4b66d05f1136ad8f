//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// deleteCallee: deleting the Callee removes its queue, user and
// permission from the broker, its harness, Secrets and HCPSessions from
// the cluster, and nothing the Caller still needs: the shared exchanges,
// the event queue and its binding, the caller's user.
func (r *samplesRun) deleteCallee(t *testing.T) {
	ctx := t.Context()
	if out, err := r.kubectl(ctx, nil, "delete", "callee", calleeID, "-n", r.ns, "--wait=false"); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("kubectl delete callee %s: %s", calleeID, strings.TrimSpace(out))
	}
	calleeUser := topology.Username(topology.RoleCallee, r.vhost, calleeID)
	callerUser := topology.Username(topology.RoleCaller, r.vhost, callerID)
	secrets := []string{r.callee.Status.CredentialsSecret}
	eventually(t, deleteTimeout, "the Callee, its topology, user, harness and sessions gone", func(ctx context.Context) error {
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.callee), &hcpv1alpha1.Callee{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Callee %s still exists (%v)", calleeID, err)
		}
		if _, err := r.broker.Queue(r.vhost, topology.CommandQueue(calleeID)); !testbed.IsNotFound(err) {
			return fmt.Errorf("queue %s still on the broker (%v)", topology.CommandQueue(calleeID), err)
		}
		if _, err := r.broker.API.GetUser(calleeUser); !testbed.IsNotFound(err) {
			return fmt.Errorf("user %s still on the broker (%v)", calleeUser, err)
		}
		ps, err := r.broker.Permissions(r.vhost)
		if err != nil {
			return err
		}
		for _, p := range ps {
			if p.User == calleeUser {
				return fmt.Errorf("permission of %s still on %s", calleeUser, r.vhost)
			}
		}
		deploys := &appsv1.DeploymentList{}
		if err := r.c.List(ctx, deploys, client.InNamespace(r.ns), client.MatchingLabels{"hcp.io/callee": calleeID}); err != nil {
			return err
		}
		pods := &corev1.PodList{}
		if err := r.c.List(ctx, pods, client.InNamespace(r.ns), client.MatchingLabels{"hcp.io/callee": calleeID}); err != nil {
			return err
		}
		if len(deploys.Items)+len(pods.Items) > 0 {
			return fmt.Errorf("%d harness Deployments and %d pods left", len(deploys.Items), len(pods.Items))
		}
		for _, name := range secrets {
			if err := r.c.Get(ctx, client.ObjectKey{Namespace: r.ns, Name: name}, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				return fmt.Errorf("Secret %s still exists (%v)", name, err)
			}
		}
		hss := &hcpv1alpha1.HCPSessionList{}
		if err := r.c.List(ctx, hss, client.InNamespace(r.ns)); err != nil {
			return err
		}
		if n := len(hss.Items); n > 0 {
			return fmt.Errorf("%d HCPSessions of the deleted Callee left", n)
		}
		return nil
	})

	// What the Caller still uses stays.
	names, err := r.exchangeNames()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{topology.CommandsExchange, topology.DeadLetterExchange, topology.EventsExchange}; !slices.Equal(names, want) {
		t.Errorf("exchanges after deleting the Callee: %v, want %v (the Caller still uses them)", names, want)
	}
	bindings, err := r.bindings()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{
		fmt.Sprintf("binding %s -> %s [%s]", topology.EventsExchange, topology.EventQueue(callerID), topology.EventBindingKey(callerID)),
	}; !slices.Equal(bindings, want) {
		t.Errorf("bindings after deleting the Callee: %v, want %v", bindings, want)
	}
	if _, err := r.broker.API.GetUser(callerUser); err != nil {
		t.Errorf("the Caller's user %s: %v", callerUser, err)
	}
	if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.caller), r.caller); err != nil || !meta.IsStatusConditionTrue(r.caller.Status.Conditions, hcpv1alpha1.ConditionReady) {
		t.Errorf("Caller %s after deleting the Callee: %v %s", callerID, err, conditions(r.caller.Status.Conditions))
	}
	t.Logf("left on the broker in %s: exchanges %v, %v", r.vhost, names, bindings)
}

// deleteCaller: with the last user of the vhost gone, the shared
// exchanges, the event queue, the caller's user and (deletionPolicy
// delete) the vhost leave the broker.
func (r *samplesRun) deleteCaller(t *testing.T) {
	ctx := t.Context()
	start := time.Now()
	if _, err := r.kubectl(ctx, nil, "delete", "caller", callerID, "-n", r.ns, "--wait=false"); err != nil {
		t.Fatal(err)
	}
	callerUser := topology.Username(topology.RoleCaller, r.vhost, callerID)
	// When each part went, for the log: the parts are removed by
	// different controllers.
	gone := map[string]time.Duration{}
	mark := func(what string) {
		if _, ok := gone[what]; !ok {
			gone[what] = time.Since(start).Round(100 * time.Millisecond)
		}
	}
	eventually(t, deleteTimeout, "the Caller, its user, the exchanges and the vhost gone", func(ctx context.Context) error {
		var left []string
		if err := r.c.Get(ctx, client.ObjectKeyFromObject(r.caller), &hcpv1alpha1.Caller{}); !apierrors.IsNotFound(err) {
			left = append(left, fmt.Sprintf("Caller %s (%v)", callerID, err))
		} else {
			mark("Caller object")
		}
		if _, err := r.broker.API.GetUser(callerUser); !testbed.IsNotFound(err) {
			left = append(left, fmt.Sprintf("user %s (%v)", callerUser, err))
		} else {
			mark("broker user")
		}
		if names, err := r.exchangeNames(); err == nil && len(names) > 0 {
			left = append(left, fmt.Sprintf("exchanges %v", names))
		} else {
			mark("exchanges")
		}
		if _, err := r.broker.API.GetVhost(r.vhost); !testbed.IsNotFound(err) {
			left = append(left, fmt.Sprintf("vhost %s (%v)", r.vhost, err))
		} else {
			mark("vhost")
		}
		if len(left) > 0 {
			return fmt.Errorf("still there: %s", strings.Join(left, ", "))
		}
		return nil
	})
	t.Logf("gone after: %v", gone)
}
