package memlimit

import (
	"os"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr/testr"
)

func TestSetFromTheContainerLimit(t *testing.T) {
	unsetenv(t, "GOMEMLIMIT", "AUTOMEMLIMIT")
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })

	limit, ratio := uint64(512<<20), DefaultRatio
	want := int64(float64(limit) * ratio)
	if got := Set(testr.New(t), memlimit.Limit(512<<20)); got != want {
		t.Fatalf("Set = %d, want 90 %% of 512 MiB", got)
	}
	if got := debug.SetMemoryLimit(-1); got != want {
		t.Fatalf("runtime memory limit %d, want 90 %% of 512 MiB", got)
	}
}

func TestSetLeavesAnExplicitLimit(t *testing.T) {
	t.Setenv("GOMEMLIMIT", "100MiB")
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	if got := Set(testr.New(t), memlimit.Limit(512<<20)); got != 0 {
		t.Fatalf("Set = %d with GOMEMLIMIT in the environment, want 0 (left alone)", got)
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("runtime memory limit changed to %d", got)
	}
}

func TestSetWithoutALimit(t *testing.T) {
	unsetenv(t, "GOMEMLIMIT", "AUTOMEMLIMIT")
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	noLimit := func() (uint64, error) { return 0, memlimit.ErrNoLimit }
	if got := Set(testr.New(t), noLimit); got != 0 {
		t.Fatalf("Set = %d without a container limit, want 0", got)
	}
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Fatalf("runtime memory limit changed to %d", got)
	}
}

func TestSetGCPercent(t *testing.T) {
	unsetenv(t, "GOGC")
	before := debug.SetGCPercent(-1)
	debug.SetGCPercent(before)
	t.Cleanup(func() { debug.SetGCPercent(before) })
	SetGCPercent(testr.New(t), ManagerGCPercent)
	if got := debug.SetGCPercent(before); got != ManagerGCPercent {
		t.Fatalf("runtime GC percent %d, want %d", got, ManagerGCPercent)
	}
}

func TestSetGCPercentLeavesAnExplicitGOGC(t *testing.T) {
	t.Setenv("GOGC", "200")
	before := debug.SetGCPercent(200) // as the runtime read it at start
	t.Cleanup(func() { debug.SetGCPercent(before) })
	SetGCPercent(testr.New(t), ManagerGCPercent)
	if got := debug.SetGCPercent(200); got != 200 {
		t.Fatalf("runtime GC percent changed to %d", got)
	}
}

// unsetenv removes keys from the environment for the test (t.Setenv
// restores them after).
func unsetenv(t *testing.T, keys ...string) {
	for _, k := range keys {
		t.Setenv(k, "")
		if err := os.Unsetenv(k); err != nil {
			t.Fatal(err)
		}
	}
}
