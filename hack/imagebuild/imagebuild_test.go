package main

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var testCA = []byte("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")

// packSpec packs spec s with fake binaries (their path as content) for
// amd64 and arm64 into dir, as `all` does with real ones.
func packSpec(t *testing.T, s imageSpec, dir string, epoch time.Time) imageRecord {
	t.Helper()
	files := map[string]map[string]string{}
	for _, arch := range []string{"amd64", "arm64"} {
		files[arch] = map[string]string{}
		for _, b := range s.Binaries {
			local := filepath.Join(dir, arch+"-"+filepath.Base(b.Path))
			if err := os.WriteFile(local, []byte(arch+b.Path), 0o755); err != nil {
				t.Fatal(err)
			}
			files[arch][b.Path] = local
		}
	}
	var base []byte
	if s.Base {
		var err error
		if base, err = layerTar(baseEntries(testCA), epoch); err != nil {
			t.Fatal(err)
		}
	}
	rec, err := pack(s.refs([]string{"0.1.0", "latest"}), s.Entrypoint, s.Cmd, s.User, base, []string{"amd64", "arm64"}, files, filepath.Join(dir, s.Tarball), epoch)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

func fileSHA(t *testing.T, file string) [32]byte {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return sha256.Sum256(b)
}

// Same inputs, same bytes: two builds in different directories give the
// same archive and digests; another SOURCE_DATE_EPOCH gives another.
func TestReproducible(t *testing.T) {
	s := specs[0]
	a, b, c := t.TempDir(), t.TempDir(), t.TempDir()
	ra := packSpec(t, s, a, epochZero)
	rb := packSpec(t, s, b, epochZero)
	if ra.Digest != rb.Digest || fileSHA(t, ra.Tarball) != fileSHA(t, rb.Tarball) {
		t.Fatalf("two builds differ: %s vs %s", ra.Digest, rb.Digest)
	}
	for i := range ra.Platforms {
		if ra.Platforms[i].Digest != rb.Platforms[i].Digest {
			t.Fatalf("platform %s differs", ra.Platforms[i].Platform)
		}
	}
	rc := packSpec(t, s, c, time.Unix(1700000000, 0).UTC())
	if rc.Digest == ra.Digest {
		t.Fatal("SOURCE_DATE_EPOCH does not change the digest")
	}
}

// The archive is a valid OCI layout (go-containerregistry's validator reads
// every blob and checks digests, sizes and diff IDs), index.json names the
// index once per tag with the annotations containerd reads, and every
// entry of every layer carries the epoch and fixed owners, in sorted order.
func TestArchiveLayout(t *testing.T) {
	dir := t.TempDir()
	epoch := time.Unix(1234567890, 0).UTC()
	rec := packSpec(t, specs[0], dir, epoch)
	x := filepath.Join(dir, "x")
	if err := untar(rec.Tarball, x); err != nil {
		t.Fatal(err)
	}
	top, err := layout.ImageIndexFromPath(x)
	if err != nil {
		t.Fatal(err)
	}
	tm, err := top.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range tm.Manifests {
		if m.Digest.String() != rec.Digest {
			t.Errorf("index.json entry %s, want %s", m.Digest, rec.Digest)
		}
		names = append(names, m.Annotations[annotationContainerdName]+" "+m.Annotations[annotationOCIRefName])
	}
	want := []string{"ghcr.io/hcp-io/hcp-operator:0.1.0 0.1.0", "ghcr.io/hcp-io/hcp-operator:latest latest"}
	if !reflect.DeepEqual(names, want) {
		t.Errorf("index.json names %q, want %q", names, want)
	}
	idx, err := top.ImageIndex(tm.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Index(idx); err != nil {
		t.Fatalf("validate: %v", err)
	}
	im, _ := idx.IndexManifest()
	for i, m := range im.Manifests {
		if got := m.Platform.String(); got != rec.Platforms[i].Platform {
			t.Errorf("platform %d: %s, want %s", i, got, rec.Platforms[i].Platform)
		}
		img, _ := idx.Image(m.Digest)
		cf, _ := img.ConfigFile()
		if !cf.Created.Equal(epoch) || cf.History != nil || cf.Architecture != m.Platform.Architecture {
			t.Errorf("config: created %v history %v arch %s", cf.Created, cf.History, cf.Architecture)
		}
		raw, _ := img.RawConfigFile()
		var generic map[string]any
		_ = json.Unmarshal(raw, &generic)
		if _, ok := generic["history"]; ok {
			t.Error("config has a history")
		}
		layers, _ := img.Layers()
		for _, l := range layers {
			rc, _ := l.Uncompressed()
			var names []string
			tr := tar.NewReader(rc)
			for {
				h, err := tr.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				if !h.ModTime.Equal(epoch) || h.Uname != "" || h.Gname != "" {
					t.Errorf("%s: mtime %v owner %q/%q", h.Name, h.ModTime, h.Uname, h.Gname)
				}
				names = append(names, h.Name)
			}
			rc.Close()
			if !sort.StringsAreSorted(names) {
				t.Errorf("layer entries not sorted: %q", names)
			}
		}
	}
}

// describe of a built archive says what describe of the spec says, for
// every image: the check of the Dockerfiles relies on the spec form.
func TestDescribeArchiveMatchesSpec(t *testing.T) {
	for _, s := range specs {
		dir := t.TempDir()
		rec := packSpec(t, s, dir, epochZero)
		got, err := describeArchive(rec.Tarball)
		if err != nil {
			t.Fatal(err)
		}
		want, err := describeSpec(s, []string{"0.1.0", "latest"}, testCA)
		if err != nil {
			t.Fatal(err)
		}
		if got.Digest != rec.Digest || !reflect.DeepEqual(got.Platforms, []string{"linux/amd64", "linux/arm64"}) {
			t.Errorf("%s: digest %s platforms %v", s.Repository, got.Digest, got.Platforms)
		}
		got.Digest, got.Platforms = "", nil
		if !reflect.DeepEqual(got, want) {
			g, _ := json.MarshalIndent(got, "", " ")
			w, _ := json.MarshalIndent(want, "", " ")
			t.Errorf("%s: archive\n%s\nspec\n%s", s.Repository, g, w)
		}
	}
}

// The base layer holds distroless static:nonroot's users and directories.
func TestBaseLayer(t *testing.T) {
	d, err := describeSpec(specs[0], []string{"latest"}, testCA)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]fileDesc{}
	for _, f := range d.Layers[0].Files {
		got[f.Path] = f
	}
	for p, want := range map[string]fileDesc{
		"/tmp":                               {Path: "/tmp", Dir: true, Mode: "1777"},
		"/home/nonroot":                      {Path: "/home/nonroot", Dir: true, Mode: "0700", UID: 65532, GID: 65532},
		"/etc/passwd":                        {Path: "/etc/passwd", Mode: "0644"},
		"/etc/ssl/certs/ca-certificates.crt": {Path: "/etc/ssl/certs/ca-certificates.crt", Mode: "0644"},
	} {
		if got[p] != want {
			t.Errorf("%s: %+v, want %+v", p, got[p], want)
		}
	}
	if d.Layers[1].Files[0].Path != "/hcp-sidecar" || d.Layers[1].Files[1].Path != "/manager" {
		t.Errorf("app layer %+v", d.Layers[1].Files)
	}
}

func TestSplitWords(t *testing.T) {
	for in, want := range map[string][]string{
		`-trimpath -ldflags=-s\ -w`:   {"-trimpath", "-ldflags=-s -w"},
		`-trimpath -ldflags="-s -w"`:  {"-trimpath", "-ldflags=-s -w"},
		` -ldflags='-X a=b c'  -race`: {"-ldflags=-X a=b c", "-race"},
		``:                            nil,
	} {
		got, err := splitWords(in)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := splitWords(`-ldflags="-s`); err == nil {
		t.Error("unbalanced quote accepted")
	}
}

func TestSplitRef(t *testing.T) {
	for _, ok := range []string{"ghcr.io/a/b:1", "localhost/hcp-local/pause:1", "127.0.0.1:5000/x:latest"} {
		if _, _, err := splitRef(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"hcp-operator:1", "a/b:1", "ghcr.io/a/b", "ghcr.io/a/b@sha256:00", "127.0.0.1:5000/x"} {
		if _, _, err := splitRef(bad); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

// The index lists plain images: no artifactType on its entries.
func TestIndexEntriesAreImages(t *testing.T) {
	img, err := buildImage(platformImage{Arch: "amd64", App: mustTar(t), Entrypoint: []string{"/x"}}, epochZero)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := buildIndex([]v1.Image{img}, []string{"amd64"}).RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(raw, []byte("artifactType")) {
		t.Errorf("index: %s", raw)
	}
}

func mustTar(t *testing.T) []byte {
	t.Helper()
	b, err := layerTar([]entry{{Path: "/x", Mode: 0o755, Data: []byte("x")}}, epochZero)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
