// Command imagebuild builds the project's container images with no daemon
// and no registry: static Go binaries plus a distroless-like base layer,
// written as OCI image-layout tar archives that `ctr images import`,
// `skopeo copy oci-archive:...` and any OCI tool accept. The images are
// reproducible: the same sources, toolchain and SOURCE_DATE_EPOCH give
// the same digests.
//
//	imagebuild all [-repo DIR] [-out DIR] [-tags T,...] [-platforms linux/amd64,...]
//	imagebuild image -name REF [-name REF] -entrypoint WORD... -file /PATH=LOCAL... -out FILE.tar
//	imagebuild describe [-text] [FILE.tar...]
//	imagebuild digest [-manifest FILE] REPOSITORY
//	imagebuild list [-manifest FILE] [-release]
//	imagebuild sbom -cyclonedx BIN -out DIR [-manifest FILE] [-version V]
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// manifestFile is bin/images/images.json: what `all` built, for scripts
// (release, the test node) to find tarballs and digests without parsing
// the archives. Paths are relative to the directory of images.json, so the
// file stays valid wherever the tree is and whatever the reader's cwd.
type manifestFile struct {
	SourceDateEpoch int64         `json:"sourceDateEpoch"`
	Images          []imageRecord `json:"images"`
}

type imageRecord struct {
	Name       string           `json:"name"`
	Tags       []string         `json:"tags"`
	Refs       []string         `json:"refs"`
	Tarball    string           `json:"tarball"`
	Digest     string           `json:"digest"` // of the image index
	Release    bool             `json:"release"`
	Entrypoint []string         `json:"entrypoint"`
	Platforms  []platformRecord `json:"platforms"`
}

type platformRecord struct {
	Platform string            `json:"platform"`
	Digest   string            `json:"digest"` // of the platform's manifest
	Files    map[string]string `json:"files"`  // image path -> the binary packed there
}

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "all":
		err = cmdAll(os.Args[2:])
	case "image":
		err = cmdImage(os.Args[2:])
	case "describe":
		err = cmdDescribe(os.Args[2:])
	case "digest":
		err = cmdDigest(os.Args[2:])
	case "list":
		err = cmdList(os.Args[2:])
	case "sbom":
		err = cmdSBOM(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "imagebuild:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: imagebuild all|image|describe|digest|list|sbom [flags] (imagebuild CMD -h for the flags)")
	os.Exit(2)
}

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, " ") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// pack builds, per arch, the image of the given layers and config, puts
// them in one index and writes the archive. files[arch] maps image paths
// to local files.
func pack(refs []string, entrypoint, cmd []string, user string, base []byte, archs []string,
	files map[string]map[string]string, out string, epoch time.Time) (imageRecord, error) {
	var rec imageRecord
	var imgs []v1.Image
	for _, arch := range archs {
		var app []entry
		for p, local := range files[arch] {
			b, err := os.ReadFile(local)
			if err != nil {
				return rec, err
			}
			// Binaries are root-owned and world-executable, as Docker's
			// COPY leaves a 0755 file, so any USER may run them.
			app = append(app, entry{Path: p, Mode: 0o755, Data: b})
		}
		appTar, err := layerTar(app, epoch)
		if err != nil {
			return rec, err
		}
		img, err := buildImage(platformImage{Arch: arch, Base: base, App: appTar, Entrypoint: entrypoint, Cmd: cmd, User: user}, epoch)
		if err != nil {
			return rec, err
		}
		d, err := img.Digest()
		if err != nil {
			return rec, err
		}
		imgs = append(imgs, img)
		rec.Platforms = append(rec.Platforms, platformRecord{Platform: linuxOS + "/" + arch, Digest: d.String(), Files: files[arch]})
	}
	idx := buildIndex(imgs, archs)
	if err := writeArchive(out, idx, refs, epoch); err != nil {
		return rec, err
	}
	d, err := idx.Digest()
	if err != nil {
		return rec, err
	}
	rec.Digest, rec.Refs, rec.Tarball, rec.Entrypoint = d.String(), refs, out, entrypoint
	for _, r := range refs {
		repo, tag, _ := splitRef(r)
		if rec.Name == "" {
			rec.Name = repo
		}
		rec.Tags = append(rec.Tags, tag)
	}
	return rec, nil
}

// cmdAll builds every image of specs from the repository's sources.
func cmdAll(args []string) error {
	fs := flag.NewFlagSet("all", flag.ExitOnError)
	repo := fs.String("repo", ".", "repository root")
	out := fs.String("out", "bin/images", "output directory, relative to -repo unless absolute")
	tags := fs.String("tags", "", "tags of the project's images, comma-separated (default: the chart's appVersion and latest)")
	platforms := fs.String("platforms", "linux/amd64,linux/arm64", "platforms of every image")
	goFlags := fs.String("go-build-flags", defaultGoBuildFlags, "the Makefile's GO_BUILD_FLAGS, shell-quoted")
	caBundle := fs.String("ca-bundle", caBundlePath, "host CA bundle copied into the base layer")
	_ = fs.Parse(args)

	root, err := filepath.Abs(*repo)
	if err != nil {
		return err
	}
	outDir := *out
	if !filepath.IsAbs(outDir) {
		outDir = filepath.Join(root, outDir)
	}
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	archs, err := parsePlatforms(*platforms)
	if err != nil {
		return err
	}
	flags, err := splitWords(*goFlags)
	if err != nil {
		return err
	}
	defTags := parseTags(*tags)
	if len(defTags) == 0 {
		v, err := chartAppVersion(root)
		if err != nil {
			return err
		}
		defTags = []string{v, latestTag}
	}
	ca, err := readCABundle(*caBundle)
	if err != nil {
		return err
	}
	base, err := layerTar(baseEntries(ca), epoch)
	if err != nil {
		return err
	}

	rel := func(p string) string {
		if r, err := filepath.Rel(outDir, p); err == nil {
			return filepath.ToSlash(r)
		}
		return p
	}
	mf := manifestFile{SourceDateEpoch: epoch.Unix()}
	for _, s := range specs {
		files := map[string]map[string]string{}
		for _, arch := range archs {
			files[arch] = map[string]string{}
			for _, b := range s.Binaries {
				local := filepath.Join(outDir, "bin", "linux-"+arch, filepath.Base(b.Path))
				if err := goBuild(root, b.Module, b.Pkg, arch, local, flags); err != nil {
					return err
				}
				files[arch][b.Path] = local
			}
		}
		var sbase []byte
		if s.Base {
			sbase = base
		}
		rec, err := pack(s.refs(defTags), s.Entrypoint, s.Cmd, s.User, sbase, archs, files, filepath.Join(outDir, s.Tarball), epoch)
		if err != nil {
			return fmt.Errorf("%s: %w", s.Repository, err)
		}
		rec.Tarball, rec.Release = rel(rec.Tarball), s.Release
		for _, pr := range rec.Platforms {
			for p, local := range pr.Files {
				pr.Files[p] = rel(local)
			}
		}
		fmt.Fprintf(os.Stderr, "imagebuild: %s %s %s\n", rec.Tarball, rec.Digest, strings.Join(rec.Refs, " "))
		mf.Images = append(mf.Images, rec)
	}
	b, err := json.MarshalIndent(mf, "", "  ")
	if err != nil {
		return err
	}
	// Written aside and renamed: the local stack may be reading the last one.
	file := filepath.Join(outDir, "images.json")
	if err := os.WriteFile(file+".tmp", append(b, '\n'), 0o644); err != nil {
		return err
	}
	return os.Rename(file+".tmp", file)
}

// cmdImage builds one image from given local files, for one arch: the
// upgrade test packs an older checkout's binaries this way.
func cmdImage(args []string) error {
	fs := flag.NewFlagSet("image", flag.ExitOnError)
	var names, entrypoint, cmd, files listFlag
	fs.Var(&names, "name", "full image reference repository:tag (repeatable)")
	fs.Var(&entrypoint, "entrypoint", "one word of the exec-form entrypoint (repeatable, in order)")
	fs.Var(&cmd, "cmd", "one word of the exec-form cmd (repeatable, in order)")
	fs.Var(&files, "file", "/IMAGE/PATH=LOCAL_FILE, packed 0755 root:root (repeatable)")
	user := fs.String("user", nonrootUser, "user:group the image runs as")
	arch := fs.String("arch", "", "GOARCH of the image (default: read from the files' ELF headers)")
	base := fs.Bool("base", true, "include the distroless-like base layer")
	caBundle := fs.String("ca-bundle", caBundlePath, "host CA bundle copied into the base layer")
	out := fs.String("out", "", "output archive (.tar)")
	_ = fs.Parse(args)
	if len(names) == 0 || len(entrypoint) == 0 || len(files) == 0 || *out == "" {
		return fmt.Errorf("image: -name, -entrypoint, -file and -out are required")
	}
	for _, n := range names {
		if _, _, err := splitRef(n); err != nil {
			return err
		}
	}
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	m := map[string]string{}
	for _, f := range files {
		p, local, ok := strings.Cut(f, "=")
		if !ok || !strings.HasPrefix(p, "/") || local == "" {
			return fmt.Errorf("-file %q: want /IMAGE/PATH=LOCAL_FILE", f)
		}
		m[p] = local
	}
	a := *arch
	if a == "" {
		if a, err = elfArch(m); err != nil {
			return err
		}
	}
	var b []byte
	if *base {
		ca, err := readCABundle(*caBundle)
		if err != nil {
			return err
		}
		if b, err = layerTar(baseEntries(ca), epoch); err != nil {
			return err
		}
	}
	rec, err := pack(names, entrypoint, cmd, *user, b, []string{a}, map[string]map[string]string{a: m}, *out, epoch)
	if err != nil {
		return err
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(rec)
}

// cmdDigest prints the index digest of one image of images.json: what the
// release pins the chart to.
func cmdDigest(args []string) error {
	fs := flag.NewFlagSet("digest", flag.ExitOnError)
	manifest := fs.String("manifest", "bin/images/images.json", "images.json written by `imagebuild all`")
	_ = fs.Parse(args)
	if fs.NArg() != 1 {
		return fmt.Errorf("digest: want one repository, e.g. ghcr.io/hcp-io/hcp-operator")
	}
	mf, err := readManifest(*manifest)
	if err != nil {
		return err
	}
	for _, im := range mf.Images {
		if im.Name == fs.Arg(0) {
			fmt.Println(im.Digest)
			return nil
		}
	}
	return fmt.Errorf("%s is not in %s", fs.Arg(0), *manifest)
}

// cmdList prints one line per image of images.json, "NAME INDEX-DIGEST
// TARBALL", the tarball's path joined to the manifest's directory, for
// shell scripts (the release copies the release images).
func cmdList(args []string) error {
	fs := flag.NewFlagSet("list", flag.ExitOnError)
	manifest := fs.String("manifest", "bin/images/images.json", "images.json written by `imagebuild all`")
	release := fs.Bool("release", false, "only the images a release publishes")
	_ = fs.Parse(args)
	mf, err := readManifest(*manifest)
	if err != nil {
		return err
	}
	for _, im := range mf.Images {
		if im.Release || !*release {
			fmt.Println(im.Name, im.Digest, filepath.Join(filepath.Dir(*manifest), im.Tarball))
		}
	}
	return nil
}

func readManifest(file string) (*manifestFile, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%w (run make images first)", err)
	}
	var mf manifestFile
	if err := json.Unmarshal(b, &mf); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &mf, nil
}
