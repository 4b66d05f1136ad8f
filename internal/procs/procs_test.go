package procs

import (
	"os"
	"runtime"
	"testing"

	"github.com/go-logr/logr"
)

func TestSet(t *testing.T) {
	before := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(before) })
	if before < 2 {
		runtime.GOMAXPROCS(2)
	}
	t.Setenv("GOMAXPROCS", "") // so the environment can be unset below and restored after
	if got := Set(logr.Discard(), 1); got != runtime.GOMAXPROCS(0) || got == 1 {
		t.Errorf("with GOMAXPROCS set, Set(1) = %d and the runtime has %d; want the environment's value kept", got, runtime.GOMAXPROCS(0))
	}
	unsetenv(t)
	if got := Set(logr.Discard(), 1); got != 1 || runtime.GOMAXPROCS(0) != 1 {
		t.Errorf("Set(1) = %d, runtime %d; want 1", got, runtime.GOMAXPROCS(0))
	}
	runtime.GOMAXPROCS(2)
	if got := Set(logr.Discard(), 8); got != 2 || runtime.GOMAXPROCS(0) != 2 {
		t.Errorf("Set(8) with 2 = %d, runtime %d; want 2 (never more than the default)", got, runtime.GOMAXPROCS(0))
	}
}

// unsetenv unsets GOMAXPROCS for the rest of the test (t.Setenv before
// restores it after).
func unsetenv(t *testing.T) {
	t.Helper()
	if err := os.Unsetenv("GOMAXPROCS"); err != nil {
		t.Fatal(err)
	}
}
