package samplecallee

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// post calls the sidecar, retrying for up to RetryFor while it is
// unreachable (restarting) or answers 503 (it cannot vouch for the session
// right now); events carry idempotency keys, so a retry of a call that did
// reach the sidecar is not published twice. A 404 after such an outage
// means the session moved to another replica.
//
// complete, fail and checkpoint are retried without a deadline while the
// sidecar answers 503 (fenced: it cannot confirm it still owns the
// session, for as long as an API server outage lasts) or cannot be
// reached, until stop is closed (the session was aborted or moved: 409
// ownership_lost or a stop request): a result is never given up.
func (h *Harness) post(id, action string, body any) error {
	return h.postUntil(id, action, body, nil)
}

// postUntil is post; with stop non-nil, retries have no deadline and end
// when stop is closed.
func (h *Harness) postUntil(id, action string, body any, stop <-chan struct{}) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(RetryFor)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		status, msg, err := h.postOnce(id, action, b)
		retry := err != nil || status == http.StatusServiceUnavailable
		if !retry {
			if status/100 != 2 {
				return fmt.Errorf("%s: HTTP %d: %s", action, status, msg)
			}
			return nil
		}
		// Once, then about every half minute: a call the sidecar keeps
		// refusing shows in the log, not only a stalled task.
		if attempt == 1 || attempt%15 == 0 {
			h.log.Info("Retrying a call to the sidecar", "session", id, "action", action, "attempt", attempt,
				"error", errOrStatus(err, status, msg).Error())
		}
		if stop != nil {
			select {
			case <-stop:
				return fmt.Errorf("%s: stopped while retrying: %w", action, errOrStatus(err, status, msg))
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 2*time.Second)
			continue
		}
		if time.Now().After(deadline) {
			if err == nil {
				err = fmt.Errorf("%s: HTTP %d: %s", action, status, msg)
			}
			return err
		}
		time.Sleep(backoff)
		backoff = min(2*backoff, 2*time.Second)
	}
}

func errOrStatus(err error, status int, msg string) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("HTTP %d: %s", status, msg)
}

// RetryFor is how long calls to the sidecar are retried.
var RetryFor = 2 * time.Minute

func (h *Harness) postOnce(id, action string, b []byte) (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.sidecar+"/hcp/v1/sessions/"+id+"/"+action, bytes.NewReader(b))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := h.http.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(msg)), nil
}

// Bodies of the local API (see docs/openapi/callee-sidecar.yaml).
type (
	status struct {
		Status string `json:"status"`
	}
	reason struct {
		Reason string `json:"reason"`
	}
	event struct {
		EventType      string `json:"event_type"`
		Data           any    `json:"data"`
		IdempotencyKey string `json:"idempotency_key,omitempty"`
	}
	progress struct {
		Stage   string  `json:"stage"`
		Percent float64 `json:"percent"`
		Message string  `json:"message"`
	}
	logData struct {
		Level   string `json:"level"`
		Message string `json:"message"`
	}
	failure struct {
		Code        string `json:"code"`
		Message     string `json:"message"`
		Recoverable bool   `json:"recoverable"`
	}
	apiError struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
)
