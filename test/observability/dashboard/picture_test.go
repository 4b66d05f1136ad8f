//go:build dashboardpicture

package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/util/teststorage"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/hcp-io/hcp-operator/internal/controller"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// TestDashboardPicture draws the Grafana dashboard of the chart
// (charts/hcp-operator/dashboards/hcp.json) without Grafana, which cannot
// run here: it runs the relay (a callee and a caller sidecar with the
// sample harness and app) under real traffic for a while, scrapes the two
// sidecars' registries and the manager's session collector every second
// into Prometheus' own storage, evaluates every panel's queries with
// Prometheus' PromQL engine, and plots them in the dashboard's layout to
// HCP_DASHBOARD_PICTURE (a PNG). `make dashboard-picture` runs it (build
// tag dashboardpicture: Prometheus' storage is a heavy build). The
// operator's controller-runtime panels stay empty: this bed runs no manager.
func TestDashboardPicture(t *testing.T) {
	out := os.Getenv("HCP_DASHBOARD_PICTURE")
	if out == "" {
		t.Skip("set HCP_DASHBOARD_PICTURE to the PNG to write (make dashboard-picture)")
	}
	runFor := 150 * time.Second
	if d, err := time.ParseDuration(os.Getenv("HCP_DASHBOARD_DURATION")); err == nil {
		runFor = d
	}
	app := samplecaller.NewRecorder()
	b := newBed(t, bedOptions{
		Harness: func(url string, log logr.Logger) http.Handler { return samplecallee.New(url, log).Handler() },
		App:     app.Handler(),
		Quiet:   true,
	})
	st := teststorage.New(t)
	manager := prometheus.NewRegistry()
	manager.MustRegister(controller.NewSessionCollector(b.env.Client, nil))
	// Target labels as the chart's PodMonitor and ServiceMonitor give them
	// (the ServiceMonitor honours the manager's own namespace label).
	targets := []scrapeTarget{
		{reg: b.CalleeReg, labels: map[string]string{"job": "hcp-sidecars", "namespace": b.ns, "pod": "hcp-callee-lab-cvd-0", "callee": calleeID}},
		{reg: b.CallerReg, labels: map[string]string{"job": "hcp-sidecars", "namespace": b.ns, "pod": "hcp-caller-alpha-0", "caller": callerID}},
		{reg: manager, labels: map[string]string{"job": "hcp-operator", "namespace": "hcp-system", "pod": "hcp-operator-0"}, honor: true},
	}

	ctx, cancel := context.WithTimeout(t.Context(), runFor)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() { traffic(ctx, t, b) })
	wg.Go(func() {
		// Cut the sidecars' connections once, two thirds in: the
		// connection panels show it.
		select {
		case <-ctx.Done():
			return
		case <-time.After(runFor * 2 / 3):
		}
		_ = b.broker.CloseConnectionsOf(b.callee.name)
	})
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	scrapes := 0
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case now := <-tick.C:
			for _, tg := range targets {
				scrape(t, st, tg, now)
			}
			scrapes++
		}
	}
	wg.Wait()
	end := time.Now()
	t.Logf("%d scrapes over %s", scrapes, end.Sub(start).Round(time.Second))

	dash := readDashboard(t)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	vars := strings.NewReplacer("$__rate_interval", "20s", "$__interval", "2s", "$namespace", ".*", "$callee", ".*")
	step := 2 * time.Second
	for i := range dash.Panels {
		p := &dash.Panels[i]
		for _, tg := range p.Targets {
			q, err := engine.NewRangeQuery(t.Context(), st, nil, vars.Replace(tg.Expr), start.Add(20*time.Second), end, step)
			if err != nil {
				t.Fatalf("panel %q: %v", p.Title, err)
			}
			res := q.Exec(t.Context())
			if res.Err != nil {
				t.Fatalf("panel %q: %v", p.Title, res.Err)
			}
			m, err := res.Matrix()
			if err != nil {
				t.Fatalf("panel %q: %v", p.Title, err)
			}
			for _, s := range m {
				// Copied: Close returns the result's slices to the engine's pool.
				p.series = append(p.series, drawnSeries{name: legend(tg.LegendFormat, s.Metric), points: slices.Clone(s.Floats), start: start})
			}
			q.Close()
		}
	}
	if err := drawDashboard(dash, out, end.Sub(start)); err != nil {
		t.Fatal(err)
	}
	empty := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.series) == 0 {
			empty++
			t.Logf("no data: %q", p.Title)
		}
	}
	t.Logf("wrote %s: %d panels, %d without data", out, len(dash.Panels), empty)
}

// traffic submits tasks through the caller sidecar as an app would: most
// admitted and completing, some refused by the policy, some failing.
func traffic(ctx context.Context, t *testing.T, b *bed) {
	submit := func(capability, inputs string) {
		req := caller.SubmitRequest{
			CalleeID: calleeID, Capability: capability, Intent: "dashboard picture",
			Inputs: json.RawMessage(inputs), Constraints: task.Constraints{DataClassification: task.T1},
		}
		var v caller.TaskView
		if code := call(ctx, http.MethodPost, b.CallerAPI+"/hcp/v1/tasks", req, &v); code != http.StatusAccepted && ctx.Err() == nil {
			t.Logf("POST /hcp/v1/tasks: HTTP %d", code)
		}
	}
	for i := 0; ctx.Err() == nil; i++ {
		submit("analyze", fmt.Sprintf(`{"steps":%d,"step_ms":250,"log_every":5,"checkpoint_every":10}`, 10+i%4*10))
		if i%2 == 0 {
			submit("analyze", `{"steps":60,"step_ms":100}`)
		}
		if i%3 == 0 {
			submit("restricted", `{}`) // the policy does not admit it: not_authorized
		}
		if i%7 == 3 {
			submit("analyze", `{"steps":20,"step_ms":100,"fail_at":12}`)
		}
		if i%9 == 5 {
			submit("analyze", `{"steps":10,"step_ms":100,"pause_at":3,"pause_ms":15000}`)
		}
		select {
		case <-ctx.Done():
		case <-time.After(1500 * time.Millisecond):
		}
	}
}

type scrapeTarget struct {
	reg    prometheus.Gatherer
	labels map[string]string
	// honor keeps a series' own label over the target's (honorLabels).
	honor bool
}

// scrape appends one scrape of tg to st, as Prometheus stores it.
func scrape(t *testing.T, st *teststorage.TestStorage, tg scrapeTarget, now time.Time) {
	families, err := tg.reg.Gather()
	if err != nil {
		t.Logf("scrape: %v", err)
	}
	app := st.Appender(context.Background())
	ts := now.UnixMilli()
	add := func(name string, m *dto.Metric, extra map[string]string, v float64) {
		b := labels.NewBuilder(labels.EmptyLabels())
		for k, val := range tg.labels {
			b.Set(k, val)
		}
		for _, lp := range m.GetLabel() {
			if _, clash := tg.labels[lp.GetName()]; clash && !tg.honor {
				b.Set("exported_"+lp.GetName(), lp.GetValue())
				continue
			}
			b.Set(lp.GetName(), lp.GetValue())
		}
		for k, val := range extra {
			b.Set(k, val)
		}
		b.Set(model.MetricNameLabel, name)
		if _, err := app.Append(0, b.Labels(), ts, v); err != nil {
			t.Fatalf("append %s: %v", name, err)
		}
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
					add(f.GetName()+"_bucket", m, map[string]string{"le": fmt.Sprint(bk.GetUpperBound())}, float64(bk.GetCumulativeCount()))
				}
				add(f.GetName()+"_bucket", m, map[string]string{"le": "+Inf"}, float64(h.GetSampleCount()))
				add(f.GetName()+"_sum", m, nil, h.GetSampleSum())
				add(f.GetName()+"_count", m, nil, float64(h.GetSampleCount()))
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
}

type pictureDashboard struct {
	Title  string         `json:"title"`
	Panels []picturePanel `json:"panels"`
}

type picturePanel struct {
	Type    string                   `json:"type"`
	Title   string                   `json:"title"`
	GridPos struct{ H, W, X, Y int } `json:"gridPos"`
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	series []drawnSeries
}

type drawnSeries struct {
	name   string
	points []promql.FPoint
	start  time.Time
}

func readDashboard(t *testing.T) *pictureDashboard {
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "charts", "hcp-operator", "dashboards", "hcp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d pictureDashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatal(err)
	}
	return &d
}

var legendRE = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

func legend(format string, l labels.Labels) string {
	if format == "" {
		return l.String()
	}
	return legendRE.ReplaceAllStringFunc(format, func(m string) string {
		return l.Get(legendRE.FindStringSubmatch(m)[1])
	})
}

var palette = []color.Color{
	color.RGBA{0x73, 0xbf, 0x69, 0xff}, color.RGBA{0xf2, 0xcc, 0x0c, 0xff}, color.RGBA{0x56, 0x94, 0xf2, 0xff},
	color.RGBA{0xff, 0x78, 0x0a, 0xff}, color.RGBA{0xf2, 0x49, 0x5c, 0xff}, color.RGBA{0x5d, 0xc2, 0xcd, 0xff},
	color.RGBA{0xb8, 0x77, 0xd9, 0xff}, color.RGBA{0x88, 0x88, 0x88, 0xff},
}

var (
	background = color.RGBA{0x11, 0x12, 0x17, 0xff}
	panelBG    = color.RGBA{0x18, 0x1b, 0x1f, 0xff}
	foreground = color.RGBA{0xcc, 0xcc, 0xdc, 0xff}
	gridColor  = color.RGBA{0x2c, 0x30, 0x35, 0xff}
)

// drawDashboard lays the panels out on Grafana's 24-column grid.
func drawDashboard(d *pictureDashboard, out string, span time.Duration) error {
	const colW, rowH = 1.0 * vg.Inch * 0.75, 0.40 * vg.Inch
	bottom := 0
	for _, p := range d.Panels {
		bottom = max(bottom, p.GridPos.Y+p.GridPos.H)
	}
	header := 0.6 * vg.Inch
	W, H := 24*colW, vg.Length(bottom)*rowH+header
	img := vgimg.NewWith(vgimg.UseWH(W, H), vgimg.UseDPI(96), vgimg.UseBackgroundColor(background))
	dc := draw.New(img)
	title := draw.TextStyle{Color: foreground, Font: font.From(plot.DefaultFont, 16), XAlign: draw.XLeft, YAlign: draw.YCenter, Handler: plot.DefaultTextHandler}
	dc.FillText(title, vg.Point{X: 0.2 * vg.Inch, Y: H - header/2},
		fmt.Sprintf("%s — the chart's dashboard, its queries evaluated by PromQL over a %s relay run (not a Grafana screenshot)", d.Title, span.Round(time.Second)))
	for _, p := range d.Panels {
		g := p.GridPos
		r := vg.Rectangle{
			Min: vg.Point{X: vg.Length(g.X)*colW + 3, Y: H - header - vg.Length(g.Y+g.H)*rowH + 3},
			Max: vg.Point{X: vg.Length(g.X+g.W)*colW - 3, Y: H - header - vg.Length(g.Y)*rowH - 3},
		}
		c := draw.Crop(dc, r.Min.X, r.Max.X-W, r.Min.Y, r.Max.Y-H)
		if p.Type == "row" {
			st := title
			st.Font = font.From(plot.DefaultFont, 14)
			c.FillText(st, vg.Point{X: c.Min.X + 4, Y: (c.Min.Y + c.Max.Y) / 2}, p.Title)
			continue
		}
		c.SetColor(panelBG)
		c.Fill(c.Path())
		if err := drawPanel(c, &p); err != nil {
			return fmt.Errorf("panel %q: %w", p.Title, err)
		}
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	_, err = vgimg.PngCanvas{Canvas: img}.WriteTo(f)
	return err
}

func unitScale(unit string) (float64, string) {
	switch unit {
	case "percentunit":
		return 100, "%"
	case "reqps", "ops", "wps":
		return 1, "/s"
	case "s":
		return 1, "s"
	}
	return 1, ""
}

func drawPanel(c draw.Canvas, p *picturePanel) error {
	scale, unit := unitScale(p.FieldConfig.Defaults.Unit)
	text := func(size vg.Length, col color.Color) draw.TextStyle {
		return draw.TextStyle{Color: col, Font: font.From(plot.DefaultFont, size), XAlign: draw.XCenter, YAlign: draw.YCenter, Handler: plot.DefaultTextHandler}
	}
	mid := vg.Point{X: (c.Min.X + c.Max.X) / 2, Y: (c.Min.Y + c.Max.Y) / 2}
	if len(p.series) == 0 || p.Type == "stat" {
		c.FillText(text(11, foreground), vg.Point{X: mid.X, Y: c.Max.Y - 12}, p.Title)
		msg, col, size := "no data in this run", color.Color(color.RGBA{0x88, 0x88, 0x88, 0xff}), vg.Length(11)
		if len(p.series) > 0 {
			pts := p.series[0].points
			v := pts[len(pts)-1].F * scale
			msg, col, size = fmt.Sprintf("%.1f%s", v, unit), palette[0], 40
			if v >= 25 && unit == "%" {
				col = palette[4]
			}
		}
		c.FillText(text(size, col), mid, msg)
		return nil
	}
	pl := plot.New()
	pl.BackgroundColor = panelBG
	pl.Title.Text = p.Title
	pl.Title.TextStyle.Color = foreground
	pl.Title.TextStyle.Font.Size = 11
	for _, a := range []*plot.Axis{&pl.X, &pl.Y} {
		a.Color, a.Tick.Color = gridColor, gridColor
		a.Tick.Label.Color, a.Label.TextStyle.Color = foreground, foreground
		a.Tick.Label.Font.Size = 8
		a.Label.TextStyle.Font.Size = 8
	}
	pl.X.Label.Text = "seconds into the run"
	pl.Y.Label.Text = unit
	pl.Y.Min = 0
	pl.Add(plotter.NewGrid())
	pl.Legend.Top, pl.Legend.Left = true, true
	pl.Legend.TextStyle.Color = foreground
	pl.Legend.TextStyle.Font.Size = 7
	sort.SliceStable(p.series, func(i, j int) bool { return p.series[i].name < p.series[j].name })
	shown := 0
	for i, s := range p.series {
		xy := make(plotter.XYs, 0, len(s.points))
		for _, pt := range s.points {
			if math.IsNaN(pt.F) || math.IsInf(pt.F, 0) {
				continue
			}
			xy = append(xy, plotter.XY{X: time.UnixMilli(pt.T).Sub(s.start).Seconds(), Y: pt.F * scale})
		}
		if len(xy) == 0 {
			continue
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return err
		}
		l.Color = palette[i%len(palette)]
		l.Width = 1.5
		pl.Add(l)
		if shown < 6 {
			pl.Legend.Add(s.name, l)
		}
		shown++
	}
	if pl.Y.Max <= pl.Y.Min {
		pl.Y.Max = pl.Y.Min + 1 // all zero: keep 0 at the bottom
	}
	pl.Draw(c)
	return nil
}
