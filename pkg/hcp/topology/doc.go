// Package topology names the HCP AMQP objects of L1 and the broker
// identities and permissions of the project's design. It has no Kubernetes
// dependencies; the operator (which declares the topology) and the sidecar
// (which uses it) share it.
//
// Per vhost (DefaultVhost "/hcp"):
//
//	exchange hcp.commands  direct  routing key {callee_id}
//	exchange hcp.events    topic   routing key {caller_id}.{session_id}.{type}
//	queue    hcp.cmd.{callee_id}   bound to hcp.commands with {callee_id}
//	queue    hcp.evt.{caller_id}   bound to hcp.events with {caller_id}.#
//
// Consumers may also bind per session ({caller_id}.{session_id}.#) or per
// type ({caller_id}.*.{type}).
//
// Ids match IDPattern, ^[a-z0-9]([a-z0-9_-]{0,61}[a-z0-9])?$: one routing-key
// word, never containing '.', '*', '#' or '@'.
//
// # Broker usernames
//
// Every callee and caller gets its own broker user, named
//
//	{role}.{id}@{vhost}     e.g. callee.lab-cvd@/hcp, caller.alpha@/hcp
//
// with role "callee" or "caller". Broker users are global while ids are
// unique only per vhost, so the vhost is part of the name. The scheme is
// reversible without a lookup: roles and ids contain neither '.' nor '@', so
// the role ends at the first '.', the id at the next '@', and the vhost is
// the rest (vhost names may contain anything). A sidecar thus learns the
// peer's role and id from the user_id property that RabbitMQ has checked
// against the publishing connection's login (ParseUsername).
//
// # Permissions
//
// Harness users never configure (the operator declares topology). A callee
// writes only to hcp.events and reads only hcp.cmd.{callee_id}; a caller
// writes only to hcp.commands and reads only hcp.evt.{caller_id}
// (CalleePermissions, CallerPermissions).
//
// # Session ids
//
// SessionID derives a session id from (callee id, task_submit message_id)
// deterministically, in UUID v4 form, so duplicates of one task_submit map
// to one session (and one HCPSession object).
package topology
