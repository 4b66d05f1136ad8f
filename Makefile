# hcp-operator Makefile. `make help` lists the targets.

SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

# Versions of build tools that are not go.mod tools.
GOLANGCI_LINT_VERSION ?= v2.15.0
LOCALBIN ?= $(CURDIR)/bin
GOLANGCI_LINT ?= $(LOCALBIN)/golangci-lint-$(GOLANGCI_LINT_VERSION)
CONTROLLER_GEN ?= go tool controller-gen

# Flags shared by `make build` and the Dockerfile (CI checks they agree).
GO_BUILD_FLAGS ?= -trimpath -ldflags=-s\ -w
export CGO_ENABLED ?= 0

# Test settings.
GO_TEST_FLAGS ?= -count=1
TEST_TIMEOUT ?= 40m

.PHONY: all
all: build

##@ General

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"; printf "\nUsage:\n  make \033[36m<target>\033[0m\n"} /^[a-zA-Z_0-9-]+:.*?##/ { printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2 } /^##@/ { printf "\n\033[1m%s\033[0m\n", substr($$0, 5) } ' $(MAKEFILE_LIST)

##@ Development

.PHONY: manifests
manifests: ## Generate CRDs and RBAC from the kubebuilder markers.
	$(CONTROLLER_GEN) crd paths="./api/..." output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=manager-role paths="./internal/controller/..." output:rbac:artifacts:config=config/rbac
	@hack/sync-chart-crds.sh

.PHONY: generate
generate: ## Generate deepcopy code.
	$(CONTROLLER_GEN) object:headerFile="hack/boilerplate.go.txt" paths="./api/..."

.PHONY: fmt
fmt: ## Run go fmt.
	go fmt ./...

.PHONY: vet
vet: ## Run go vet.
	go vet ./...

.PHONY: lint
lint: golangci-lint ## Run golangci-lint.
	$(GOLANGCI_LINT) run ./...

.PHONY: verify
verify: generate manifests fmt ## Regenerate everything and fail if anything changed.
	go mod tidy
	@if [ -n "$$(git status --porcelain -- api config charts go.mod go.sum '*.go')" ]; then \
		echo "make verify: generated files or formatting are out of date:"; \
		git status --porcelain -- api config charts go.mod go.sum '*.go'; \
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
test: testbed ## Run all tests: unit, fuzz seeds, envtest, integration against real RabbitMQ and the topology operator.
	KUBEBUILDER_ASSETS="$$(hack/testbed-k8s.sh)" go test $(GO_TEST_FLAGS) -timeout $(TEST_TIMEOUT) ./...

.PHONY: test-unit
test-unit: ## Run the pure unit tests only (no API server, no broker).
	go test $(GO_TEST_FLAGS) -short ./pkg/... ./api/... ./internal/resource/...

.PHONY: fuzz
fuzz: ## Run every fuzz target for FUZZTIME (default 60s) each.
	@for t in $$(go test -list '^Fuzz' ./pkg/... | grep -E '^(Fuzz|ok)' | awk '/^Fuzz/{f=f" "$$1} /^ok/{print $$2":"f; f=""}'); do \
		pkg=$${t%%:*}; for fz in $${t#*:}; do \
			echo "== $$pkg $$fz"; go test $$pkg -run='^$$' -fuzz="^$$fz$$" -fuzztime=$${FUZZTIME:-60s}; \
		done; done

##@ Build

.PHONY: build
build: ## Build the manager and hcp-sidecar binaries into bin/.
	go build $(GO_BUILD_FLAGS) -o $(LOCALBIN)/manager ./cmd/manager
	go build $(GO_BUILD_FLAGS) -o $(LOCALBIN)/hcp-sidecar ./cmd/hcp-sidecar

##@ Tools

.PHONY: golangci-lint
golangci-lint: $(GOLANGCI_LINT)
$(GOLANGCI_LINT):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) go install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$(GOLANGCI_LINT_VERSION)
	mv $(LOCALBIN)/golangci-lint $(GOLANGCI_LINT)
