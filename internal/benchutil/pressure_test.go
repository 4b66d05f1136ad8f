package benchutil

import (
	"os"
	"runtime"
	"sync"
	"testing"
	"time"
)

// More busy threads than processors make runnable tasks wait: the
// pressure sampled around them grows by a good part of the window, and a
// run's Pressure is that wait over its elapsed time.
func TestSampleCPUCountsTheWaitForAProcessor(t *testing.T) {
	if _, err := os.Stat(pressureFile); err != nil {
		t.Skipf("no CPU pressure information on this kernel: %v", err)
	}
	before := SampleCPU()
	const window = 300 * time.Millisecond
	var wg sync.WaitGroup
	for range runtime.NumCPU() + 2 {
		wg.Go(func() {
			runtime.LockOSThread()
			spin(window)
		})
	}
	wg.Wait()
	d := SampleCPU().Sub(before)
	if d.Waited < window/10 {
		t.Fatalf("%d threads spinning on %d processors for %v: CPU pressure grew by %v, want a good part of the window",
			runtime.NumCPU()+2, runtime.NumCPU(), window, d.Waited)
	}
	r := Result{Elapsed: window, CPU: d}
	if p := r.Pressure(); p <= 0 || p > 1.5 {
		t.Fatalf("Pressure() = %v for %v waited in %v", p, d.Waited, window)
	}
}

func TestPressureWithoutTheInformation(t *testing.T) {
	if p := (Result{Elapsed: time.Second}).Pressure(); p != 0 {
		t.Fatalf("Pressure() = %v without a sample, want 0", p)
	}
}
