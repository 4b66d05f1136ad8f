package controller

import (
	"context"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// Field indexes on the manager's cache.
const (
	// indexIDVhost: "{id}@{vhost}" of a Callee or Caller. Ids must be unique
	// per vhost and broker; this finds the candidates of a conflict.
	indexIDVhost = "hcp.io/id-vhost"
	// indexVhostKey: the hcp.io/vhost-key label of a Callee or Caller (set
	// once it holds its id): the users of a (broker, vhost) pair.
	indexVhostKey = "hcp.io/vhost-key"
	// indexConnectionSecret: "{namespace}/{name}" of the connection Secret a
	// Callee or Caller uses, directly or through the manager's default.
	indexConnectionSecret = "hcp.io/connection-secret"
	// indexTLSSecret: "{namespace}/{name}" of each Secret named in a
	// Callee's or Caller's spec.broker.tls.
	indexTLSSecret = "hcp.io/tls-secret"
	// indexLiveUse: what a Callee or Caller that holds its claim on a
	// vhost key and is not being deleted uses of it (liveUse). The
	// questions asked on every reconcile and at every deletion ("does any
	// creator of the vhost retain it?", "does anyone else use the key?")
	// are answered from the first entry or two, not from a list of every
	// user of the vhost: a list of N users on each of N reconciles is
	// quadratic in the size of a shared vhost.
	indexLiveUse = "hcp.io/live-use"
	// indexCalleeID: a Callee's id (namespaced lookups from HCPSessions).
	indexCalleeID = "hcp.io/callee-id"
	// indexSessionCallee: an HCPSession's spec.calleeID.
	indexSessionCallee = "spec.calleeID"
	// indexPolicyCallerID: the caller ids, "*" included, a CapabilityPolicy
	// lists in its valid rules (policy.NamedCallerIDs): the policies that
	// can admit a caller of another namespace (caller_grants.go).
	indexPolicyCallerID = "hcp.io/policy-caller-id"
)

func idVhost(id string, spec hcpv1alpha1.BrokerSpec) string {
	return id + "@" + resource.VhostOf(spec)
}

func connectionSecretKey(obj client.Object, spec hcpv1alpha1.BrokerSpec, def *resource.DefaultBroker) []string {
	ref, err := resource.Reference(spec, def)
	if err != nil || ref.ConnectionSecret == nil {
		return nil
	}
	ns := ref.Namespace
	if ns == "" {
		ns = obj.GetNamespace()
	}
	return []string{ns + "/" + ref.ConnectionSecret.Name}
}

func tlsSecretKeys(obj client.Object, spec hcpv1alpha1.BrokerSpec) []string {
	t := spec.TLS
	if t == nil {
		return nil
	}
	var out []string
	for _, name := range []string{t.CASecret, t.ClientCertSecret} {
		if name != "" {
			out = append(out, obj.GetNamespace()+"/"+name)
		}
	}
	return out
}

func vhostKeyLabel(obj client.Object) []string {
	if k := obj.GetLabels()[hcpv1alpha1.LabelVhostKey]; k != "" {
		return []string{k}
	}
	return nil
}

// The values of indexLiveUse beside the bare key: a user that asks for the
// vhost (createVhost) adds the key with the deletion policy it asks for.
const (
	useVhostRetain = "/vhost-retain"
	useVhostDelete = "/vhost-delete"
)

// liveUse is indexLiveUse of a Callee or Caller: its vhost key while it
// holds its claim and is not being deleted and, if it asks for the vhost,
// the key with useVhostRetain or useVhostDelete.
func liveUse(obj client.Object) []string {
	key := obj.GetLabels()[hcpv1alpha1.LabelVhostKey]
	if key == "" || !claimed(obj, key) || !obj.GetDeletionTimestamp().IsZero() {
		return nil
	}
	b := brokerSpecOf(obj)
	switch {
	case !b.CreateVhost:
		return []string{key}
	case b.VhostDeletionPolicy == resource.DeletionPolicyDelete:
		return []string{key, key + useVhostDelete}
	default:
		return []string{key, key + useVhostRetain}
	}
}

// SetupIndexes registers the field indexes the reconcilers use. Call it once
// per manager, before the reconcilers' SetupWithManager.
func SetupIndexes(ctx context.Context, mgr ctrl.Manager, o Options) error {
	idx := mgr.GetFieldIndexer()
	for _, reg := range []struct {
		obj   client.Object
		field string
		fn    client.IndexerFunc
	}{
		{&hcpv1alpha1.Callee{}, indexIDVhost, func(o client.Object) []string {
			c := o.(*hcpv1alpha1.Callee)
			return []string{idVhost(c.ID(), c.Spec.Broker)}
		}},
		{&hcpv1alpha1.Caller{}, indexIDVhost, func(o client.Object) []string {
			c := o.(*hcpv1alpha1.Caller)
			return []string{idVhost(c.ID(), c.Spec.Broker)}
		}},
		{&hcpv1alpha1.Callee{}, indexVhostKey, vhostKeyLabel},
		{&hcpv1alpha1.Caller{}, indexVhostKey, vhostKeyLabel},
		{&hcpv1alpha1.Callee{}, indexLiveUse, liveUse},
		{&hcpv1alpha1.Caller{}, indexLiveUse, liveUse},
		{&hcpv1alpha1.Callee{}, indexConnectionSecret, func(obj client.Object) []string {
			return connectionSecretKey(obj, obj.(*hcpv1alpha1.Callee).Spec.Broker, o.DefaultBroker)
		}},
		{&hcpv1alpha1.Caller{}, indexConnectionSecret, func(obj client.Object) []string {
			return connectionSecretKey(obj, obj.(*hcpv1alpha1.Caller).Spec.Broker, o.DefaultBroker)
		}},
		{&hcpv1alpha1.Callee{}, indexTLSSecret, func(obj client.Object) []string {
			return tlsSecretKeys(obj, obj.(*hcpv1alpha1.Callee).Spec.Broker)
		}},
		{&hcpv1alpha1.Caller{}, indexTLSSecret, func(obj client.Object) []string {
			return tlsSecretKeys(obj, obj.(*hcpv1alpha1.Caller).Spec.Broker)
		}},
		{&hcpv1alpha1.Callee{}, indexCalleeID, func(o client.Object) []string {
			return []string{o.(*hcpv1alpha1.Callee).ID()}
		}},
		{&hcpv1alpha1.CapabilityPolicy{}, indexPolicyCallerID, func(o client.Object) []string {
			return policy.NamedCallerIDs(o.(*hcpv1alpha1.CapabilityPolicy))
		}},
		{&hcpv1alpha1.HCPSession{}, indexSessionCallee, func(o client.Object) []string {
			return []string{o.(*hcpv1alpha1.HCPSession).Spec.CalleeID}
		}},
	} {
		if err := idx.IndexField(ctx, reg.obj, reg.field, reg.fn); err != nil {
			return err
		}
	}
	return nil
}
