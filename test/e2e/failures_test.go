//go:build e2e

package e2e

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/conformance"
)

// The suite's failures, printed after its timings: what a CI log shows
// is its end, where a failing test's dumps (events, every pod's log, the
// node's logs) would otherwise hide what failed.
var (
	failuresMu sync.Mutex
	failed     []string            // test names, in the order they failed
	details    map[string][]string // by test name
)

// noteFailure records t's name when t has failed by the time its cleanups
// run, with what detail returns (nil: nothing more).
func noteFailure(t *testing.T, detail func() string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		var d string
		if detail != nil {
			d = detail()
		}
		failuresMu.Lock()
		defer failuresMu.Unlock()
		if details == nil {
			details = map[string][]string{}
		}
		if _, seen := details[t.Name()]; !seen {
			failed = append(failed, t.Name())
		}
		details[t.Name()] = append(details[t.Name()], d)
	})
}

// failedRows is a conformance report's rows that did not pass, each with
// the start of its detail.
func failedRows(rep *conformance.Report) string {
	if len(rep.Rows) == 0 {
		return "the kit did not run to its end"
	}
	var rows []string
	for _, r := range rep.Rows {
		if r.Result != conformance.Pass {
			rows = append(rows, fmt.Sprintf("%s %s (%s)", r.ID, r.Result, truncate(r.Detail, 300)))
		}
	}
	return strings.Join(rows, "; ")
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func printFailures(w io.Writer) {
	failuresMu.Lock()
	defer failuresMu.Unlock()
	if len(failed) == 0 {
		return
	}
	var b strings.Builder
	b.WriteString("e2e failures (each test's log above says more):\n")
	for _, name := range failed {
		line := name
		if d := strings.Join(slices.DeleteFunc(details[name], func(s string) bool { return s == "" }), "; "); d != "" {
			line += ": " + d
		}
		fmt.Fprintf(&b, "  %s\n", line)
	}
	_, _ = io.WriteString(w, b.String())
}
