package scrapelog

import (
	"bytes"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestScrapeAsPrometheusStoresIt(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_test_total"}, []string{"type", "namespace"})
	c.WithLabelValues("event", "tenant-a").Add(3)
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hcp_test_seconds", Buckets: []float64{0.5, 1}})
	h.Observe(0.2)
	h.Observe(0.7)
	reg.MustRegister(c, h)
	now := time.UnixMilli(1_700_000_000_123)

	target := map[string]string{"job": "hcp-sidecars", "namespace": "ns"}
	got, err := Scrape(Target{Gatherer: reg, Labels: target}, now)
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string][]Sample{}
	for _, s := range got {
		if s.T != now.UnixMilli() {
			t.Errorf("%v at %d, want %d", s.Labels, s.T, now.UnixMilli())
		}
		byName[s.Labels[NameLabel]] = append(byName[s.Labels[NameLabel]], s)
	}
	want := map[string]string{NameLabel: "hcp_test_total", "job": "hcp-sidecars", "namespace": "ns", "exported_namespace": "tenant-a", "type": "event"}
	if cs := byName["hcp_test_total"]; len(cs) != 1 || !reflect.DeepEqual(cs[0].Labels, want) || cs[0].V != 3 {
		t.Errorf("counter: %+v, want labels %v and 3", cs, want)
	}
	if target["exported_namespace"] != "" || len(target) != 2 {
		t.Errorf("the target's labels changed: %v", target)
	}
	buckets := map[string]float64{}
	for _, s := range byName["hcp_test_seconds_bucket"] {
		buckets[s.Labels["le"]] = s.V
	}
	if !reflect.DeepEqual(buckets, map[string]float64{"0.5": 1, "1": 2, "+Inf": 2}) {
		t.Errorf("buckets %v", buckets)
	}
	if s := byName["hcp_test_seconds_count"]; len(s) != 1 || s[0].V != 2 {
		t.Errorf("count %+v", s)
	}
	if s := byName["hcp_test_seconds_sum"]; len(s) != 1 || math.Abs(s[0].V-0.9) > 1e-9 {
		t.Errorf("sum %+v", s)
	}

	honored, err := Scrape(Target{Gatherer: reg, Labels: target, Honor: true}, now)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range honored {
		if s.Labels[NameLabel] == "hcp_test_total" && (s.Labels["namespace"] != "tenant-a" || s.Labels["exported_namespace"] != "") {
			t.Errorf("honorLabels: %v", s.Labels)
		}
	}
}

func TestWriteReadRoundTrip(t *testing.T) {
	run := Run{
		Start: time.UnixMilli(1_700_000_000_000),
		End:   time.UnixMilli(1_700_000_150_000),
		Samples: []Sample{
			{Labels: map[string]string{NameLabel: "a", "x": "1"}, T: 1_700_000_001_000, V: 1.5},
			{Labels: map[string]string{NameLabel: "b"}, T: 1_700_000_002_000, V: math.Inf(1)},
			{Labels: map[string]string{NameLabel: "c"}, T: 1_700_000_003_000, V: math.NaN()},
		},
	}
	var buf bytes.Buffer
	if err := Write(&buf, run); err != nil {
		t.Fatal(err)
	}
	got, err := Read(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Start.Equal(run.Start) || !got.End.Equal(run.End) || len(got.Samples) != 3 {
		t.Fatalf("read %+v", got)
	}
	if !reflect.DeepEqual(got.Samples[:2], run.Samples[:2]) || !math.IsNaN(got.Samples[2].V) {
		t.Errorf("samples %+v, want %+v", got.Samples, run.Samples)
	}
}

func TestReadRefusesWhatWriteDoesNotWrite(t *testing.T) {
	for name, in := range map[string]string{
		"empty":          "",
		"no header":      `{"labels":{"__name__":"a"},"t":1,"v":"1"}`,
		"end before":     `{"start_ms":10,"end_ms":5}`,
		"no metric name": `{"start_ms":1,"end_ms":5}` + "\n" + `{"labels":{"x":"1"},"t":1,"v":"1"}`,
		"not a number":   `{"start_ms":1,"end_ms":5}` + "\n" + `{"labels":{"__name__":"a"},"t":1,"v":"many"}`,
		"broken line":    `{"start_ms":1,"end_ms":5}` + "\n" + `{"labels":`,
	} {
		if _, err := Read(strings.NewReader(in)); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
