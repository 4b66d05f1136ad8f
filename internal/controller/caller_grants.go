package controller

import (
	"context"
	"slices"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// A Caller's reads of HCPSessions beyond its namespace.
//
// A session's HCPSession lives in its Callee's namespace. A caller sidecar
// that replaced another pod reads it to verify a session it has no record
// of (internal/sidecar/caller, stream seed): without it, the sessions of a
// Callee in another namespace would be refused as unsolicited and their
// remaining events lost. So the Caller's sidecar may get HCPSessions (by
// name, see resource/sessionreader.go) in the namespaces where it may have
// sessions, and in no other:
//
//   - a CapabilityPolicy there names the caller id, or "*", in a valid rule
//     (a selector reaches only the policy's own namespace), and selects a
//     Callee that holds its id on the Caller's vhost and broker: what the
//     namespace's owners wrote, and what the gate admits from a caller of
//     another namespace (policy.NamesCallerFor);
//   - or HCPSessions of the caller are still there, on such a Callee: a
//     policy that stops naming the caller leaves its running sessions to
//     finish, and its sidecar still verifies them. Such a namespace is
//     looked at again every lingerRecheck (sessions are not watched).
//
// The same Role lets the sidecar patch the status of those HCPSessions, and
// admission narrows it to status.callerAckedSequence of its own caller id's
// sessions (resource.SessionReaderRules, config/admission policy 1): a new
// pod resumes such a session where the app left it.
//
// Only a Caller with a harness has a sidecar; an external Caller gets
// nothing. The namespaces granted are in status.sessionNamespaces, where
// the sidecar reads them. The Roles and RoleBindings carry no owner
// reference (their owner is in another namespace): the Caller finds them
// by their labels, deletes those no longer wanted, and the finalizer
// deletes them all when the Caller goes (revokeSessionReads).

// The manager holds what it grants (RBAC refuses a Role granting more than
// its creator may do): the positions of every caller id.
// +kubebuilder:rbac:groups=hcp.io,resources=callerpositions,verbs=record

// lingerRecheck is how often a namespace granted only for the caller's
// remaining sessions is looked at again.
const lingerRecheck = time.Minute

// sessionReaderRoleKind compares a grant Role by its rules' digest, as the
// sidecar Role (the cache trims Roles: trimRole).
var sessionReaderRoleKind = childKind{upToDate: roleUpToDate}

// sessionReads is what grantSessionReads did.
type sessionReads struct {
	// namespaces granted, sorted.
	namespaces []string
	// recheck, when not zero, is when to look again.
	recheck time.Duration
}

// grantSessionReads applies the Roles and RoleBindings of caller (holder
// of its id on key) in the namespaces it needs and deletes the others.
func (c *core) grantSessionReads(ctx context.Context, caller *hcpv1alpha1.Caller, key string) (sessionReads, error) {
	var out sessionReads
	sub := resource.ForCaller(caller)
	have, err := c.sessionReaderObjects(ctx, sub)
	if err != nil {
		return out, err
	}
	want := map[string]bool{}
	if caller.Spec.Harness != nil {
		if want, err = c.admittingNamespaces(ctx, caller, key); err != nil {
			return out, err
		}
		looked := map[string]bool{}
		for _, o := range have {
			ns := o.GetNamespace()
			if want[ns] || looked[ns] {
				continue
			}
			looked[ns] = true
			remain, err := c.sessionsRemain(ctx, ns, caller.ID(), key)
			if err != nil {
				return out, err
			}
			if remain {
				want[ns], out.recheck = true, lingerRecheck
			}
		}
	}
	for ns := range want {
		out.namespaces = append(out.namespaces, ns)
	}
	slices.Sort(out.namespaces)
	for _, ns := range out.namespaces {
		if _, err := c.applyChild(ctx, caller, &sessionReaderRoleKind, resource.SessionReaderRole(sub, ns), nil); err != nil {
			return out, err
		}
		if _, err := c.applyChild(ctx, caller, nil, resource.SessionReaderRoleBinding(sub, ns), nil); err != nil {
			return out, err
		}
	}
	for _, o := range have {
		if !want[o.GetNamespace()] {
			if err := c.deleteGrant(ctx, caller, o); err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

// revokeSessionReads deletes every Role and RoleBinding of the Caller of v
// in other namespaces: the Caller goes, or no longer holds its id.
func (c *core) revokeSessionReads(ctx context.Context, v view) error {
	have, err := c.sessionReaderObjects(ctx, v.sub)
	if err != nil {
		return err
	}
	for _, o := range have {
		if err := c.deleteGrant(ctx, v.obj, o); err != nil {
			return err
		}
	}
	return nil
}

// sessionReaderObjects are the Roles and RoleBindings of s in other
// namespaces, from the cache.
func (c *core) sessionReaderObjects(ctx context.Context, s resource.Subject) ([]client.Object, error) {
	sel := client.MatchingLabels{
		hcpv1alpha1.LabelManagedBy:       hcpv1alpha1.ManagedByValue,
		hcpv1alpha1.LabelCaller:          resource.LabelValue(s.Name),
		hcpv1alpha1.LabelCallerNamespace: s.Namespace,
	}
	var out []client.Object
	for _, l := range []client.ObjectList{&rbacv1.RoleList{}, &rbacv1.RoleBindingList{}} {
		if err := c.List(ctx, l, sel); err != nil {
			return nil, err
		}
		for _, o := range listItems(l) {
			// The label holds a cut name for a long one: the object's name
			// tells.
			if o.GetName() == resource.SessionReaderName(s) {
				out = append(out, o)
			}
		}
	}
	return out, nil
}

func (c *core) deleteGrant(ctx context.Context, owner, o client.Object) error {
	if err := c.Delete(ctx, o, client.Preconditions{UID: new(o.GetUID())}); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	kind := c.kindOf(o)
	ctrl.LoggerFrom(ctx).Info("Revoked a read of HCPSessions in another namespace", "kind", kind, "object", klog.KObj(o))
	c.noteChange(ctx, owner, o, kind, verbDeleted)
	return nil
}

// admittingNamespaces are the namespaces other than caller's where a
// CapabilityPolicy names the caller (by id or "*") for a Callee that holds
// its id on key.
func (c *core) admittingNamespaces(ctx context.Context, caller *hcpv1alpha1.Caller, key string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, id := range []string{caller.ID(), policy.AnyCallerID} {
		var pols hcpv1alpha1.CapabilityPolicyList
		if err := c.List(ctx, &pols, client.MatchingFields{indexPolicyCallerID: id}, client.UnsafeDisableDeepCopy); err != nil {
			return nil, err
		}
		for i := range pols.Items {
			p := &pols.Items[i]
			if p.Namespace == caller.Namespace || out[p.Namespace] {
				continue
			}
			callees, err := c.calleesOnKey(ctx, p.Namespace, key)
			if err != nil {
				return nil, err
			}
			for j := range callees {
				if policy.NamesCallerFor(p, &callees[j], caller.ID()) {
					out[p.Namespace] = true
					break
				}
			}
		}
	}
	return out, nil
}

// calleesOnKey are the Callees of ns that hold their id on key.
func (c *core) calleesOnKey(ctx context.Context, ns, key string) ([]hcpv1alpha1.Callee, error) {
	var list hcpv1alpha1.CalleeList
	if err := c.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{indexVhostKey: key}, client.UnsafeDisableDeepCopy); err != nil {
		return nil, err
	}
	return slices.DeleteFunc(list.Items, func(e hcpv1alpha1.Callee) bool { return !claimed(&e, key) }), nil
}

// sessionsRemain reports whether ns holds an HCPSession of callerID on a
// Callee that holds its id on key.
func (c *core) sessionsRemain(ctx context.Context, ns, callerID, key string) (bool, error) {
	var sessions hcpv1alpha1.HCPSessionList
	if err := c.List(ctx, &sessions, client.InNamespace(ns), client.MatchingLabels{hcpv1alpha1.LabelCallerID: callerID}, client.UnsafeDisableDeepCopy); err != nil {
		return false, err
	}
	if len(sessions.Items) == 0 {
		return false, nil
	}
	callees, err := c.calleesOnKey(ctx, ns, key)
	if err != nil {
		return false, err
	}
	for i := range sessions.Items {
		if s := &sessions.Items[i]; s.Spec.CallerID == callerID &&
			slices.ContainsFunc(callees, func(e hcpv1alpha1.Callee) bool { return e.ID() == s.Spec.CalleeID }) {
			return true, nil
		}
	}
	return false, nil
}
