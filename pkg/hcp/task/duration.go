package task

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// maxDurationLen bounds the input ParseDuration looks at. The longest
// meaningful duration ("P15250W…" with nanosecond seconds) is far shorter;
// the bound keeps hostile input from costing more than a few microseconds.
const maxDurationLen = 100

// durationRE is the ISO 8601 duration grammar in designator form:
// PnYnMnWnDTnHnMnS, components in this order, each at most once. A decimal
// fraction (with '.' or ',') is checked separately: ISO 8601 allows it only
// on the smallest component present.
var durationRE = regexp.MustCompile(`^P(?:(\d+(?:[.,]\d+)?)Y)?(?:(\d+(?:[.,]\d+)?)M)?(?:(\d+(?:[.,]\d+)?)W)?(?:(\d+(?:[.,]\d+)?)D)?(?:T(?:(\d+(?:[.,]\d+)?)H)?(?:(\d+(?:[.,]\d+)?)M)?(?:(\d+(?:[.,]\d+)?)S)?)?$`)

// Sub-match indexes of durationRE and the nanoseconds per unit (0 = no
// fixed length).
var durationUnits = [...]struct {
	name string
	ns   int64
}{
	{"years", 0},
	{"months", 0},
	{"weeks", 7 * 24 * int64(time.Hour)},
	{"days", 24 * int64(time.Hour)},
	{"hours", int64(time.Hour)},
	{"minutes", int64(time.Minute)},
	{"seconds", int64(time.Second)},
}

// ErrInvalidDuration is matched (errors.Is) by every error ParseDuration
// returns.
var ErrInvalidDuration = errors.New("invalid ISO 8601 duration")

// ParseDuration parses an ISO 8601 duration such as "PT72H", "PT2H15M",
// "P3D" or "PT0.5S" into a time.Duration.
//
// HCP durations measure elapsed time, so the rules are stricter than full
// ISO 8601:
//   - Years (Y) and months (M before T) are rejected: their length depends on
//     the calendar, and a limit that means 28 days in one month and 31 in
//     another is not a limit. Use weeks, days or hours.
//   - A day (D) is exactly 24 hours and a week (W) exactly 7 days.
//   - Negative durations ("-P…") are rejected.
//   - At least one component is required; "P" and "PT" are invalid, as is a
//     "T" with no time component after it.
//   - Components appear in designator order, each at most once.
//   - Only the last component may carry a decimal fraction ('.' or ',').
//     Fractions finer than a nanosecond are truncated.
//   - The value must fit a time.Duration (about 292 years); larger values
//     are rejected rather than wrapped.
//   - "PT0S" (zero) is valid here; callers that need a positive duration
//     check for it.
//
// The github.com/sosodev/duration parser is not used for the conversion: it
// accepts "P", duplicate and out-of-order designators and signs, converts
// through float64 (losing nanoseconds above about 104 days) and wraps on
// overflow. Tests use it as a reference for the values both accept.
func ParseDuration(s string) (time.Duration, error) {
	if len(s) > maxDurationLen {
		return 0, fmt.Errorf("%w: longer than %d characters", ErrInvalidDuration, maxDurationLen)
	}
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%w %q: negative durations are not allowed", ErrInvalidDuration, s)
	}
	m := durationRE.FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%w %q: want the form PnWnDTnHnMnS, for example PT72H or P1DT12H", ErrInvalidDuration, s)
	}
	comps := m[1:]
	if strings.HasSuffix(s, "T") {
		return 0, fmt.Errorf("%w %q: a time designator T must be followed by hours, minutes or seconds", ErrInvalidDuration, s)
	}
	last := -1
	for i, c := range comps {
		if c != "" {
			last = i
		}
	}
	if last < 0 {
		return 0, fmt.Errorf("%w %q: no component", ErrInvalidDuration, s)
	}
	if comps[0] != "" || comps[1] != "" {
		return 0, fmt.Errorf("%w %q: years and months have no fixed length; use weeks (W), days (D) or hours (H)", ErrInvalidDuration, s)
	}

	total := new(big.Int)
	for i, c := range comps {
		if c == "" {
			continue
		}
		intPart, frac, hasFrac := strings.Cut(strings.Replace(c, ",", ".", 1), ".")
		if hasFrac && i != last {
			return 0, fmt.Errorf("%w %q: only the last component may have a fraction", ErrInvalidDuration, s)
		}
		// value = (intPart·10^len(frac) + frac) · unit / 10^len(frac), truncated.
		digits, ok := new(big.Int).SetString(intPart+frac, 10)
		if !ok { // unreachable: the regexp admits digits only
			return 0, fmt.Errorf("%w %q: bad number %q", ErrInvalidDuration, s, c)
		}
		digits.Mul(digits, big.NewInt(durationUnits[i].ns))
		if hasFrac {
			scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
			digits.Quo(digits, scale)
		}
		total.Add(total, digits)
	}
	if !total.IsInt64() {
		return 0, fmt.Errorf("%w %q: longer than the maximum of %s", ErrInvalidDuration, s, FormatDuration(math.MaxInt64))
	}
	return time.Duration(total.Int64()), nil
}

// FormatDuration formats d as an ISO 8601 duration using hours, minutes and
// seconds only ("PT72H", "PT1H30M", "PT0.25S", zero as "PT0S"), which is
// exact for every time.Duration and never uses calendar units. Seconds carry
// up to nine fraction digits. A negative d is formatted with a leading '-'
// (an ISO 8601-2 extension) that ParseDuration rejects.
func FormatDuration(d time.Duration) string {
	if d == 0 {
		return "PT0S"
	}
	var b strings.Builder
	u := uint64(d)
	if d < 0 {
		b.WriteByte('-')
		u = -u // two's complement: correct for math.MinInt64 too
	}
	b.WriteString("PT")
	h := u / uint64(time.Hour)
	u %= uint64(time.Hour)
	m := u / uint64(time.Minute)
	u %= uint64(time.Minute)
	sec := u / uint64(time.Second)
	ns := u % uint64(time.Second)
	if h > 0 {
		b.WriteString(strconv.FormatUint(h, 10))
		b.WriteByte('H')
	}
	if m > 0 {
		b.WriteString(strconv.FormatUint(m, 10))
		b.WriteByte('M')
	}
	if sec > 0 || ns > 0 {
		b.WriteString(strconv.FormatUint(sec, 10))
		if ns > 0 {
			f := fmt.Sprintf("%09d", ns)
			b.WriteByte('.')
			b.WriteString(strings.TrimRight(f, "0"))
		}
		b.WriteByte('S')
	}
	return b.String()
}

// Duration is a time.Duration that travels on the wire as an ISO 8601
// duration string (see ParseDuration and FormatDuration). The zero value is
// "PT0S"; with `omitempty` a zero Duration is left out, which payloads use
// for "not set".
type Duration time.Duration

// Std returns d as a time.Duration.
func (d Duration) Std() time.Duration { return time.Duration(d) }

// String returns the ISO 8601 form of d.
func (d Duration) String() string { return FormatDuration(time.Duration(d)) }

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) {
	if d < 0 {
		return nil, fmt.Errorf("%w: negative duration %s", ErrInvalidDuration, time.Duration(d))
	}
	return []byte(d.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := ParseDuration(string(b))
	if err != nil {
		return err
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) {
	t, err := d.MarshalText()
	if err != nil {
		return nil, err
	}
	return json.Marshal(string(t))
}

// UnmarshalJSON implements json.Unmarshaler. JSON null leaves d unchanged.
func (d *Duration) UnmarshalJSON(b []byte) error {
	if string(b) == jsonNull {
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("%w: want a JSON string such as \"PT1H\", got %s", ErrInvalidDuration, truncate(string(b), 32))
	}
	return d.UnmarshalText([]byte(s))
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
