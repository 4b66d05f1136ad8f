package procs

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/go-logr/logr"
)

func TestSet(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	none := t.TempDir() // no cgroup files: no limit
	runtime.GOMAXPROCS(2)
	t.Setenv("GOMAXPROCS", "") // so the environment can be unset below and restored after
	if got := Set(logr.Discard(), 1, none); got != 2 || runtime.GOMAXPROCS(0) != 2 {
		t.Errorf("with GOMAXPROCS set, Set(1) = %d and the runtime has %d; want the environment's value kept (2)", got, runtime.GOMAXPROCS(0))
	}
	unsetenv(t)
	if got := Set(logr.Discard(), 1, none); got != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("Set(1) = %d, runtime %d; want 1", got, runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(2)
	if got := Set(logr.Discard(), 8, none); got != 2 || runtime.GOMAXPROCS(0) != 2 {
		t.Errorf("Set(8) with 2 = %d, runtime %d; want 2 (never more than the default)", got, runtime.GOMAXPROCS(0))
	}
	// A container limited to 1.5 cores: the runtime's default (2 here)
	// stands; limited to half a core: one processor.
	v2 := cgroup(t, map[string]string{"cpu.max": "150000 100000\n"})
	if got := Set(logr.Discard(), 1, v2); got != 2 {
		t.Errorf("with a CPU limit of 1.5 cores Set(1) = %d; want the runtime's 2", got)
	}
	half := cgroup(t, map[string]string{"cpu.max": "50000 100000\n"})
	if got := Set(logr.Discard(), 1, half); got != 1 {
		t.Errorf("with a CPU limit of half a core Set(1) = %d; want 1", got)
	}
}

func TestCPULimit(t *testing.T) {
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  float64
		ok    bool
	}{
		{"none", nil, 0, false},
		{"v2 unlimited", map[string]string{"cpu.max": "max 100000\n"}, 0, false},
		{"v2 two cores", map[string]string{"cpu.max": "200000 100000\n"}, 2, true},
		{"v2 malformed", map[string]string{"cpu.max": "lots\n"}, 0, false},
		{"v1 unlimited", map[string]string{"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0, false},
		{"v1 a quarter", map[string]string{"cpu/cpu.cfs_quota_us": "25000\n", "cpu/cpu.cfs_period_us": "100000\n"}, 0.25, true},
	} {
		got, ok := CPULimit(cgroup(t, tc.files))
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: CPULimit = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// cgroup makes a cgroup root with files (path: content).
func cgroup(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// unsetenv unsets GOMAXPROCS for the rest of the test (t.Setenv before
// restores it after).
func unsetenv(t *testing.T) {
	t.Helper()
	if err := os.Unsetenv("GOMAXPROCS"); err != nil {
		t.Fatal(err)
	}
}
