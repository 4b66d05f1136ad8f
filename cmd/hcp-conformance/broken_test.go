package main

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/conformance"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// naiveCaller is a deliberately broken caller: it consumes its event
// queue with no_ack (automatic acknowledgement) and processes every
// message as it arrives, without reordering or deduplication. It is a
// conformance.CallerDriver of its own.
type naiveCaller struct {
	t    *testing.T
	b    *kitBed
	conn *amqp.Connection
	pub  *amqp.Channel

	mu        sync.Mutex
	processed []conformance.Processed
	tokens    map[string]string
}

func startNaiveCaller(t *testing.T, b *kitBed) *naiveCaller {
	t.Helper()
	conn, err := amqp.Dial(b.callerURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	pub, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	cons, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	deliveries, err := cons.Consume(topology.EventQueue(bedCaller), "naive", true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := &naiveCaller{t: t, b: b, conn: conn, pub: pub, tokens: map[string]string{}}
	go func() {
		for d := range deliveries {
			env, err := envelope.Decode(d.Body)
			if err != nil {
				continue
			}
			p := conformance.Processed{SessionID: env.Session(), MessageID: env.MessageID, Type: string(env.Type)}
			var pl struct {
				TaskMessageID string          `json:"task_message_id"`
				SessionToken  string          `json:"session_token"`
				Sequence      int64           `json:"sequence"`
				EventType     string          `json:"event_type"`
				Data          json.RawMessage `json:"data"`
			}
			_ = json.Unmarshal(env.Payload, &pl)
			p.TaskMessageID, p.Sequence, p.EventType, p.Data = pl.TaskMessageID, pl.Sequence, pl.EventType, pl.Data
			n.mu.Lock()
			if pl.SessionToken != "" {
				n.tokens[env.Session()] = pl.SessionToken
			}
			n.processed = append(n.processed, p)
			n.mu.Unlock()
		}
	}()
	return n
}

func (n *naiveCaller) publish(ctx context.Context, t envelope.MessageType, sid string, payload any) error {
	env, err := envelope.New(t, sid, payload)
	if err != nil {
		return err
	}
	p, err := envelope.EncodePublishing(env, n.b.callerUser)
	if err != nil {
		return err
	}
	return n.pub.PublishWithContext(ctx, topology.CommandsExchange, bedKit, false, false, p)
}

func (n *naiveCaller) Submit(ctx context.Context, dt conformance.DriverTask) error {
	return n.publish(ctx, envelope.TypeTaskSubmit, "", task.TaskSubmit{CallerID: bedCaller, CalleeID: dt.CalleeID,
		Capability: dt.Capability, Intent: dt.Intent, Inputs: dt.Inputs})
}

func (n *naiveCaller) Abort(ctx context.Context, sid string) error {
	n.mu.Lock()
	token := n.tokens[sid]
	n.mu.Unlock()
	return n.publish(ctx, envelope.TypeAbort, sid, task.Abort{SessionToken: token})
}

func (n *naiveCaller) Processed() []conformance.Processed {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]conformance.Processed(nil), n.processed...)
}

// TestCallerKitFailsBrokenCaller: the caller kit against a caller that
// acknowledges automatically, sets no prefetch, neither reorders nor
// deduplicates, never republishes, keeps amqp091-go's 10 s heartbeat and
// does not reconnect fails the checks of what it breaks, each failure citing the spec line
// (file, line, section and text), and passes the rest it does right.
func TestCallerKitFailsBrokenCaller(t *testing.T) {
	b := newKitBed(t)
	n := startNaiveCaller(t, b)
	rep := conformance.RunCaller(t.Context(), conformance.CallerConfig{
		AMQPURL: b.kitURL, CalleeID: bedKit, CallerID: bedCaller, Driver: n, ManagementURL: b.mgmtURL,
		Timeout: 10 * time.Second, RetryWait: 2 * time.Second, Log: testWriter{t},
	})
	var out strings.Builder
	_ = rep.Print(&out)
	t.Logf("the kit against the naive caller:\n%s", out.String())
	for id, cites := range map[string]string{
		conformance.CnsManualAck:  `L1-transport-encoding.md:199 (Caller Consumer Configuration): "no_ack false Manual ACK mode."`,
		conformance.OrdInOrder:    `L2-session-lifecycle.md:113 (Event Ordering): "Consumers MUST process events in sequence order."`,
		conformance.DdpOnce:       `L2-session-lifecycle.md:124 (Integration with L1 Stream Continuity)`,
		conformance.CnsPrefetch:   `L1-transport-encoding.md:200 (Caller Consumer Configuration)`,
		conformance.CnsHeartbeat:  `L1-transport-encoding.md:298 (Network Partition (Temporary Disconnection)): "HCP implementations SHOULD configure heartbeats"`,
		conformance.OrdReordered:  `L2-session-lifecycle.md:114 (Event Ordering): "the consumer SHOULD buffer and reorder"`,
		conformance.RcnReconnects: `L1-transport-encoding.md:336 (Broker Failure)`,
		conformance.RcnResumes:    `L1-transport-encoding.md:169 (Stream Continuity)`,
		conformance.SubRetried:    `L1-transport-encoding.md:148 (Delivery Guarantees: Command Channel): "it SHOULD republish the task_submit with the same message_id"`,
	} {
		row, _ := rep.Row(id)
		if row.Result != conformance.Fail {
			t.Errorf("%s: %s (%s), want fail", id, row.Result, row.Detail)
		}
		if !strings.Contains(out.String(), "- "+id+" [") || !strings.Contains(out.String(), cites) {
			t.Errorf("%s: the failure does not cite %s", id, cites)
		}
	}
	for _, id := range []string{conformance.CmdDeliveryMode, conformance.CmdContentType, conformance.SubPublished, conformance.AbrToken, conformance.AccFirst, conformance.RjcProcessed, conformance.AbrTransient, conformance.CnsExclusive} {
		if row, _ := rep.Row(id); row.Result != conformance.Pass {
			t.Errorf("%s: %s (%s), want pass: the naive caller does that right", id, row.Result, row.Detail)
		}
	}
	for _, row := range rep.Rows {
		if row.Profile != conformance.ProfileSpec {
			t.Errorf("%s of profile %s in a spec run", row.ID, row.Profile)
		}
	}
}

// testWriter sends the kit's progress lines to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
