package controller

import (
	"context"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/resource"
)

// The token Secret of an earlier version.
//
// A Callee's session-token keys were in a Secret of their own,
// hcp-callee-N-token; they are now in its credentials Secret
// (resource.WithTokenKeys), one write less per Callee. On upgrade the keys
// move, never a new key: sessions in flight carry tokens signed with the
// old one, and callers may hold the published public key. The new pod
// template mounts the credentials Secret; pods of the old template, until
// the rollout replaces them, still mount the old Secret, so it stays as
// it was until the Deployment has rolled out. Then its data is removed
// (an update: the manager holds no delete on Secrets) and it is marked
// hcpv1alpha1.AnnotationTokenKeysMovedTo; garbage collection deletes it
// with the Callee. Emptied, it can never give its key back: deleting the
// credentials Secret, the emergency replacement of a key, generates a new
// one (docs/upgrades.md).

// adoptLegacyTokenKeys returns the token keys of the Callee's Secret of an
// earlier version: zero when there is none, it is not the Callee's, or it
// was emptied. The cache holds it: it carries the topology operator's
// label, as written.
func (c *core) adoptLegacyTokenKeys(ctx context.Context, v view) (resource.TokenKeys, error) {
	legacy := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: v.sub.LegacyTokenSecretName()}, legacy); err != nil {
		return resource.TokenKeys{}, client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(legacy, v.obj) {
		return resource.TokenKeys{}, nil
	}
	keys := resource.TokenKeysOf(legacy)
	if len(keys.PrivatePEM) > 0 {
		ctrl.LoggerFrom(ctx).Info("Adopted the session-token keys of an earlier version's Secret", "from", klog.KObj(legacy), "into", v.sub.CredentialsSecretName())
	}
	return keys, nil
}

// retireLegacyTokenSecret empties the Callee's token Secret of an earlier
// version once creds (the live credentials Secret) holds the token keys
// and dep (the live Deployment; nil: none applied) has rolled out without
// it (legacyUnmounted).
func (c *core) retireLegacyTokenSecret(ctx context.Context, v view, creds *corev1.Secret, dep *appsv1.Deployment) error {
	legacy := &corev1.Secret{}
	if err := c.Get(ctx, client.ObjectKey{Namespace: v.obj.GetNamespace(), Name: v.sub.LegacyTokenSecretName()}, legacy); err != nil {
		return client.IgnoreNotFound(err)
	}
	if !metav1.IsControlledBy(legacy, v.obj) || len(legacy.Data) == 0 ||
		len(creds.Data[resource.TokenPrivateKeyKey]) == 0 || !legacyUnmounted(dep, legacy.Name) {
		return nil
	}
	legacy.Data = nil
	if legacy.Annotations == nil {
		legacy.Annotations = map[string]string{}
	}
	legacy.Annotations[hcpv1alpha1.AnnotationTokenKeysMovedTo] = creds.Name
	if err := c.Update(ctx, legacy); err != nil {
		return err
	}
	ctrl.LoggerFrom(ctx).Info("Emptied the token Secret of an earlier version", "secret", klog.KObj(legacy), "keysIn", creds.Name)
	c.noteChange(ctx, v.obj, legacy, "Secret", verbUpdated)
	return nil
}

// legacyUnmounted: dep, as applied, mounts no Secret named secret in its
// pod template and has rolled out (its controller has seen its generation
// and every pod it has is of the current template), so that no pod of it
// mounts the Secret any more. A pod on its way out keeps the files it has.
func legacyUnmounted(dep *appsv1.Deployment, secret string) bool {
	if dep == nil {
		return false
	}
	for _, vol := range dep.Spec.Template.Spec.Volumes {
		if vol.Secret != nil && vol.Secret.SecretName == secret {
			return false
		}
	}
	st := dep.Status
	return st.ObservedGeneration >= dep.Generation && st.UpdatedReplicas == st.Replicas
}
