// Package scrapelog records scrapes of Prometheus registries as Prometheus
// would store them, and writes and reads them as a file: one JSON object a
// line. `make dashboard-picture` records a relay run with it (test/relay,
// in the main module) and draws the chart's dashboard over the file in
// test/observability/dashboard, a module of its own, so that Prometheus'
// query engine and the plotting library stay out of the main module.
package scrapelog

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// NameLabel is the label that holds a series' metric name.
const NameLabel = "__name__"

// Sample is one value of one series at one time.
type Sample struct {
	Labels map[string]string
	// T is milliseconds since the Unix epoch, as Prometheus stores it.
	T int64
	V float64
}

// Target is a registry scraped with the labels a scrape config gives it.
type Target struct {
	Gatherer prometheus.Gatherer
	Labels   map[string]string
	// Honor keeps a series' own label over the target's (honorLabels);
	// otherwise the series' label is renamed exported_<name>.
	Honor bool
}

// Scrape gathers t once at now and returns its samples: counters, gauges
// and untyped values as they are, a histogram as its _bucket (with le),
// _sum and _count series. A gather error is returned with the samples that
// were gathered (prometheus.Gatherer's contract).
func Scrape(t Target, now time.Time) ([]Sample, error) {
	families, err := t.Gatherer.Gather()
	ts := now.UnixMilli()
	var out []Sample
	add := func(name string, m *dto.Metric, extra map[string]string, v float64) {
		l := maps.Clone(t.Labels)
		if l == nil {
			l = map[string]string{}
		}
		for _, lp := range m.GetLabel() {
			if _, clash := t.Labels[lp.GetName()]; clash && !t.Honor {
				l["exported_"+lp.GetName()] = lp.GetValue()
				continue
			}
			l[lp.GetName()] = lp.GetValue()
		}
		maps.Copy(l, extra)
		l[NameLabel] = name
		out = append(out, Sample{Labels: l, T: ts, V: v})
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				add(f.GetName(), m, nil, m.GetCounter().GetValue())
			case dto.MetricType_GAUGE:
				add(f.GetName(), m, nil, m.GetGauge().GetValue())
			case dto.MetricType_UNTYPED:
				add(f.GetName(), m, nil, m.GetUntyped().GetValue())
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				for _, bk := range h.GetBucket() {
					add(f.GetName()+"_bucket", m, map[string]string{"le": strconv.FormatFloat(bk.GetUpperBound(), 'g', -1, 64)}, float64(bk.GetCumulativeCount()))
				}
				add(f.GetName()+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				add(f.GetName()+"_sum", m, nil, h.GetSampleSum())
				add(f.GetName()+"_count", m, nil, float64(h.GetSampleCount()))
			}
		}
	}
	return out, err
}

// Run is a recorded run: when it started and ended, and its samples.
type Run struct {
	Start, End time.Time
	Samples    []Sample
}

// header is the file's first line; every later line is a line.
type header struct {
	Start int64 `json:"start_ms"`
	End   int64 `json:"end_ms"`
}

type line struct {
	Labels map[string]string `json:"labels"`
	T      int64             `json:"t"`
	// V is a string: JSON has no NaN or ±Inf, which gauges may hold.
	V string `json:"v"`
}

// Write writes r to w.
func Write(w io.Writer, r Run) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	if err := enc.Encode(header{Start: r.Start.UnixMilli(), End: r.End.UnixMilli()}); err != nil {
		return err
	}
	for _, s := range r.Samples {
		if err := enc.Encode(line{Labels: s.Labels, T: s.T, V: strconv.FormatFloat(s.V, 'g', -1, 64)}); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// Read reads a run Write wrote. It fails on a file without its header, on
// a sample without a metric name, and on a value that is not a number.
func Read(r io.Reader) (Run, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var h header
	if err := dec.Decode(&h); err != nil {
		return Run{}, fmt.Errorf("scrapelog: the header: %w", err)
	}
	if h.Start == 0 || h.End < h.Start {
		return Run{}, fmt.Errorf("scrapelog: the header gives no run (start %d, end %d)", h.Start, h.End)
	}
	run := Run{Start: time.UnixMilli(h.Start), End: time.UnixMilli(h.End)}
	for n := 2; ; n++ {
		var l line
		err := dec.Decode(&l)
		if errors.Is(err, io.EOF) {
			return run, nil
		}
		if err != nil {
			return Run{}, fmt.Errorf("scrapelog: line %d: %w", n, err)
		}
		if l.Labels[NameLabel] == "" {
			return Run{}, fmt.Errorf("scrapelog: line %d: a sample without %s", n, NameLabel)
		}
		v, err := strconv.ParseFloat(l.V, 64)
		if err != nil {
			return Run{}, fmt.Errorf("scrapelog: line %d: %w", n, err)
		}
		run.Samples = append(run.Samples, Sample{Labels: l.Labels, T: l.T, V: v})
	}
}
