package conformance

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

const (
	testCaller = "kit"
	testCallee = "lab"
	testVhost  = "/hcp"
)

var calleeUser = topology.Username(topology.RoleCallee, testVhost, testCallee)

// delivery is what a conforming callee publishes for env, as the caller
// receives it.
func delivery(t *testing.T, env *envelope.Envelope) amqp.Delivery {
	t.Helper()
	p, err := envelope.EncodePublishing(env, calleeUser)
	if err != nil {
		t.Fatal(err)
	}
	return amqp.Delivery{
		ContentType: p.ContentType, ContentEncoding: p.ContentEncoding, DeliveryMode: p.DeliveryMode,
		CorrelationId: p.CorrelationId, MessageId: p.MessageId, Timestamp: p.Timestamp, Type: p.Type, UserId: p.UserId,
		Exchange: topology.EventsExchange, RoutingKey: topology.EventRoutingKey(testCaller, env.Session(), env.Type), Body: p.Body,
	}
}

func progressEvent(t *testing.T, sid string, seq int64) *envelope.Envelope {
	t.Helper()
	pct := 50.0
	p, err := session.NewEvent(seq, &session.ProgressData{Stage: "step 1/2", Percent: &pct, Message: "working"})
	if err != nil {
		t.Fatal(err)
	}
	env, err := envelope.New(envelope.TypeEvent, sid, p)
	if err != nil {
		t.Fatal(err)
	}
	return env
}

func TestCheckMessageConforming(t *testing.T) {
	sid := envelope.NewMessageID()
	exp := Expect{CallerID: testCaller, CalleeUser: calleeUser}
	rejected, err := envelope.New(envelope.TypeTaskRejected, sid, task.TaskRejected{TaskMessageID: envelope.NewMessageID(), ReasonCode: task.ReasonUnknownCapability, Message: "no such capability"})
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range []*envelope.Envelope{progressEvent(t, sid, 1), rejected} {
		got, v := CheckMessage(delivery(t, env), exp)
		if len(v) != 0 || got == nil || !got.Equal(env) {
			t.Errorf("%s: violations %v, envelope %v", env.Type, v, got)
		}
	}
}

// Each crafted delivery breaks one rule and must fail exactly that check.
func TestCheckMessageViolations(t *testing.T) {
	sid := envelope.NewMessageID()
	exp := Expect{CallerID: testCaller, CalleeUser: calleeUser}
	cases := []struct {
		name string
		edit func(*amqp.Delivery)
		want string
	}{
		{"content_type text/plain", func(d *amqp.Delivery) { d.ContentType = "text/plain" }, MsgContentType},
		{"content_type missing", func(d *amqp.Delivery) { d.ContentType = "" }, MsgContentType},
		{"content_encoding gzip", func(d *amqp.Delivery) { d.ContentEncoding = "gzip" }, MsgContentEncoding},
		{"transient delivery", func(d *amqp.Delivery) { d.DeliveryMode = amqp.Transient }, MsgDeliveryMode},
		{"no message_id property", func(d *amqp.Delivery) { d.MessageId = "" }, MsgMessageID},
		{"message_id property differs", func(d *amqp.Delivery) { d.MessageId = envelope.NewMessageID() }, MsgMessageID},
		{"correlation_id differs", func(d *amqp.Delivery) { d.CorrelationId = envelope.NewMessageID() }, MsgMirrored},
		{"type property differs", func(d *amqp.Delivery) { d.Type = "task_completed" }, MsgMirrored},
		{"no user_id", func(d *amqp.Delivery) { d.UserId = "" }, MsgUserID},
		{"another user_id", func(d *amqp.Delivery) { d.UserId = "callee.other@/hcp" }, MsgUserID},
		{"routing key of another caller", func(d *amqp.Delivery) {
			d.RoutingKey = topology.EventRoutingKey("other", sid, envelope.TypeEvent)
		}, MsgRoutingKey},
		{"routing key of another session", func(d *amqp.Delivery) {
			d.RoutingKey = topology.EventRoutingKey(testCaller, envelope.NewMessageID(), envelope.TypeEvent)
		}, MsgRoutingKey},
		{"routing key malformed", func(d *amqp.Delivery) { d.RoutingKey = testCaller }, MsgRoutingKey},
		{"body not JSON", func(d *amqp.Delivery) { d.Body = []byte("\x00garbage") }, MsgEnvelope},
		{"session_id null on an event", func(d *amqp.Delivery) {
			d.Body = []byte(strings.Replace(string(d.Body), `"session_id":"`+sid+`"`, `"session_id":null`, 1))
		}, MsgSessionID},
		{"event sequence 0 (an integer for L2, below this project's 1)", func(d *amqp.Delivery) {
			d.Body = []byte(strings.Replace(string(d.Body), `"sequence":1`, `"sequence":0`, 1))
		}, MsgPayloadSchema},
		{"event sequence not an integer", func(d *amqp.Delivery) {
			d.Body = []byte(strings.Replace(string(d.Body), `"sequence":1`, `"sequence":"1"`, 1))
		}, MsgPayload},
		{"unknown envelope key (spec-silent: this project refuses it)", func(d *amqp.Delivery) {
			d.Body = []byte(strings.Replace(string(d.Body), `{"hcp_version"`, `{"x_extra":1,"hcp_version"`, 1))
		}, MsgStrictEnvelope},
		{"command type on the event channel", func(d *amqp.Delivery) {
			env, _ := envelope.New(envelope.TypeAbort, sid, task.Abort{SessionToken: "a.b.c"})
			body, _ := envelope.Encode(env)
			d.Body, d.MessageId, d.Type = body, env.MessageID, string(env.Type)
		}, MsgEnvelope},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d := delivery(t, progressEvent(t, sid, 1))
			c.edit(&d)
			_, v := CheckMessage(d, exp)
			if _, ok := v[c.want]; !ok {
				t.Fatalf("violations %v, want %s", v, c.want)
			}
		})
	}
	// With no expected callee user, any user_id passes but a missing one
	// does not.
	d := delivery(t, progressEvent(t, sid, 1))
	d.UserId = "someone"
	if _, v := CheckMessage(d, Expect{CallerID: testCaller}); len(v) != 0 {
		t.Errorf("any user_id: %v", v)
	}
	// Nothing panics on an empty delivery.
	if env, v := CheckMessage(amqp.Delivery{}, exp); env != nil || len(v) == 0 {
		t.Errorf("empty delivery: %v %v", env, v)
	}
}

func ev(t *testing.T, seq int64, d session.EventData) Event {
	t.Helper()
	raw, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	return Event{MessageID: envelope.NewMessageID(), Sequence: seq, Type: d.EventType(), Data: raw}
}

// completed is a conforming stream: PENDING → RUNNING → COMPLETED.
func completed(t *testing.T) []Event {
	pct := 100.0
	return []Event{
		ev(t, 1, &session.SessionCreatedData{State: session.StatePending, RiskLevel: task.R1, SessionToken: "a.b.c"}),
		ev(t, 2, &session.StateChangedData{FromState: session.StatePending, ToState: session.StateRunning, Reason: "admitted"}),
		ev(t, 3, &session.ProgressData{Stage: "s", Percent: &pct, Message: "m"}),
		ev(t, 4, &session.StateChangedData{FromState: session.StateRunning, ToState: session.StateCompleted, Reason: "done"}),
		ev(t, 5, &session.SessionClosedData{FinalState: session.StateCompleted, Reason: "done"}),
	}
}

func TestCheckSequence(t *testing.T) {
	good := completed(t)
	if err := CheckSequence(good); err != nil {
		t.Fatal(err)
	}
	renumber := func(seqs ...int64) []Event {
		out := make([]Event, len(seqs))
		for i, s := range seqs {
			out[i] = good[i]
			out[i].Sequence = s
		}
		return out
	}
	for name, evs := range map[string][]Event{
		"gap":             renumber(1, 2, 4),
		"starts at 2":     renumber(2, 3),
		"repeat":          renumber(1, 2, 2),
		"step back":       renumber(1, 3, 2),
		"same id, no seq": append(renumber(1), Event{MessageID: "x", Sequence: 1}),
	} {
		if err := CheckSequence(evs); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestCheckTransitions(t *testing.T) {
	w, err := CheckTransitions(completed(t))
	if err != nil || !w.Closed || w.FinalState != session.StateCompleted {
		t.Fatalf("conforming stream: %+v %v", w, err)
	}
	abort := []Event{
		ev(t, 1, &session.SessionCreatedData{State: session.StatePending, RiskLevel: task.R1, SessionToken: "a.b.c"}),
		ev(t, 2, &session.StateChangedData{FromState: session.StatePending, ToState: session.StateRunning}),
		ev(t, 3, &session.StateChangedData{FromState: session.StateRunning, ToState: session.StateAborting}),
		ev(t, 4, &session.StateChangedData{FromState: session.StateAborting, ToState: session.StateAborted}),
		ev(t, 5, &session.SessionClosedData{FinalState: session.StateAborted}),
	}
	if w, err := CheckTransitions(abort); err != nil || w.FinalState != session.StateAborted || len(w.States) != 4 {
		t.Fatalf("abort stream: %+v %v", w, err)
	}
	bad := map[string][]Event{
		"PENDING to COMPLETED": {ev(t, 1, &session.StateChangedData{FromState: session.StatePending, ToState: session.StateCompleted})},
		"from_state is not the current state": {
			ev(t, 1, &session.StateChangedData{FromState: session.StateRunning, ToState: session.StateCompleted}),
		},
		"ABORTING to COMPLETED": append(abort[:3:3], ev(t, 4, &session.StateChangedData{FromState: session.StateAborting, ToState: session.StateCompleted})),
		"closed while RUNNING":  append(completed(t)[:3:3], ev(t, 4, &session.SessionClosedData{FinalState: session.StateRunning})),
		"closed with another final state": append(completed(t)[:4:4],
			ev(t, 5, &session.SessionClosedData{FinalState: session.StateFailed})),
		"event after session_closed": append(completed(t), ev(t, 6, &session.LogData{Level: session.LogInfo, Message: "late"})),
		"session_created in COMPLETED": {
			ev(t, 1, &session.SessionCreatedData{State: session.StateCompleted, RiskLevel: task.R1, SessionToken: "a.b.c"}),
		},
	}
	for name, evs := range bad {
		if _, err := CheckTransitions(evs); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestTerminalMessage(t *testing.T) {
	sid := envelope.NewMessageID()
	msg := func(typ envelope.MessageType, payload any) *Message {
		env, err := envelope.New(typ, sid, payload)
		if err != nil {
			t.Fatal(err)
		}
		return &Message{Env: env}
	}
	closedEv := func(final session.State) *Message {
		p, _ := session.NewEvent(9, &session.SessionClosedData{FinalState: final})
		return msg(envelope.TypeEvent, p)
	}
	done := msg(envelope.TypeTaskCompleted, task.TaskCompleted{})
	if err := terminalMessage([]*Message{done, closedEv(session.StateCompleted)}, session.StateCompleted); err != nil {
		t.Error(err)
	}
	for name, c := range map[string]struct {
		msgs  []*Message
		final session.State
	}{
		"COMPLETED without task_completed": {[]*Message{closedEv(session.StateCompleted)}, session.StateCompleted},
		"task_completed after closing":     {[]*Message{closedEv(session.StateCompleted), done}, session.StateCompleted},
		"ABORTED with task_completed":      {[]*Message{done, closedEv(session.StateAborted)}, session.StateAborted},
	} {
		if err := terminalMessage(c.msgs, c.final); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestManagementJudgements(t *testing.T) {
	cfg, err := Config{AMQPURL: "amqp://u:p@h/x", CalleeID: testCallee, CallerID: testCaller, Capability: "c"}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	check := func(name string, want Result, got Result, detail string) {
		t.Helper()
		if got != want {
			t.Errorf("%s: %s (%s), want %s", name, got, detail, want)
		}
	}
	res, d := commandQueueResult(true, map[string]any{"x-queue-type": "quorum"}, true, cfg)
	check("command queue", Pass, res, d)
	res, d = commandQueueResult(true, map[string]any{"x-message-ttl": float64(1000)}, true, cfg)
	check("command queue with TTL", Fail, res, d)
	res, d = commandQueueResult(true, nil, false, cfg)
	check("command queue unbound", Fail, res, d)
	res, d = commandQueueResult(false, nil, true, cfg)
	check("command queue transient", Fail, res, d)

	res, d = eventQueueTTLResult(map[string]any{"x-message-ttl": float64(86400000)})
	check("TTL 24h", Pass, res, d)
	res, d = eventQueueTTLResult(map[string]any{})
	check("no TTL", Fail, res, d)
	res, d = eventQueueTTLResult(map[string]any{"x-message-ttl": "1d"})
	check("TTL not a number", Fail, res, d)

	res, d = eventQueueMaxResult(map[string]any{"x-max-length": float64(100000), "x-overflow": "drop-head"})
	check("max length drop-head", Pass, res, d)
	res, d = eventQueueMaxResult(map[string]any{"x-max-length-bytes": float64(1 << 20)})
	check("max bytes", Pass, res, d)
	res, d = eventQueueMaxResult(map[string]any{"x-max-length": float64(10), "x-overflow": "reject-publish"})
	check("reject-publish", Fail, res, d)
	res, d = eventQueueMaxResult(nil)
	check("no limit", Fail, res, d)
}

func TestReportPrint(t *testing.T) {
	rep := Report{Rows: []Row{
		{ID: "MSG-3", Ref: "L1:356", Statement: "content_type", Result: Pass, Detail: "all 3"},
		{ID: "MSG-4", Ref: "L1:357", Statement: "a | b", Result: Fail, Detail: "got\n\"x|y\"" + strings.Repeat("z", 300), Level: "MUST", Cite: cite("L1:357", "q")},
		{ID: "MGMT-1", Ref: "L1:100", Statement: "types", Result: Skip, Detail: "no URL"},
	}}
	var b strings.Builder
	if err := rep.Print(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 11 { // header, rule, 3 rows, blank, summary, blank, heading, blank, one failure
		t.Fatalf("%d lines:\n%s", len(lines), out)
	}
	for _, want := range []string{
		"| MSG-3 | L1:356 | content_type | pass | all 3 |",
		`| MSG-4 | L1:357 | a \| b | **FAIL** | got "x\|y"zzz`,
		"| MGMT-1 | L1:100 | types | skip | no URL |",
		"3 checks: 1 pass, 1 fail, 1 skip",
		`- MSG-4 [MUST] L1-transport-encoding.md:357 (Encoding): "q": got "x\|y"zzz`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, l := range lines[2:5] {
		if strings.Count(l, "|")-strings.Count(l, `\|`) != 6 {
			t.Errorf("row with other than 5 cells: %s", l)
		}
	}
	if !rep.Failed() || (Report{Rows: rep.Rows[:1]}).Failed() {
		t.Error("Failed is wrong")
	}
}

// Every check in the catalog has a unique id and a spec reference, and
// the report has one row per check.
func TestCatalog(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range Checks() {
		if seen[c.ID] || c.Ref == "" || c.Statement == "" {
			t.Errorf("check %+v: duplicate or incomplete", c)
		}
		seen[c.ID] = true
	}
	rep := newRecorder().report()
	if len(rep.Rows) != len(checks) || !rep.Failed() || rep.Count(Fail) != len(checks) {
		t.Errorf("an empty run: %d rows, %d failed; want every check failed (not evaluated)", len(rep.Rows), rep.Count(Fail))
	}
}

func TestConfigValidate(t *testing.T) {
	good := Config{AMQPURL: "amqp://caller.kit@%2Fhcp:pw@127.0.0.1:5672/%2Fhcp", CalleeID: testCallee, CallerID: testCaller, Capability: "cvd.run-synthesis", Inputs: json.RawMessage(`{"steps":3}`)}
	rc, err := good.resolve()
	if err != nil {
		t.Fatal(err)
	}
	if rc.Vhost != "/hcp" || rc.CalleeUser != calleeUser || rc.AbortCapability != good.Capability || string(rc.AbortInputs) != `{"steps":3}` {
		t.Errorf("resolved %+v", rc)
	}
	for name, edit := range map[string]func(*Config){
		"no URL":               func(c *Config) { c.AMQPURL = "" },
		"not a URL":            func(c *Config) { c.AMQPURL = "http://x" },
		"bad callee id":        func(c *Config) { c.CalleeID = "Lab.CVD" },
		"no caller id":         func(c *Config) { c.CallerID = "" },
		"no capability":        func(c *Config) { c.Capability = "" },
		"inputs not an object": func(c *Config) { c.Inputs = json.RawMessage(`[1]`) },
		"inputs not JSON":      func(c *Config) { c.AbortInputs = json.RawMessage(`{`) },
		"bad data class":       func(c *Config) { c.DataClassification = "T9" },
		"bad management URL":   func(c *Config) { c.ManagementURL = "ftp://x" },
		"negative timeout":     func(c *Config) { c.Timeout = -time.Second },
	} {
		c := good
		edit(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// Bad input never panics: Run fails every check with the reason.
func TestRunWithoutPeer(t *testing.T) {
	rep := Run(context.Background(), Config{})
	if rep.Count(Fail) != len(rep.Rows) || !strings.Contains(rep.Rows[0].Detail, "invalid configuration") {
		t.Errorf("empty config: %+v", rep.Rows[0])
	}
	rep = Run(context.Background(), Config{AMQPURL: "amqp://u:p@127.0.0.1:1/", CalleeID: testCallee, CallerID: testCaller, Capability: "c", Timeout: time.Second})
	if rep.Count(Fail) != len(rep.Rows) || !strings.Contains(rep.Rows[0].Detail, "not run") {
		t.Errorf("no broker: %+v", rep.Rows[0])
	}
}

func TestHoldRule(t *testing.T) {
	sid, taskID := envelope.NewMessageID(), envelope.NewMessageID()
	acc, err := envelope.New(envelope.TypeTaskAccepted, sid, json.RawMessage(`{"task_message_id":"`+taskID+`","session_id":"`+sid+`"}`))
	if err != nil {
		t.Fatal(err)
	}
	h := &holdRule{task: taskID, keep: 2}
	var held []bool
	held = append(held, h.hold(&Message{Env: acc}))
	for i := int64(1); i <= 4; i++ {
		held = append(held, h.hold(&Message{Env: progressEvent(t, sid, i)}))
	}
	held = append(held, h.hold(&Message{Env: progressEvent(t, envelope.NewMessageID(), 1)}), h.hold(&Message{}))
	if want := []bool{false, false, false, true, true, false, false}; !equalBools(held, want) {
		t.Errorf("held %v, want %v", held, want)
	}
	var none *holdRule
	if none.hold(&Message{Env: acc}) {
		t.Error("nil rule held a message")
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// The aggregate checks over all messages: a message_id reused for another
// body fails MSG-10 (a redelivery with the same body does not), a returned
// publish fails TOP-5, one bad message fails its check for the run.
func TestAggregateMessageChecks(t *testing.T) {
	cfg, err := Config{AMQPURL: "amqp://caller.kit@%2Fhcp:p@h/%2Fhcp", CalleeID: testCallee, CallerID: testCaller, Capability: "c"}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	sid := envelope.NewMessageID()
	exp := Expect{CallerID: testCaller, CalleeUser: cfg.CalleeUser}
	msg := func(d amqp.Delivery) *Message {
		env, v := CheckMessage(d, exp)
		return &Message{D: d, Env: env, V: v, Gen: 1, Acked: true}
	}
	one := delivery(t, progressEvent(t, sid, 1))
	two := delivery(t, progressEvent(t, sid, 2))

	evaluate := func(msgs []*Message, returned bool) Report {
		k := newKit(cfg)
		k.msgs, k.nPublish = msgs, 3
		if returned {
			k.nReturns, k.returned["x"] = 1, "312 NO_ROUTE"
		}
		r := newRecorder()
		(&run{k: k, r: r}).messages()
		return r.report()
	}
	result := func(rep Report, id string) Result {
		row, _ := rep.Row(id)
		return row.Result
	}

	redelivered := one
	redelivered.Redelivered = true
	rep := evaluate([]*Message{msg(one), msg(two), msg(redelivered)}, false)
	for _, id := range []string{MsgUniqueID, MsgContentType, TopCommandRouting} {
		if result(rep, id) != Pass {
			t.Errorf("conforming messages: %s %s", id, result(rep, id))
		}
	}

	reused := two
	reused.Body = []byte(strings.Replace(string(two.Body), two.MessageId, one.MessageId, 1))
	reused.MessageId = one.MessageId
	plain := two
	plain.ContentType = "text/plain"
	rep = evaluate([]*Message{msg(one), msg(reused), msg(plain)}, true)
	for _, id := range []string{MsgUniqueID, MsgContentType, TopCommandRouting} {
		if result(rep, id) != Fail {
			t.Errorf("bad messages: %s %s", id, result(rep, id))
		}
	}
	if rep := evaluate(nil, false); result(rep, MsgEnvelope) != Fail {
		t.Error("no message at all must fail")
	}
}

// The continuity judgement from crafted deliveries: messages 1-3
// acknowledged on the first connection, 4 held, then 4 redelivered and 5
// new on the second.
func TestJudgeContinuity(t *testing.T) {
	sid := envelope.NewMessageID()
	evs := completed(t)
	envs := make([]*envelope.Envelope, 0, len(evs))
	for _, e := range evs {
		env, err := envelope.New(envelope.TypeEvent, sid, session.EventPayload{EventType: e.Type, Sequence: e.Sequence, Data: e.Data})
		if err != nil {
			t.Fatal(err)
		}
		envs = append(envs, env)
	}
	m := func(i, gen int, acked, redelivered bool) *Message {
		return &Message{Env: envs[i], Gen: gen, Acked: acked, D: amqp.Delivery{Redelivered: redelivered}}
	}
	judge := func(msgs []*Message, nFresh int) Report {
		r := newRecorder()
		judgeContinuity(r, time.Second, sid, 1, 4, nFresh, msgs)
		return r.report()
	}
	results := func(rep Report) []Result {
		out := make([]Result, 0, 3)
		for _, id := range []string{ConRetained, ConRedelivery, ConNoGap} {
			row, _ := rep.Row(id)
			out = append(out, row.Result)
		}
		return out
	}
	gen1 := []*Message{m(0, 1, true, false), m(1, 1, true, false), m(2, 1, true, false), m(3, 1, false, false)}
	for _, c := range []struct {
		name   string
		msgs   []*Message
		nFresh int
		want   []Result
	}{
		{"conforming", append(gen1[:4:4], m(3, 2, true, true), m(4, 2, true, false)), 1, []Result{Pass, Pass, Pass}},
		{"held message not flagged redelivered", append(gen1[:4:4], m(3, 2, true, false), m(4, 2, true, false)), 1, []Result{Pass, Fail, Pass}},
		{"acknowledged message delivered again", append(gen1[:4:4], m(1, 2, true, true), m(3, 2, true, true), m(4, 2, true, false)), 1, []Result{Pass, Fail, Pass}},
		{"held message lost", append(gen1[:4:4], m(4, 2, true, false)), 1, []Result{Pass, Fail, Fail}}, // 1,2,3,5: a gap (L2:126)
		{"nothing new after the reconnect", append(gen1[:4:4], m(3, 2, true, true)), 0, []Result{Fail, Pass, Fail}},
		{"nothing held", append(gen1[:3:3], m(3, 1, true, false), m(4, 2, true, false)), 1, []Result{Fail, Fail, Pass}},
	} {
		if got := results(judge(c.msgs, c.nFresh)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestEffectiveLimits: limits set by policy count like arguments (the
// operator's queues carry none); for numbers the lower wins, for overflow
// the policy.
func TestEffectiveLimits(t *testing.T) {
	args := map[string]any{"x-queue-type": "quorum", "x-single-active-consumer": true}
	def := map[string]any{"message-ttl": float64(86400000), "max-length": float64(100000), "overflow": "drop-head"}
	got := effectiveLimits(args, def)
	if res, d := eventQueueTTLResult(got); res != Pass {
		t.Errorf("MGMT-4 with the TTL in a policy: %s %s", res, d)
	}
	if res, d := eventQueueMaxResult(got); res != Pass {
		t.Errorf("MGMT-5 with the length in a policy: %s %s", res, d)
	}
	if res, _ := eventQueueTTLResult(effectiveLimits(args, nil)); res != Fail {
		t.Errorf("MGMT-4 with no TTL anywhere: %s, want fail", res)
	}
	pinned := effectiveLimits(map[string]any{"x-max-length": float64(10), "x-overflow": "reject-publish"}, def)
	if pinned["x-max-length"] != float64(10) || pinned["x-overflow"] != "drop-head" {
		t.Errorf("effective limits %v: want the lower max-length (10) and the policy's overflow", pinned)
	}
}
