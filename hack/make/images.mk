# Container images and the release, without a Docker daemon or a registry
# (included by the Makefile). hack/imagebuild, a Go module of its own,
# packs the static binaries onto a distroless-like base layer as OCI
# image-layout archives: reproducible (SOURCE_DATE_EPOCH, default 0),
# importable with `ctr -n k8s.io images import`, pushable with skopeo.

##@ Images and release

IMAGEBUILD ?= $(LOCALBIN)/imagebuild
IMAGES_DIR ?= $(LOCALBIN)/images
# The release version: the chart's appVersion unless given (the release
# workflow checks that the git tag agrees with it).
RELEASE_VERSION ?= $(shell sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$$/\1/p' charts/hcp-operator/Chart.yaml)
# The samples and config/manager use :latest, the chart its appVersion.
IMAGE_TAGS ?= $(RELEASE_VERSION),latest
IMAGE_PLATFORMS ?= linux/amd64,linux/arm64
DIST ?= $(CURDIR)/dist
CYCLONEDX_GOMOD_VERSION ?= v1.10.0
CYCLONEDX_GOMOD ?= $(LOCALBIN)/cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION)
ACTIONLINT_VERSION ?= v1.7.12
ACTIONLINT ?= $(LOCALBIN)/actionlint-$(ACTIONLINT_VERSION)

.PHONY: imagebuild
imagebuild: ## Build the image builder (hack/imagebuild, its own module) into bin/imagebuild.
	@mkdir -p $(LOCALBIN)
	$(IMAGEBUILD_GO) && go build -o $(IMAGEBUILD) .

.PHONY: images
images: imagebuild ## Build every image for IMAGE_PLATFORMS into bin/images/ (OCI archives, images.json with the digests): hcp-operator, the two samples, and the local test node's pause image.
	$(IMAGEBUILD) all -repo $(CURDIR) -out $(IMAGES_DIR) -tags '$(IMAGE_TAGS)' -platforms '$(IMAGE_PLATFORMS)' -go-build-flags '$(GO_BUILD_FLAGS)'
	$(IMAGEBUILD) list -manifest $(IMAGES_DIR)/images.json

.PHONY: release
release: images helm cyclonedx-gomod ## Dry-run a release into dist/ (nothing is pushed): the image archives, a CycloneDX SBOM per image and platform, the chart packaged with image.digest pinned, SHA256SUMS.
	IMAGEBUILD=$(IMAGEBUILD) HELM=$(HELM) CYCLONEDX_GOMOD=$(CYCLONEDX_GOMOD) IMAGES_DIR=$(IMAGES_DIR) \
		DIST=$(DIST) RELEASE_VERSION=$(RELEASE_VERSION) hack/imagebuild/release.sh

.PHONY: check-release-workflow
check-release-workflow: actionlint ## Lint .github/workflows/release.yaml with actionlint (its shell steps with shellcheck too, when installed).
	$(ACTIONLINT) -color=false .github/workflows/release.yaml

.PHONY: check-images-import
check-images-import: images ## Import the images into a throw-away containerd (root; Debian's containerd and runc) and run the pause and sample images with runc.
	IMAGES_DIR=$(IMAGES_DIR) hack/imagebuild/import-check.sh

.PHONY: cyclonedx-gomod
cyclonedx-gomod: $(CYCLONEDX_GOMOD)
$(CYCLONEDX_GOMOD):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) GOWORK=off go install github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION)
	mv $(LOCALBIN)/cyclonedx-gomod $(CYCLONEDX_GOMOD)

.PHONY: actionlint
actionlint: $(ACTIONLINT)
$(ACTIONLINT):
	@mkdir -p $(LOCALBIN)
	GOBIN=$(LOCALBIN) GOWORK=off go install github.com/rhysd/actionlint/cmd/actionlint@$(ACTIONLINT_VERSION)
	mv $(LOCALBIN)/actionlint $(ACTIONLINT)
