package samplecaller

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strconv"
)

// streamPath is the app's stream endpoint: the caller sidecar writes one
// delivery per NDJSON line, {"delivery": n, "session_id": "…",
// "messages": [Message, …]}, and the app answers each, in order, with
// {"ack": n} once it has processed it or {"nack": n, "error": "…"}.
const streamPath = "/hcp/v1/events/stream"

// maxStreamLine bounds one delivery on the stream (a batch of large
// messages).
const maxStreamLine = 16 << 20

// streamDelivery is one line of the stream.
type streamDelivery struct {
	Delivery  int64     `json:"delivery"`
	SessionID string    `json:"session_id"`
	Messages  []Message `json:"messages"`
}

// handleStream serves one stream full duplex: each delivery is processed
// as a request's body would be (take: all or nothing, receipts first) and
// acked or nacked before the next line is read. A line that is not a
// delivery ends the stream: the app cannot name it in a nack, and the
// sidecar sends what it had in flight again on a new stream.
//
// The sidecar has one stream open at a time: it opens a new one only after
// giving up on the last (no answer within its timeout, a broken
// connection). Lines of an older stream still buffered here are therefore
// not processed: the sidecar sends them again on the new one, and
// processing them too would make duplicates.
func (r *Recorder) handleStream(w http.ResponseWriter, req *http.Request) {
	if r.streamWithdrawn() {
		http.NotFound(w, req)
		return
	}
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		http.Error(w, "full duplex: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	r.offers().set(w.Header())
	w.WriteHeader(http.StatusOK)
	if rc.Flush() != nil {
		return
	}
	r.mu.Lock()
	r.streams++
	gen := r.streams
	r.mu.Unlock()
	sc := bufio.NewScanner(req.Body)
	sc.Buffer(make([]byte, 0, 64<<10), maxStreamLine)
	var out []byte
	for sc.Scan() {
		var d streamDelivery
		if err := json.Unmarshal(sc.Bytes(), &d); err != nil || d.Delivery < 1 {
			return
		}
		if !r.streamCurrent(gen) || req.Context().Err() != nil {
			return // not processed: sent again on a new stream, or by request
		}
		code, msg := 0, ""
		for _, m := range d.Messages {
			if m.SessionID != d.SessionID {
				code, msg = http.StatusBadRequest, "a message of another session"
			}
		}
		if code == 0 {
			code, msg = r.take(d.Messages, &r.lines)
		}
		out = out[:0]
		if code == 0 {
			out = append(strconv.AppendInt(append(out, `{"ack":`...), d.Delivery, 10), "}\n"...)
		} else {
			nack, _ := json.Marshal(struct {
				Nack  int64  `json:"nack"`
				Error string `json:"error"`
			}{d.Delivery, msg})
			out = append(append(out, nack...), '\n')
		}
		if _, err := w.Write(out); err != nil || rc.Flush() != nil {
			return
		}
	}
}

func (r *Recorder) streamWithdrawn() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.streamGone
}

// streamCurrent reports whether stream gen is the last one opened and the
// stream is not withdrawn.
func (r *Recorder) streamCurrent(gen int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !r.streamGone && gen == r.streams
}
