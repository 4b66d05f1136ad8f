// Command hcp-conformance checks an HCP peer against the specification
// and prints one pass/fail row per spec statement, each citing its file
// and line. See docs/conformance-kit.md.
//
//	hcp-conformance callee [flags]   play a caller against the callee under test
//	hcp-conformance caller [flags]   play a callee against the caller under test
//	hcp-conformance checks [flags]   list the checks of a kit and profile
//
// Without a subcommand, the flags are the callee kit's (as before the
// caller kit existed).
//
// Exit status: 0 all checks passed (or were skipped), 1 a check failed,
// 2 usage error.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/conformance"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "callee":
			return runCallee(args[1:], stdout, stderr)
		case "caller":
			return runCaller(args[1:], stdout, stderr)
		case "checks":
			return runChecks(args[1:], stdout, stderr)
		case "help", "-h", "--help", "-help":
			usage(stderr)
			return 0
		}
	}
	return runCallee(args, stdout, stderr)
}

func usage(w io.Writer) {
	_, _ = fmt.Fprint(w, `Usage:
  hcp-conformance callee --amqp-url URI --callee ID --caller ID --capability NAME [flags]
  hcp-conformance caller --amqp-url URI --callee ID --caller ID --caller-api URL [flags]
  hcp-conformance checks [--kit callee|caller] [--profile spec|hcp-operator]

callee: the kit plays a caller and checks the callee under test (also without a subcommand).
caller: the kit plays a callee and checks the caller under test.
Each prints one row per spec statement; 'hcp-conformance KIT --help' lists the flags.
Exit status: 0 pass, 1 a check failed, 2 usage error.
`)
}

// common are the flags both kits take.
type common struct {
	urlFile, profile, jsonPath, junitPath string
	quiet                                 bool
}

func (c *common) bind(fs *flag.FlagSet, amqpURL, vhost, mgmt *string, timeout *time.Duration) {
	fs.StringVar(amqpURL, "amqp-url", "", "AMQP URI of the kit's broker user (amqp[s]://user:pass@host:port/vhost); default $HCP_CONFORMANCE_AMQP_URL")
	fs.StringVar(&c.urlFile, "amqp-url-file", "", "read the AMQP URI from this file (e.g. the key uri of a credentials Secret)")
	fs.StringVar(vhost, "vhost", "", "vhost; overrides the URL's")
	fs.StringVar(mgmt, "management-url", "", "RabbitMQ management API, http(s)://user:pass@host:15672; without it the checks that need it are skipped")
	fs.DurationVar(timeout, "timeout", conformance.DefaultTimeout, "bound of each wait")
	fs.StringVar(&c.profile, "profile", conformance.ProfileSpec, "checks to run: spec (what the specification says) or hcp-operator (adds this project's stricter choices)")
	fs.StringVar(&c.jsonPath, "report-json", "", "also write the report as JSON to this file")
	fs.StringVar(&c.junitPath, "report-junit", "", "also write the report as JUnit XML to this file")
	fs.BoolVar(&c.quiet, "quiet", false, "no progress lines on stderr")
}

// url fills the AMQP URL from the file or the environment.
func (c *common) url(u *string, stderr io.Writer) bool {
	if *u == "" && c.urlFile != "" {
		b, err := os.ReadFile(c.urlFile)
		if err != nil {
			_, _ = fmt.Fprintf(stderr, "hcp-conformance: --amqp-url-file: %v\n", err)
			return false
		}
		*u = strings.TrimSpace(string(b))
	}
	if *u == "" {
		*u = os.Getenv("HCP_CONFORMANCE_AMQP_URL")
	}
	return true
}

// parse parses flags: ok false with the exit code on help or an error.
func parse(fs *flag.FlagSet, args []string, stderr io.Writer) (int, bool) {
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return 0, false
		}
		return 2, false
	}
	if fs.NArg() > 0 {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: unexpected arguments %q\n", fs.Args())
		return 2, false
	}
	return 0, true
}

// finish prints the report, writes its files and returns the exit code.
func finish(rep conformance.Report, header string, c *common, stdout, stderr io.Writer) int {
	_, _ = fmt.Fprintf(stdout, "%s, profile %s, %s, %s\n\n", header, rep.Profile,
		rep.Started.Format(time.RFC3339), rep.Duration.Round(100*time.Millisecond))
	if rep.Broker.MaxMessageSize > 0 {
		_, _ = fmt.Fprintf(stdout, "Broker max_message_size: %d bytes\n\n", rep.Broker.MaxMessageSize)
	}
	if err := rep.Print(stdout); err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: %v\n", err)
		return 1
	}
	if err := rep.WriteFiles(c.jsonPath, c.junitPath); err != nil {
		_, _ = fmt.Fprintf(stderr, "hcp-conformance: writing the report: %v\n", err)
		return 1
	}
	if rep.Failed() {
		return 1
	}
	return 0
}

func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// runChecks lists a kit's catalog.
func runChecks(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("hcp-conformance checks", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kit := fs.String("kit", "callee", "callee or caller")
	profile := fs.String("profile", conformance.ProfileHCPOperator, "spec or hcp-operator (every check)")
	if code, ok := parse(fs, args, stderr); !ok {
		return code
	}
	var cat []conformance.Check
	switch *kit {
	case "callee":
		cat = conformance.Checks()
	case "caller":
		cat = conformance.CallerChecks()
	default:
		_, _ = fmt.Fprintf(stderr, "hcp-conformance checks: --kit %q: want callee or caller\n", *kit)
		return 2
	}
	_, _ = fmt.Fprintf(stdout, "| ID | Profile | Level | Cites | Statement |\n| --- | --- | --- | --- | --- |\n")
	for _, c := range cat {
		if c.Profile == conformance.ProfileHCPOperator && *profile != conformance.ProfileHCPOperator {
			continue
		}
		level := c.Level
		if level == "" {
			level = "normative"
		}
		_, _ = fmt.Fprintf(stdout, "| %s | %s | %s | %s | %s |\n", c.ID, c.Profile, level, strings.ReplaceAll(c.Cite().String(), "|", `\|`), c.Statement)
	}
	return 0
}
