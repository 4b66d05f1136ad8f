// Package procs sets how many processors (GOMAXPROCS) the Go runtime of
// the sidecar schedules goroutines on.
//
// The sidecar is a relay: per event it reads a socket, writes a log
// record and a frame, and wakes the goroutine that waits for the answer.
// With more than one processor each of those hand-offs wakes an idle
// thread on another processor (a futex wake-up and a scheduler pass),
// which at paced rates costs more than the work itself. With one, the
// woken goroutine runs on the same thread once the current one blocks,
// and the idle thread waits in the network poller. Measured with each
// sidecar as a process of its own (BenchmarkCalleeCPU, BenchmarkCallerCPU,
// 2026-11-30, docs/performance.md): about a fifth less CPU per event at
// 1,000 events/s, and no less throughput at full speed. Blocking system
// calls (fsync, file writes) still run on threads of their own.
package procs

import (
	"os"
	"runtime"

	"github.com/go-logr/logr"
)

// Sidecar is the sidecar's processor count unless GOMAXPROCS is set.
const Sidecar = 1

// Set sets the runtime's processors to n, at most the runtime's default
// (the machine's CPUs, or the container's CPU limit), unless GOMAXPROCS
// is set in the environment: that one wins, as with any Go program. It
// returns the processors in use.
func Set(log logr.Logger, n int) int {
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		log.V(1).Info("GOMAXPROCS is set in the environment; the processors are left as they are", "GOMAXPROCS", v)
		return runtime.GOMAXPROCS(0)
	}
	if n < 1 || n >= runtime.GOMAXPROCS(0) {
		return runtime.GOMAXPROCS(0)
	}
	runtime.GOMAXPROCS(n)
	log.V(1).Info("Set the processors the Go runtime schedules on", "GOMAXPROCS", n)
	return n
}
