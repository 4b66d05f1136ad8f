// Package transporttest gives tests and benchmarks a real RabbitMQ to work
// against: a throw-away vhost per test, forced connection closes through the
// management API, and a TCP proxy that can stall or cut the connection.
package transporttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvSkipBroker, set to "1", skips tests that need RabbitMQ instead of
// failing them (the same switch as internal/testbed).
const EnvSkipBroker = "HCP_SKIP_BROKER"

// Broker is a RabbitMQ reachable over AMQP and its management API.
type Broker struct {
	// AMQPAddr is host:port of the AMQP listener.
	AMQPAddr string
	// ManagementURL is the management API base URL.
	ManagementURL      string
	Username, Password string
	http               *http.Client
}

var (
	ensureOnce sync.Once
	ensureErr  error
)

// RabbitMQ returns the local broker ($RABBITMQ_AMQP_ADDR, default
// 127.0.0.1:5672; $RABBITMQ_MANAGEMENT_URL, default http://127.0.0.1:15672;
// $RABBITMQ_USERNAME/$RABBITMQ_PASSWORD, default guest/guest). If the
// management API does not answer it runs hack/testbed-rabbitmq.sh once,
// which enables the plugin (or starts or installs the broker). It fails tb
// when the broker stays unavailable, or skips it when HCP_SKIP_BROKER=1.
func RabbitMQ(tb testing.TB) *Broker {
	tb.Helper()
	if os.Getenv(EnvSkipBroker) == "1" {
		tb.Skipf("%s=1: skipping a test that needs RabbitMQ", EnvSkipBroker)
	}
	b := &Broker{
		AMQPAddr:      envOr("RABBITMQ_AMQP_ADDR", "127.0.0.1:5672"),
		ManagementURL: strings.TrimSuffix(envOr("RABBITMQ_MANAGEMENT_URL", "http://127.0.0.1:15672"), "/"),
		Username:      envOr("RABBITMQ_USERNAME", "guest"),
		Password:      envOr("RABBITMQ_PASSWORD", "guest"),
		http:          &http.Client{Timeout: 15 * time.Second},
	}
	ensureOnce.Do(func() {
		if b.api(context.Background(), http.MethodGet, "/api/overview", nil, nil) == nil {
			return
		}
		ensureErr = runTestbedScript()
	})
	if ensureErr != nil {
		tb.Fatalf("RabbitMQ with the management plugin is not available (set %s=1 to skip): %v", EnvSkipBroker, ensureErr)
	}
	return b
}

func runTestbedScript() error {
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	for {
		script := filepath.Join(dir, "hack", "testbed-rabbitmq.sh")
		if _, err := os.Stat(script); err == nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
			defer cancel()
			out, err := exec.CommandContext(ctx, "bash", script).CombinedOutput()
			if err != nil {
				return fmt.Errorf("%s: %w\n%s", script, err, out)
			}
			return nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return fmt.Errorf("management API not reachable and hack/testbed-rabbitmq.sh not found")
		}
		dir = parent
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// URL is the amqp:// URL for vhost with the broker's credentials.
func (b *Broker) URL(vhost string) string {
	return b.URLVia(b.AMQPAddr, vhost)
}

// URLVia is URL with another address, for example a Proxy's.
func (b *Broker) URLVia(addr, vhost string) string {
	u := url.URL{Scheme: "amqp", User: url.UserPassword(b.Username, b.Password), Host: addr, Path: "/" + vhost, RawPath: "/" + url.PathEscape(vhost)}
	return u.String()
}

// NewVhost creates a uniquely named vhost, gives the broker user full
// permissions in it, and deletes it (with everything in it) when tb ends.
func (b *Broker) NewVhost(tb testing.TB) string {
	tb.Helper()
	var buf [4]byte
	_, _ = rand.Read(buf[:])
	name := fmt.Sprintf("hcp-test-%s-%s", sanitize(tb.Name()), hex.EncodeToString(buf[:]))
	ctx := context.Background()
	if err := b.api(ctx, http.MethodPut, "/api/vhosts/"+url.PathEscape(name), map[string]any{}, nil); err != nil {
		tb.Fatalf("creating vhost %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if err := b.api(context.Background(), http.MethodDelete, "/api/vhosts/"+url.PathEscape(name), nil, nil); err != nil {
			tb.Logf("deleting vhost %s: %v", name, err)
		}
	})
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := b.api(ctx, http.MethodPut, "/api/permissions/"+url.PathEscape(name)+"/"+url.PathEscape(b.Username), perm, nil); err != nil {
		tb.Fatalf("granting permissions on %s: %v", name, err)
	}
	return name
}

// SetUser creates or updates a broker user with password and full
// permissions in vhost, and deletes it when tb ends. Existing connections
// keep their login; a new password applies to the next one.
func (b *Broker) SetUser(tb testing.TB, vhost, name, password string) {
	tb.Helper()
	ctx := context.Background()
	if err := b.api(ctx, http.MethodPut, "/api/users/"+url.PathEscape(name), map[string]string{"password": password, "tags": ""}, nil); err != nil {
		tb.Fatalf("user %s: %v", name, err)
	}
	perm := map[string]string{"configure": ".*", "write": ".*", "read": ".*"}
	if err := b.api(ctx, http.MethodPut, "/api/permissions/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), perm, nil); err != nil {
		tb.Fatalf("permissions of %s on %s: %v", name, vhost, err)
	}
	tb.Cleanup(func() {
		_ = b.api(context.Background(), http.MethodDelete, "/api/users/"+url.PathEscape(name), nil, nil)
	})
}

// UserURL is URL for another user.
func (b *Broker) UserURL(vhost, user, password string) string {
	u := url.URL{Scheme: "amqp", User: url.UserPassword(user, password), Host: b.AMQPAddr, Path: "/" + vhost, RawPath: "/" + url.PathEscape(vhost)}
	return u.String()
}

func sanitize(s string) string {
	s = strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			return r
		}
		return '-'
	}, s)
	if len(s) > 60 {
		s = s[:60]
	}
	return s
}

// Connection is one AMQP connection as the management API lists it.
type Connection struct {
	Name             string         `json:"name"`
	Vhost            string         `json:"vhost"`
	User             string         `json:"user"`
	ClientProperties map[string]any `json:"client_properties"`
	// Timeout is the negotiated heartbeat interval in seconds.
	Timeout int `json:"timeout"`
}

// ConnectionName is the client's connection_name property.
func (c Connection) ConnectionName() string {
	s, _ := c.ClientProperties["connection_name"].(string)
	return s
}

// Connections lists the connections to vhost.
func (b *Broker) Connections(ctx context.Context, vhost string) ([]Connection, error) {
	var cs []Connection
	err := b.api(ctx, http.MethodGet, "/api/vhosts/"+url.PathEscape(vhost)+"/connections", nil, &cs)
	return cs, err
}

// CloseConnections force-closes every connection to vhost whose
// connection_name is name ("" for all) through the management API (DELETE
// /api/connections/{name}), as an operator or a broker restart would. It
// first waits (within ctx) until at least one such connection is listed,
// since the management API learns about new connections asynchronously,
// and returns how many it closed.
func (b *Broker) CloseConnections(ctx context.Context, vhost, name string) (int, error) {
	for {
		cs, err := b.Connections(ctx, vhost)
		if err != nil {
			return 0, err
		}
		n := 0
		for _, c := range cs {
			if name != "" && c.ConnectionName() != name {
				continue
			}
			err := b.api(ctx, http.MethodDelete, "/api/connections/"+url.PathEscape(c.Name), nil, nil, http.Header{"X-Reason": {"transporttest: forced close"}})
			if err != nil && !strings.Contains(err.Error(), "404") {
				return n, err
			}
			n++
		}
		if n > 0 {
			return n, nil
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("no connection to vhost %s named %q appeared: %w", vhost, name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// QueueInfo is what the management API reports about a queue.
type QueueInfo struct {
	Name      string `json:"name"`
	Messages  int    `json:"messages"`
	Consumers int    `json:"consumers"`
}

// Queue returns one queue's management view (its counters lag by the
// statistics interval).
func (b *Broker) Queue(ctx context.Context, vhost, name string) (QueueInfo, error) {
	var q QueueInfo
	err := b.api(ctx, http.MethodGet, "/api/queues/"+url.PathEscape(vhost)+"/"+url.PathEscape(name), nil, &q)
	return q, err
}

func (b *Broker) api(ctx context.Context, method, path string, body, out any, hdr ...http.Header) error {
	var rd io.Reader
	if body != nil {
		js, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequestWithContext(ctx, method, b.ManagementURL+path, rd)
	if err != nil {
		return err
	}
	req.SetBasicAuth(b.Username, b.Password)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range hdr {
		for k, v := range h {
			req.Header[k] = v
		}
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, bytes.TrimSpace(data))
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}
