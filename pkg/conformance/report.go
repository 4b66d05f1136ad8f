package conformance

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// Result is the outcome of one check.
type Result string

// The three outcomes.
const (
	Pass Result = "pass"
	Fail Result = "fail"
	Skip Result = "skip"
)

// Row is one line of the report: one check of one statement.
type Row struct {
	// ID names the check (for example "MSG-3"); see Checks and CallerChecks.
	ID string `json:"id"`
	// Ref is the short citation ("L1:356"); Cite is the full one.
	Ref string `json:"ref"`
	// Statement is what the peer must do, abridged from the spec.
	Statement string `json:"statement"`
	// Level is MUST, SHOULD, MAY, "" (normative prose) or "choice".
	Level string `json:"level,omitempty"`
	// Profile is ProfileSpec or ProfileHCPOperator.
	Profile string   `json:"profile"`
	Cite    Citation `json:"cite"`
	Result  Result   `json:"result"`
	// Detail says what was seen: evidence on a pass, the first offences
	// on a fail, why on a skip.
	Detail string `json:"detail"`
}

// Report is the outcome of a run, one row per check of the selected
// profile in catalog order.
type Report struct {
	// Kit is "callee" (the kit checked a callee) or "caller".
	Kit string `json:"kit,omitempty"`
	// Peer is the id of the peer under test; Self the kit's own id.
	Peer    string `json:"peer,omitempty"`
	Self    string `json:"self,omitempty"`
	Profile string `json:"profile"`
	// Started and Duration time the run.
	Started  time.Time     `json:"started,omitzero"`
	Duration time.Duration `json:"duration_ns,omitempty"`
	// Broker is what the kit learnt about the broker.
	Broker BrokerInfo `json:"broker,omitzero"`
	Rows   []Row      `json:"checks"`
}

// BrokerInfo is what the kit measured of the broker.
type BrokerInfo struct {
	// MaxMessageSize is the broker's max_message_size in bytes when the
	// kit learnt it (from the refusal of a probe), else 0.
	MaxMessageSize int64 `json:"max_message_size,omitempty"`
	// MaxMessageSizeAbove is the size of a probe the broker accepted: its
	// limit is above it.
	MaxMessageSizeAbove int64 `json:"max_message_size_above,omitempty"`
}

// Failed reports whether any row failed.
func (r Report) Failed() bool { return r.Count(Fail) > 0 }

// Count counts the rows with result res.
func (r Report) Count(res Result) int {
	n := 0
	for _, row := range r.Rows {
		if row.Result == res {
			n++
		}
	}
	return n
}

// Row returns the row with the given id.
func (r Report) Row(id string) (Row, bool) {
	for _, row := range r.Rows {
		if row.ID == id {
			return row, true
		}
	}
	return Row{}, false
}

// maxDetail bounds the Detail column in the table (the full text stays in
// the Row).
const maxDetail = 160

// Print writes the report as a Markdown table (readable as plain text too),
// one summary line, then each failure with its full citation.
func (r Report) Print(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| ID | Spec | Statement | Result | Detail |\n")
	b.WriteString("| --- | --- | --- | --- | --- |\n")
	for _, row := range r.Rows {
		res := string(row.Result)
		if row.Result == Fail {
			res = "**FAIL**"
		}
		ref := row.Ref
		if row.Profile == ProfileHCPOperator {
			ref += " (" + ProfileHCPOperator + ")"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n",
			cell(row.ID, 0), cell(ref, 0), cell(row.Statement, 0), res, cell(row.Detail, maxDetail))
	}
	fmt.Fprintf(&b, "\n%d checks: %d pass, %d fail, %d skip\n", len(r.Rows), r.Count(Pass), r.Count(Fail), r.Count(Skip))
	if r.Failed() {
		b.WriteString("\nFailures, with the statement each breaks:\n\n")
		for _, row := range r.Rows {
			if row.Result == Fail {
				fmt.Fprintf(&b, "- %s [%s] %s: %s\n", row.ID, levelOr(row.Level), cell(row.Cite.String(), 0), cell(row.Detail, 0))
			}
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func levelOr(l string) string {
	if l == "" {
		return "normative"
	}
	return l
}

// cell makes s safe in a Markdown table cell: one line, pipes escaped,
// invalid UTF-8 replaced, at most limit runes (0: no limit).
func cell(s string, limit int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.Join(strings.Fields(s), " ")
	if limit > 0 && utf8.RuneCountInString(s) > limit {
		rs := []rune(s)
		s = string(rs[:limit-1]) + "…"
	}
	return strings.ReplaceAll(s, "|", `\|`)
}

// Test runs the callee kit against the peer cfg names and reports each
// check as a subtest of t named by its ID: a failed check fails its
// subtest, a skipped one is skipped. The whole table is logged. It returns
// the report.
func Test(t *testing.T, cfg Config) Report {
	t.Helper()
	rep := Run(t.Context(), cfg)
	subtests(t, fmt.Sprintf("callee %q as caller %q", cfg.CalleeID, cfg.CallerID), rep)
	return rep
}

// TestCaller runs the caller kit against the caller cfg names and reports
// each check as a subtest of t, as Test does.
func TestCaller(t *testing.T, cfg CallerConfig) Report {
	t.Helper()
	rep := RunCaller(t.Context(), cfg)
	subtests(t, fmt.Sprintf("caller %q as callee %q", cfg.CallerID, cfg.CalleeID), rep)
	return rep
}

// subtests logs a report and runs one subtest per row.
func subtests(t *testing.T, what string, rep Report) {
	t.Helper()
	var b strings.Builder
	_ = rep.Print(&b)
	t.Logf("HCP conformance against %s:\n%s", what, b.String())
	for _, row := range rep.Rows {
		t.Run(row.ID, func(t *testing.T) {
			switch row.Result {
			case Pass:
				t.Logf("%s %s: %s", row.Ref, row.Statement, row.Detail)
			case Skip:
				t.Skipf("%s %s: skipped: %s", row.Ref, row.Statement, row.Detail)
			default:
				t.Errorf("%s %s: %s", row.Cite, row.Statement, row.Detail)
			}
		})
	}
}
