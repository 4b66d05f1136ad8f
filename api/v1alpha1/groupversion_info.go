// Package v1alpha1 contains the hcp.io/v1alpha1 API: Callee, Caller,
// CapabilityPolicy and HCPSession.
//
// The package imports nothing but core Kubernetes API types so that clients
// (kubectl plugins, other operators) can depend on it cheaply.
//
// +kubebuilder:object:generate=true
// +groupName=hcp.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the group and version used to register these objects.
	GroupVersion = schema.GroupVersion{Group: "hcp.io", Version: "v1alpha1"}

	// SchemeBuilder is used to add go types to the GroupVersionKind scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types in this group-version to the given scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
