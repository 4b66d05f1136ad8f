package main

import (
	"archive/tar"
	"bytes"
	"debug/elf"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// description is what `describe` prints of one image: its run-time config
// and the files of each layer. The last layer holds the binaries (role
// "app"), any before it are the base: imagebuild builds them in that order.
type description struct {
	Name       string      `json:"name"`
	Refs       []string    `json:"refs"`
	Digest     string      `json:"digest,omitempty"`    // archives only
	Platforms  []string    `json:"platforms,omitempty"` // archives only
	Entrypoint []string    `json:"entrypoint"`
	Cmd        []string    `json:"cmd"`
	User       string      `json:"user"`
	Env        []string    `json:"env"`
	WorkingDir string      `json:"workingDir"`
	Layers     []layerDesc `json:"layers"`
}

type layerDesc struct {
	Role  string     `json:"role"`
	Files []fileDesc `json:"files"`
}

type fileDesc struct {
	Path string `json:"path"`
	Dir  bool   `json:"dir,omitempty"`
	Mode string `json:"mode"`
	UID  int    `json:"uid"`
	GID  int    `json:"gid"`
}

// cmdDescribe describes the built archives given, or, with none, the
// images imagebuild would build (from its specs, without building), which
// is what hack/check-dockerfile.sh compares the Dockerfiles with.
func cmdDescribe(args []string) error {
	fs := flag.NewFlagSet("describe", flag.ExitOnError)
	text := fs.Bool("text", false, "one fact a line (NAME KEY VALUE) instead of JSON, for shell scripts")
	repo := fs.String("repo", ".", "repository root (for the default tags)")
	caBundle := fs.String("ca-bundle", caBundlePath, "host CA bundle (the base layer's contents)")
	_ = fs.Parse(args)

	var ds []description
	if fs.NArg() == 0 {
		tags := []string{latestTag}
		if v, err := chartAppVersion(*repo); err == nil {
			tags = []string{v, latestTag}
		}
		ca, err := readCABundle(*caBundle)
		if err != nil {
			return err
		}
		for _, s := range specs {
			d, err := describeSpec(s, tags, ca)
			if err != nil {
				return err
			}
			ds = append(ds, d)
		}
	}
	for _, file := range fs.Args() {
		d, err := describeArchive(file)
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		ds = append(ds, d)
	}
	if !*text {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(ds)
	}
	for _, d := range ds {
		// Exec-form arrays as compact JSON, an absent one as [].
		ep, _ := json.Marshal(append([]string{}, d.Entrypoint...))
		cmd, _ := json.Marshal(append([]string{}, d.Cmd...))
		for _, r := range d.Refs {
			fmt.Printf("%s ref %s\n", d.Name, r)
		}
		fmt.Printf("%s entrypoint %s\n%s cmd %s\n%s user %s\n%s workdir %s\n", d.Name, ep, d.Name, cmd, d.Name, d.User, d.Name, d.WorkingDir)
		for _, l := range d.Layers {
			for _, f := range l.Files {
				p := f.Path
				if f.Dir {
					p += "/"
				}
				fmt.Printf("%s %s %s %s %d:%d\n", d.Name, l.Role, p, f.Mode, f.UID, f.GID)
			}
		}
	}
	return nil
}

// describeSpec describes a spec's image by building its layers' tar
// listings (binaries empty) and reading them back with the code that reads
// archives, so both kinds of description say the same of the same image.
func describeSpec(s imageSpec, tags []string, ca []byte) (description, error) {
	d := description{Name: s.Repository, Refs: s.refs(tags), Entrypoint: s.Entrypoint, Cmd: s.Cmd, User: s.User, Env: imageEnv, WorkingDir: "/"}
	app := make([]entry, 0, len(s.Binaries))
	for _, b := range s.Binaries {
		app = append(app, entry{Path: b.Path, Mode: 0o755})
	}
	var layers [][]entry
	if s.Base {
		layers = append(layers, baseEntries(ca))
	}
	layers = append(layers, app)
	for i, es := range layers {
		b, err := layerTar(es, epochZero)
		if err != nil {
			return d, err
		}
		files, err := listTar(bytes.NewReader(b))
		if err != nil {
			return d, err
		}
		d.Layers = append(d.Layers, layerDesc{Role: role(i, len(layers)), Files: files})
	}
	return d, nil
}

func role(i, n int) string {
	if i == n-1 {
		return "app"
	}
	return "base"
}

// describeArchive reads an OCI layout archive with go-containerregistry's
// layout reader (an independent check that the archive is a valid layout)
// and describes the image index its index.json names.
func describeArchive(file string) (description, error) {
	var d description
	dir, err := os.MkdirTemp("", "imagebuild-describe-")
	if err != nil {
		return d, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if err := untar(file, dir); err != nil {
		return d, err
	}
	top, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return d, err
	}
	tm, err := top.IndexManifest()
	if err != nil {
		return d, err
	}
	var idxDigest v1.Hash
	for _, m := range tm.Manifests {
		if idxDigest.Hex != "" && m.Digest != idxDigest {
			return d, errors.New("index.json names more than one image index")
		}
		idxDigest = m.Digest
		d.Refs = append(d.Refs, m.Annotations[annotationContainerdName])
	}
	if len(d.Refs) == 0 {
		return d, errors.New("index.json is empty")
	}
	if d.Name, _, err = splitRef(d.Refs[0]); err != nil {
		return d, err
	}
	d.Digest = idxDigest.String()
	idx, err := top.ImageIndex(idxDigest)
	if err != nil {
		return d, err
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return d, err
	}
	var first *description
	for _, m := range im.Manifests {
		img, err := idx.Image(m.Digest)
		if err != nil {
			return d, err
		}
		pd, err := describeImage(img)
		if err != nil {
			return d, err
		}
		if first == nil {
			first = &pd
		} else if !reflect.DeepEqual(*first, pd) {
			return d, fmt.Errorf("platform %s differs from %s in its config or files", m.Platform, d.Platforms[0])
		}
		d.Platforms = append(d.Platforms, m.Platform.String())
	}
	if first == nil {
		return d, errors.New("the image index holds no image")
	}
	d.Entrypoint, d.Cmd, d.User, d.Env, d.WorkingDir, d.Layers = first.Entrypoint, first.Cmd, first.User, first.Env, first.WorkingDir, first.Layers
	return d, nil
}

// describeImage reads one platform's config and layer listings.
func describeImage(img v1.Image) (description, error) {
	var d description
	cf, err := img.ConfigFile()
	if err != nil {
		return d, err
	}
	c := cf.Config
	d.Entrypoint, d.Cmd, d.User, d.Env, d.WorkingDir = c.Entrypoint, c.Cmd, c.User, c.Env, c.WorkingDir
	layers, err := img.Layers()
	if err != nil {
		return d, err
	}
	for i, l := range layers {
		rc, err := l.Uncompressed()
		if err != nil {
			return d, err
		}
		files, err := listTar(rc)
		_ = rc.Close() // a read-only stream: its data has been checked by now
		if err != nil {
			return d, err
		}
		d.Layers = append(d.Layers, layerDesc{Role: role(i, len(layers)), Files: files})
	}
	return d, nil
}

// listTar lists a layer's entries in their order.
func listTar(r io.Reader) ([]fileDesc, error) {
	var out []fileDesc
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, fileDesc{
			Path: "/" + strings.TrimSuffix(h.Name, "/"),
			Dir:  h.Typeflag == tar.TypeDir,
			Mode: fmt.Sprintf("%04o", h.Mode),
			UID:  h.Uid,
			GID:  h.Gid,
		})
	}
}

// untar extracts an archive's regular files and directories into dir,
// refusing names that would leave it.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }() // opened for reading only
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, dir+string(filepath.Separator)) {
			return fmt.Errorf("entry %q leaves the archive", h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			w, err := os.Create(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(w, tr)
			if cerr := w.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		default:
			return fmt.Errorf("entry %q: unexpected type %c in an OCI layout", h.Name, h.Typeflag)
		}
	}
}

// elfArch reads the GOARCH of the files' ELF headers; non-ELF files (data)
// are skipped, and binaries of two architectures are an error.
func elfArch(files map[string]string) (string, error) {
	names := map[elf.Machine]string{elf.EM_X86_64: "amd64", elf.EM_AARCH64: "arm64", elf.EM_PPC64: "ppc64le", elf.EM_S390: "s390x", elf.EM_RISCV: "riscv64"}
	arch := ""
	for p, local := range files {
		f, err := elf.Open(local)
		if err != nil {
			continue
		}
		a, ok := names[f.Machine]
		_ = f.Close()
		if !ok {
			return "", fmt.Errorf("%s: ELF machine %s: pass -arch", local, f.Machine)
		}
		if arch != "" && a != arch {
			return "", fmt.Errorf("%s is %s, another file is %s", p, a, arch)
		}
		arch = a
	}
	if arch == "" {
		return "", errors.New("no ELF binary among the files: pass -arch")
	}
	return arch, nil
}
