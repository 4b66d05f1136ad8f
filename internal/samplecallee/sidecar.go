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
func (h *Harness) post(id, action string, body any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(RetryFor)
	backoff := 100 * time.Millisecond
	for {
		status, msg, err := h.postOnce(id, action, b)
		retry := err != nil || status == http.StatusServiceUnavailable
		if !retry {
			if status/100 != 2 {
				return fmt.Errorf("%s: HTTP %d: %s", action, status, msg)
			}
			return nil
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
