# hcp-operator Makefile. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

# Versions of build tools that are not go.mod tools.
GOLANGCI_LINT_VERSION ?= v2.15.0
LOCALBIN ?= $(CURDIR)/bin
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
HELM_VERSION ?= v3.22.0
HELM ?= $(LOCALBIN)/helm-$(HELM_VERSION)
HELM_DOCS_VERSION ?= v1.14.2
HELM_DOCS ?= $(LOCALBIN)/helm-docs-$(HELM_DOCS_VERSION)
CONTROLLER_GEN ?= go tool controller-gen

# Flags shared by `make build` and the Dockerfile (CI checks they agree).
GO_BUILD_FLAGS ?= -trimpath -ldflags=-s\ -w
export CGO_ENABLED ?= 0

# hack/imagebuild, which builds the images offline, is a Go module of its
# own (go-containerregistry stays out of the main module): root ./...
# patterns skip it, so the targets that cover it too (lint, verify, test)
# enter its directory. GOWORK off: it builds alone, whatever workspace is
# around.
IMAGEBUILD_GO := cd hack/imagebuild && export GOWORK=off
# test/observability (the checks of the alerts, the dashboard and the metric
# tables, and the dashboard's picture) is a module of its own as well, so
# that Prometheus' rule and query packages and the plotting library, and
# the cloud SDKs they pull, stay out of the main module and the images'
# `go mod download`. Its go.mod replaces the main module with this
# checkout; the same targets enter its directory.
OBSERVABILITY_GO := cd test/observability && export GOWORK=off

# Test settings.
GO_TEST_FLAGS ?= -count=1
# CHAOS_REPORT receives the fault table of `make chaos`; CHAOS_RUNS is how
# many times it runs each fault, each run with fresh sessions.
CHAOS_REPORT ?= $(CURDIR)/test/e2e/_artifacts/chaos.md
CHAOS_RUNS ?= 5
# CHAOS_ONLY, a regular expression, runs only the faults it matches.
CHAOS_ONLY ?=
TEST_TIMEOUT ?= 40m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: helm-docs ## Generate CRDs and RBAC from the kubebuilder markers, and the chart's copies of them.
	$(CONTROLLER_GEN) crd:generateEmbeddedObjectMeta=true paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths="./internal/controller/..." output:rbac:artifacts:config=config/rbac
	@HELM_DOCS=$(HELM_DOCS) hack/sync-chart.sh

.PHONY: generate
generate: ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet (the main module and test/observability).
	go vet ./...
	$(OBSERVABILITY_GO) && go vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint on the module and on hack/imagebuild and test/observability (modules of their own).
	$(GOLANGCI_LINT) run ./...
	$(IMAGEBUILD_GO) && $(GOLANGCI_LINT) run ./...
	$(OBSERVABILITY_GO) && $(GOLANGCI_LINT) run ./...

.PHONY: verify
verify: generate manifests fmt ## Regenerate everything (deepcopy, CRDs, RBAC, chart, API docs) and fail if anything changed; no non-test Go file in internal/, pkg/, cmd/ or api/ over 450 lines (generated deepcopy aside); every doc path named in docs/, README and the chart exists.
	go mod tidy
	$(IMAGEBUILD_GO) && go fmt ./... && go mod tidy
	$(OBSERVABILITY_GO) && go fmt ./... && go mod tidy
	hack/gen-api-docs.sh
	hack/conformance-check.sh
	hack/check-file-size.sh
	hack/check-doc-paths.sh
	@if [ -n "$$(git status --porcelain -- api config charts docs go.mod go.sum hack/imagebuild/go.mod hack/imagebuild/go.sum test/observability/go.mod test/observability/go.sum '*.go')" ]; then \
		echo "make verify: generated files or formatting are out of date:"; \
		git status --porcelain -- api config charts docs go.mod go.sum hack/imagebuild/go.mod hack/imagebuild/go.sum test/observability/go.mod test/observability/go.sum '*.go'; \
		git --no-pager diff --stat; exit 1; \
	fi
	@echo "make verify: everything is up to date"

##@ Test bed (real parts, built from Go modules; cached outside the repo)

.PHONY: testbed
testbed: ## Provide kube-apiserver/etcd/kubectl, RabbitMQ with management, and the topology operator.
	hack/testbed-k8s.sh >/dev/null
	hack/testbed-rabbitmq.sh
	hack/testbed-mto.sh >/dev/null

##@ Test

.PHONY: test
test: testbed ## Run all tests: unit, fuzz seeds, envtest, integration (real RabbitMQ and topology operator), install checks (chart, kustomize, Dockerfile), and the end-to-end suite on the local stack.
	KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) ./...; \
		rc=$$?; hack/rabbitmq-cluster.sh down 2>/dev/null || true; exit $$rc
	$(IMAGEBUILD_GO) && go test $(GO_TEST_FLAGS) ./...
	$(OBSERVABILITY_GO) && go test $(GO_TEST_FLAGS) ./...
	$(MAKE) check-install
	$(MAKE) test-e2e
	$(MAKE) test-scale

.PHONY: test-unit
test-unit: ## Run the pure unit tests only (no API server, no broker).
	go test $(GO_TEST_FLAGS) -short ./pkg/... ./api/... ./internal/resource/...

# BENCH_EVENTS per run at max rate; BENCH_REPORT receives the issue-35
# target lines of `make bench` (also printed).
BENCH_EVENTS ?= 50000
BENCH_REPORT ?= $(LOCALBIN)/bench-targets.txt
.PHONY: bench
bench: testbed ## Benchmarks against their raw baselines in the same run: transport vs raw amqp091-go; the full sidecar relay vs raw and vs the harness API's floor (every harness and app mode, 1 and 10 sessions, 5 rotating rounds, BENCH_EVENTS a run at max rate, 20,000 at 1,000/s; several hours), then issue 35's targets with the Istio and Dapr anchors, ✓ or ✗ (a measurement: a ✗ does not fail), also in BENCH_REPORT; the status writer's API write budget at 10, 100, 1,000 sessions; each sidecar's CPU per event as a process of its own beside raw amqp091-go processes (make bench-sidecars), and at full speed.
	@mkdir -p $(dir $(BENCH_REPORT))
	go test -run '^$$' -bench . -benchtime $(BENCH_EVENTS)x -timeout 60m ./internal/transport
	HCP_BENCH_REPORT=$(BENCH_REPORT) KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test -run '^$$' -bench BenchmarkRelay -benchtime $(BENCH_EVENTS)x -timeout 600m -v ./test/relay
	KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test -run '^$$' -bench BenchmarkWriteBudget -benchtime 1x -timeout 20m -v ./internal/sidecar/status
	ROUNDS=5 hack/bench-sidecars.sh
	go test -run '^$$' -bench 'BenchmarkCalleeCPU/api=.*/rate=max' -benchtime 20000x -count 3 -timeout 30m ./internal/sidecar/callee
	go test -run '^$$' -bench 'BenchmarkCallerCPU/app=stream/rate=1000/sessions=10' -benchtime 20000x -count 3 -timeout 30m ./internal/sidecar/caller
	@echo "issue 35's targets (also in $(BENCH_REPORT)):" && cat $(BENCH_REPORT)

.PHONY: bench-sidecars
bench-sidecars: testbed ## Each sidecar as a process of its own (one processor) at 1,000 events/s beside raw amqp091-go's publisher and consumer as processes fed the same way, SIDECAR_ROUNDS rotating rounds (default 3, about 3 minutes each): medians and issue 35's CPU target with the raw pair beside it.
	ROUNDS=$(SIDECAR_ROUNDS) hack/bench-sidecars.sh

SIDECAR_ROUNDS ?= 3

.PHONY: relay-cuts
relay-cuts: testbed ## The relay while the broker closes the sidecars' connections at random (RELAY_CUTS_RUNS runs, default 5): every event once and in order, none given up.
	HCP_RELAY_CUTS=1 KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test -count=$(RELAY_CUTS_RUNS) -run '^TestRelayRandomConnectionCuts$$' -v -timeout 30m ./test/relay

RELAY_CUTS_RUNS ?= 5
REJECT_FLOOD ?= 10000
.PHONY: bench-rejections
bench-rejections: testbed ## A flood of REJECT_FLOOD (default 10000) task_submits the gate refuses: the API objects left behind (make test runs 2,000).
	HCP_REJECT_FLOOD=$(REJECT_FLOOD) KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test -count=1 -run '^TestRejectionFloodWritesNothing$$' -v -timeout 20m ./internal/sidecar/callee

# SCALE_N Callees and as many Callers for `make bench-scale`; SCALE_IDLE is
# the window in which the operator must not write; SCALE_REPORT receives
# the table.
SCALE_N ?= 1000
SCALE_IDLE ?= 60s
SCALE_REPORT ?= $(LOCALBIN)/bench-scale.md
SCALE_HEAP_PROFILE ?= $(LOCALBIN)/bench-scale-heap.pprof
SCALE_CPU_PROFILE ?= $(LOCALBIN)/bench-scale-cpu.pprof
SCALE_APISERVER_PROFILE ?= $(LOCALBIN)/bench-scale-apiserver
SCALE_MANAGER_LOG ?= $(LOCALBIN)/bench-scale-manager.log
.PHONY: bench-scale
bench-scale: testbed ## SCALE_N (default 1000) Callees and Callers, replicas 0, on the local stack (root): time to Ready vs the same children created directly and vs a floor (the same plus the Callee/Caller creates and one status write each), manager RSS per object, API writes in SCALE_IDLE idle, cleanup and broker orphans; the table also goes to SCALE_REPORT, the manager's heap profile to SCALE_HEAP_PROFILE, its CPU profile of the first minute of convergence to SCALE_CPU_PROFILE, the API server's of each phase to SCALE_APISERVER_PROFILE-{baseline,operator}.pprof, the manager's log to SCALE_MANAGER_LOG.
	@mkdir -p $(sort $(dir $(SCALE_REPORT) $(SCALE_HEAP_PROFILE) $(SCALE_CPU_PROFILE) $(SCALE_APISERVER_PROFILE) $(SCALE_MANAGER_LOG)))
	HCP_SCALE_N=$(SCALE_N) HCP_SCALE_IDLE=$(SCALE_IDLE) HCP_SCALE_REPORT=$(SCALE_REPORT) HCP_SCALE_HEAP_PROFILE=$(SCALE_HEAP_PROFILE) HCP_SCALE_CPU_PROFILE=$(SCALE_CPU_PROFILE) HCP_SCALE_APISERVER_PROFILE=$(SCALE_APISERVER_PROFILE) HCP_SCALE_MANAGER_LOG=$(SCALE_MANAGER_LOG) go test -tags e2e -count=1 -run '^TestScale$$' -v -timeout 300m ./test/scale

# SCALE_RUNS A-B-A runs of bench-scale and their mean (issue 35 asks for 3).
SCALE_RUNS ?= 3
.PHONY: bench-scale-runs
bench-scale-runs: testbed ## SCALE_RUNS (default 3) runs of bench-scale at SCALE_N (default here 200), each on a fresh local stack (SCALE_N and SCALE_IDLE given to make pass through); prints each run's time to Ready against the floor and the baseline and their means with issue 35's target line (reports in bin/bench-scale-runs/).
	RUNS=$(SCALE_RUNS) hack/bench-scale-runs.sh

.PHONY: test-scale
test-scale: ## The smoke of bench-scale (part of make test): 50 Callees and 50 Callers, 10 s idle; asserts convergence, the baseline's objects, 0 idle writes, 0 broker orphans (timings only printed).
	HCP_SCALE_N=50 HCP_SCALE_IDLE=10s go test -tags e2e -count=1 -run '^TestScale$$' -v -timeout 30m ./test/scale

# DASHBOARD_SAMPLES receives the relay run's scrapes that
# `make dashboard-picture` draws the dashboard from.
DASHBOARD_SAMPLES ?= $(LOCALBIN)/dashboard-samples.jsonl
.PHONY: dashboard-picture
dashboard-picture: testbed ## Draw docs/images/dashboard.png: the chart's Grafana dashboard, its queries evaluated by PromQL over metrics scraped from a relay run with real traffic (no Grafana here); the scrapes go to DASHBOARD_SAMPLES.
	@mkdir -p $(dir $(DASHBOARD_SAMPLES))
	HCP_DASHBOARD_SAMPLES=$(DASHBOARD_SAMPLES) KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test -count=1 -run '^TestDashboardRun$$' -v -timeout 15m ./test/relay
	$(OBSERVABILITY_GO) && HCP_DASHBOARD_SAMPLES=$(DASHBOARD_SAMPLES) HCP_DASHBOARD_PICTURE=$(CURDIR)/docs/images/dashboard.png go test -count=1 -run '^TestDashboardPicture$$' -v -timeout 15m ./dashboard

.PHONY: test-e2e
test-e2e: ## Run the end-to-end suite (test/e2e): chart install, samples, sessions on the local stack (root; brought up if not running) or, with HCP_E2E_USE_EXISTING_CLUSTER=1, the cluster in KUBECONFIG.
	go test -tags e2e -count=1 -timeout 30m ./test/e2e/...

.PHONY: test-upgrade
test-upgrade: ## The upgrade test alone (docs/upgrades.md; make test-e2e runs it too): helm install of version N (HCP_UPGRADE_FROM, a git ref) on the local stack (root), sessions streaming, helm upgrade to the working tree; every session completes.
	go test -tags e2e -count=1 -run '^TestUpgrade$$' -v -timeout 20m ./test/e2e/...

# CONFORMANCE_REPORT receives the table of `make conformance-kit`.
CONFORMANCE_REPORT ?= $(CURDIR)/test/e2e/_artifacts/conformance.md

.PHONY: conformance-kit
conformance-kit: ## Run the conformance kit (cmd/hcp-conformance; docs/conformance-kit.md) against the sample callee on the local stack (root); the table goes to CONFORMANCE_REPORT. make test-e2e runs it too.
	@mkdir -p $(dir $(CONFORMANCE_REPORT))
	HCP_CONFORMANCE_REPORT=$(CONFORMANCE_REPORT) go test -tags e2e -count=1 -timeout 30m -run '^TestConformanceKit$$' -v ./test/e2e/...

.PHONY: chaos
chaos: ## Run the end-to-end suite on a three-node RabbitMQ cluster (hack/rabbitmq-cluster.sh; stopped afterwards) with every chaos fault, each CHAOS_RUNS (5) times, etcd fsyncing (sidecar kills and an OOM kill, app and pod kills, rollouts and a kill during a hand-over, an operator upgrade, caller faults, the broker restarted, a broker node killed or partitioned, the API server down 30 s and 120 s, an owner cut off from the API server, paused past its Lease, or deleted while it runs on); CHAOS_ONLY (a regular expression) narrows the faults; the table goes to CHAOS_REPORT.
	HCP_ETCD_FSYNC=1 hack/local-stack.sh up
	HCP_E2E_RABBITMQ_CLUSTER=1 HCP_ETCD_FSYNC=1 HCP_CHAOS=full HCP_CHAOS_ONLY='$(CHAOS_ONLY)' HCP_CHAOS_RUNS=$(CHAOS_RUNS) HCP_CHAOS_REPORT=$(CHAOS_REPORT) \
		go test -tags e2e -count=1 -timeout 240m -run '^TestHCP$$' -v ./test/e2e/...; rc=$$?; hack/rabbitmq-cluster.sh down; exit $$rc

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 60s) each.
	@go test -list '^Fuzz' ./pkg/... ./internal/sidecar/... | \
		awk '/^Fuzz/{f[n++]=$$1} /^ok/{for (i = 0; i < n; i++) print $$2, f[i]; n = 0}' | \
		while read -r pkg fz; do \
			echo "== $$pkg $$fz"; go test $$pkg -run='^$$' -fuzz="^$$fz$$" -fuzztime=$${FUZZTIME:-60s} -fuzzminimizetime=10s || exit 1; \
		done

##@ Build

.PHONY: build
build: kubectl-hcp ## Build the manager, hcp-sidecar, hcp-conformance and kubectl-hcp binaries into bin/.
	go build $(GO_BUILD_FLAGS) -o $(LOCALBIN)/manager ./cmd/manager
	go build $(GO_BUILD_FLAGS) -o $(LOCALBIN)/hcp-sidecar ./cmd/hcp-sidecar
	go build $(GO_BUILD_FLAGS) -o $(LOCALBIN)/hcp-conformance ./cmd/hcp-conformance

.PHONY: kubectl-hcp
kubectl-hcp: ## Build the kubectl plugin into bin/kubectl-hcp (put it on PATH: kubectl hcp; docs/kubectl-plugin.md).
	go build $(GO_BUILD_FLAGS) -o $(LOCALBIN)/kubectl-hcp ./cmd/kubectl-hcp

include hack/make/images.mk

##@ Install checks

.PHONY: check-install
check-install: helm ## Lint and render the chart, dry-run it and config/default server-side on a throw-away API server, check idempotence and the Dockerfile.
	HELM=$(HELM) hack/check-install.sh

.PHONY: check-dockerfile
check-dockerfile: ## Build the Dockerfile's binaries with its exact commands and check them against GO_BUILD_FLAGS.
	GO_BUILD_FLAGS='$(GO_BUILD_FLAGS)' hack/check-dockerfile.sh

##@ Demo

.PHONY: demo
demo: ## Bring up a local control plane and node (kubelet, containerd), RabbitMQ, the topology operator and hcp-operator with the samples, from images built offline (root), and run a task.
	hack/demo.sh up

.PHONY: demo-down
demo-down: ## Stop everything `make demo` started and remove its state.
	hack/demo.sh down

.PHONY: local-stack
local-stack: ## Only the local stack (control plane, a real node, RabbitMQ, topology operator), for e2e tests; see hack/local-stack.sh.
	hack/local-stack.sh up

##@ Tools

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(LOCALBIN)/golangci-lint $(GOLANGCI_LINT)

# The ldflags are those of helm's own release build: without them `helm
# version` is blank and helm assumes Kubernetes v1.20 (Capabilities.KubeVersion,
# lint's deprecation checks); 1.37 is the k8s.io/client-go of helm v3.22.0.
HELM_LDFLAGS ?= -X helm.sh/helm/v3/internal/version.version=$(HELM_VERSION) \
	-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=37 \
	-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=37

.PHONY: helm
helm: $(HELM)
$(HELM):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install -ldflags '$(HELM_LDFLAGS)' helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
	mv $(LOCALBIN)/helm $(HELM)

.PHONY: helm-docs
helm-docs: $(HELM_DOCS)
$(HELM_DOCS):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/norwoodj/helm-docs/cmd/helm-docs@$(HELM_DOCS_VERSION)
	mv $(LOCALBIN)/helm-docs $(HELM_DOCS)
