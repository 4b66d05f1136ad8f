package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/internal/transport/transporttest"
	"github.com/hcp-io/hcp-operator/pkg/conformance"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// The ids of the caller-kit beds: the caller under test and the kit's
// own callee identity.
const (
	bedCaller = "alpha"
	bedKit    = "hcp-conformance"
)

// kitBed is a vhost of the local RabbitMQ with the HCP topology of one
// caller and the kit's callee, as the operator declares it, and broker
// users with the DESIGN permissions.
type kitBed struct {
	broker     *transporttest.Broker
	vhost      string
	callerURL  string
	kitURL     string
	callerUser string
	mgmtURL    string
}

func newKitBed(t *testing.T) *kitBed {
	t.Helper()
	b := &kitBed{broker: transporttest.RabbitMQ(t)}
	b.vhost = b.broker.NewVhost(t)
	mg, err := url.Parse(b.broker.ManagementURL)
	if err != nil {
		t.Fatal(err)
	}
	mg.User = url.UserPassword(b.broker.Username, b.broker.Password)
	b.mgmtURL = mg.String()
	user := func(role topology.Role, id string) string {
		name := topology.Username(role, b.vhost, id)
		pw := fmt.Sprintf("pw-%d", time.Now().UnixNano())
		b.broker.SetUser(t, b.vhost, name, pw)
		p := topology.PermissionsFor(role, id)
		b.mgmtPut(t, "/api/permissions/"+url.PathEscape(b.vhost)+"/"+url.PathEscape(name),
			map[string]string{"configure": p.Configure, "write": p.Write, "read": p.Read})
		return b.broker.UserURL(b.vhost, name, pw)
	}
	b.callerUser = topology.Username(topology.RoleCaller, b.vhost, bedCaller)
	b.callerURL = user(topology.RoleCaller, bedCaller)
	b.kitURL = user(topology.RoleCallee, bedKit)

	conn, err := amqp.Dial(b.broker.URL(b.vhost))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(ch.ExchangeDeclare(topology.CommandsExchange, topology.CommandsExchangeType, true, false, false, false, nil))
	must(ch.ExchangeDeclare(topology.EventsExchange, topology.EventsExchangeType, true, false, false, false, nil))
	_, err = ch.QueueDeclare(topology.EventQueue(bedCaller), true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-message-ttl": int64(86400000), "x-max-length": int64(100000), "x-overflow": "drop-head",
		"x-single-active-consumer": true,
	})
	must(err)
	must(ch.QueueBind(topology.EventQueue(bedCaller), topology.EventBindingKey(bedCaller), topology.EventsExchange, false, nil))
	_, err = ch.QueueDeclare(topology.CommandQueue(bedKit), true, false, false, false, amqp.Table{"x-queue-type": "quorum"})
	must(err)
	must(ch.QueueBind(topology.CommandQueue(bedKit), topology.CommandRoutingKey(bedKit), topology.CommandsExchange, false, nil))
	return b
}

func (b *kitBed) mgmtPut(t *testing.T, path string, body any) {
	t.Helper()
	js, _ := json.Marshal(body)
	req, _ := http.NewRequest(http.MethodPut, b.broker.ManagementURL+path, bytes.NewReader(js))
	req.SetBasicAuth(b.broker.Username, b.broker.Password)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT %s: HTTP %d", path, resp.StatusCode)
	}
}

// startCallerSidecar runs this project's caller sidecar in-process
// (internal/sidecar/caller, without Kubernetes: positions in its state
// directory only), its app at appURL; it returns the sidecar's app API
// URL.
func (b *kitBed) startCallerSidecar(t *testing.T, appURL string) string {
	t.Helper()
	log := testr.NewWithOptions(t, testr.Options{LogTimestamp: true})
	conn, err := transport.Dial(context.Background(), transport.Options{
		URL: b.callerURL, ConnectionName: "caller sidecar under test", Logger: log.WithName("amqp"),
		BackoffMin: 100 * time.Millisecond, BackoffMax: time.Second, DrainTimeout: 3 * time.Second, DrainWithoutCancel: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := transport.NewPublisher(conn, transport.PublisherOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := caller.New(caller.Options{
		Config: &config.Config{
			Mode: config.ModeCaller, ID: bedCaller, ObjectName: bedCaller, Namespace: "default",
			Vhost: b.vhost, AMQPURL: b.callerURL, Username: b.callerUser, HarnessURL: appURL,
			Prefetch: 10, StateDir: t.TempDir(), Heartbeat: 5 * time.Second,
		},
		Publisher: pub, Consumer: conn, Log: log,
		// An unanswered task_submit is republished after 1 s (the
		// default 30 s would make SUB-2 wait that long).
		SubmitRetry: caller.RetryPolicy{Timeout: time.Second},
	})
	if err != nil {
		t.Fatal(err)
	}
	api := httptest.NewServer(sc.Handler())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("caller sidecar: Run: %v", err)
			}
		case <-time.After(30 * time.Second):
			t.Error("caller sidecar: Run did not return within 30s")
		}
		api.Close()
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer ccancel()
		_ = conn.Close(cctx)
	})
	b.waitConsumer(t)
	return api.URL
}

// waitConsumer waits until the caller's event queue has a consumer: the
// sidecar subscribes after it starts (TOP-6 checks that it does).
func (b *kitBed) waitConsumer(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := amqp.Dial(b.broker.URL(b.vhost))
		if err == nil {
			var q amqp.Queue
			if ch, err := conn.Channel(); err == nil {
				q, _ = ch.QueueDeclarePassive(topology.EventQueue(bedCaller), true, false, false, false, nil)
			}
			_ = conn.Close()
			if q.Consumers > 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no consumer on %s 30s after the caller sidecar started", topology.EventQueue(bedCaller))
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// freeAddr returns a loopback address no one listens on (for the kit's
// app endpoint, which the sidecar must know before the kit starts).
func freeAddr(t *testing.T) string {
	t.Helper()
	addr, err := testbed.FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestCallerKitAgainstCallerSidecar runs `hcp-conformance caller` (the
// command's own code path) against this project's caller sidecar, run
// in-process against the local RabbitMQ, with profile hcp-operator: every
// check must pass, and the JSON and JUnit reports must say so.
// HCP_CONFORMANCE_REPORT=FILE writes the command line and its output to
// FILE (docs/conformance-kit.md shows one).
func TestCallerKitAgainstCallerSidecar(t *testing.T) {
	b := newKitBed(t)
	app := freeAddr(t)
	api := b.startCallerSidecar(t, "http://"+app)
	dir := t.TempDir()
	jsonPath, junitPath := filepath.Join(dir, "report.json"), filepath.Join(dir, "report.xml")
	args := []string{"caller", "--amqp-url", b.kitURL, "--callee", bedKit, "--caller", bedCaller,
		"--caller-api", api, "--app-listen", app, "--management-url", b.mgmtURL, "--profile", conformance.ProfileHCPOperator,
		"--data-class", "T1", "--timeout", "30s", "--retry-wait", "10s", "--report-json", jsonPath, "--report-junit", junitPath}
	var stdout, stderr strings.Builder
	start := time.Now()
	code := run(args, &stdout, &stderr)
	t.Logf("hcp-conformance caller … (%s):\n%s\n%s", time.Since(start).Round(100*time.Millisecond), stdout.String(), stderr.String())
	if code != 0 {
		t.Errorf("exit status %d, want 0", code)
	}
	var rep conformance.Report
	js, err := os.ReadFile(jsonPath)
	if err == nil {
		err = json.Unmarshal(js, &rep)
	}
	if err != nil {
		t.Fatalf("JSON report: %v", err)
	}
	if rep.Kit != "caller" || rep.Profile != conformance.ProfileHCPOperator || len(rep.Rows) != len(conformance.CallerChecks()) || rep.Count(conformance.Pass) != len(rep.Rows) {
		t.Errorf("JSON report: kit %q profile %q, %d rows (want %d), %d pass", rep.Kit, rep.Profile, len(rep.Rows), len(conformance.CallerChecks()), rep.Count(conformance.Pass))
	}
	var ju struct {
		Suites []struct {
			Tests    int `xml:"tests,attr"`
			Failures int `xml:"failures,attr"`
		} `xml:"testsuite"`
	}
	x, err := os.ReadFile(junitPath)
	if err == nil {
		err = xml.Unmarshal(x, &ju)
	}
	if err != nil || len(ju.Suites) != 1 || ju.Suites[0].Tests != len(rep.Rows) || ju.Suites[0].Failures != 0 {
		t.Errorf("JUnit report: %+v %v", ju, err)
	}
	if path := os.Getenv("HCP_CONFORMANCE_REPORT"); path != "" {
		shown := strings.NewReplacer(b.kitURL, "amqp://callee.hcp-conformance@…:…@127.0.0.1:5672/VHOST", b.mgmtURL, "http://guest:…@127.0.0.1:15672").Replace(strings.Join(args, " "))
		host, _ := os.Hostname()
		out := fmt.Sprintf("$ hcp-conformance %s\n# exit status %d; %s on %s\n\n%s", shown, code, time.Now().UTC().Format(time.RFC3339), host, stdout.String())
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Error(err)
		}
	}
}
