package conformance

import (
	"fmt"
	"io"
	"strings"
	"testing"
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

// Row is one line of the report: one check of one spec sentence.
type Row struct {
	// ID names the check (for example "MSG-3"); see Checks.
	ID string
	// Ref is the spec file and line, "L1:356" (line 356 of
	// L1-transport-encoding.md), "L2:188", or "D§3" for the project's
	// design (DESIGN.md section 3) where the spec leaves it to
	// implementations.
	Ref string
	// Statement is what the peer must do, abridged from the spec.
	Statement string
	Result    Result
	// Detail says what was seen: evidence on a pass, the first offences
	// on a fail, why on a skip.
	Detail string
}

// Report is the outcome of a run, one row per check in Checks order.
type Report struct {
	Rows []Row
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
// then one summary line.
func (r Report) Print(w io.Writer) error {
	var b strings.Builder
	b.WriteString("| ID | Spec | Statement | Result | Detail |\n")
	b.WriteString("| --- | --- | --- | --- | --- |\n")
	for _, row := range r.Rows {
		res := string(row.Result)
		if row.Result == Fail {
			res = "**FAIL**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n",
			cell(row.ID, 0), cell(row.Ref, 0), cell(row.Statement, 0), res, cell(row.Detail, maxDetail))
	}
	fmt.Fprintf(&b, "\n%d checks: %d pass, %d fail, %d skip\n", len(r.Rows), r.Count(Pass), r.Count(Fail), r.Count(Skip))
	_, err := io.WriteString(w, b.String())
	return err
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

// Test runs the kit against the peer cfg names and reports each check as a
// subtest of t named by its ID: a failed check fails its subtest, a skipped
// one is skipped. The whole table is logged. It returns the report.
func Test(t *testing.T, cfg Config) Report {
	t.Helper()
	rep := Run(t.Context(), cfg)
	var b strings.Builder
	_ = rep.Print(&b)
	t.Logf("HCP conformance against callee %q as caller %q:\n%s", cfg.CalleeID, cfg.CallerID, b.String())
	for _, row := range rep.Rows {
		t.Run(row.ID, func(t *testing.T) {
			switch row.Result {
			case Pass:
				t.Logf("%s %s: %s", row.Ref, row.Statement, row.Detail)
			case Skip:
				t.Skipf("%s %s: skipped: %s", row.Ref, row.Statement, row.Detail)
			default:
				t.Errorf("%s %s: %s", row.Ref, row.Statement, row.Detail)
			}
		})
	}
	return rep
}
