package kubectlhcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/portforward"
	"k8s.io/client-go/transport/spdy"

	"github.com/hcp-io/hcp-operator/internal/harnessclient"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// The Caller sidecar's local API (docs/harness-api.md#caller-side): the
// plugin submits a task as the caller app would.

// SubmitRequest is the body of the Caller sidecar's POST /hcp/v1/tasks.
type SubmitRequest struct {
	MessageID   string           `json:"message_id,omitempty"`
	CalleeID    string           `json:"callee_id"`
	Capability  string           `json:"capability"`
	Intent      string           `json:"intent"`
	Inputs      json.RawMessage  `json:"inputs,omitempty"`
	Constraints task.Constraints `json:"constraints"`
}

// TaskView is the Caller sidecar's record of a task.
type TaskView struct {
	MessageID  string `json:"message_id"`
	CalleeID   string `json:"callee_id"`
	Capability string `json:"capability"`
	// Status: pending, accepted, rejected, unanswered or expired.
	Status     string `json:"status"`
	SessionID  string `json:"session_id"`
	Attempts   int    `json:"attempts"`
	RiskLevel  string `json:"risk_level"`
	ReasonCode string `json:"reason_code"`
	Message    string `json:"message"`
	Warning    string `json:"warning"`
}

// sidecarClient calls the Caller sidecar's local API.
type sidecarClient struct {
	*harnessclient.Client
}

func newSidecarClient(base string) *sidecarClient {
	return &sidecarClient{harnessclient.New(base, "the Caller sidecar")}
}

func (c *sidecarClient) submit(ctx context.Context, req SubmitRequest) (TaskView, error) {
	var t TaskView
	return t, c.Do(ctx, http.MethodPost, "/hcp/v1/tasks", req, &t)
}

func (c *sidecarClient) task(ctx context.Context, messageID string) (TaskView, error) {
	var t TaskView
	return t, c.Do(ctx, http.MethodGet, "/hcp/v1/tasks/"+url.PathEscape(messageID), nil, &t)
}

// sidecarPort is the port of the Caller sidecar's local API in pod: from
// the hcp-sidecar container's HCP_API_ADDR, else the default 9090.
func sidecarPort(pod *corev1.Pod) int {
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name != "hcp-sidecar" {
			continue
		}
		for _, e := range c.Env {
			if e.Name != "HCP_API_ADDR" {
				continue
			}
			if _, p, err := net.SplitHostPort(e.Value); err == nil {
				if n, err := strconv.Atoi(p); err == nil && n > 0 {
					return n
				}
			}
		}
	}
	return 9090
}

// forward is a port-forward to a pod through the API server (what kubectl
// port-forward does): SPDY to the kubelet's portforward endpoint.
type forward struct {
	URL    string
	stop   chan struct{}
	once   sync.Once
	errOut *syncBuffer
}

// Close ends the port-forward.
func (f *forward) Close() { f.once.Do(func() { close(f.stop) }) }

// problems is what the port-forward reported on its error stream (the
// kubelet refusing, the pod's port closed).
func (f *forward) problems() string { return strings.TrimSpace(f.errOut.String()) }

// portForward forwards a free local port on 127.0.0.1 to pod's port.
func portForward(ctx context.Context, cfg *rest.Config, pod *corev1.Pod, port int) (*forward, error) {
	rt, upgrader, err := spdy.RoundTripperFor(cfg)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(strings.TrimSuffix(cfg.Host, "/"))
	if err != nil {
		return nil, err
	}
	u = u.JoinPath("/api/v1/namespaces", pod.Namespace, "pods", pod.Name, "portforward")
	dialer := spdy.NewDialer(upgrader, &http.Client{Transport: rt}, http.MethodPost, u)
	f := &forward{stop: make(chan struct{}), errOut: &syncBuffer{}}
	ready := make(chan struct{})
	fw, err := portforward.NewOnAddresses(dialer, []string{"127.0.0.1"}, []string{fmt.Sprintf("0:%d", port)}, f.stop, ready, io.Discard, f.errOut)
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- fw.ForwardPorts() }()
	select {
	case <-ready:
	case err := <-done:
		if err == nil {
			err = errors.New("it ended at once")
		}
		return nil, fmt.Errorf("port-forward to pod %s/%s port %d: %w %s", pod.Namespace, pod.Name, port, err, f.problems())
	case <-ctx.Done():
		f.Close()
		return nil, ctx.Err()
	case <-time.After(30 * time.Second):
		f.Close()
		return nil, fmt.Errorf("port-forward to pod %s/%s port %d: not ready within 30s %s", pod.Namespace, pod.Name, port, f.problems())
	}
	ports, err := fw.GetPorts()
	if err != nil || len(ports) != 1 {
		f.Close()
		return nil, fmt.Errorf("port-forward to pod %s/%s: no local port: %v", pod.Namespace, pod.Name, err)
	}
	f.URL = fmt.Sprintf("http://127.0.0.1:%d", ports[0].Local)
	return f, nil
}

// syncBuffer is a bytes.Buffer safe for the port-forward's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
