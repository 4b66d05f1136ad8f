package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// Annotations containerd reads on the entries of an OCI layout's
// index.json: `ctr images import` names an image after the first, the
// full reference (images.AnnotationImageName), and falls back to the
// second, which the OCI spec defines as the tag alone and which skopeo's
// oci-archive:FILE:TAG selects by.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationOCIRefName     = "org.opencontainers.image.ref.name"
)

// The environment of every image: distroless's PATH, and the CA bundle of
// the base layer named for programs that do not look in Debian's path.
var imageEnv = []string{
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"SSL_CERT_FILE=" + caBundlePath,
}

// platformImage is what one platform's image is made of.
type platformImage struct {
	Arch       string
	Base       []byte // uncompressed base layer; nil for none
	App        []byte // uncompressed application layer
	Entrypoint []string
	Cmd        []string
	User       string
}

// layerFromTar turns an uncompressed tar into an OCI gzip layer. Go's gzip
// writes no name and no mtime in its header, so the compressed bytes (and
// the digest) depend only on the tar and the Go version.
func layerFromTar(b []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
}

// buildImage assembles one platform's image: OCI media types, the base and
// application layers, and a config whose only time is epoch. The config has
// no history: its entries would carry timestamps, and nothing needs them.
func buildImage(p platformImage, epoch time.Time) (v1.Image, error) {
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	var layers []v1.Layer
	for _, b := range [][]byte{p.Base, p.App} {
		if b == nil {
			continue
		}
		l, err := layerFromTar(b)
		if err != nil {
			return nil, err
		}
		layers = append(layers, l)
	}
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.Architecture = p.Arch
	cf.OS = linuxOS
	cf.Created = v1.Time{Time: epoch}
	cf.History = nil
	cf.Config = v1.Config{
		Entrypoint: p.Entrypoint,
		Cmd:        p.Cmd,
		User:       p.User,
		Env:        imageEnv,
		WorkingDir: "/",
	}
	return mutate.ConfigFile(img, cf)
}

// buildIndex puts the platforms' images into one OCI image index, in the
// order given (amd64 first, the platform a runtime picks when it may).
func buildIndex(imgs []v1.Image, archs []string) v1.ImageIndex {
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	adds := make([]mutate.IndexAddendum, 0, len(imgs))
	for i, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{
			Add: plainImage{img},
			Descriptor: v1.Descriptor{
				Platform: &v1.Platform{OS: linuxOS, Architecture: archs[i]},
			},
		})
	}
	return mutate.AppendManifests(idx, adds...)
}

// plainImage keeps go-containerregistry from copying the config's media
// type into the index entry's artifactType: OCI image-spec 1.1 has that
// field for artifacts, and a plain image index is what runtimes and
// registries expect of a container image.
type plainImage struct{ v1.Image }

func (plainImage) ArtifactType() (string, error) { return "", nil }

// splitRef splits repository:tag; a digest reference cannot name an import.
func splitRef(ref string) (repo, tag string, err error) {
	if strings.Contains(ref, "@") {
		return "", "", fmt.Errorf("image name %q: want repository:tag, not a digest", ref)
	}
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return "", "", fmt.Errorf("image name %q has no tag", ref)
	}
	host, _, _ := strings.Cut(ref, "/")
	isHost := strings.ContainsAny(host, ".:") || host == "localhost"
	if !strings.Contains(ref[:i], "/") || !isHost {
		// The CRI normalises "foo/bar" to docker.io/foo/bar; an import
		// under the short name would never be found by a pod.
		return "", "", fmt.Errorf("image name %q: give the full name with its registry host (e.g. ghcr.io/...)", ref)
	}
	return ref[:i], ref[i+1:], nil
}

// writeArchive writes idx as an OCI image-layout tar: oci-layout,
// index.json with one entry per reference (all pointing at idx), and the
// blobs. Entries are sorted, with fixed owners and mtime epoch, so the
// same index gives the same archive.
func writeArchive(file string, idx v1.ImageIndex, refs []string, epoch time.Time) error {
	blobs := map[string]func() ([]byte, error){}
	addRaw := func(h v1.Hash, b []byte) { blobs[h.Hex] = func() ([]byte, error) { return b, nil } }

	raw, err := idx.RawManifest()
	if err != nil {
		return err
	}
	idxDigest, err := idx.Digest()
	if err != nil {
		return err
	}
	addRaw(idxDigest, raw)
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	for _, d := range im.Manifests {
		img, err := idx.Image(d.Digest)
		if err != nil {
			return err
		}
		if err := addImageBlobs(img, blobs); err != nil {
			return err
		}
	}

	top := v1.IndexManifest{SchemaVersion: 2, MediaType: types.OCIImageIndex}
	for _, ref := range refs {
		_, tag, err := splitRef(ref)
		if err != nil {
			return err
		}
		top.Manifests = append(top.Manifests, v1.Descriptor{
			MediaType:   types.OCIImageIndex,
			Size:        int64(len(raw)),
			Digest:      idxDigest,
			Annotations: map[string]string{annotationContainerdName: ref, annotationOCIRefName: tag},
		})
	}
	indexJSON, err := json.Marshal(top)
	if err != nil {
		return err
	}

	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	tmp := file + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp) }() // gone already after the rename
	tw := tar.NewWriter(f)
	put := func(name string, dir bool, b []byte) error {
		h := &tar.Header{Name: name, Mode: 0o644, ModTime: epoch, Format: tar.FormatUSTAR, Typeflag: tar.TypeReg, Size: int64(len(b))}
		if dir {
			h.Mode, h.Typeflag, h.Size = 0o755, tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		_, err := tw.Write(b)
		return err
	}
	if err := put("blobs/", true, nil); err != nil {
		return err
	}
	if err := put("blobs/sha256/", true, nil); err != nil {
		return err
	}
	hexes := make([]string, 0, len(blobs))
	for h := range blobs {
		hexes = append(hexes, h)
	}
	sort.Strings(hexes)
	for _, h := range hexes {
		b, err := blobs[h]()
		if err != nil {
			return err
		}
		if err := put("blobs/sha256/"+h, false, b); err != nil {
			return err
		}
	}
	if err := put("index.json", false, indexJSON); err != nil {
		return err
	}
	if err := put("oci-layout", false, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, file)
}

// addImageBlobs records an image's manifest, config and compressed layers;
// layers the platforms share (the base) are stored once.
func addImageBlobs(img v1.Image, blobs map[string]func() ([]byte, error)) error {
	m, err := img.RawManifest()
	if err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	blobs[d.Hex] = func() ([]byte, error) { return m, nil }
	c, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	cn, err := img.ConfigName()
	if err != nil {
		return err
	}
	blobs[cn.Hex] = func() ([]byte, error) { return c, nil }
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	for _, l := range layers {
		ld, err := l.Digest()
		if err != nil {
			return err
		}
		blobs[ld.Hex] = func() ([]byte, error) {
			rc, err := l.Compressed()
			if err != nil {
				return nil, err
			}
			defer func() { _ = rc.Close() }() // an in-memory stream
			return io.ReadAll(rc)
		}
	}
	return nil
}
