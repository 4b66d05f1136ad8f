package relay

import (
	"context"
	"encoding/json"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"net/http"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecallee"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
	"github.com/hcp-io/hcp-operator/pkg/conformance"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// kitCallerID is the callee kit's own caller identity in the bed.
const kitCallerID = "hcp-conformance"

// TestConformanceKitAgainstCalleeSidecar runs the callee kit
// (pkg/conformance, the library behind `hcp-conformance callee`) with
// profile hcp-operator against this project's callee sidecar and the
// sample callee harness, in-process on the local RabbitMQ and an API
// server: every check must pass. The kit has a caller identity of its own
// (a broker user named and permitted as the operator does, its event
// queue with the operator's arguments, a Caller object and a policy rule
// admitting it). HCP_CONFORMANCE_CALLEE_REPORT=FILE writes the table to
// FILE, HCP_CONFORMANCE_CALLEE_JSON=FILE the JSON report.
func TestConformanceKitAgainstCalleeSidecar(t *testing.T) {
	rules := append(defaultRules(), v1alpha1.PolicyRule{
		Name: "kit-analyze", Callers: v1alpha1.CallerMatch{IDs: []string{kitCallerID}},
		Capabilities: []string{"analyze"}, MaxRiskLevel: v1alpha1.RiskR2,
	})
	b := newBed(t, bedOptions{
		Harness: func(url string, log logr.Logger) http.Handler { return samplecallee.New(url, log).Handler() },
		App:     samplecaller.NewRecorder().Handler(),
		Rules:   rules,
	})
	kit := b.newUser(topology.RoleCaller, kitCallerID)
	must(t, withChannel(b.adminURL(), func(ch *amqp.Channel) error {
		if _, err := ch.QueueDeclare(topology.EventQueue(kitCallerID), true, false, false, false, eventQueueArgs()); err != nil {
			return err
		}
		return ch.QueueBind(topology.EventQueue(kitCallerID), topology.EventBindingKey(kitCallerID), topology.EventsExchange, false, nil)
	}))
	must(t, b.env.Client.Create(t.Context(), &v1alpha1.Caller{ObjectMeta: metav1.ObjectMeta{Name: kitCallerID, Namespace: b.ns}}))
	mg, err := url.Parse(b.broker.ManagementURL)
	must(t, err)
	mg.User = url.UserPassword(b.broker.Username, b.broker.Password)

	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	rep := conformance.Run(ctx, conformance.Config{
		AMQPURL: b.broker.AMQPURI(kit.name, kit.password, b.vhost), CalleeID: calleeID, CallerID: kitCallerID,
		Capability: "analyze", Inputs: json.RawMessage(`{"steps":3,"step_ms":50}`),
		AbortInputs: json.RawMessage(`{"steps":600,"step_ms":50}`), DataClassification: "T2",
		ManagementURL: mg.String(), Timeout: 30 * time.Second, Profile: conformance.ProfileHCPOperator,
	})
	var out strings.Builder
	_ = rep.Print(&out)
	t.Logf("hcp-conformance callee against the callee sidecar (%s):\n%s", time.Since(start).Round(100*time.Millisecond), out.String())
	if n := rep.Count(conformance.Pass); n != len(rep.Rows) || len(rep.Rows) != len(conformance.Checks()) {
		t.Errorf("%d of %d checks passed (%d failed, %d skipped); want all %d", n, len(rep.Rows), rep.Count(conformance.Fail), rep.Count(conformance.Skip), len(conformance.Checks()))
	}
	if path := os.Getenv("HCP_CONFORMANCE_CALLEE_REPORT"); path != "" {
		must(t, os.WriteFile(path, []byte(out.String()), 0o644))
	}
	if path := os.Getenv("HCP_CONFORMANCE_CALLEE_JSON"); path != "" {
		must(t, rep.WriteFiles(path, ""))
	}
}
