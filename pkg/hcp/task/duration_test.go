package task

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	isodur "github.com/sosodev/duration"
)

func TestParseDuration(t *testing.T) {
	const day = 24 * time.Hour
	valid := []struct {
		in   string
		want time.Duration
	}{
		{"PT72H", 72 * time.Hour},
		{"PT2H15M", 2*time.Hour + 15*time.Minute},
		{"PT0S", 0},
		{"P0D", 0},
		{"PT1S", time.Second},
		{"PT0.5S", 500 * time.Millisecond},
		{"PT0,5S", 500 * time.Millisecond},
		{"PT1.5H", 90 * time.Minute},
		{"P1D", day},
		{"P1W", 7 * day},
		{"P2W3D", 17 * day},
		{"P1DT12H", 36 * time.Hour},
		{"P1DT1H1M1.000000001S", day + time.Hour + time.Minute + time.Second + 1},
		{"PT0.0000000009S", 0},               // sub-nanosecond fraction truncated
		{"PT1.0000000019S", time.Second + 1}, // truncated, not rounded
		{"PT0001H", time.Hour},
		{"PT2562047H47M16.854775807S", math.MaxInt64},
		{"PT9223372036.854775807S", math.MaxInt64},
		{"PT0.1H", 6 * time.Minute},
	}
	for _, tc := range valid {
		got, err := ParseDuration(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
	invalid := []struct{ in, why string }{
		{"", "form"},
		{"P", "no component"},
		{"PT", "must be followed"},
		{"P1DT", "must be followed"},
		{"-PT1H", "negative"},
		{"+PT1H", "form"},
		{"P1Y", "years and months"},
		{"P1M", "years and months"},
		{"P1Y2M3D", "years and months"},
		{"PT1H2H", "form"},
		{"PT1S1H", "form"},
		{"P1DT1D", "form"},
		{"PT1.5H30M", "only the last"},
		{"P1.5DT1H", "only the last"},
		{"PT.5S", "form"},
		{"PT5.S", "form"},
		{"PT1e3S", "form"},
		{"pt1h", "form"},
		{"PT1h", "form"},
		{"1h", "form"},
		{"PT 1H", "form"},
		{"PT1H ", "form"},
		{"PT١H", "form"}, // non-ASCII digit
		{"PT2562048H", "maximum"},
		{"PT9223372036.854775808S", "maximum"},
		{"P99999999999999999999999W", "maximum"},
		{"PT" + strings.Repeat("0", 120) + "1S", "longer than"},
	}
	for _, tc := range invalid {
		got, err := ParseDuration(tc.in)
		if err == nil {
			t.Errorf("ParseDuration(%q) = %v, want error", tc.in, got)
			continue
		}
		if !errors.Is(err, ErrInvalidDuration) {
			t.Errorf("ParseDuration(%q) error %v does not match ErrInvalidDuration", tc.in, err)
		}
		if !strings.Contains(err.Error(), tc.why) {
			t.Errorf("ParseDuration(%q) error %q does not mention %q", tc.in, err, tc.why)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "PT0S"},
		{72 * time.Hour, "PT72H"},
		{2*time.Hour + 15*time.Minute, "PT2H15M"},
		{time.Hour + time.Second, "PT1H1S"},
		{250 * time.Millisecond, "PT0.25S"},
		{1, "PT0.000000001S"},
		{math.MaxInt64, "PT2562047H47M16.854775807S"},
		{-time.Minute, "-PT1M"},
		{math.MinInt64, "-PT2562047H47M16.854775808S"},
	} {
		if got := FormatDuration(tc.in); got != tc.want {
			t.Errorf("FormatDuration(%d) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func TestDurationJSON(t *testing.T) {
	type wrap struct {
		D Duration  `json:"d"`
		O Duration  `json:"o,omitempty"`
		P *Duration `json:"p,omitempty"`
	}
	in := wrap{D: Duration(90 * time.Minute)}
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := string(b), `{"d":"PT1H30M"}`; got != want {
		t.Fatalf("Marshal = %s, want %s", got, want)
	}
	var out wrap
	if err := json.Unmarshal(b, &out); err != nil || out != in {
		t.Fatalf("Unmarshal = %+v, %v", out, err)
	}
	if err := json.Unmarshal([]byte(`{"d":null}`), &out); err != nil {
		t.Fatalf("null: %v", err)
	}
	for _, bad := range []string{`{"d":3600}`, `{"d":"1h"}`, `{"d":"P1Y"}`, `{"d":true}`} {
		if err := json.Unmarshal([]byte(bad), &out); err == nil || !errors.Is(err, ErrInvalidDuration) {
			t.Errorf("Unmarshal(%s) = %v, want ErrInvalidDuration", bad, err)
		}
	}
	if _, err := json.Marshal(wrap{D: Duration(-time.Second)}); err == nil {
		t.Error("Marshal of a negative Duration succeeded")
	}
	if got := Duration(time.Hour).String(); got != "PT1H" {
		t.Errorf("String() = %q", got)
	}
	if got := Duration(time.Hour).Std(); got != time.Hour {
		t.Errorf("Std() = %v", got)
	}
}

// FuzzParseDuration checks that ParseDuration never panics, that every
// accepted value formats and parses back to itself, that FormatDuration
// output always parses back exactly, and that sosodev/duration (the
// reference parser) agrees on values both accept.
func FuzzParseDuration(f *testing.F) {
	for _, s := range []string{
		"PT72H", "PT2H15M", "P1DT12H", "PT0S", "P", "PT", "-PT1H", "P1Y", "PT1.5H",
		"PT0,25S", "P2W3D", "PT2562047H47M16.854775807S", "PT2562048H", "PT1H2H", "PT.5S",
	} {
		f.Add(s, int64(0))
	}
	f.Add("", int64(math.MaxInt64))
	f.Add("", int64(1))
	f.Add("", int64(90*time.Minute+1))
	f.Fuzz(func(t *testing.T, s string, n int64) {
		if d, err := ParseDuration(s); err == nil {
			if d < 0 {
				t.Fatalf("ParseDuration(%q) = %d < 0", s, d)
			}
			again, err := ParseDuration(FormatDuration(d))
			if err != nil || again != d {
				t.Fatalf("ParseDuration(FormatDuration(ParseDuration(%q)=%d)=%q) = %d, %v", s, d, FormatDuration(d), again, err)
			}
			if !strings.Contains(s, ",") {
				ref, err := isodur.Parse(s)
				if err != nil {
					t.Fatalf("reference parser rejects %q which we accept as %d: %v", s, d, err)
				}
				if d < 1<<60 {
					diff := ref.ToTimeDuration() - d
					if diff < 0 {
						diff = -diff
					}
					// float64 arithmetic in the reference; 2^-40 relative is generous.
					if tol := max(time.Duration(2), d>>40); diff > tol {
						t.Fatalf("ParseDuration(%q) = %d, reference %d", s, d, ref.ToTimeDuration())
					}
				}
			}
		}
		if n < 0 {
			n = -(n + 1) // map onto the non-negative range without overflow
		}
		d := time.Duration(n)
		got, err := ParseDuration(FormatDuration(d))
		if err != nil || got != d {
			t.Fatalf("ParseDuration(FormatDuration(%d)=%q) = %d, %v", n, FormatDuration(d), got, err)
		}
	})
}
