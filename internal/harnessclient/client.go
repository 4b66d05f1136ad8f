// Package harnessclient calls a sidecar's local HTTP API
// (docs/harness-api.md): JSON in, JSON out, and the API's error answer
// {"error": {"code", "message", "fields": [{"field", "message"}]}} as an
// *APIError. The sample caller app and kubectl hcp submit both use it.
package harnessclient

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

// maxAnswer is the most of an answer the client reads.
const maxAnswer = 4 << 20

// maxRawMessage is the most of a non-API error answer's body kept as the
// APIError's message (on one line).
const maxRawMessage = 300

// CodeHTTPError is the APIError code of an error answer that is not the
// API's error document (a proxy's error page, a server that is not the
// sidecar).
const CodeHTTPError = "http_error"

// APIError is an error answer of the sidecar.
type APIError struct {
	// Status is the HTTP status of the answer.
	Status int `json:"-"`
	// Peer names who answered in Error ("the Caller sidecar"); empty,
	// Error starts with "HTTP <status>".
	Peer    string `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Fields  []struct {
		Field   string `json:"field"`
		Message string `json:"message"`
	} `json:"fields"`
}

func (e *APIError) Error() string {
	var b strings.Builder
	if e.Peer != "" {
		fmt.Fprintf(&b, "%s answered %d %s: %s", e.Peer, e.Status, e.Code, e.Message)
	} else {
		fmt.Fprintf(&b, "HTTP %d %s: %s", e.Status, e.Code, e.Message)
	}
	for _, f := range e.Fields {
		fmt.Fprintf(&b, "; %s: %s", f.Field, f.Message)
	}
	return b.String()
}

// Client calls the local API at BaseURL.
type Client struct {
	BaseURL string
	HTTP    *http.Client
	// Peer names the sidecar in errors (see APIError.Peer).
	Peer string
}

// New returns a Client for the API at baseURL with a 30 s timeout per
// call; peer names the sidecar in errors ("" for plain "HTTP <status>").
func New(baseURL, peer string) *Client {
	return &Client{BaseURL: strings.TrimSuffix(baseURL, "/"), HTTP: &http.Client{Timeout: 30 * time.Second}, Peer: peer}
}

// Do sends in (nil: no body) as JSON with method to path and decodes a 2xx
// answer into out (nil: the body is dropped). A non-2xx answer is an
// *APIError.
func (c *Client) Do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswer))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return c.apiError(resp.StatusCode, data)
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s answer to %s %s: %w", c.peerPossessive(), method, path, err)
	}
	return nil
}

// apiError is the error of an answer with status and body data: the API's
// error document, or the body itself on one line.
func (c *Client) apiError(status int, data []byte) *APIError {
	var e struct {
		Error *APIError `json:"error"`
	}
	if json.Unmarshal(data, &e) != nil || e.Error == nil || e.Error.Code == "" {
		return &APIError{Status: status, Peer: c.Peer, Code: CodeHTTPError, Message: oneLine(string(data), maxRawMessage)}
	}
	e.Error.Status, e.Error.Peer = status, c.Peer
	return e.Error
}

func (c *Client) peerPossessive() string {
	if c.Peer == "" {
		return "the sidecar's"
	}
	return c.Peer + "'s"
}

// oneLine folds s's white space and cuts it to max runes.
func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}
