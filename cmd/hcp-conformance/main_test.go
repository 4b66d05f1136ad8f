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
