// Package controller holds the hcp-operator's reconcilers: Callee and Caller
// (topology, credentials, harness), HCPSession housekeeping, and
// CapabilityPolicy.
//
// The desired state of every child comes from the pure builders of
// internal/resource; this package fetches inputs, applies, and reports.
//
// # Where things are
//
//	doc.go                          this map
//	setup.go                        Setup: indexes and every reconciler on a manager
//	options.go                      Options, AddToScheme, the controllers' names
//	manager_config.go               ManagerConfig, its defaults, Validate
//	manager_flags.go                BindFlags: the manager's flags
//	manager_options.go              the manager built from its config: REST limits, controllers, ctrl.Options
//	cache.go                        what the manager caches, and the transforms that trim it
//	reconciler.go                   the one reconcile loop of Callee and Caller; the harness Deployment
//	callee_controller.go            CalleeReconciler and the manager's RBAC markers
//	sidecar_rbac.go                 RBAC markers for what the sidecars' Roles are granted
//	callee_drain.go                 held sidecar updates and pod deletion costs
//	caller_controller.go            CallerReconciler
//	capabilitypolicy_controller.go  CapabilityPolicyReconciler: validation and status only
//	hcpsession_controller.go        HCPSessionReconciler: deletes finished sessions after their TTL
//	harness.go                      core, view, broker resolution, id claims
//	children.go                     the children table of a Callee or Caller
//	ssa.go                          applying children by server-side apply; up-to-date checks
//	apply.go                        apply and createOrUpdate for the rest
//	limits.go                       live queue limits through a Policy
//	secrets.go                      broker credentials and the token key
//	tls.go                          the broker TLS Secrets, checked
//	status.go, statusmemo.go        conditions, and the status last written
//	statuspace.go                   status writes held back: a wait's detail, a new object's first wait
//	mapping.go                      watch mappings and predicates
//	indexes.go                      field indexes
//	sessions_metrics.go             the HCPSession metrics, from the cache
//	shared.go                       the shared per-vhost topology: its home namespace
//	shared_apply.go                 the shared objects applied, the home's connection Secret copy
//	shared_legacy.go                shared objects of earlier versions adopted without a broker deletion
//	shared_redeclare.go             a lost shared exchange re-created and its bindings re-declared
//	shared_users.go                 who still uses a vhost, asked of the API server (claimLog)
//	finalizer.go                    the topology finalizer: own objects, then the shared ones by the last user
//	writebudget/                    a test: the manager's API writes per Callee/Caller (issue 35)
package controller
