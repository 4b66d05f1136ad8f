package procs

import (
	"os"
	"os/exec"
	"runtime"
	"testing"
	"time"
)

const idleHelperEnv = "HCP_PROCS_IDLE_HELPER"

// BenchmarkIdleProcess is what a Go process with one processor that has
// nothing to do but a timer a second costs in CPU, with the runtime's
// defaults and with GODEBUG=schedtrace=2147483647 (docs/performance.md,
// "Choosing settings": the runtime's monitor thread then never sleeps
// longer than 10 ms, so it is not woken after every idle spell, which
// saves a paced sidecar a third of its CPU per event but costs this).
// Each run is a process of its own, idle for 10 s; cpu-ms/s is its
// user+sys time per second.
//
//	go test -run '^$' -bench BenchmarkIdleProcess -benchtime 1x -count 3 ./internal/procs
func BenchmarkIdleProcess(b *testing.B) {
	for _, godebug := range []string{"", "schedtrace=2147483647"} {
		b.Run("GODEBUG="+godebug, func(b *testing.B) {
			var total time.Duration
			for range b.N {
				cmd := exec.Command(os.Args[0], "-test.run=^TestHelperIdleProcess$", "-test.count=1")
				cmd.Env = append(os.Environ(), idleHelperEnv+"=10s", "GODEBUG="+godebug)
				if out, err := cmd.CombinedOutput(); err != nil {
					b.Fatalf("idle helper: %v\n%s", err, out)
				}
				total += cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
			}
			b.ReportMetric(float64(total.Microseconds())/1e3/(10*float64(b.N)), "cpu-ms/s")
		})
	}
}

// TestHelperIdleProcess is BenchmarkIdleProcess's process: one processor,
// a timer a second, nothing else, for the duration in idleHelperEnv.
func TestHelperIdleProcess(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv(idleHelperEnv))
	if err != nil {
		t.Skip("helper process of BenchmarkIdleProcess")
	}
	runtime.GOMAXPROCS(1)
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); {
		<-tick.C
	}
}
