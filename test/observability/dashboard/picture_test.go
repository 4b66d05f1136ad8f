// Package dashboard draws the chart's Grafana dashboard
// (charts/hcp-operator/dashboards/hcp.json) without Grafana, which cannot
// run here: it loads a recorded run (internal/scrapelog's file) into
// Prometheus' own storage, evaluates every panel's queries with Prometheus'
// PromQL engine, and plots them in the dashboard's layout. It lives in the
// test/observability module so that Prometheus and the plotting library
// stay out of the main module.
package dashboard

import (
	"context"
	"encoding/json"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/util/teststorage"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/hcp-io/hcp-operator/internal/scrapelog"
)

// TestDashboardPicture draws the dashboard over the run recorded in
// HCP_DASHBOARD_SAMPLES (test/relay's TestDashboardRun) to
// HCP_DASHBOARD_PICTURE, a PNG. `make dashboard-picture` runs both.
func TestDashboardPicture(t *testing.T) {
	in, out := os.Getenv("HCP_DASHBOARD_SAMPLES"), os.Getenv("HCP_DASHBOARD_PICTURE")
	if in == "" || out == "" {
		t.Skip("set HCP_DASHBOARD_SAMPLES (a run recorded by test/relay's TestDashboardRun) and HCP_DASHBOARD_PICTURE (the PNG to write); make dashboard-picture does")
	}
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	run, err := scrapelog.Read(f)
	_ = f.Close()
	if err != nil {
		t.Fatal(err)
	}
	dash := picture(t, run, out)
	empty := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.series) == 0 {
			empty++
			t.Logf("no data: %q", p.Title)
		}
	}
	t.Logf("wrote %s from %d samples: %d panels, %d without data", out, len(run.Samples), len(dash.Panels), empty)
}

// TestDashboardPictureOfARun draws the dashboard over a small run made up
// here: every panel's queries evaluate, the panels of the series given
// have data, and the picture is a PNG.
func TestDashboardPictureOfARun(t *testing.T) {
	start := time.Now().Add(-2 * time.Minute).Truncate(time.Second)
	run := scrapelog.Run{Start: start, End: start.Add(90 * time.Second)}
	target := map[string]string{"job": "hcp-sidecars", "namespace": "tenant-a", "pod": "hcp-callee-lab-cvd-0", "callee": "lab-cvd"}
	series := func(name string, extra map[string]string, v func(s int) float64) {
		for s := 1; s <= 90; s++ {
			l := map[string]string{scrapelog.NameLabel: name}
			for k, x := range target {
				l[k] = x
			}
			for k, x := range extra {
				l[k] = x
			}
			run.Samples = append(run.Samples, scrapelog.Sample{Labels: l, T: start.Add(time.Duration(s) * time.Second).UnixMilli(), V: v(s)})
		}
	}
	series("hcp_sidecar_messages_in_total", map[string]string{"type": "task_submit"}, func(s int) float64 { return float64(2 * s) })
	series("hcp_sidecar_messages_out_total", map[string]string{"type": "event"}, func(s int) float64 { return float64(40 * s) })
	series("hcp_sidecar_amqp_connected", map[string]string{"connection": "publish"}, func(s int) float64 { return 1 })
	out := filepath.Join(t.TempDir(), "dashboard.png")
	dash := picture(t, run, out)
	drawn := 0
	for _, p := range dash.Panels {
		if p.Type != "row" && len(p.series) > 0 {
			drawn++
		}
	}
	if drawn == 0 {
		t.Error("no panel has data from hcp_sidecar_messages_in_total, hcp_sidecar_messages_out_total or hcp_sidecar_amqp_connected")
	}
	png, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(png), "\x89PNG\r\n\x1a\n") || len(png) < 10_000 {
		t.Errorf("%s: %d bytes, not a PNG of the dashboard", out, len(png))
	}
	t.Logf("%d of %d panels drawn with data, %d bytes", drawn, len(dash.Panels), len(png))
}

// picture loads run into Prometheus' storage, evaluates every panel's
// queries over it and draws the dashboard to out.
func picture(t *testing.T, run scrapelog.Run, out string) *pictureDashboard {
	t.Helper()
	st := teststorage.New(t)
	app := st.Appender(context.Background())
	for _, s := range run.Samples {
		if _, err := app.Append(0, labels.FromMap(s.Labels), s.T, s.V); err != nil {
			t.Fatalf("append %v: %v", s.Labels, err)
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	dash := readDashboard(t)
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 50_000_000, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	vars := strings.NewReplacer("$__rate_interval", "20s", "$__interval", "2s", "$namespace", ".*", "$callee", ".*")
	step := 2 * time.Second
	for i := range dash.Panels {
		p := &dash.Panels[i]
		for _, tg := range p.Targets {
			q, err := engine.NewRangeQuery(t.Context(), st, nil, vars.Replace(tg.Expr), run.Start.Add(20*time.Second), run.End, step)
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
				p.series = append(p.series, drawnSeries{name: legend(tg.LegendFormat, s.Metric), points: slices.Clone(s.Floats), start: run.Start})
			}
			q.Close()
		}
	}
	if err := drawDashboard(dash, out, run.End.Sub(run.Start)); err != nil {
		t.Fatal(err)
	}
	return dash
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
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "..", "..", "charts", "hcp-operator", "dashboards", "hcp.json"))
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
