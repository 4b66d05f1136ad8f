//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// history records every version of the run's HCPSessions that a watch
// sees: what `kubectl get hcpsessions -w` shows.
type history struct {
	mu    sync.Mutex
	lines map[string][]histLine
}

type histLine struct {
	At          time.Time
	State       hcpv1alpha1.SessionState
	Progress    string
	LastSeq     int64
	Events      int64
	CallerAcked int64
}

// watchSessions watches the run's HCPSessions until t ends.
func (s *suite) watchSessions(t *testing.T) *history {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := s.c.Watch(ctx, &hcpv1alpha1.HCPSessionList{}, client.InNamespace(s.ns))
	if err != nil {
		cancel()
		t.Fatalf("watch HCPSessions: %v", err)
	}
	h := &history{lines: map[string][]histLine{}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			hs, ok := ev.Object.(*hcpv1alpha1.HCPSession)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
				continue
			}
			l := histLine{At: time.Now(), State: hs.Status.State, LastSeq: hs.Status.LastSequence, Events: hs.Status.EventCount, CallerAcked: hs.Status.CallerAckedSequence}
			if p := hs.Status.Progress; p != nil && p.Percent != nil {
				l.Progress = fmt.Sprintf("%d%%", *p.Percent)
			}
			h.mu.Lock()
			h.lines[hs.Name] = append(h.lines[hs.Name], l)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); cancel(); <-done })
	return h
}

func (h *history) of(name string) []histLine {
	h.mu.Lock()
	defer h.mu.Unlock()
	return slices.Clone(h.lines[name])
}

func formatHistory(lines []histLine) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "%-12s  %-10s  %-8s  %-4s  %-6s  %s\n", "TIME", "STATE", "PROGRESS", "SEQ", "EVENTS", "CALLER-ACKED")
	for _, l := range lines {
		state := string(l.State)
		if state == "" {
			state = "<none>"
		}
		fmt.Fprintf(&sb, "%-12s  %-10s  %-8s  %-4d  %-6d  %d\n", l.At.Format("15:04:05.000"), state, l.Progress, l.LastSeq, l.Events, l.CallerAcked)
	}
	return sb.String()
}

// isSubsequence reports whether got follows the order of want, skipping
// any of its elements (coalesced status writes may skip a state).
func isSubsequence[T comparable](got, want []T) bool {
	i := 0
	for _, g := range got {
		for i < len(want) && want[i] != g {
			i++
		}
		if i == len(want) {
			return false
		}
	}
	return true
}

// maxOverlap is the largest number of the sessions whose event streams
// (first to last event, as the app received them) overlapped in time.
func maxOverlap(snap samplecaller.Snapshot, ids []string) int {
	type edge struct {
		at    time.Time
		delta int
	}
	var edges []edge
	for _, id := range ids {
		s := snap.Sessions[id]
		if s == nil || len(s.Messages) == 0 {
			continue
		}
		edges = append(edges, edge{s.Messages[0].At, +1}, edge{s.Messages[len(s.Messages)-1].At, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].at.Equal(edges[j].at) {
			return edges[i].delta < edges[j].delta // ends before starts
		}
		return edges[i].at.Before(edges[j].at)
	})
	n, best := 0, 0
	for _, e := range edges {
		n += e.delta
		best = max(best, n)
	}
	return best
}

// eventually fails the test unless check returns nil within timeout,
// checking every pollInterval. The failure quotes the last error that
// says something: a check cut short by the deadline itself ("context
// deadline exceeded") does not hide what the previous attempts saw.
func eventually(t testing.TB, timeout time.Duration, what string, check func(context.Context) error) {
	t.Helper()
	if err := poll(t.Context(), timeout, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

const pollInterval = 250 * time.Millisecond

func poll(ctx context.Context, timeout time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	var last error
	for {
		err := check(ctx)
		if err == nil {
			return nil
		}
		if last == nil || ctx.Err() == nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("not after %s: %w", timeout, last)
		case <-tick.C:
		}
	}
}
