// Package events builds the hcp-sidecar's Kubernetes Event recorder: the
// standard client-go broadcaster, whose correlator aggregates similar
// events (a flood of rejections becomes a few Event objects with counts)
// and rate-limits each source and object.
package events

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// Component is the source of the sidecar's Events.
const Component = "hcp-sidecar"

// NewRecorder returns a recorder writing Events to namespace ns (the
// sidecar may write Events in its own namespace only) as Component on host
// (the pod), and a function that flushes and stops it.
func NewRecorder(cfg *rest.Config, scheme *runtime.Scheme, ns, host string) (record.EventRecorder, func(), error) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("event recorder: %w", err)
	}
	b := NewBroadcaster()
	b.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events(ns)})
	return b.NewRecorder(scheme, corev1.EventSource{Component: Component, Host: host}), b.Shutdown, nil
}

// NewBroadcaster is client-go's broadcaster whose spam filter (a burst of
// 25 Events, then one per 5 minutes) counts each reason on an object
// apart: a stream of TaskAccepted on a Callee never silences its
// TaskRejected, nor the other way round.
func NewBroadcaster() record.EventBroadcaster {
	return record.NewBroadcaster(record.WithCorrelatorOptions(record.CorrelatorOptions{SpamKeyFunc: SpamKey}))
}

// SpamKey is client-go's spam key (source, object, type) with the reason.
func SpamKey(e *corev1.Event) string {
	return strings.Join([]string{
		e.Source.Component, e.Source.Host,
		e.InvolvedObject.Kind, e.InvolvedObject.Namespace, e.InvolvedObject.Name, string(e.InvolvedObject.UID), e.InvolvedObject.APIVersion,
		e.Type, e.Reason,
	}, "/")
}

// Ref is the reference an Event names for the hcp.io object kind/name in
// ns; uid may be empty (kubectl describe matches an object's Events by
// it, so give it when known).
func Ref(kind, ns, name string, uid types.UID) *corev1.ObjectReference {
	return &corev1.ObjectReference{APIVersion: v1alpha1.GroupVersion.String(), Kind: kind, Namespace: ns, Name: name, UID: uid}
}
