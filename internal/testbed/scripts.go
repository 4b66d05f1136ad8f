package testbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ModulePath is the module whose checkout RepoRoot looks for.
const ModulePath = "github.com/hcp-io/hcp-operator"

// RepoRoot returns the root of the hcp-operator checkout: the nearest
// directory at or above the working directory (a test's package directory)
// whose go.mod declares ModulePath.
func RepoRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && declaresModule(data, ModulePath) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("testbed: no go.mod for %s at or above %s", ModulePath, wd)
		}
		dir = parent
	}
}

func declaresModule(goMod []byte, path string) bool {
	for line := range strings.Lines(string(goMod)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "module" && strings.Trim(f[1], `"`) == path {
			return true
		}
	}
	return false
}

// runScript runs hack/<name> from the repository root and returns the last
// non-empty line it printed on stdout (the scripts' result convention) and
// all of its stdout. Its stderr (progress) is streamed to os.Stderr, which
// go test shows for failing packages and with -v, and is quoted in the error.
func runScript(ctx context.Context, name string, args ...string) (last, stdout string, err error) {
	root, err := RepoRoot()
	if err != nil {
		return "", "", err
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", name), args...)
	cmd.Dir = root
	cmd.Stdout = &out
	cmd.Stderr = io.MultiWriter(&errOut, os.Stderr)
	// A daemon the script starts (RabbitMQ) might keep our pipes open; do not
	// wait for it once the script itself has exited.
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Run(); err != nil {
		return "", out.String(), fmt.Errorf("hack/%s %s: %w\n%s", name, strings.Join(args, " "), err, tail(errOut.String(), 4000))
	}
	stdout = out.String()
	for l := range strings.Lines(stdout) {
		if l = strings.TrimSpace(l); l != "" {
			last = l
		}
	}
	if last == "" {
		return "", stdout, fmt.Errorf("hack/%s printed nothing on stdout\n%s", name, tail(errOut.String(), 4000))
	}
	return last, stdout, nil
}

// once caches the result of a slow, machine-wide step for the whole test
// process; a failure is cached too, so a broken step fails fast everywhere.
type once[T any] struct {
	once sync.Once
	val  T
	err  error
}

func (o *once[T]) do(f func() (T, error)) (T, error) {
	o.once.Do(func() { o.val, o.err = f() })
	return o.val, o.err
}

// withFileLock holds an exclusive flock on path while f runs. Test packages
// run as parallel processes; this keeps them from building the same thing in
// the same directory at once (the scripts themselves are idempotent).
func withFileLock(path string, f func() error) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	lf, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer func() { _ = lf.Close() }() // closing releases the lock
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", path, err)
	}
	defer syscall.Flock(int(lf.Fd()), syscall.LOCK_UN) //nolint:errcheck // closing releases it anyway
	return f()
}

func cacheDir() string {
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "hcp-operator")
	}
	if d, err := os.UserHomeDir(); err == nil {
		return filepath.Join(d, ".cache", "hcp-operator")
	}
	return filepath.Join(os.TempDir(), "hcp-operator")
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
