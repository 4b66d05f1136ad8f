package main

// The images this project ships, written down once. They must match the
// Dockerfile and Dockerfile.samples (hack/check-dockerfile.sh compares them
// with what `imagebuild describe` prints), because CI builds its images here
// while users who have a Docker daemon may build from the Dockerfiles.

const (
	// The non-root user of distroless static:nonroot, which the Dockerfiles
	// use and the chart's restricted security context expects.
	nonrootUser = "65532:65532"
	// The pause image runs as the same user as the upstream
	// registry.k8s.io/pause image (USER 65535:65535).
	pauseUser = "65535:65535"

	// The images are Linux images (static binaries, Linux users).
	linuxOS = "linux"
	// The tag the samples and config/manager name, built beside the
	// chart's appVersion.
	latestTag = "latest"

	// The repository root's module, where the product binaries are built.
	mainModule = "."
	// The pause program lives in this module, which is not part of the
	// main module's build list (it is a test-node helper, not a product).
	imagebuildModule = "hack/imagebuild"
)

// binary is one file of an image's application layer.
type binary struct {
	Path   string // path in the image, e.g. /manager
	Module string // directory of the Go module to build it in, relative to the repo root
	Pkg    string // package to build, relative to Module
}

// imageSpec is one image: its repository, what it runs, and what it holds.
type imageSpec struct {
	Repository string   // e.g. ghcr.io/hcp-io/hcp-operator
	Tarball    string   // file name in the output directory
	Entrypoint []string // exec form, as the Dockerfile's ENTRYPOINT
	Cmd        []string
	User       string
	Binaries   []binary
	// Base is false for images that need nothing but their binary: the
	// upstream pause image is FROM scratch, so ours carries no base layer.
	Base bool
	// FixedTags replace the configurable tags (the pause image's name is
	// set in the test node's containerd config and never changes).
	FixedTags []string
	// Release marks the images `make release` publishes; the pause image
	// exists only for the local test node.
	Release bool
}

// specs lists every image `imagebuild all` builds, in build order.
var specs = []imageSpec{
	{
		Repository: "ghcr.io/hcp-io/hcp-operator",
		Tarball:    "hcp-operator.tar",
		Entrypoint: []string{"/manager"},
		User:       nonrootUser,
		Binaries: []binary{
			{Path: "/manager", Module: mainModule, Pkg: "./cmd/manager"},
			{Path: "/hcp-sidecar", Module: mainModule, Pkg: "./cmd/hcp-sidecar"},
		},
		Base:    true,
		Release: true,
	},
	{
		Repository: "ghcr.io/hcp-io/hcp-sample-callee",
		Tarball:    "hcp-sample-callee.tar",
		Entrypoint: []string{"/sample-callee"},
		User:       nonrootUser,
		Binaries:   []binary{{Path: "/sample-callee", Module: mainModule, Pkg: "./cmd/sample-callee"}},
		Base:       true,
		Release:    true,
	},
	{
		Repository: "ghcr.io/hcp-io/hcp-sample-caller",
		Tarball:    "hcp-sample-caller.tar",
		Entrypoint: []string{"/sample-caller", "serve"},
		User:       nonrootUser,
		Binaries:   []binary{{Path: "/sample-caller", Module: mainModule, Pkg: "./cmd/sample-caller"}},
		Base:       true,
		Release:    true,
	},
	{
		Repository: "localhost/hcp-local/pause",
		Tarball:    "pause.tar",
		Entrypoint: []string{"/pause"},
		User:       pauseUser,
		Binaries:   []binary{{Path: "/pause", Module: imagebuildModule, Pkg: "./cmd/pause"}},
		FixedTags:  []string{"1"},
	},
}

// tags returns the tags of s given the configured default tags.
func (s imageSpec) tags(defaults []string) []string {
	if len(s.FixedTags) > 0 {
		return s.FixedTags
	}
	return defaults
}

// refs returns the full references (repository:tag) of s.
func (s imageSpec) refs(defaults []string) []string {
	tags := s.tags(defaults)
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		out = append(out, s.Repository+":"+t)
	}
	return out
}
