package controller

// The manager grants the sidecars' Roles (internal/resource.RoleRules);
// Kubernetes lets it grant only what it holds itself.
// +kubebuilder:rbac:groups=coordination.k8s.io,resources=leases,verbs=get;create;update
// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get;create;update
