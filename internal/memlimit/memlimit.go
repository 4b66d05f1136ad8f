// Package memlimit tunes the Go runtime's memory use. It sets the soft
// memory limit (GOMEMLIMIT) from the container's memory limit, so that the
// garbage collector works harder as the heap nears the limit instead of
// the kernel killing the process: the manager while it caches many
// objects, a sidecar under a burst of sessions. Without it the runtime
// ignores the cgroup and grows the heap to twice what is live. It also
// sets the manager's garbage collection target (SetGCPercent).
package memlimit

import (
	"errors"
	"log/slog"
	"os"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/go-logr/logr"
)

// DefaultRatio is the share of the container's limit given to the Go
// heap; the rest is headroom for what the runtime does not count (stacks
// beyond the heap, the binary's pages, cgo).
const DefaultRatio = 0.9

// Set sets the limit to DefaultRatio of the cgroup's memory limit (or
// the ratio in AUTOMEMLIMIT; AUTOMEMLIMIT=off turns it off) and logs it.
// It leaves a GOMEMLIMIT set in the environment alone and does nothing
// without a cgroup limit. It returns the limit set, 0 for none.
func Set(log logr.Logger, provider memlimit.Provider) int64 {
	limit, err := memlimit.SetGoMemLimitWithOpts(
		memlimit.WithRatio(DefaultRatio),
		memlimit.WithProvider(provider),
		memlimit.WithLogger(slog.New(logr.ToSlogHandler(log.V(1)))),
	)
	switch {
	case err == nil && limit > 0:
		log.Info("Set the Go memory limit from the container's", "GOMEMLIMIT", limit)
	case err != nil && !errors.Is(err, memlimit.ErrNoLimit):
		log.Info("Could not read the container's memory limit; the Go memory limit is left as it is", "reason", err.Error())
	}
	return limit
}

// FromCgroup is the provider of a process in a container: its cgroup's
// memory limit (v1 or v2).
var FromCgroup memlimit.Provider = memlimit.FromCgroup

// ManagerGCPercent is the manager's garbage collection target (GOGC):
// the heap may grow by half of what is live before a collection, not by
// all of it. Most of the manager's live heap is its cache, which stays;
// with Go's default of 100 the RSS is about twice the cache. A collection
// marks the whole cache, so collecting twice as often costs CPU, but the
// manager allocates little once the objects are Ready (docs/troubleshooting.md,
// "Memory limits", has the figures).
const ManagerGCPercent = 50

// SetGCPercent sets the garbage collection target to percent unless
// GOGC is set in the environment.
func SetGCPercent(log logr.Logger, percent int) {
	if v, ok := os.LookupEnv("GOGC"); ok {
		log.V(1).Info("GOGC is set in the environment; the garbage collection target is left as it is", "GOGC", v)
		return
	}
	debug.SetGCPercent(percent)
	log.Info("Set the garbage collection target", "GOGC", percent)
}
