package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// fakeBOM is the shape cyclonedx-gomod bin writes for one binary.
func fakeBOM(t *testing.T, bin string, deps ...string) map[string]any {
	t.Helper()
	main := "pkg:golang/github.com/hcp-io/hcp-operator@v0.1.0?type=module#cmd/" + bin
	var comps []any
	for _, d := range deps {
		comps = append(comps, map[string]any{"bom-ref": d, "type": "library", "name": d})
	}
	var dependsOn []any
	for _, d := range deps {
		dependsOn = append(dependsOn, d)
	}
	b, _ := json.Marshal(map[string]any{
		"$schema": "http://cyclonedx.org/schema/bom-1.6.schema.json", "bomFormat": "CycloneDX", "specVersion": "1.6", "version": 1,
		"metadata": map[string]any{
			"tools":      []any{map[string]any{"vendor": "CycloneDX", "name": "cyclonedx-gomod", "version": "v1.10.0"}},
			"component":  map[string]any{"bom-ref": main, "type": "application", "name": "github.com/hcp-io/hcp-operator"},
			"properties": []any{map[string]any{"name": "cdx:gomod:binary:name", "value": bin}},
		},
		"components":   comps,
		"dependencies": []any{map[string]any{"ref": main, "dependsOn": dependsOn}},
	})
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

// Two binaries sharing a module give one image BOM: the image as the
// subject, both binaries with their paths, each module once, and the
// image depending on its binaries.
func TestMergeBOMs(t *testing.T) {
	rec := imageRecord{Name: "ghcr.io/hcp-io/hcp-operator", Digest: "sha256:aa", Refs: []string{"ghcr.io/hcp-io/hcp-operator:0.1.0"}}
	pr := platformRecord{Platform: "linux/arm64", Digest: "sha256:bb"}
	boms := []map[string]any{fakeBOM(t, "hcp-sidecar", "pkg:golang/a@v1", "pkg:golang/b@v1"), fakeBOM(t, "manager", "pkg:golang/a@v1", "pkg:golang/c@v1")}
	out, err := mergeBOMs(rec, pr, []string{"/hcp-sidecar", "/manager"}, boms, epochZero)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(out)
	var got struct {
		SpecVersion string `json:"specVersion"`
		Metadata    struct {
			Timestamp string           `json:"timestamp"`
			Component cdxComponent     `json:"component"`
			Tools     []map[string]any `json:"tools"`
		} `json:"metadata"`
		Components   []cdxComponent `json:"components"`
		Dependencies []struct {
			Ref       string   `json:"ref"`
			DependsOn []string `json:"dependsOn"`
		} `json:"dependencies"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	c := got.Metadata.Component
	wantPurl := "pkg:oci/hcp-operator@sha256%3Abb?arch=arm64&repository_url=ghcr.io/hcp-io/hcp-operator"
	if c.Type != "container" || c.Purl != wantPurl || c.Version != "sha256:bb" || got.Metadata.Timestamp != "1970-01-01T00:00:00Z" || got.SpecVersion != "1.6" {
		t.Errorf("image component %+v, timestamp %s", c, got.Metadata.Timestamp)
	}
	if len(got.Metadata.Tools) != 2 {
		t.Errorf("tools %v", got.Metadata.Tools)
	}
	var refs []string
	for _, comp := range got.Components {
		refs = append(refs, comp.BOMRef)
	}
	if want := "pkg:golang/github.com/hcp-io/hcp-operator@v0.1.0?type=module#cmd/hcp-sidecar pkg:golang/a@v1 pkg:golang/b@v1 pkg:golang/github.com/hcp-io/hcp-operator@v0.1.0?type=module#cmd/manager pkg:golang/c@v1"; strings.Join(refs, " ") != want {
		t.Errorf("components %q", refs)
	}
	if p := got.Components[0].Properties; len(p) != 2 || p[1] != (cdxProperty{"hcp:image:path", "/hcp-sidecar"}) {
		t.Errorf("binary properties %v", p)
	}
	for _, d := range got.Dependencies {
		if d.Ref == wantPurl && len(d.DependsOn) != 2 {
			t.Errorf("image depends on %v", d.DependsOn)
		}
	}
	if _, err := mergeBOMs(rec, pr, []string{"/a", "/b"}, []map[string]any{boms[0], boms[0]}, epochZero); err == nil {
		t.Error("a repeated binary bom-ref was accepted")
	}
}
