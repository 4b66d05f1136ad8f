package samplecaller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"time"

	"github.com/hcp-io/hcp-operator/internal/harnessclient"
)

// SubmitRequest is the body of the sidecar's POST /hcp/v1/tasks.
type SubmitRequest struct {
	MessageID    string          `json:"message_id,omitempty"`
	CalleeID     string          `json:"callee_id"`
	Capability   string          `json:"capability"`
	Intent       string          `json:"intent"`
	Inputs       json.RawMessage `json:"inputs,omitempty"`
	Constraints  Constraints     `json:"constraints"`
	OutputFormat json.RawMessage `json:"output_format,omitempty"`
	ExpiresAt    string          `json:"expires_at,omitempty"`
	Metadata     json.RawMessage `json:"metadata,omitempty"`
}

// Constraints of a task.
type Constraints struct {
	MaxDuration        string `json:"max_duration,omitempty"`
	MaxRiskLevel       string `json:"max_risk_level,omitempty"`
	DataClassification string `json:"data_classification"`
	Deadline           string `json:"deadline,omitempty"`
}

// Task is the sidecar's view of a submitted task.
type Task struct {
	MessageID      string `json:"message_id"`
	CalleeID       string `json:"callee_id"`
	Capability     string `json:"capability"`
	Status         string `json:"status"`
	SessionID      string `json:"session_id"`
	Attempts       int    `json:"attempts"`
	RiskLevel      string `json:"risk_level"`
	ReasonCode     string `json:"reason_code"`
	Message        string `json:"message"`
	DeliveredToApp bool   `json:"delivered_to_app"`
	Warning        string `json:"warning"`
}

// Session is the sidecar's view of a session.
type Session struct {
	SessionID      string `json:"session_id"`
	CalleeID       string `json:"callee_id"`
	State          string `json:"state"`
	LastSequence   int64  `json:"last_sequence"`
	Buffered       int    `json:"buffered"`
	TokenExpiresAt string `json:"token_expires_at"`
	Terminal       string `json:"terminal"`
	Finished       bool   `json:"finished"`
	Closed         bool   `json:"closed"`
}

// APIError is an error answer of the sidecar.
type APIError = harnessclient.APIError

// Client calls the caller sidecar's local API.
type Client struct {
	harnessclient.Client
}

// NewClient returns a Client for the sidecar at baseURL.
func NewClient(baseURL string) *Client {
	return &Client{Client: *harnessclient.New(baseURL, "")}
}

// Submit submits a task and returns the sidecar's record of it.
func (c *Client) Submit(ctx context.Context, req SubmitRequest) (Task, error) {
	var t Task
	err := c.Do(ctx, http.MethodPost, "/hcp/v1/tasks", req, &t)
	return t, err
}

// Task returns a submitted task.
func (c *Client) Task(ctx context.Context, messageID string) (Task, error) {
	var t Task
	err := c.Do(ctx, http.MethodGet, "/hcp/v1/tasks/"+url.PathEscape(messageID), nil, &t)
	return t, err
}

// Session returns what the sidecar knows of a session.
func (c *Client) Session(ctx context.Context, id string) (Session, error) {
	var s Session
	err := c.Do(ctx, http.MethodGet, "/hcp/v1/sessions/"+url.PathEscape(id), nil, &s)
	return s, err
}

// Watch polls a task until it is answered, then its session until it has
// ended (its terminal message and its session_closed event delivered, or
// the terminal message and two seconds without session_closed, for callees
// that do not send one), writing one line per change to w. It returns the
// final task and session (the session is zero for a rejected task).
func (c *Client) Watch(ctx context.Context, messageID string, poll time.Duration, w io.Writer) (Task, Session, error) {
	var last string
	t := time.NewTicker(poll)
	defer t.Stop()
	var task Task
	for {
		var err error
		task, err = c.Task(ctx, messageID)
		if err != nil {
			return task, Session{}, err
		}
		line := fmt.Sprintf("task %s: %s (attempts %d)", task.MessageID, task.Status, task.Attempts)
		if task.ReasonCode != "" {
			line += fmt.Sprintf(": %s: %s", task.ReasonCode, task.Message)
		}
		if line != last {
			if _, err := fmt.Fprintln(w, line); err != nil {
				return task, Session{}, err
			}
			last = line
		}
		switch task.Status {
		case "rejected", "unanswered", "expired":
			return task, Session{}, nil
		}
		if task.Status == "accepted" && task.DeliveredToApp {
			break
		}
		select {
		case <-ctx.Done():
			return task, Session{}, ctx.Err()
		case <-t.C:
			continue
		}
	}
	var finishedAt time.Time
	for {
		s, err := c.Session(ctx, task.SessionID)
		var ae *APIError
		switch {
		case err == nil:
			line := fmt.Sprintf("session %s: %s, last sequence %d", s.SessionID, s.State, s.LastSequence)
			if s.Terminal != "" {
				line += ", " + s.Terminal
			}
			if line != last {
				if _, err := fmt.Fprintln(w, line); err != nil {
					return task, s, err
				}
				last = line
			}
			if s.Finished && finishedAt.IsZero() {
				finishedAt = time.Now()
			}
			if s.Finished && (s.Closed || time.Since(finishedAt) > 2*time.Second) {
				return task, s, nil
			}
		case errors.As(err, &ae) && ae.Status == http.StatusNotFound:
		default:
			return task, s, err
		}
		select {
		case <-ctx.Done():
			return task, s, ctx.Err()
		case <-t.C:
		}
	}
}
