// Package e2e is the end-to-end suite: the operator installed from the
// rendered Helm chart, the samples (config/samples) applied in a fresh
// namespace, tasks submitted through the caller pod's sidecar, and
// everything checked where a user would look: object status, the broker's
// management API and the events the sample caller app received.
//
// The tests are behind the build tag e2e, so `go test ./...` does not run
// them:
//
//	make test-e2e     # go test -tags e2e -count=1 -timeout 30m ./test/e2e/...
//
// By default they run against the local stack (hack/local-stack.sh; root):
// reused when it runs, brought up (and stopped afterwards) when it does not.
// HCP_E2E_USE_EXISTING_CLUSTER=1 runs them against the cluster in
// KUBECONFIG instead. See README.md in this directory for every setting.
package e2e
