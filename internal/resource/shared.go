package resource

import (
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Shared topology.
//
// The vhost and the hcp.commands/hcp.events exchanges belong to a (broker,
// vhost) pair that Callees and Callers of many namespaces use. Their
// objects live in one namespace that is not a tenant's: the operator's
// (the shared topology's home). Deleting a tenant namespace then deletes
// only that tenant's queues, bindings, users, permissions and policies.
//
// The topology objects reach the broker through a connection Secret in
// their own namespace, and the Secret a tenant names may live in the
// tenant's namespace (spec.broker.rabbitmqClusterReference.connectionSecret,
// or a default broker given by name only) and die with it. So the home
// holds its own copy, hcp-broker-KEY, of the connection Secret of a user
// of the pair (keys uri, username, password); the shared objects always
// name that copy and never a tenant's Secret. A pair reached through a
// RabbitmqCluster is referenced by the cluster's name and namespace (a
// cluster outside the home must allow the home namespace with its
// rabbitmq.com/topology-allowed-namespaces annotation).

// AnnotationCopiedFrom on a shared connection Secret names the Secret it
// was copied from (namespace/name).
const AnnotationCopiedFrom = "hcp.io/copied-from"

// SharedConnectionSecretName is the home's copy of a connection Secret of
// a vhost key's broker.
func SharedConnectionSecretName(key string) string { return "hcp-broker-" + key }

// SharedConnectionSecret copies what the topology operator reads from a
// connection Secret (uri, username, password) into the home namespace,
// labelled for the topology operator and with the vhost key.
func SharedConnectionSecret(home, key string, src *corev1.Secret) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: sharedMeta(SharedConnectionSecretName(key), home, key),
		Type:       corev1.SecretTypeOpaque,
		Data:       map[string][]byte{},
	}
	s.Labels[LabelTopologyOperator] = TopologyOperatorLabelValue
	s.Annotations = map[string]string{AnnotationCopiedFrom: src.Namespace + "/" + src.Name}
	for _, k := range []string{ConnectionSecretURIKey, ConnectionSecretUsernameKey, ConnectionSecretPasswordKey} {
		s.Data[k] = src.Data[k]
	}
	return s
}

// SharedReference is how the shared objects in home reach the broker of b,
// whose reference was resolved in namespace (the user's): through the
// home's connection Secret copy, or the RabbitmqCluster by name and
// namespace (without the namespace when it is home).
func SharedReference(home, namespace string, b Broker) topologyv1beta1.RabbitmqClusterReference {
	if b.Reference.ConnectionSecret != nil {
		return topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: SharedConnectionSecretName(b.Key())}}
	}
	ns := b.Reference.Namespace
	if ns == "" {
		ns = namespace
	}
	if ns == home {
		ns = ""
	}
	return topologyv1beta1.RabbitmqClusterReference{Name: b.Reference.Name, Namespace: ns}
}

// IsShared reports whether o is a shared object of a vhost key (labelled
// with it and managed by the operator), and which key.
func IsShared(o interface{ GetLabels() map[string]string }) (string, bool) {
	l := o.GetLabels()
	key := l[hcpv1alpha1.LabelVhostKey]
	return key, key != "" && l[hcpv1alpha1.LabelManagedBy] == hcpv1alpha1.ManagedByValue
}
