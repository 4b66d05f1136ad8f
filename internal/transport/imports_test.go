package transport_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestNoApplicationImports keeps the transport a library: neither it, nor
// its helpers, nor their tests depend, even indirectly, on the sidecar,
// the operator or the CLI (the sidecar passes its metrics in through
// Options.Metrics instead).
func TestNoApplicationImports(t *testing.T) {
	const module = "github.com/hcp-io/hcp-operator/"
	forbidden := []string{module + "internal/sidecar", module + "internal/controller", module + "cmd", module + "internal/kubectlhcp"}
	// -deps lists every package in the import graph once, with its direct
	// imports, so a finding names the package that brings it in.
	out, err := exec.Command("go", "list", "-deps", "-test", "-f", `{{.ImportPath}}|{{join .Imports " "}}`, "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	listed := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
		pkg, imports, ok := strings.Cut(line, "|")
		if !ok {
			continue
		}
		listed++
		for imp := range strings.FieldsSeq(imports) {
			for _, bad := range forbidden {
				if imp == bad || strings.HasPrefix(imp, bad+"/") {
					t.Errorf("%s imports %s: internal/transport must not depend on the application", pkg, imp)
				}
			}
		}
	}
	if listed < 10 { // the standard library alone is more: the listing worked
		t.Fatalf("go list listed %d packages:\n%s", listed, out)
	}
}
