package samplecaller

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// handleEvent serves POST /hcp/v1/events (one message) and POST
// /hcp/v1/events/batch (several of one session).
func (r *Recorder) handleEvent(w http.ResponseWriter, req *http.Request) {
	body, err := io.ReadAll(io.LimitReader(req.Body, 2<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var batch struct {
		Messages []Message `json:"messages"`
	}
	r.mu.Lock()
	batchGone := r.batchGone
	r.mu.Unlock()
	offers := r.offers()
	isBatch := strings.HasSuffix(req.URL.Path, "/batch")
	if isBatch && batchGone {
		http.NotFound(w, req)
		return
	}
	if isBatch {
		err = json.Unmarshal(body, &batch)
	} else {
		batch.Messages = make([]Message, 1)
		err = json.Unmarshal(body, &batch.Messages[0])
	}
	if err != nil {
		http.Error(w, fmt.Sprintf("not an HCP message: %v", err), http.StatusBadRequest)
		return
	}
	if code, msg := r.take(batch.Messages, &r.requests); code != 0 {
		http.Error(w, msg, code)
		return
	}
	offers.set(w.Header())
	w.WriteHeader(http.StatusNoContent)
}

// take processes the messages of one delivery (a request, or a line of
// the stream) all or nothing: it checks them, waits the delay, fails them
// if a failure is injected for any, appends them to the receipt log, and
// records them, counting the delivery in *count (guarded by r.mu). It
// returns 0, or the HTTP status and the error of the failure (nothing
// recorded).
func (r *Recorder) take(ms []Message, count *int) (int, string) {
	if len(ms) == 0 {
		return http.StatusBadRequest, "not an HCP message: no messages"
	}
	for _, m := range ms {
		if m.SessionID == "" || m.Type == "" {
			return http.StatusBadRequest, "not an HCP message: session_id and type are required"
		}
	}
	r.mu.Lock()
	fail, delay, receipts := r.fail, r.delay, r.receipts
	r.mu.Unlock()
	if delay > 0 {
		time.Sleep(delay)
	}
	// A batch is processed all or nothing: a failure injected for any of
	// its messages fails the delivery.
	for _, m := range ms {
		if fail != nil && fail(m) {
			r.mu.Lock()
			r.failed++
			r.mu.Unlock()
			return http.StatusInternalServerError, "injected failure"
		}
	}
	at := time.Now()
	if receipts != nil {
		if err := receipts.append(ms, at); err != nil {
			return http.StatusInternalServerError, "receipt log: " + err.Error()
		}
	}
	r.mu.Lock()
	*count++
	r.mu.Unlock()
	for _, m := range ms {
		r.RecordAt(m, at)
	}
	return 0, ""
}
