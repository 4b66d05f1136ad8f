package controller

import (
	"context"
	"fmt"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// resolveTLS reads the Secrets named in spec.broker.tls and checks that the
// sidecar can use them, so that a mistake shows on the Callee or Caller
// with its fix instead of as a crash-looping sidecar. It returns the hash
// of what the sidecar reads of them: part of the pods' config hash, so a
// renewed CA or certificate rolls the pods (the sidecar loads its TLS files
// once, at start).
func (c *core) resolveTLS(ctx context.Context, v view) (string, *problem, error) {
	t := v.broker.TLS
	if t == nil {
		return "", nil, nil
	}
	var ca, client *corev1.Secret
	if t.CASecret != "" {
		s, prob, err := c.tlsSecret(ctx, v, "caSecret", t.CASecret)
		if err != nil || prob != nil {
			return "", prob, err
		}
		if err := resource.CheckTLSCASecret(s); err != nil {
			return "", &problem{hcpv1alpha1.ReasonTLSSecretInvalid, err.Error()}, nil
		}
		ca = s
	}
	if t.ClientCertSecret != "" {
		s, prob, err := c.tlsSecret(ctx, v, "clientCertSecret", t.ClientCertSecret)
		if err != nil || prob != nil {
			return "", prob, err
		}
		if err := resource.CheckTLSClientSecret(s); err != nil {
			return "", &problem{hcpv1alpha1.ReasonTLSSecretInvalid, err.Error()}, nil
		}
		client = s
	}
	return resource.TLSSecretsHash(ca, client), nil, nil
}

// tlsSecret gets a Secret named in spec.broker.tls. The manager's cache
// holds only Secrets labelled rabbitmq.com/topology-operator=true; on a
// miss the API server tells a missing Secret from an unlabelled one, which
// the operator could read but not watch (a renewal would go unnoticed).
func (c *core) tlsSecret(ctx context.Context, v view, field, name string) (*corev1.Secret, *problem, error) {
	ns := v.obj.GetNamespace()
	key := types.NamespacedName{Namespace: ns, Name: name}
	s := &corev1.Secret{}
	err := c.Get(ctx, key, s)
	if err == nil {
		return s, nil, nil
	}
	if !apierrors.IsNotFound(err) {
		return nil, nil, err
	}
	if err := c.apiReader.Get(ctx, key, s); err != nil {
		if apierrors.IsNotFound(err) {
			return nil, &problem{hcpv1alpha1.ReasonTLSSecretNotFound, fmt.Sprintf(
				"spec.broker.tls.%s: Secret %s/%s not found: create it (cert-manager can) with the label %s=true",
				field, ns, name, resource.LabelTopologyOperator)}, nil
		}
		return nil, nil, err
	}
	return nil, &problem{hcpv1alpha1.ReasonTLSSecretUnlabeled, fmt.Sprintf(
		"spec.broker.tls.%s: Secret %s/%s lacks the label %s=true, without which the operator cannot watch it for renewals; fix: kubectl label secret -n %s %s %s=true (with cert-manager: the Certificate's spec.secretTemplate.labels)",
		field, ns, name, resource.LabelTopologyOperator, ns, name, resource.LabelTopologyOperator)}, nil
}

// harnessState is what deployHarness did.
type harnessState struct {
	// dep is the live Deployment; nil when it was not applied.
	dep *appsv1.Deployment
	// sidecarHeld: a sidecar-only change was held back (holdSidecar).
	sidecarHeld bool
}

// deployHarness applies the harness (ensureHarness) once the TLS Secrets it
// mounts check out, and sets HarnessReady (the loop derives Ready). With a TLS problem the
// Deployment is left as it is (running pods keep what they mounted) and no
// Deployment is returned, with a backstop requeue: an unlabelled Secret's
// fix raises no event the manager sees.
func (c *core) deployHarness(ctx context.Context, v view, holdSidecar bool, p resource.HarnessParams) (harnessState, ctrl.Result, error) {
	tlsHash, prob, err := c.resolveTLS(ctx, v)
	if err != nil {
		return harnessState{}, ctrl.Result{}, err
	}
	if prob != nil {
		setCondition(v, hcpv1alpha1.ConditionHarnessReady, false, prob.reason, prob.message+" (the harness Deployment is not changed until then)")
		return harnessState{}, ctrl.Result{RequeueAfter: time.Minute}, nil
	}
	p.TLS = v.broker.TLS
	p.SecretsHash += tlsHash
	dep, held, err := c.ensureHarness(ctx, v, p, holdSidecar)
	if err != nil {
		return harnessState{}, ctrl.Result{}, err
	}
	setHarnessReady(v, dep)
	return harnessState{dep: dep, sidecarHeld: held}, ctrl.Result{}, nil
}
