// Package valuesschema checks that the chart's values.schema.json describes
// every value of its values.yaml.
package valuesschema

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// chartDir is the chart, relative to this package.
const chartDir = "../../../charts/hcp-operator"

// TestValuesSchemaComplete: every value in values.yaml has an entry in
// values.schema.json with a type and a description, down to the values the
// schema describes property by property (free-form objects such as
// resources end the walk: their keys are Kubernetes' own).
func TestValuesSchemaComplete(t *testing.T) {
	values, schema := loadChartValues(t)
	if problems := schemaProblems(values, schema); len(problems) > 0 {
		t.Errorf("charts/hcp-operator/values.schema.json does not describe every value of values.yaml:\n  %s", strings.Join(problems, "\n  "))
	}
}

// TestSchemaProblemsFindsGaps: the check itself notices a value without an
// entry, one without a type, one without a description, at any depth.
func TestSchemaProblemsFindsGaps(t *testing.T) {
	values := map[string]any{
		"ok":      1,
		"missing": true,
		"untyped": "x",
		"group":   map[string]any{"inner": "x", "free": map[string]any{"k": "v"}},
		"either":  "info",
	}
	schema := map[string]any{"properties": map[string]any{
		"ok":      map[string]any{"type": "integer", "description": "fine"},
		"untyped": map[string]any{"description": "no type"},
		"group": map[string]any{"type": "object", "description": "a group", "properties": map[string]any{
			"inner": map[string]any{"type": "string"},
			"free":  map[string]any{"type": "object", "description": "free-form"},
		}},
		"either": map[string]any{"description": "one of", "anyOf": []any{map[string]any{"type": "string"}, map[string]any{"enum": []any{"a"}}}},
	}}
	got := schemaProblems(values, schema)
	want := []string{
		"either: no type",
		"group.inner: no description",
		"missing: no entry",
		"untyped: no type",
	}
	if !slices.Equal(got, want) {
		t.Errorf("schemaProblems = %q, want %q", got, want)
	}
}

func loadChartValues(t *testing.T) (values, schema map[string]any) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(chartDir, "values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatalf("values.yaml: %v", err)
	}
	data, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(data, &schema); err != nil {
		t.Fatalf("values.schema.json: %v", err)
	}
	return values, schema
}

// schemaProblems lists, sorted, each value of values whose schema entry
// (under schema's properties) is missing, has no type (a bare type, or one
// in every anyOf/oneOf branch) or no description.
func schemaProblems(values, schema map[string]any) []string {
	var problems []string
	var walk func(prefix string, values, schema map[string]any)
	walk = func(prefix string, values, schema map[string]any) {
		props, _ := schema["properties"].(map[string]any)
		for key, value := range values {
			path := prefix + key
			entry, ok := props[key].(map[string]any)
			if !ok {
				problems = append(problems, path+": no entry")
				continue
			}
			if !typed(entry) {
				problems = append(problems, path+": no type")
			}
			if d, _ := entry["description"].(string); strings.TrimSpace(d) == "" {
				problems = append(problems, path+": no description")
			}
			if sub, ok := value.(map[string]any); ok {
				if _, described := entry["properties"]; described {
					walk(path+".", sub, entry)
				}
			}
		}
	}
	walk("", values, schema)
	slices.Sort(problems)
	return problems
}

func typed(entry map[string]any) bool {
	if _, ok := entry["type"]; ok {
		return true
	}
	for _, k := range []string{"anyOf", "oneOf"} {
		branches, ok := entry[k].([]any)
		if !ok || len(branches) == 0 {
			continue
		}
		all := true
		for _, b := range branches {
			if m, ok := b.(map[string]any); !ok || !typed(m) {
				all = false
			}
		}
		return all
	}
	return false
}
