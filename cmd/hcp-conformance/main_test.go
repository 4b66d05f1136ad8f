package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
	t.Setenv("HCP_CONFORMANCE_AMQP_URL", "")
	uriFile := filepath.Join(t.TempDir(), "uri")
	if err := os.WriteFile(uriFile, []byte("amqp://u:p@127.0.0.1:1/%2Fhcp\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	good := []string{"--callee", "lab-cvd", "--caller", "kit", "--capability", "cvd.run-synthesis", "--timeout", "2s", "--quiet"}
	for _, c := range []struct {
		name string
		args []string
		want int
		out  string // in stdout (code 1) or stderr (code 2)
	}{
		{"help", []string{"--help"}, 0, ""},
		{"no flags", nil, 2, "no AMQP URL"},
		{"unknown flag", []string{"--nope"}, 2, "flag provided but not defined"},
		{"stray argument", append([]string{"--amqp-url-file", uriFile, "x"}, good...), 2, "unexpected arguments"},
		{"bad callee id", append([]string{"--amqp-url-file", uriFile}, append(good, "--callee", "Lab.CVD")...), 2, "callee id"},
		{"inputs not JSON", append([]string{"--amqp-url-file", uriFile}, append(good, "--inputs", "{")...), 2, "inputs"},
		{"missing URL file", append([]string{"--amqp-url-file", "/nonexistent/uri"}, good...), 2, "amqp-url-file"},
		{"broker unreachable", append([]string{"--amqp-url-file", uriFile}, good...), 1, "checks: 0 pass, "},
		{"callee subcommand, broker unreachable", append([]string{"callee", "--amqp-url-file", uriFile}, good...), 1, "checks: 0 pass, "},
		{"unknown profile", append([]string{"--amqp-url-file", uriFile, "--profile", "strict"}, good...), 2, "profile"},
		{"uppercase id: spec profile", append([]string{"--amqp-url-file", uriFile}, append(good, "--callee", "Lab_CVD")...), 1, "checks: 0 pass, "},
		{"uppercase id: hcp-operator profile", append([]string{"--amqp-url-file", uriFile, "--profile", "hcp-operator"}, append(good, "--callee", "Lab_CVD")...), 2, "callee id"},
		{"report to an unwritable path", append([]string{"--amqp-url-file", uriFile, "--report-json", "/nonexistent/dir/r.json"}, good...), 1, "writing the report"},
		{"caller: no driver", []string{"caller", "--amqp-url-file", uriFile, "--callee", "kit", "--caller", "alpha"}, 2, "no driver"},
		{"caller: help", []string{"caller", "--help"}, 0, "--caller-api"},
		{"caller: broker unreachable", []string{"caller", "--amqp-url-file", uriFile, "--callee", "kit", "--caller", "alpha",
			"--caller-api", "http://127.0.0.1:1", "--app-listen", "127.0.0.1:0", "--timeout", "2s", "--quiet"}, 1, "checks: 0 pass, "},
		{"checks: caller catalog", []string{"checks", "--kit", "caller"}, 0, "| ORD-1 | spec | MUST | L2-session-lifecycle.md:113 (Event Ordering)"},
		{"checks: spec only", []string{"checks", "--profile", "spec"}, 0, "| MSG-1 | spec |"},
		{"checks: unknown kit", []string{"checks", "--kit", "broker"}, 2, "want callee or caller"},
		{"help", []string{"help"}, 0, "hcp-conformance caller"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			got := run(c.args, &stdout, &stderr)
			if got != c.want || !strings.Contains(stdout.String()+stderr.String(), c.out) {
				t.Errorf("exit %d, want %d with %q in the output:\n%s\n%s", got, c.want, c.out, stdout.String(), stderr.String())
			}
		})
	}
}
