package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// cmdSBOM writes one CycloneDX SBOM per release image and platform. The
// analysis is cyclonedx-gomod's (`bin` mode: the module list Go embeds in
// every binary, so the SBOM describes exactly what was linked); this only
// joins the BOMs of an image's binaries under one component for the image
// itself (type container, its manifest digest), which is what
// `cosign attest` binds the SBOM to. Per platform, because the binaries,
// their hashes and the manifest digest differ per architecture.
func cmdSBOM(args []string) error {
	fs := flag.NewFlagSet("sbom", flag.ExitOnError)
	manifest := fs.String("manifest", "bin/images/images.json", "images.json written by `imagebuild all`")
	tool := fs.String("cyclonedx", "", "the cyclonedx-gomod binary")
	out := fs.String("out", "", "directory for NAME.linux-ARCH.cdx.json")
	version := fs.String("version", "", "version of the main module (default: the image's first tag)")
	_ = fs.Parse(args)
	if *tool == "" || *out == "" {
		return fmt.Errorf("sbom: -cyclonedx and -out are required")
	}
	mf, err := readManifest(*manifest)
	if err != nil {
		return err
	}
	epoch, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, rec := range mf.Images {
		if !rec.Release {
			continue
		}
		v := *version
		if v == "" && len(rec.Tags) > 0 {
			v = rec.Tags[0]
		}
		if !strings.HasPrefix(v, "v") {
			v = "v" + v
		}
		for _, pr := range rec.Platforms {
			paths := make([]string, 0, len(pr.Files))
			for p := range pr.Files {
				paths = append(paths, p)
			}
			sort.Strings(paths)
			var boms []map[string]any
			for _, p := range paths {
				b, err := runCycloneDX(*tool, v, filepath.Join(filepath.Dir(*manifest), pr.Files[p]))
				if err != nil {
					return fmt.Errorf("%s %s: %w", rec.Name, p, err)
				}
				boms = append(boms, b)
			}
			merged, err := mergeBOMs(rec, pr, paths, boms, epoch)
			if err != nil {
				return fmt.Errorf("%s %s: %w", rec.Name, pr.Platform, err)
			}
			b, err := json.MarshalIndent(merged, "", "  ")
			if err != nil {
				return err
			}
			name := strings.TrimSuffix(filepath.Base(rec.Tarball), ".tar") + "." + strings.ReplaceAll(pr.Platform, "/", "-") + ".cdx.json"
			file := filepath.Join(*out, name)
			if err := os.WriteFile(file, append(b, '\n'), 0o644); err != nil {
				return err
			}
			fmt.Println(file)
		}
	}
	return nil
}

// runCycloneDX runs cyclonedx-gomod bin on one binary, without serial
// number and timestamp so that the same binary gives the same BOM.
func runCycloneDX(tool, version, binary string) (map[string]any, error) {
	cmd := exec.Command(tool, "bin", "-json", "-noserial", "-notimestamp", "-version", version, binary)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	var bom map[string]any
	if err := json.Unmarshal(stdout.Bytes(), &bom); err != nil {
		return nil, fmt.Errorf("cyclonedx-gomod output: %w", err)
	}
	return bom, nil
}

// mergeBOMs joins per-binary BOMs into the image's: metadata.component is
// the image; each binary's own component (with its build properties and
// its path in the image) and the union of their modules are components;
// the dependency graph is the union of theirs plus image -> binaries.
func mergeBOMs(rec imageRecord, pr platformRecord, paths []string, boms []map[string]any, epoch time.Time) (map[string]any, error) {
	if len(boms) == 0 {
		return nil, fmt.Errorf("no binaries")
	}
	_, arch, _ := strings.Cut(pr.Platform, "/")
	hex := strings.TrimPrefix(pr.Digest, "sha256:")
	// purl-spec's oci type: the name is the repository's last element, the
	// version the manifest digest, the registry in repository_url.
	purl := fmt.Sprintf("pkg:oci/%s@sha256%%3A%s?arch=%s&repository_url=%s", path.Base(rec.Name), hex, arch, rec.Name)
	image := cdxComponent{
		BOMRef: purl, Type: "container", Name: rec.Name, Version: pr.Digest, Purl: purl,
		Hashes:     []cdxHash{{Alg: "SHA-256", Content: hex}},
		Properties: []cdxProperty{{"hcp:image:index-digest", rec.Digest}},
	}
	for _, r := range rec.Refs {
		image.Properties = append(image.Properties, cdxProperty{"hcp:image:ref", r})
	}

	var components []any
	seen := map[string]bool{}
	deps := map[string]map[string]bool{purl: {}}
	for i, bom := range boms {
		meta, _ := bom["metadata"].(map[string]any)
		bin, _ := meta["component"].(map[string]any)
		ref, _ := bin["bom-ref"].(string)
		if ref == "" || seen[ref] {
			return nil, fmt.Errorf("binary %s: missing or repeated bom-ref %q", paths[i], ref)
		}
		seen[ref] = true
		bprops, _ := meta["properties"].([]any)
		bin["properties"] = append(bprops, cdxProperty{"hcp:image:path", paths[i]})
		components = append(components, bin)
		deps[purl][ref] = true
		cs, _ := bom["components"].([]any)
		for _, c := range cs {
			cm, _ := c.(map[string]any)
			r, _ := cm["bom-ref"].(string)
			if r != "" && !seen[r] {
				seen[r] = true
				components = append(components, c)
			}
		}
		ds, _ := bom["dependencies"].([]any)
		for _, d := range ds {
			dm, _ := d.(map[string]any)
			r, _ := dm["ref"].(string)
			if deps[r] == nil {
				deps[r] = map[string]bool{}
			}
			on, _ := dm["dependsOn"].([]any)
			for _, o := range on {
				if s, ok := o.(string); ok {
					deps[r][s] = true
				}
			}
		}
	}
	var dependencies []any
	for _, r := range sortedKeys(deps) {
		d := map[string]any{"ref": r}
		if on := sortedKeys(deps[r]); len(on) > 0 {
			d["dependsOn"] = on
		}
		dependencies = append(dependencies, d)
	}

	first := boms[0]
	meta, _ := first["metadata"].(map[string]any)
	tools := meta["tools"]
	switch t := tools.(type) {
	case []any: // the pre-1.5 form cyclonedx-gomod writes
		tools = append(t, cdxTool{Vendor: "hcp-io", Name: "imagebuild"})
	case map[string]any:
		cs, _ := t["components"].([]any)
		t["components"] = append(cs, cdxComponent{Type: "application", Group: "hcp-io", Name: "imagebuild"})
	}
	return map[string]any{
		"$schema":     first["$schema"],
		"bomFormat":   "CycloneDX",
		"specVersion": first["specVersion"],
		"version":     1,
		"metadata": map[string]any{
			"timestamp": epoch.Format(time.RFC3339),
			"tools":     tools,
			"component": image,
		},
		"components":   components,
		"dependencies": dependencies,
	}, nil
}

// The CycloneDX objects written here; what cyclonedx-gomod wrote passes
// through as parsed, untouched.
type cdxComponent struct {
	BOMRef     string        `json:"bom-ref,omitempty"`
	Type       string        `json:"type"`
	Group      string        `json:"group,omitempty"`
	Name       string        `json:"name"`
	Version    string        `json:"version,omitempty"`
	Purl       string        `json:"purl,omitempty"`
	Hashes     []cdxHash     `json:"hashes,omitempty"`
	Properties []cdxProperty `json:"properties,omitempty"`
}

type cdxHash struct {
	Alg     string `json:"alg"`
	Content string `json:"content"`
}

type cdxProperty struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

type cdxTool struct {
	Vendor string `json:"vendor"`
	Name   string `json:"name"`
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
