//go:build e2e

package scale

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
)

// clockTick is the unit of utime and stime in /proc/PID/stat (USER_HZ,
// 100 on every Linux architecture Go runs on).
const clockTick = 10 * time.Millisecond

// cpuByProcess is the CPU time (user + system) of this machine's
// processes so far, summed by command name (/proc/PID/comm, at most 15
// bytes: "kube-apiserver", "etcd", "messaging-topo" …). Processes that
// ended are not counted, so compare two samples only over a window in
// which the processes of interest live.
type cpuByProcess map[string]time.Duration

func sampleCPU() cpuByProcess {
	out := cpuByProcess{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // ended meanwhile
		}
		// pid (comm) state ppid … utime stime: comm may hold spaces and
		// parentheses, so split after its last ')'.
		s := string(b)
		open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 13 {
			continue
		}
		ut, err1 := strconv.ParseInt(fields[11], 10, 64)
		st, err2 := strconv.ParseInt(fields[12], 10, 64)
		if err1 != nil || err2 != nil {
			continue
		}
		out[s[open+1:end]] += time.Duration(ut+st) * clockTick
	}
	return out
}

// since is the CPU each process name used between before and c, the
// largest first, as "name 12.3 s" for those above 0.5 s.
func (c cpuByProcess) since(before cpuByProcess) string {
	type use struct {
		name string
		d    time.Duration
	}
	var all []use
	var total time.Duration
	for name, d := range c {
		if d -= before[name]; d > 0 {
			total += d
			if d >= 500*time.Millisecond {
				all = append(all, use{name, d})
			}
		}
	}
	slices.SortFunc(all, func(a, b use) int { return int(b.d - a.d) })
	parts := make([]string, 0, len(all))
	for _, u := range all {
		parts = append(parts, fmt.Sprintf("%s %.1f s", u.name, u.d.Seconds()))
	}
	return fmt.Sprintf("%.1f s in all: %s", total.Seconds(), strings.Join(parts, ", "))
}

// apiRequests is the API server's count of requests so far, from every
// client, by verb and resource (benchutil.APIWrites, every verb); empty
// when its metrics cannot be read.
type apiRequests benchutil.APIWrites

func (b *bed) apiRequests(ctx context.Context) apiRequests {
	w, err := benchutil.ReadAPIRequests(ctx, b.api)
	if err != nil {
		b.t.Logf("API server metrics: %v", err)
		return apiRequests{}
	}
	return apiRequests(w)
}

// apiUse is what the API server served in a phase: its writes and its
// reads, each as apiRequests.since prints them.
type apiUse struct{ writes, reads string }

func (w apiRequests) use(before apiRequests) apiUse {
	all := benchutil.APIWrites(w)
	prev := benchutil.APIWrites(before)
	return apiUse{writes: since(all.Writes(), prev.Writes()), reads: since(all.Reads(), prev.Reads())}
}

// since is the requests between before and w, the most first, as
// "APPLY apps/deployments 400" for those above 1 % of the total.
func since(w, before benchutil.APIWrites) string {
	type n struct {
		what string
		v    float64
	}
	var all []n
	var total float64
	for k, v := range w {
		if v -= before[k]; v > 0 {
			total += v
			all = append(all, n{k, v})
		}
	}
	slices.SortFunc(all, func(a, b n) int { return int(b.v - a.v) })
	parts := []string{}
	for _, x := range all {
		if x.v >= total/100 {
			parts = append(parts, fmt.Sprintf("%s %.0f", x.what, x.v))
		}
	}
	return fmt.Sprintf("%.0f in all: %s", total, strings.Join(parts, ", "))
}

// startAPIProfile starts the API server's CPU profile of the next
// apiProfileFor into <prefix>-<phase>.pprof (nothing when prefix is
// empty); the function it returns waits for it and says where it went.
func (b *bed) startAPIProfile(ctx context.Context, prefix, phase string) func() {
	if prefix == "" {
		return func() {}
	}
	path := prefix + "-" + phase + ".pprof"
	done := make(chan error, 1)
	go func() {
		raw, err := b.api.Get().AbsPath("/debug/pprof/profile").Param("seconds", strconv.Itoa(int(apiProfileFor.Seconds()))).
			Timeout(apiProfileFor + 15*time.Second).DoRaw(ctx)
		if err == nil {
			err = os.WriteFile(path, raw, 0o644)
		}
		done <- err
	}()
	return func() {
		if err := <-done; err != nil {
			b.t.Errorf("API server CPU profile (%s): %v", phase, err)
			return
		}
		b.t.Logf("API server CPU profile of the first %s of the %s phase: %s (go tool pprof -top %s)", apiProfileFor, phase, path, path)
	}
}
