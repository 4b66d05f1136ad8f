//go:build e2e

package scale

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// repoRoot is the module's root; stackStarted says this run brought the
// local stack up (and stops it at the end).
var (
	repoRoot     string
	stackStarted bool
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The test's own clients and cache log to stderr (controller-runtime
	// prints a warning with a stack trace otherwise).
	ctrl.SetLogger(zap.New(zap.WriteTo(os.Stderr)))
	var err error
	if repoRoot, err = testbed.RepoRoot(); err != nil {
		fmt.Fprintf(os.Stderr, "scale: %v\n", err)
		return 1
	}
	if err := localStack(); err != nil {
		fmt.Fprintf(os.Stderr, "scale: %v\n", err)
		return 1
	}
	code := m.Run()
	if stackStarted && os.Getenv("HCP_SCALE_KEEP_STACK") != "1" {
		cmd := exec.Command(filepath.Join(repoRoot, "hack", "local-stack.sh"), "down")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintf(os.Stderr, "scale: hack/local-stack.sh down: %v\n", err)
		}
	}
	return code
}

// localStack reuses a running local stack (another suite may be using it:
// this one only adds namespaces and a vhost of its own) or brings one up,
// then loads its environment (KUBECONFIG, HCP_STACK_*) into the process.
func localStack() error {
	script := filepath.Join(repoRoot, "hack", "local-stack.sh")
	ctx := context.Background()
	if exec.CommandContext(ctx, script, "status").Run() == nil {
		fmt.Fprintln(os.Stderr, "scale: reusing the running local stack")
	} else {
		if os.Geteuid() != 0 {
			return fmt.Errorf("the local stack is not running and bringing it up needs root (network namespaces, mounts)")
		}
		fmt.Fprintln(os.Stderr, "scale: bringing the local stack up (hack/local-stack.sh up)")
		cmd := exec.CommandContext(ctx, script, "up")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("hack/local-stack.sh up: %w", err)
		}
		stackStarted = true
	}
	out, err := exec.CommandContext(ctx, script, "env").Output()
	if err != nil {
		return fmt.Errorf("hack/local-stack.sh env: %w", err)
	}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(strings.TrimPrefix(line, "export "), "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if err := os.Setenv(k, os.ExpandEnv(strings.Trim(v, `"'`))); err != nil {
			return err
		}
	}
	if os.Getenv("KUBECONFIG") == "" {
		return fmt.Errorf("hack/local-stack.sh env gave no KUBECONFIG:\n%s", out)
	}
	return nil
}
