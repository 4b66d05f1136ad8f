package relay

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// TestNoGoroutineLeakAfterSessions: two rounds of 50 concurrent sessions
// stream through the relay and end; after the second the sidecars' own
// goroutines (both sidecars run in this process) return to what they were
// after the first, so none is left per session. HTTP keep-alive connections are
// left out of the count: their pools are sized by concurrency, not by
// sessions, and close when idle.
func TestNoGoroutineLeakAfterSessions(t *testing.T) {
	const sessions, events = 50, 1000
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()

	// A first round of sessions grows the pools sized by concurrency (the
	// status writers' workers, HTTP connections) to their size; the second
	// round must then leave exactly as many goroutines as the first.
	r := newRelayRun(t, modeAsync, sessions)
	defer r.close()
	_, err := r.run(ctx, benchutil.Config{Messages: events})
	must(t, err)
	before := settledSidecarGoroutines(t, ctx, -1)

	var peak int
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			peak = max(peak, sidecarGoroutines())
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	_, err = r.run(ctx, benchutil.Config{Messages: events})
	close(stop)
	<-done
	must(t, err)
	after := settledSidecarGoroutines(t, ctx, before)
	t.Logf("sidecar goroutines: %d after a first round of %d sessions, %d at the peak of the second round, %d after it ended",
		before, sessions, peak, after)
	if after > before {
		t.Fatalf("%d sidecar goroutines after %d sessions ended, %d before: %.1f left per session", after, sessions, before, float64(after-before)/sessions)
	}
}

// settledSidecarGoroutines waits until the count of sidecar goroutines is
// at most want (any, when want < 0) and has not changed for 3 s (longer
// than a finished session's worker lingers), and returns it.
func settledSidecarGoroutines(t testing.TB, ctx context.Context, want int) int {
	t.Helper()
	n, err := settleSidecarGoroutines(ctx, want)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// settleSidecarGoroutines is settledSidecarGoroutines returning an error
// (with a goroutine dump) instead of failing, and the last count.
func settleSidecarGoroutines(ctx context.Context, want int) (int, error) {
	n, since := -1, time.Now()
	err := testbed.Poll(ctx, time.Minute, func(context.Context) error {
		cur := sidecarGoroutines()
		if cur != n {
			n, since = cur, time.Now()
		}
		switch {
		case want >= 0 && n > want:
			return fmt.Errorf("%d sidecar goroutines, want at most %d", n, want)
		case time.Since(since) < 3*time.Second:
			return fmt.Errorf("%d sidecar goroutines, not settled", n)
		}
		return nil
	})
	if err != nil {
		var b bytes.Buffer
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		return n, fmt.Errorf("%w\n%s", err, b.String())
	}
	return n, nil
}

// sidecarGoroutines counts the goroutines running the sidecars' code (the
// packages under internal/sidecar and internal/transport), leaving out
// idle HTTP connections.
func sidecarGoroutines() int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	n := 0
	for _, block := range strings.Split(b.String(), "\n\n") {
		head, _, _ := strings.Cut(block, " @ ")
		count, err := strconv.Atoi(strings.TrimSpace(head))
		if err != nil {
			continue
		}
		if (strings.Contains(block, "hcp-operator/internal/sidecar/") || strings.Contains(block, "hcp-operator/internal/transport.")) &&
			!strings.Contains(block, "net/http.(*persistConn)") && !strings.Contains(block, "net/http.(*conn).serve") {
			n += count
		}
	}
	return n
}
