package conformance

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"
)

// AppAPIDriver drives a caller through this project's caller app API
// (docs/harness-api.md, "Caller side"; openapi/caller-sidecar.yaml): it
// submits with POST {APIURL}/hcp/v1/tasks, aborts with POST
// {APIURL}/hcp/v1/sessions/{id}/abort, and is the caller's app: Handler
// serves POST /hcp/v1/events (and /hcp/v1/events/batch) and records each
// message as processed. Point the caller's app URL (the sidecar's
// HCP_HARNESS_URL) at Handler. A caller of another implementation can
// expose the same three endpoints.
type AppAPIDriver struct {
	APIURL string
	Client *http.Client

	mu        sync.Mutex
	processed []Processed
}

// NewAppAPIDriver returns a driver for the caller app API at apiURL.
func NewAppAPIDriver(apiURL string) *AppAPIDriver {
	return &AppAPIDriver{APIURL: strings.TrimSuffix(apiURL, "/"), Client: &http.Client{Timeout: 30 * time.Second}}
}

// Submit posts the task to the caller's API.
func (d *AppAPIDriver) Submit(ctx context.Context, t DriverTask) error {
	body := map[string]any{"callee_id": t.CalleeID, "capability": t.Capability, "intent": t.Intent, "inputs": t.Inputs}
	if t.DataClassification != "" {
		body["constraints"] = map[string]string{"data_classification": t.DataClassification}
	}
	return d.post(ctx, "/hcp/v1/tasks", body)
}

// Abort asks the caller to abort a session.
func (d *AppAPIDriver) Abort(ctx context.Context, sessionID string) error {
	return d.post(ctx, "/hcp/v1/sessions/"+url.PathEscape(sessionID)+"/abort", map[string]string{"reason": "hcp-conformance abort check"})
}

func (d *AppAPIDriver) post(ctx context.Context, path string, body any) error {
	js, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.APIURL+path, bytes.NewReader(js))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := d.Client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: HTTP %d: %s", path, resp.StatusCode, bytes.TrimSpace(out))
	}
	return nil
}

// Processed returns what the caller has delivered to Handler, in order.
func (d *AppAPIDriver) Processed() []Processed {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]Processed(nil), d.processed...)
}

// Handler is the caller's app: it records every message the caller
// delivers and answers 200.
func (d *AppAPIDriver) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hcp/v1/events", func(w http.ResponseWriter, r *http.Request) {
		var p Processed
		if err := json.NewDecoder(io.LimitReader(r.Body, 4<<20)).Decode(&p); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		d.mu.Lock()
		d.processed = append(d.processed, p)
		d.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /hcp/v1/events/batch", func(w http.ResponseWriter, r *http.Request) {
		var b struct {
			Messages []Processed `json:"messages"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&b); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		d.mu.Lock()
		d.processed = append(d.processed, b.Messages...)
		d.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	})
	return mux
}
