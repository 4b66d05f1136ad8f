// Package testbed starts the real parts that envtest, integration and
// end-to-end suites run against, built from Go modules and Debian packages
// (see docs/design section 6 and the hack/testbed-*.sh scripts):
//
//   - StartEnv / Start: envtest (kube-apiserver + etcd) with the project's
//     CRDs, the messaging-topology-operator CRDs and the RabbitmqCluster CRD
//     installed, an uncached client, and a kubeconfig file for subprocesses.
//   - EnsureRabbitMQ: a RabbitMQ broker with the management plugin on
//     localhost (hack/testbed-rabbitmq.sh), and a Broker to inspect it.
//   - StartTopologyOperator: the real messaging-topology-operator as a
//     subprocess (hack/testbed-mto.sh builds it), logs kept per test.
//   - CreateConnectionSecret, WaitForTopologyReady, Eventually, DumpOnFailure.
//
// Tests use real parts: when the broker cannot be made available, tests fail
// with the script's message; set HCP_SKIP_BROKER=1 to skip them explicitly.
//
// This package is for tests only. Production code must not import it
// (TestNotImportedByProductionCode enforces that).
package testbed
