package benchutil

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"k8s.io/client-go/rest"
)

// APIWrites is the API server's count of its write requests so far, from
// every client, by verb and resource: "APPLY apps/deployments",
// "PATCH hcp.io/hcpsessions/status".
type APIWrites map[string]float64

// ReadAPIWrites reads APIWrites from the API server's own metrics
// (apiserver_request_total) through c, a REST client of an admin config.
func ReadAPIWrites(ctx context.Context, c rest.Interface) (APIWrites, error) {
	all, err := ReadAPIRequests(ctx, c)
	if err != nil {
		return nil, err
	}
	return all.Writes(), nil
}

// ReadAPIRequests is ReadAPIWrites for every verb: reads (GET, LIST,
// WATCH) too.
func ReadAPIRequests(ctx context.Context, c rest.Interface) (APIWrites, error) {
	raw, err := c.Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	return ParseAPIRequests(raw)
}

// ParseAPIWrites counts the write requests (POST, PUT, PATCH, APPLY,
// DELETE, DELETECOLLECTION) of apiserver_request_total in text, the
// Prometheus text format.
func ParseAPIWrites(text []byte) (APIWrites, error) {
	all, err := ParseAPIRequests(text)
	if err != nil {
		return nil, err
	}
	return all.Writes(), nil
}

// ParseAPIRequests counts the requests of apiserver_request_total in
// text, every verb.
func ParseAPIRequests(text []byte) (APIWrites, error) {
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, fmt.Errorf("API server metrics: %w", err)
	}
	out := APIWrites{}
	for _, m := range families["apiserver_request_total"].GetMetric() {
		l := map[string]string{}
		for _, p := range m.GetLabel() {
			l[p.GetName()] = p.GetValue()
		}
		what := l["resource"]
		if l["group"] != "" {
			what = l["group"] + "/" + what
		}
		if l["subresource"] != "" {
			what += "/" + l["subresource"]
		}
		out[l["verb"]+" "+what] += m.GetCounter().GetValue()
	}
	return out, nil
}

// Writes keeps the write verbs' counts (POST, PUT, PATCH, APPLY, DELETE,
// DELETECOLLECTION); Reads the others.
func (w APIWrites) Writes() APIWrites { return w.verbs(true) }

// Reads keeps the counts of the verbs that do not write (GET, LIST,
// WATCH).
func (w APIWrites) Reads() APIWrites { return w.verbs(false) }

func (w APIWrites) verbs(writes bool) APIWrites {
	out := APIWrites{}
	for k, v := range w {
		verb, _, _ := strings.Cut(k, " ")
		switch verb {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
			if writes {
				out[k] = v
			}
		default:
			if !writes {
				out[k] = v
			}
		}
	}
	return out
}

// Of sums the writes to resource ("hcp.io/hcpsessions"), its subresources
// included, whatever the verb.
func (w APIWrites) Of(resource string) float64 {
	var n float64
	for _, v := range w.Only(resource) {
		n += v
	}
	return n
}

// Only keeps the counts of resource, its subresources included.
func (w APIWrites) Only(resource string) APIWrites {
	out := APIWrites{}
	for k, v := range w {
		if _, what, _ := strings.Cut(k, " "); what == resource || strings.HasPrefix(what, resource+"/") {
			out[k] = v
		}
	}
	return out
}

// PerEach prints the counts divided by n, the most first, as "POST
// hcp.io/hcpsessions 1.00, PATCH hcp.io/hcpsessions/status 2.10".
func (w APIWrites) PerEach(n int) string {
	keys := slices.Collect(maps.Keys(w))
	slices.SortFunc(keys, func(a, b string) int { return cmp.Or(cmp.Compare(w[b], w[a]), cmp.Compare(a, b)) })
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		if w[k] != 0 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, w[k]/float64(max(n, 1))))
		}
	}
	return strings.Join(parts, ", ")
}
