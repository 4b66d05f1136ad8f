// Package resource builds the desired state of everything the operator
// creates for a Callee or a Caller: the messaging-topology-operator objects
// (Vhost, the two shared Exchanges, Queue, Binding, User, Permission), the
// broker credentials Secret (with a callee's session-token keys), the harness
// Deployment with the injected hcp-sidecar, and the sidecar's
// ServiceAccount, Role and RoleBinding.
//
// Builders are pure: no client calls, no clock, no randomness (passwords and
// keys are passed in). The controllers fetch what the builders need, call
// them, and apply the result.
//
// # Names
//
// Children of a Callee or Caller named N are named hcp-callee-N or
// hcp-caller-N (the credentials Secret adds -credentials; a Callee's token
// keys were in one of their own, -token, before they joined it), so a
// Callee and a Caller may share a name. Shared per-vhost
// objects are named after the vhost key (VhostKey): hcp-commands-KEY,
// hcp-events-KEY and hcp-vhost-KEY, one set per namespace.
//
// # Broker identity and the vhost key
//
// The exchanges hcp.commands and hcp.events are shared by every harness of a
// vhost on a broker, across namespaces. The vhost key names that pair: the
// first 10 hex digits of SHA-256 over the broker identity and the vhost. The
// broker identity is
//
//   - for a connection Secret: the host and port of its management uri,
//     lowercased, so Secrets in different namespaces that reach the same
//     broker agree;
//   - for a RabbitmqCluster: "rabbitmqcluster:NAMESPACE/NAME".
//
// # The AMQP address
//
// The credentials Secret carries an amqp(s) URL (key uri) with the
// username, password and URL-escaped vhost. Its host and port come from
//
//   - the connection Secret's optional key amqpURL (amqp:// or amqps://;
//     any credentials or path in it are ignored), else
//   - the host of the connection Secret's management uri with port 5672
//     (amqp) or, when the management uri is https, 5671 (amqps), else
//   - for a RabbitmqCluster reference, NAME.NAMESPACE.svc:5672 (the Service
//     the cluster-operator creates).
package resource
