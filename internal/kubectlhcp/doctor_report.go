package kubectlhcp

import (
	"fmt"
	"io"
	"slices"
)

// CheckStatus is the outcome of one doctor check.
type CheckStatus int

const (
	CheckOK CheckStatus = iota
	// CheckWarn: worth knowing, does not fail the doctor.
	CheckWarn
	CheckFail
)

// Check is one doctor check: what it looked at, what it found, and how to
// fix it when it failed.
type Check struct {
	Name   string
	Status CheckStatus
	Detail string
	Fix    string
}

// Names of checks that several code paths report.
const (
	checkHarnesses         = "harnesses"
	checkAdmissionPolicies = "admission policies"
	checkAdmissionWebhooks = "admission webhooks"
	checkPolicies          = "policies"
)

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}

func firstN(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("and %d more", len(s)-n))
}

// RenderChecks writes the checks, one line each with ✓, ! or ✗, the fix
// under a failed or warned one, and a summary.
func RenderChecks(w io.Writer, checks []Check) {
	var ok, warn, fail int
	for _, c := range checks {
		mark := "✓"
		switch c.Status {
		case CheckOK:
			ok++
		case CheckWarn:
			mark = "!"
			warn++
		case CheckFail:
			mark = "✗"
			fail++
		}
		_, _ = fmt.Fprintf(w, "%s %s: %s\n", mark, c.Name, c.Detail)
		if c.Status != CheckOK && c.Fix != "" {
			_, _ = fmt.Fprintf(w, "    fix: %s\n", c.Fix)
		}
	}
	_, _ = fmt.Fprintf(w, "\n%d checks: %d passed, %d warnings, %d failed\n", len(checks), ok, warn, fail)
}
