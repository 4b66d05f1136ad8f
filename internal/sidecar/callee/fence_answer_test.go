package callee

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// A 2xx tells the harness to go on with its task, so none is given while
// the replica cannot vouch for the session. The failure it prevents, seen
// in make chaos (owning sidecar paused past its Lease): a step's event was
// published just before the pause and its answer never reached the
// harness; the harness's retry, with the same idempotency key, was
// answered 200 by the resumed sidecar from its key table, before the
// re-read found the session taken over, and the harness ran the next step
// beside the new owner.
func TestRetriedEventIsFenced(t *testing.T) {
	f := newFenceFixture(t)
	ctx := t.Context()
	m, err := session.Restore(session.StateRunning, f.clk.Now(), f.clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	f.ss.machine = m
	f.ss.keys.Put("step-11", 7)
	retry := []harnessEvent{{EventType: session.EventProgress, IdempotencyKey: "step-11"}}
	if _, seqs, e := f.ss.publishEvents(ctx, retry); e != nil || len(seqs) != 1 || seqs[0] != 7 {
		t.Fatalf("a retry while the owner is confirmed: %v %v, want sequence 7", seqs, e)
	}

	f.clk.Step(51 * time.Second) // paused past the Lease
	_, seqs, e := f.ss.publishEvents(ctx, retry)
	if e == nil || e.status != http.StatusServiceUnavailable || e.body.Code != codeFenced {
		t.Fatalf("a retry while the Lease has lapsed: sequences %v, error %+v; want 503 %s", seqs, e, codeFenced)
	}

	// Another replica took the session over; the resumed replica renews
	// its Lease and re-reads the session.
	f.takenOver(t)
	if err := f.k.Acquire(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, e := f.ss.publishEvents(ctx, retry); e == nil || e.status != http.StatusServiceUnavailable {
		t.Fatalf("a retry after the renewal, before the re-read: %+v, want 503", e)
	}
	f.s.revalidate(ctx)
	if _, _, e := f.ss.publishEvents(ctx, retry); e == nil || e.status != http.StatusConflict || e.body.Code != codeOwnershipLost {
		t.Fatalf("a retry after the re-read found epoch 2: %+v, want 409 %s", e, codeOwnershipLost)
	}
}

// A call that passed the fence and then waited (for its confirms, or in a
// paused process) is answered by what the fence says when it answers.
func TestAnswerAfterTheLapseIsFenced(t *testing.T) {
	f := newFenceFixture(t)
	r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/hcp/v1/sessions/s1/events", nil)
	w := httptest.NewRecorder()
	respond(w, r, f.ss, nil, map[string]any{"sequence": 7})
	if w.Code != http.StatusOK {
		t.Fatalf("answer while the owner is confirmed: %d %s", w.Code, w.Body)
	}
	f.clk.Step(51 * time.Second)
	for _, prefer := range []string{"", "respond-async"} {
		r.Header.Set("Prefer", prefer)
		w = httptest.NewRecorder()
		respond(w, r, f.ss, nil, map[string]any{"sequence": 7})
		if w.Code != http.StatusServiceUnavailable {
			t.Fatalf("answer (Prefer %q) after the Lease lapsed: %d %s, want 503", prefer, w.Code, w.Body)
		}
	}
}
