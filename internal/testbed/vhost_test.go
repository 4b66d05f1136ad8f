package testbed_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// stallingAPI answers the management API's vhost requests: the first
// `stalls` of them only after the client has given up, the rest with code.
func stallingAPI(t *testing.T, stalls int32, code int) (*testbed.Broker, *atomic.Int32) {
	t.Helper()
	var seen atomic.Int32
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, "/api/vhosts/") {
			http.NotFound(w, r)
			return
		}
		if seen.Add(1) <= stalls {
			select { // as a vhost operation queued behind a slow one
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(code)
		if code >= 400 {
			_, _ = w.Write([]byte(`{"error":"bad_request","reason":"test"}`))
		}
	}))
	t.Cleanup(func() { close(release); srv.Close() })
	b, err := testbed.NewBroker(srv.URL, "guest", "guest")
	if err != nil {
		t.Fatal(err)
	}
	b.API.SetTimeout(200 * time.Millisecond)
	b.VhostOpTimeout = 10 * time.Second
	return b, &seen
}

// A vhost operation that outlasts a request's timeout (the broker's vhost
// supervisor busy with another vhost) is retried, not failed: CI lost seven
// tests to one such stall.
func TestVhostOpsOutlastAStalledBroker(t *testing.T) {
	b, seen := stallingAPI(t, 2, http.StatusCreated)
	if err := b.CreateVhost("v"); err != nil {
		t.Fatalf("CreateVhost after two stalled attempts: %v", err)
	}
	if got := seen.Load(); got != 3 {
		t.Errorf("PUT attempts: %d, want 3", got)
	}

	b, seen = stallingAPI(t, 1, http.StatusNotFound) // deleted meanwhile
	if err := b.DeleteVhost("v"); err != nil {
		t.Fatalf("DeleteVhost after a stalled attempt, then 404: %v", err)
	}
	if got := seen.Load(); got != 2 {
		t.Errorf("DELETE attempts: %d, want 2", got)
	}
}

// A refusal (4xx) is an answer: one attempt, and the error says so.
func TestVhostOpsDoNotRetryARefusal(t *testing.T) {
	b, seen := stallingAPI(t, 0, http.StatusBadRequest)
	err := b.CreateVhost("v")
	if err == nil || !strings.Contains(err.Error(), "1 attempts") {
		t.Fatalf("CreateVhost answered 400: err %v, want one attempt", err)
	}
	if got := seen.Load(); got != 1 {
		t.Errorf("PUT attempts: %d, want 1", got)
	}
}

// A broker that never answers fails the operation once its time is up,
// with the last attempt's error.
func TestVhostOpsGiveUpAfterTheirTimeout(t *testing.T) {
	b, _ := stallingAPI(t, 1<<30, http.StatusCreated)
	b.VhostOpTimeout = 1500 * time.Millisecond
	start := time.Now()
	err := b.CreateVhost("v")
	if err == nil || !strings.Contains(err.Error(), "Client.Timeout") {
		t.Fatalf("CreateVhost against a broker that never answers: %v", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("gave up after %s, want about 1.5 s", d)
	}
}

// A 5xx (the management API's answer when a vhost's start timed out on
// the node) is retried like a stall.
func TestVhostOpsRetryAServerError(t *testing.T) {
	b, seen := stallingAPI(t, 0, http.StatusInternalServerError)
	b.VhostOpTimeout = 1500 * time.Millisecond
	if err := b.CreateVhost("v"); err == nil {
		t.Fatal("CreateVhost answered 500 every time: no error")
	}
	if got := seen.Load(); got < 2 {
		t.Errorf("PUT attempts: %d, want 2 or more", got)
	}
}
