package callee

import (
	"context"
	"log"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/harnessclient"
)

// lockedBuffer collects a server's error log.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestEventStreamRefusedStreamPanics: apiEvents enables full
// duplex before lookup, so a stream refused with an ordinary answer (404:
// no such session; likewise a stream that ends early on a bad line) leaves
// its body unread when the handler returns. net/http then reads the rest
// of the body in finishRequest (after abortPendingRead), its end starts the
// connection's background read, and the next Peek for a keep-alive request
// panics: "http: panic serving …: invalid concurrent Body.Read call" (seen
// in the log of TestEventStream). The connection is dropped under a client
// that may already have put it back in its idle pool; harnessclient then
// hangs on it (TestEventStreamReviewOpenFailsInTime), which is how
// TestEventStreamHostileInput hung for 10 minutes once.
func TestEventStreamRefusedStreamPanics(t *testing.T) {
	var errs lockedBuffer
	srv := httptest.NewUnstartedServer((&Sidecar{}).routes())
	srv.Config.ErrorLog = log.New(&errs, "", 0)
	srv.Start()
	defer srv.Close()
	hc := harnessclient.New(srv.URL, "")
	for i := range 20 {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		done := make(chan error, 1)
		go func() { _, err := hc.OpenEventStream(ctx, "4b1c8f0e-2d7a-4c55-9a0e-3f1d2c7b9e10", false); done <- err }()
		select {
		case err := <-done:
			if !isAPIError(err, 404, "not_found") {
				t.Errorf("stream %d to no session: %v, want 404 not_found", i, err)
			}
		case <-time.After(8 * time.Second):
			t.Errorf("stream %d to no session: OpenEventStream still blocked after 8s", i)
		}
		cancel()
		time.Sleep(200 * time.Millisecond)
	}
	if s := errs.String(); strings.Contains(s, "panic") {
		t.Fatalf("the sidecar's HTTP server panicked serving refused streams:\n%s", clipLog(s, 1500))
	}
}

func clipLog(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
