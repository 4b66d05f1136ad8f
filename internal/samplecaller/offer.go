package samplecaller

import (
	"net/http"
	"strconv"
)

// What the app offers the caller sidecar on its answers
// (docs/harness-api.md, "Batch delivery" and "Stream delivery").
const (
	headerBatchMax = "HCP-Batch-Max"
	headerStream   = "HCP-Stream"
)

// OfferBatches makes every 2xx answer offer batches of up to n events
// (n < 2: no offer), so that the sidecar POSTs the events of a session
// that are ready together to /hcp/v1/events/batch.
func (r *Recorder) OfferBatches(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batchMax, r.batchGone = n, false
}

// WithdrawBatches stops the offer and answers /hcp/v1/events/batch with
// 404, as an older version of an app without the endpoint would.
func (r *Recorder) WithdrawBatches() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batchMax, r.batchGone = 0, true
}

// OfferStream makes every 2xx answer to a request offer the stream
// (HCP-Stream: 1), so that the sidecar sends its deliveries over one POST
// /hcp/v1/events/stream. The endpoint is served with or without the offer
// (HCP_APP_STREAM has the sidecar use it unasked), until WithdrawStream.
func (r *Recorder) OfferStream() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streamOffer, r.streamGone = true, false
}

// WithdrawStream stops the offer, ends the open streams at their next
// delivery (unprocessed: the sidecar sends it again) and answers
// /hcp/v1/events/stream with 404, as an older version of an app without
// the endpoint would.
func (r *Recorder) WithdrawStream() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.streamOffer, r.streamGone = false, true
}

// offers is what the app offers at a moment.
type offers struct {
	batchMax int
	stream   bool
}

// offers returns what the app offers now: a request's answer offers what
// held when the request came (a withdrawal while it is processed applies
// to the next one).
func (r *Recorder) offers() offers {
	r.mu.Lock()
	defer r.mu.Unlock()
	return offers{batchMax: r.batchMax, stream: r.streamOffer}
}

// set sets the offer headers of a 2xx answer.
func (o offers) set(h http.Header) {
	if o.batchMax > 1 {
		h.Set(headerBatchMax, strconv.Itoa(o.batchMax))
	}
	if o.stream {
		h.Set(headerStream, "1")
	}
}
