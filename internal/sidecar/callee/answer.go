package callee

import (
	"context"
	"errors"
	"net/http"
	"slices"

	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

// The answers to the harness's calls once their messages are published.

// respond waits for the confirms of ps (unless the harness asked for an
// asynchronous answer) and answers with body.
//
// By default the call returns once every message it caused is confirmed by
// the broker, so a 200 means the events are durable in the caller's queue.
// That costs a broker round trip per call; a harness that posts
// sequentially is then limited to one call per round trip. It can post
// batches (one round trip for many events), post concurrently (order across
// concurrent calls is the order they reach the sidecar), or send
// "Prefer: respond-async" to get 202 as soon as the events are sequenced
// and written to the channel (delivery failures are then only logged and
// counted).
//
// owner is the session of a call that lets the harness go on with its task
// (events, checkpoint, pause, resume; nil for an outcome recorded): the
// fence is asked again when the answer is written, since the call may have
// waited (for its confirms, or in a paused process) past a lapse of the
// Lease or a takeover. The messages are published either way; a 503 makes
// the harness retry, and the retry is answered by the idempotency key once
// ownership is confirmed, or 409 ownership_lost.
func respond(w http.ResponseWriter, r *http.Request, owner *sess, ps []*pending, body map[string]any) {
	async := slices.Contains(r.Header.Values("Prefer"), "respond-async")
	if !async {
		if err := waitAll(r.Context(), ps); err != nil {
			writeAPIError(w, publishError(err))
			return
		}
	}
	if owner != nil {
		if err := owner.sc.fence(owner); err != nil {
			writeAPIError(w, fencedError(err))
			return
		}
	}
	if async {
		server.WriteJSON(w, http.StatusAccepted, body)
		return
	}
	server.WriteJSON(w, http.StatusOK, body)
}

// publishError maps a publish outcome to an API error.
func publishError(err error) *apiError {
	switch {
	case errors.Is(err, errFenced), errors.Is(err, errOwnershipLost):
		return fencedError(err)
	case errors.Is(err, transport.ErrUnroutable):
		return &apiError{http.StatusBadGateway, &server.Error{Code: server.CodeUnroutable, Message: "the broker could not route the event: the caller's event queue does not exist (" + err.Error() + ")"}}
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return &apiError{http.StatusGatewayTimeout, &server.Error{Code: server.CodeTimeout, Message: "gave up waiting for the broker's confirm; the outcome is unknown: " + err.Error()}}
	default:
		return &apiError{http.StatusServiceUnavailable, &server.Error{Code: server.CodeUnavailable, Message: "the broker did not confirm the event: " + err.Error()}}
	}
}
