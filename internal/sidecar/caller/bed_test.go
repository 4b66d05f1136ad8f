package caller

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// bed is a real RabbitMQ vhost with the HCP topology of one caller and its
// callees, real broker users with the DESIGN permissions, a sample caller
// app, and caller sidecars run in-process against them.
type bed struct {
	t        testing.TB
	broker   *transporttest.Broker
	vhost    string
	callerID string
	caller   user
	callees  map[string]user
	admin    *amqp.Connection
	app      *samplecaller.Recorder
	appSrv   *httptest.Server
	stateDir string
	metrics  *metrics.Metrics
	seq      atomic.Int64
}

type user struct{ name, password string }

func newBed(t testing.TB, calleeIDs ...string) *bed {
	t.Helper()
	b := &bed{
		t:        t,
		broker:   transporttest.RabbitMQ(t),
		callerID: "alpha",
		callees:  map[string]user{},
		app:      samplecaller.NewRecorder(),
		stateDir: t.TempDir(),
		metrics:  metrics.New(prometheus.NewRegistry()),
	}
	b.vhost = b.broker.NewVhost(t)
	b.caller = b.newUser(topology.RoleCaller, b.callerID)
	for _, id := range calleeIDs {
		b.callees[id] = b.newUser(topology.RoleCallee, id)
	}
	var err error
	if b.admin, err = amqp.Dial(b.broker.URL(b.vhost)); err != nil {
		t.Fatalf("admin connection: %v", err)
	}
	t.Cleanup(func() { _ = b.admin.Close() })
	ch, err := b.admin.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// The topology of DESIGN.md section 3, as the operator declares it.
	must(ch.ExchangeDeclare(topology.CommandsExchange, topology.CommandsExchangeType, true, false, false, false, nil))
	must(ch.ExchangeDeclare(topology.EventsExchange, topology.EventsExchangeType, true, false, false, false, nil))
	must(ch.ExchangeDeclare(topology.DeadLetterExchange, topology.DeadLetterExchangeType, true, false, false, false, nil))
	_, err = ch.QueueDeclare(topology.EventQueue(b.callerID), true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-message-ttl": int64(86400000), "x-max-length": int64(100000), "x-overflow": "drop-head",
		"x-single-active-consumer": true, "x-dead-letter-exchange": topology.DeadLetterExchange,
	})
	must(err)
	dlq := topology.DeadLetterQueue(topology.EventQueue(b.callerID))
	_, err = ch.QueueDeclare(dlq, true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(err)
	must(ch.QueueBind(dlq, topology.EventDeadLetterKey(b.callerID), topology.DeadLetterExchange, false, nil))
	must(ch.QueueBind(topology.EventQueue(b.callerID), topology.EventBindingKey(b.callerID), topology.EventsExchange, false, nil))
	for _, id := range calleeIDs {
		_, err = ch.QueueDeclare(topology.CommandQueue(id), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
		must(err)
		must(ch.QueueBind(topology.CommandQueue(id), topology.CommandRoutingKey(id), topology.CommandsExchange, false, nil))
	}
	b.appSrv = httptest.NewServer(b.app.Handler())
	t.Cleanup(b.appSrv.Close)
	return b
}

// newUser creates a broker user named by the DESIGN scheme with a random
// password and the DESIGN permissions in the bed's vhost.
func (b *bed) newUser(role topology.Role, id string) user {
	b.t.Helper()
	var buf [12]byte
	_, _ = rand.Read(buf[:])
	u := user{name: topology.Username(role, b.vhost, id), password: hex.EncodeToString(buf[:])}
	b.mgmt(http.MethodPut, "/api/users/"+url.PathEscape(u.name), map[string]string{"password": u.password, "tags": ""})
	b.t.Cleanup(func() { b.mgmtNoFail(http.MethodDelete, "/api/users/"+url.PathEscape(u.name), nil) })
	p := topology.PermissionsFor(role, id)
	b.mgmt(http.MethodPut, "/api/permissions/"+url.PathEscape(b.vhost)+"/"+url.PathEscape(u.name),
		map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read})
	return u
}

func (b *bed) mgmt(method, path string, body any) []byte {
	b.t.Helper()
	out, err := b.mgmtErr(method, path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	return out
}

func (b *bed) mgmtNoFail(method, path string, body any) {
	if _, err := b.mgmtErr(method, path, body); err != nil {
		b.t.Logf("management API: %v", err)
	}
}

func (b *bed) mgmtErr(method, path string, body any) ([]byte, error) {
	var rd io.Reader
	if body != nil {
		js, _ := json.Marshal(body)
		rd = bytes.NewReader(js)
	}
	req, err := http.NewRequest(method, b.broker.ManagementURL+path, rd)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(b.broker.Username, b.broker.Password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return nil, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, data)
	}
	return data, nil
}

// closeAllConnections has the broker close every connection to the bed's
// vhost, with `rabbitmqctl close_all_connections --vhost` where rabbitmqctl
// can reach the node (immediate, and limited to this vhost so that other
// tests on the broker are not disturbed), else through the management API
// (DELETE /api/connections/{name}, which only sees connections once the
// management database has listed them).
func (b *bed) closeAllConnections() (int, string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "close_all_connections", "--vhost", b.vhost, "--limit", "10000", "hcp caller test: close_all_connections").CombinedOutput()
	if err == nil {
		var n int
		if m := regexp.MustCompile(`Closed (\d+) connections`).FindSubmatch(out); m != nil {
			n, _ = strconv.Atoi(string(m[1]))
		}
		return n, "rabbitmqctl close_all_connections", nil
	}
	n, err := b.broker.CloseConnections(ctx, b.vhost, "")
	return n, "management API", err
}

// amqpURL is the AMQP URL of a user in the bed's vhost.
func (b *bed) amqpURL(u user) string { return b.amqpURLVia(b.broker.AMQPAddr, u) }

// amqpURLVia is amqpURL through another address (a proxy).
func (b *bed) amqpURLVia(addr string, u user) string {
	return (&url.URL{Scheme: "amqp", User: url.UserPassword(u.name, u.password), Host: addr,
		Path: "/" + b.vhost, RawPath: "/" + url.PathEscape(b.vhost)}).String()
}

// queueDepth returns ready+unacked messages of a queue (management API,
// which lags by its statistics interval).
func (b *bed) queueDepth(name string) int {
	q, err := b.broker.Queue(context.Background(), b.vhost, name)
	if err != nil {
		b.t.Fatal(err)
	}
	return q.Messages
}

// running is one caller sidecar run in-process.
type running struct {
	sc     *Sidecar
	conn   *transport.Conn
	proxy  *transporttest.Proxy
	api    *httptest.Server
	cancel context.CancelFunc
	done   chan error
	name   string
}

type sidecarOpt func(*Options)

func (b *bed) logger() logr.Logger {
	return testr.NewWithInterface(b.t, testr.Options{LogTimestamp: true, Verbosity: 0})
}

// start runs a caller sidecar on the bed's state directory.
func (b *bed) start(opts ...sidecarOpt) *running {
	b.t.Helper()
	name := fmt.Sprintf("caller-sidecar-%d", b.seq.Add(1))
	log := b.logger().WithName(name)
	// Through a TCP proxy, so that a kill can cut the connection at once.
	proxy := transporttest.NewProxy(b.t, b.broker.AMQPAddr)
	conn, err := transport.Dial(context.Background(), transport.Options{
		URL: b.amqpURLVia(proxy.Addr(), b.caller), ConnectionName: name, Logger: log.WithName("amqp"), Metrics: b.metrics,
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, DrainTimeout: 3 * time.Second, DrainWithoutCancel: true,
	})
	if err != nil {
		b.t.Fatal(err)
	}
	pub, err := transport.NewPublisher(conn, transport.PublisherOptions{})
	if err != nil {
		b.t.Fatal(err)
	}
	cfg := &config.Config{
		Mode: config.ModeCaller, ID: b.callerID, ObjectName: b.callerID, Namespace: "default",
		Vhost: b.vhost, AMQPURL: b.amqpURL(b.caller), Username: b.caller.name, HarnessURL: b.appSrv.URL,
		Prefetch: 10, StateDir: b.stateDir, Heartbeat: 5 * time.Second,
	}
	o := Options{
		Config: cfg, Publisher: pub, Consumer: conn, Metrics: b.metrics, Log: log,
		AppBackoff: Backoff{Min: 20 * time.Millisecond, Max: 300 * time.Millisecond},
		GapTimeout: time.Second, AppTimeout: 5 * time.Second, PublishTimeout: 5 * time.Second, DrainTimeout: 2 * time.Second,
		SubmitRetry: RetryPolicy{Timeout: time.Minute},
	}
	for _, f := range opts {
		f(&o)
	}
	sc, err := New(o)
	if err != nil {
		b.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{sc: sc, conn: conn, proxy: proxy, api: httptest.NewServer(sc.Handler()), cancel: cancel, done: make(chan error, 1), name: name}
	go func() { r.done <- sc.Run(ctx) }()
	b.t.Cleanup(func() { r.stop(b.t) })
	return r
}

// stop shuts the sidecar down gracefully (idempotent).
func (r *running) stop(t testing.TB) {
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		if err != nil {
			t.Errorf("%s: Run: %v", r.name, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("%s: Run did not return within 30s of cancel", r.name)
	}
	r.api.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = r.conn.Close(ctx)
}

// kill stops the sidecar the hard way, as a crash would: its TCP connection
// to the broker is cut (and no new one allowed) at the moment its context is
// cancelled, so nothing can be acked any more and nothing drains; whatever
// it had not acked returns to the queue.
func (r *running) kill(t testing.TB) {
	r.proxy.Down(true)
	r.proxy.Cut()
	r.cancel()
	r.cancel = nil
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Errorf("%s: Run did not return within 30s of kill", r.name)
	}
	r.api.Close()
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // abandon: nothing left to settle politely
	_ = r.conn.Close(ctx)
}

// submit posts a task through the sidecar's API and returns the view.
func (r *running) submit(t testing.TB, req SubmitRequest) TaskView {
	t.Helper()
	var v TaskView
	status := r.call(t, http.MethodPost, "/hcp/v1/tasks", req, &v)
	if status != http.StatusAccepted {
		t.Fatalf("POST /hcp/v1/tasks: HTTP %d", status)
	}
	return v
}

// call does one API request and decodes the answer into out.
func (r *running) call(t testing.TB, method, path string, in, out any) int {
	t.Helper()
	var body io.Reader
	if in != nil {
		js, _ := json.Marshal(in)
		body = bytes.NewReader(js)
	}
	req, _ := http.NewRequest(method, r.api.URL+path, body)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("%s %s: HTTP %d, undecodable answer %q: %v", method, path, resp.StatusCode, data, err)
		}
	}
	return resp.StatusCode
}

func taskReq(callee string) SubmitRequest {
	return SubmitRequest{
		CalleeID: callee, Capability: "analyze", Intent: "analyze the run",
		Inputs:      json.RawMessage(`{"steps":3}`),
		Constraints: task.Constraints{DataClassification: task.T1},
	}
}

// callee publishes as a callee user, with publisher confirms; on a lost
// connection it redials and republishes the same message (as the real
// callee does), which may put a duplicate in the queue.
type callee struct {
	b    *bed
	id   string
	u    user
	name string

	mu   sync.Mutex
	conn *amqp.Connection
	ch   *amqp.Channel

	republished atomic.Int64
}

func (b *bed) callee(id string) *callee {
	u, ok := b.callees[id]
	if !ok {
		b.t.Fatalf("no callee %s in the bed", id)
	}
	c := &callee{b: b, id: id, u: u, name: "fake-callee-" + id}
	b.t.Cleanup(func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.conn != nil {
			_ = c.conn.Close()
		}
	})
	return c
}

func (c *callee) channel() (*amqp.Channel, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ch != nil && !c.ch.IsClosed() {
		return c.ch, nil
	}
	if c.conn == nil || c.conn.IsClosed() {
		props := amqp.NewConnectionProperties()
		props.SetClientConnectionName(c.name)
		conn, err := amqp.DialConfig(c.b.amqpURL(c.u), amqp.Config{Properties: props, Heartbeat: 5 * time.Second})
		if err != nil {
			return nil, err
		}
		c.conn = conn
	}
	ch, err := c.conn.Channel()
	if err != nil {
		return nil, err
	}
	if err := ch.Confirm(false); err != nil {
		return nil, err
	}
	c.ch = ch
	return ch, nil
}

// publishRaw publishes msg with routing key rk and waits for the confirm,
// retrying on a lost connection.
func (c *callee) publishRaw(rk string, msg amqp.Publishing) {
	c.b.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for attempt := 0; ; attempt++ {
		if time.Now().After(deadline) {
			c.b.t.Fatalf("callee %s: could not publish to %s", c.id, rk)
		}
		if attempt > 0 {
			c.republished.Add(1)
			time.Sleep(50 * time.Millisecond)
		}
		ch, err := c.channel()
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, topology.EventsExchange, rk, true, false, msg)
		if err != nil {
			cancel()
			continue
		}
		ok, err := dc.WaitContext(ctx)
		cancel()
		if err == nil && ok {
			return
		}
	}
}

// publish encodes env as this callee (user_id set) and publishes it to the
// caller.
func (c *callee) publish(env *envelope.Envelope) {
	c.b.t.Helper()
	c.publishMarked(env, -1)
}

// publishMarked is publish with envelope.HeaderConfirmedThrough set to
// mark, as the callee sidecar sets it (no header for a negative mark).
func (c *callee) publishMarked(env *envelope.Envelope, mark int64) {
	c.b.t.Helper()
	pub, err := envelope.EncodePublishing(env, c.u.name)
	if err != nil {
		c.b.t.Fatal(err)
	}
	if mark >= 0 {
		envelope.SetConfirmedThrough(&pub, mark)
	}
	c.publishRaw(topology.EventRoutingKey(c.b.callerID, env.Session(), env.Type), pub)
}

// script builds the messages of one session the way the callee sidecar
// publishes them: task_accepted, session_created (1), progress events
// (2..n-1), task_completed, session_closed (n).
type script struct {
	sessionID string
	taskID    string
	msgs      []*envelope.Envelope
}

const testToken = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ0ZXN0In0.c2lnbmF0dXJl"

func newScript(t testing.TB, calleeID, taskID string, n int) *script {
	t.Helper()
	sid := topology.SessionID(calleeID, "alpha", taskID)
	s := &script{sessionID: sid, taskID: taskID}
	now := time.Now()
	add := func(typ envelope.MessageType, payload any) {
		env, err := envelope.NewAt(now, typ, sid, payload)
		if err != nil {
			t.Fatal(err)
		}
		s.msgs = append(s.msgs, env)
	}
	add(envelope.TypeTaskAccepted, task.TaskAccepted{TaskMessageID: taskID, SessionID: sid, SessionToken: testToken,
		RiskLevel: task.R1, ExpiresAt: task.NewTimestamp(now.Add(time.Hour))})
	add(envelope.TypeEvent, mustEvent(t, 1, &session.SessionCreatedData{State: session.StateRunning, RiskLevel: task.R1, SessionToken: testToken}))
	for seq := int64(2); seq < int64(n); seq++ {
		p := float64(seq) * 100 / float64(n)
		add(envelope.TypeEvent, mustEvent(t, seq, &session.ProgressData{Stage: "step", Percent: &p, Message: fmt.Sprintf("step %d", seq)}))
	}
	add(envelope.TypeTaskCompleted, task.TaskCompleted{Result: json.RawMessage(`{"ok":true}`), Summary: task.Summary{EventCount: int64(n)}})
	add(envelope.TypeEvent, mustEvent(t, int64(n), &session.SessionClosedData{FinalState: session.StateCompleted, Reason: "done"}))
	return s
}

func mustEvent(t testing.TB, seq int64, d session.EventData) session.EventPayload {
	t.Helper()
	p, err := session.NewEvent(seq, d)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// eventually polls check until it returns nil or timeout passes.
func eventually(t testing.TB, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		if err = check(); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s: %v", timeout, what, err)
}

// complete checks that the app received session sid completely: the answer,
// events 1..n exactly once in order, the terminal message, and no problem.
func (b *bed) complete(sid string, n int) error {
	s, ok := b.app.Session(sid)
	if !ok {
		return fmt.Errorf("session %s: nothing received", sid)
	}
	if len(s.Problems) > 0 {
		return fmt.Errorf("session %s: %v", sid, s.Problems)
	}
	if s.Answer != "task_accepted" || s.Terminal != "task_completed" || s.Events != n || s.LastSequence != int64(n) {
		return fmt.Errorf("session %s: answer %q terminal %q events %d last %d, want task_accepted, task_completed, %d, %d",
			sid, s.Answer, s.Terminal, s.Events, s.LastSequence, n, n)
	}
	return nil
}
