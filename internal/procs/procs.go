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
// 1,000 events/s, and no less throughput at full speed for streams.
// Blocking system calls (fsync, file writes) still run on threads of
// their own.
package procs

import (
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/go-logr/logr"
)

// Sidecar is the sidecar's processor count unless GOMAXPROCS is set or
// its container's CPU limit is more than one core.
const Sidecar = 1

// CgroupRoot is where the container's cgroup is mounted.
const CgroupRoot = "/sys/fs/cgroup"

// Set sets the runtime's processors to n, unless GOMAXPROCS is set in the
// environment (that one wins, as with any Go program), or the container
// has a CPU limit above n cores under root (then the runtime's own
// default stands: the limit rounded up, at most the machine's CPUs; a
// user who gives the sidecar more than a core gets it used). It never
// raises the runtime's default, and returns the processors in use.
func Set(log logr.Logger, n int, root string) int {
	if v, ok := os.LookupEnv("GOMAXPROCS"); ok {
		log.V(1).Info("GOMAXPROCS is set in the environment; the processors are left as they are", "GOMAXPROCS", v)
		return runtime.GOMAXPROCS(0)
	}
	if limit, ok := CPULimit(root); ok && math.Ceil(limit) > float64(n) {
		log.V(1).Info("The container's CPU limit is above the sidecar's processors; the runtime's default stands", "cpuLimit", limit, "GOMAXPROCS", runtime.GOMAXPROCS(0))
		return runtime.GOMAXPROCS(0)
	}
	if n < 1 || n >= runtime.GOMAXPROCS(0) {
		return runtime.GOMAXPROCS(0)
	}
	runtime.GOMAXPROCS(n)
	log.V(1).Info("Set the processors the Go runtime schedules on", "GOMAXPROCS", n)
	return n
}

// CPULimit reads the CPU limit (in cores) of the cgroup mounted at root:
// cgroup v2's cpu.max, or v1's cpu/cpu.cfs_quota_us over
// cpu.cfs_period_us. ok is false without one (no file, "max", -1).
func CPULimit(root string) (cores float64, ok bool) {
	if b, err := os.ReadFile(filepath.Join(root, "cpu.max")); err == nil {
		f := strings.Fields(string(b))
		if len(f) != 2 || f[0] == "max" {
			return 0, false
		}
		return ratio(f[0], f[1])
	}
	q, errQ := os.ReadFile(filepath.Join(root, "cpu", "cpu.cfs_quota_us"))
	p, errP := os.ReadFile(filepath.Join(root, "cpu", "cpu.cfs_period_us"))
	if errQ != nil || errP != nil {
		return 0, false
	}
	return ratio(strings.TrimSpace(string(q)), strings.TrimSpace(string(p)))
}

func ratio(quota, period string) (float64, bool) {
	q, errQ := strconv.ParseFloat(quota, 64)
	p, errP := strconv.ParseFloat(period, 64)
	if errQ != nil || errP != nil || q <= 0 || p <= 0 {
		return 0, false
	}
	return q / p, true
}
