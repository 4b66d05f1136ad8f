package kubectlhcp

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/cli-runtime/pkg/genericclioptions"
	"k8s.io/cli-runtime/pkg/printers"
)

// -o of the list and describe commands (sessions, describe, topology): the
// table (default) or -o wide, which the commands render themselves, or one
// of k8s.io/cli-runtime's printers (json, yaml, kyaml, name, jsonpath,
// go-template, …), which print what the command computed as Kubernetes
// objects: the API objects themselves, with the table's computed columns
// beside them, or a view kind of group cli.hcp.io (below).

// ViewGroupVersion is the apiVersion of the plugin's computed views
// (SessionDescription, HarnessTopology). No API server serves it: it names
// what kubectl-hcp prints, so that a script can tell the views apart.
var ViewGroupVersion = schema.GroupVersion{Group: "cli.hcp.io", Version: "v1alpha1"}

// Formats the commands render themselves.
const (
	formatTable = ""
	formatWide  = "wide"
	formatName  = "name"
)

// outputFlags is -o (and cli-runtime's --template, --show-managed-fields,
// --allow-missing-template-keys) on one command.
type outputFlags struct {
	pf *genericclioptions.PrintFlags
}

// addOutputFlags adds -o to cmd; wide says what -o wide adds.
func addOutputFlags(cmd *cobra.Command, wide string) *outputFlags {
	o := &outputFlags{pf: genericclioptions.NewPrintFlags("")}
	o.pf.AddFlags(cmd)
	formats := append([]string{formatWide}, o.pf.AllowedFormats()...)
	cmd.Flags().Lookup("output").Usage = fmt.Sprintf("Output format: a table by default; one of (%s). wide: %s. json/yaml: see docs/kubectl-plugin.md#output", strings.Join(formats, ", "), wide)
	return o
}

// format is -o; nil outputFlags (a command run from Go without flags)
// print the table.
func (o *outputFlags) format() string {
	if o == nil {
		return formatTable
	}
	return strings.TrimSpace(*o.pf.OutputFormat)
}

// table reports whether the command renders a table itself (default or
// wide).
func (o *outputFlags) table() bool {
	f := o.format()
	return (f == formatTable || f == formatWide) && !o.templateOnly()
}

func (o *outputFlags) wide() bool { return o.format() == formatWide }

// templateOnly: --template without -o means go-template, as in kubectl.
func (o *outputFlags) templateOnly() bool {
	if o == nil {
		return false
	}
	t := o.pf.TemplatePrinterFlags.TemplateArgument
	return o.format() == formatTable && t != nil && *t != ""
}

// showManagedFields is --show-managed-fields; the printers drop
// metadata.managedFields of the printed objects otherwise, and the views
// drop those of the objects inside them.
func (o *outputFlags) showManagedFields() bool {
	return o != nil && o.pf.JSONYamlPrintFlags.ShowManagedFields
}

// printer is the cli-runtime printer of -o; an error for a format it does
// not know, listing the formats.
func (o *outputFlags) printer() (printers.ResourcePrinter, error) {
	if o == nil {
		return nil, &ExitError{Code: ExitFailure, Err: fmt.Errorf("no output format")}
	}
	p, err := o.pf.ToPrinter()
	if err != nil {
		if genericclioptions.IsNoCompatiblePrinterError(err) {
			formats := append([]string{formatWide}, o.pf.AllowedFormats()...)
			return nil, &ExitError{Code: ExitFailure, Err: fmt.Errorf("-o %q: not an output format (want one of %s)", o.format(), strings.Join(formats, ", "))}
		}
		return nil, &ExitError{Code: ExitFailure, Err: err}
	}
	return p, nil
}

// check validates -o before the command does any work.
func (o *outputFlags) check() error {
	if o.table() {
		return nil
	}
	_, err := o.printer()
	return err
}

// print prints obj with the printer of -o.
func (o *outputFlags) print(w io.Writer, obj runtime.Object) error {
	p, err := o.printer()
	if err != nil {
		return err
	}
	return p.PrintObj(obj, w)
}

// toObject is v as an unstructured object of apiVersion/kind gvk: v is
// marshalled to JSON and read back with integers as int64.
func toObject(v any, gvk schema.GroupVersionKind) (*unstructured.Unstructured, error) {
	m, err := toMap(v)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

func toMap(v any) (map[string]any, error) {
	data, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	m := map[string]any{}
	if err := utiljson.Unmarshal(data, &m); err != nil {
		return nil, err
	}
	return m, nil
}

// apiObject is an API object (typed, as the client read it, without
// apiVersion and kind) as an unstructured one with its apiVersion and
// kind, metadata.managedFields dropped unless keep.
func apiObject(obj runtime.Object, keep bool) (*unstructured.Unstructured, error) {
	s, err := Scheme()
	if err != nil {
		return nil, err
	}
	gvks, _, err := s.ObjectKinds(obj)
	if err != nil || len(gvks) == 0 {
		return nil, fmt.Errorf("the kind of %T: %v", obj, err)
	}
	u, err := toObject(obj, gvks[0])
	if err != nil {
		return nil, err
	}
	if !keep {
		u.SetManagedFields(nil)
	}
	return u, nil
}

// list is a List (apiVersion v1, as kubectl get prints several objects)
// of items.
func list(items []unstructured.Unstructured) *unstructured.UnstructuredList {
	l := &unstructured.UnstructuredList{Object: map[string]any{"metadata": map[string]any{}}, Items: items}
	l.SetAPIVersion("v1")
	l.SetKind("List")
	return l
}
