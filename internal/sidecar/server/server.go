// Package server holds the HTTP plumbing both hcp-sidecar modes share: the
// probe endpoints (/healthz, /readyz, /metrics), JSON requests and error
// responses of the local harness API, and serving with graceful shutdown.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// ShutdownTimeout bounds graceful shutdown of a server: in-flight requests
// get this long to finish once the context of Serve ends.
const ShutdownTimeout = 15 * time.Second

// Error codes of the local APIs.
const (
	CodeBadRequest           = "bad_request"
	CodeTooLarge             = "too_large"
	CodeUnsupportedMediaType = "unsupported_media_type"
	CodeNotFound             = "not_found"
	CodeInvalidTransition    = "invalid_transition"
	CodeUnroutable           = "unroutable"
	CodeUnavailable          = "unavailable"
	CodeTimeout              = "timeout"
)

// ContentTypeNDJSON is the media type of the local APIs' streams (one JSON
// value a line): the harness's event stream and the stream to the app.
const ContentTypeNDJSON = "application/x-ndjson"

// DefaultMaxBody is the default request body limit of DecodeJSON (1 MiB,
// the envelope size limit of L1).
const DefaultMaxBody = 1 << 20

const statusKey = "status"

// Readiness is a set of named checks behind /readyz. Checks can be added at
// any time; /readyz is ready when every check returns nil.
type Readiness struct {
	mu     sync.Mutex
	names  []string
	checks map[string]func() error
}

// Add registers (or replaces) a named check.
func (r *Readiness) Add(name string, check func() error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.checks == nil {
		r.checks = map[string]func() error{}
	}
	if _, ok := r.checks[name]; !ok {
		r.names = append(r.names, name)
	}
	r.checks[name] = check
}

// Check runs every check and returns the failures by name (nil when ready).
func (r *Readiness) Check() map[string]string {
	r.mu.Lock()
	names := slices.Clone(r.names)
	checks := make([]func() error, len(names))
	for i, n := range names {
		checks[i] = r.checks[n]
	}
	r.mu.Unlock()
	var failed map[string]string
	for i, c := range checks {
		if err := c(); err != nil {
			if failed == nil {
				failed = map[string]string{}
			}
			failed[names[i]] = err.Error()
		}
	}
	return failed
}

// ServeHTTP answers 200 {"status":"ready"} or 503 with the failed checks.
func (r *Readiness) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	if failed := r.Check(); failed != nil {
		WriteJSON(w, http.StatusServiceUnavailable, map[string]any{statusKey: "not ready", "checks": failed})
		return
	}
	WriteJSON(w, http.StatusOK, map[string]string{statusKey: "ready"})
}

// Flag is a boolean readiness condition with a reason, safe for concurrent
// use: Set(nil) when the thing works, Set(err) when it does not. The zero
// value reports "not started".
type Flag struct {
	mu  sync.Mutex
	set bool
	err error
}

// Set records the current condition.
func (f *Flag) Set(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set, f.err = true, err
}

// Err returns nil when the flag was Set(nil) last.
func (f *Flag) Err() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.set {
		return errors.New("not started")
	}
	return f.err
}

// ProbeHandler serves /healthz (the process is alive: always 200), /readyz
// (ready) and /metrics (gatherer in Prometheus text format).
func ProbeHandler(ready *Readiness, gatherer prometheus.Gatherer) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		WriteJSON(w, http.StatusOK, map[string]string{statusKey: "ok"})
	})
	mux.Handle("GET /readyz", ready)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{EnableOpenMetrics: false}))
	return mux
}

// Error is the body of every error response of the local APIs:
//
//	{"error": {"code": "invalid_transition", "message": "...", "state": "PAUSED", "fields": [...]}}
type Error struct {
	// Code is machine-readable: bad_request, unsupported_media_type,
	// too_large, not_found, invalid_transition, unroutable, unavailable,
	// internal, ...
	Code string `json:"code"`
	// Message is for humans.
	Message string `json:"message"`
	// State is the session's current state, for invalid_transition.
	State string `json:"state,omitempty"`
	// Fields lists per-field validation failures.
	Fields []FieldError `json:"fields,omitempty"`
}

// FieldError is one invalid field of a request.
type FieldError struct {
	Field   string `json:"field"`
	Message string `json:"message"`
}

func (e *Error) Error() string { return e.Code + ": " + e.Message }

// WriteJSON writes v as a JSON response with the given status.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// WriteError writes {"error": e} with the given status.
func WriteError(w http.ResponseWriter, status int, e *Error) {
	WriteJSON(w, status, map[string]*Error{"error": e})
}

// Errorf writes an error response with a code and a formatted message.
func Errorf(w http.ResponseWriter, status int, code, format string, args ...any) {
	WriteError(w, status, &Error{Code: code, Message: fmt.Sprintf(format, args...)})
}

// RequestError is a request DecodeJSON refused, with the status to answer.
type RequestError struct {
	Status int
	Err    *Error
}

func (e *RequestError) Error() string { return e.Err.Error() }

// Write answers the request with the error.
func (e *RequestError) Write(w http.ResponseWriter) { WriteError(w, e.Status, e.Err) }

// DecodeJSON decodes the request body into v: the content type must be
// application/json (charset utf-8 if any; an empty body with no content type
// is allowed when allowEmpty), the body at most maxBytes (<= 0:
// DefaultMaxBody), exactly one JSON value. Failures are *RequestError (400,
// 413 or 415).
func DecodeJSON(r *http.Request, maxBytes int64, allowEmpty bool, v any) error {
	body, err := ReadJSON(r, maxBytes, allowEmpty)
	if err != nil || body == nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return &RequestError{http.StatusBadRequest, &Error{Code: CodeBadRequest, Message: "invalid JSON: " + err.Error()}}
	}
	if dec.More() {
		return &RequestError{http.StatusBadRequest, &Error{Code: CodeBadRequest, Message: "trailing data after the JSON value"}}
	}
	return nil
}

// ReadJSON is DecodeJSON without the decoding: the body, checked for size
// and Content-Type, for a handler that parses it itself (in one pass). An
// empty body (allowEmpty) is nil.
func ReadJSON(r *http.Request, maxBytes int64, allowEmpty bool) ([]byte, error) {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBody
	}
	body, err := readBody(r, maxBytes)
	if err != nil {
		return nil, &RequestError{http.StatusBadRequest, &Error{Code: CodeBadRequest, Message: "reading the request body: " + err.Error()}}
	}
	if int64(len(body)) > maxBytes {
		return nil, &RequestError{http.StatusRequestEntityTooLarge, &Error{Code: CodeTooLarge, Message: fmt.Sprintf("request body exceeds %d bytes", maxBytes)}}
	}
	if len(bytes.TrimSpace(body)) == 0 {
		if allowEmpty {
			return nil, nil
		}
		return nil, &RequestError{http.StatusBadRequest, &Error{Code: CodeBadRequest, Message: "request body is empty; want a JSON object"}}
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || mt != "application/json" || (params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8")) {
			return nil, &RequestError{http.StatusUnsupportedMediaType, &Error{Code: CodeUnsupportedMediaType, Message: fmt.Sprintf("content type %q is not application/json", ct)}}
		}
	} else {
		return nil, &RequestError{http.StatusUnsupportedMediaType, &Error{Code: CodeUnsupportedMediaType, Message: "Content-Type application/json is required"}}
	}
	return body, nil
}

// readBody reads up to maxBytes+1 bytes of the body into one buffer sized
// from Content-Length when the client sent it (io.ReadAll would grow its
// buffer by doubling, several allocations and copies per request).
func readBody(r *http.Request, maxBytes int64) ([]byte, error) {
	n := int64(512)
	if r.ContentLength > 0 {
		n = min(r.ContentLength, maxBytes) + 1 // +1: io.ReadFrom sees EOF without growing
	}
	lr := io.LimitReader(r.Body, maxBytes+1)
	buf := make([]byte, 0, n)
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)] // a body longer than announced
		}
		m, err := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+m]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

// Serve serves h on ln until ctx ends, then shuts down gracefully: no new
// connections, in-flight requests get ShutdownTimeout to finish. It returns
// nil after a graceful shutdown.
func Serve(ctx context.Context, ln net.Listener, h http.Handler, log logr.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		// Requests carry a context that ends with the server's, so long
		// handlers (waiting for a publisher confirm) stop at shutdown.
		BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) },
	}
	errCh := make(chan error, 1)
	go func() { errCh <- srv.Serve(ln) }()
	select {
	case err := <-errCh:
		return fmt.Errorf("serving %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	log.V(1).Info("Shutting down HTTP server", "addr", ln.Addr().String())
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		_ = srv.Close()
		return fmt.Errorf("shutting down %s: %w", ln.Addr(), err)
	}
	if err := <-errCh; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
