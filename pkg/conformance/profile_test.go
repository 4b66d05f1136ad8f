package conformance

import (
	"bufio"
	"encoding/json"
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// A deliberately broken callee: its streams drop a state_changed, or
// publish events out of order. The judgement fails SES-3 and SES-2, and
// the printed failure cites the spec file, line, section and text.
func TestBrokenCalleeFailsCitingTheSpec(t *testing.T) {
	cfg, err := Config{AMQPURL: "amqp://caller.kit@%2Fhcp:p@h/%2Fhcp", CalleeID: testCallee, CallerID: testCaller, Capability: "c"}.resolve()
	if err != nil {
		t.Fatal(err)
	}
	envs := func(sid string, evs []Event) []*Message {
		var out []*Message
		for _, e := range evs {
			env, err := envelope.New(envelope.TypeEvent, sid, session.EventPayload{EventType: e.Type, Sequence: e.Sequence, Data: e.Data})
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, &Message{Env: env})
		}
		return out
	}
	judge := func(msgs []*Message, sid string) (Report, string) {
		k := newKit(cfg)
		k.msgs = msgs
		r := newRecorderFor(calleeChecks, ProfileSpec)
		(&run{k: k, r: r, started: []string{sid}}).sessions()
		rep := r.report()
		var b strings.Builder
		_ = rep.Print(&b)
		return rep, b.String()
	}
	good := completed(t)

	dropped := envelope.NewMessageID()
	stream := append(append([]Event{}, good[:1]...), good[2:]...) // PENDING→RUNNING dropped
	rep, out := judge(envs(dropped, stream), dropped)
	if row, _ := rep.Row(SesTransitions); row.Result != Fail {
		t.Errorf("state_changed dropped: SES-3 %s (%s)", row.Result, row.Detail)
	}
	if want := `- SES-3 [normative] L2-session-lifecycle.md:59 (Valid State Transitions): "Valid State Transitions": `; !strings.Contains(out, want) {
		t.Errorf("the failure does not cite %q:\n%s", want, out)
	}

	reordered := envelope.NewMessageID()
	stream = []Event{good[0], good[2], good[1], good[3], good[4]}
	rep, out = judge(envs(reordered, stream), reordered)
	if row, _ := rep.Row(SesSequence); row.Result != Fail {
		t.Errorf("events reordered: SES-2 %s (%s)", row.Result, row.Detail)
	}
	if want := `- SES-2 [MUST] L2-session-lifecycle.md:112 (Event Ordering): "Events MUST be emitted with strictly increasing sequence numbers within a session.": `; !strings.Contains(out, want) {
		t.Errorf("the failure does not cite %q:\n%s", want, out)
	}

	// A gap fails only the profile's SES-5; the spec allows one (L2:174).
	gap := envelope.NewMessageID()
	stream = append([]Event{}, good...)
	for i := 2; i < len(stream); i++ {
		stream[i].Sequence += 10
	}
	k := newKit(cfg)
	k.msgs = envs(gap, stream)
	r := newRecorderFor(calleeChecks, ProfileHCPOperator)
	(&run{k: k, r: r, started: []string{gap}}).sessions()
	rep = r.report()
	if row, _ := rep.Row(SesSequence); row.Result != Pass {
		t.Errorf("a gap: SES-2 %s (%s), want pass", row.Result, row.Detail)
	}
	if row, _ := rep.Row(SesNoGap); row.Result != Fail {
		t.Errorf("a gap: SES-5 %s (%s), want fail", row.Result, row.Detail)
	}
}

// The spec profile leaves out the project's choices; the hcp-operator
// profile has every check.
func TestProfiles(t *testing.T) {
	for _, c := range []struct {
		profile string
		want    int
	}{{ProfileSpec, 0}, {ProfileHCPOperator, 0}} {
		rep := newRecorderFor(calleeChecks, c.profile).report()
		n := 0
		for _, row := range rep.Rows {
			if row.Profile == ProfileHCPOperator {
				n++
			}
		}
		if (c.profile == ProfileSpec) != (n == 0) || len(rep.Rows) == 0 {
			t.Errorf("profile %s: %d rows, %d of them hcp-operator", c.profile, len(rep.Rows), n)
		}
	}
	if got := len(newRecorderFor(calleeChecks, ProfileHCPOperator).report().Rows); got != len(calleeChecks) {
		t.Errorf("hcp-operator: %d rows, want %d", got, len(calleeChecks))
	}
	for id, profile := range map[string]string{"Lab_CVD": ProfileSpec, "lab-cvd": ProfileHCPOperator} {
		if err := validateID(id, profile); err != nil {
			t.Errorf("id %q in profile %s: %v", id, profile, err)
		}
	}
	for id, profile := range map[string]string{"Lab_CVD": ProfileHCPOperator, "a.b": ProfileSpec, "a#": ProfileSpec, "": ProfileSpec, "a b": ProfileSpec} {
		if err := validateID(id, profile); err == nil {
			t.Errorf("id %q in profile %s: no error", id, profile)
		}
	}
	if _, err := (Config{AMQPURL: "amqp://u:p@h/", CalleeID: "Lab", CallerID: "kit", Capability: "c", Profile: "strict"}).resolve(); err == nil {
		t.Error("an unknown profile was accepted")
	}
}

// SpecDecode takes what L1 allows and this project's decoder refuses.
func TestSpecDecode(t *testing.T) {
	body := func(ts, extra string) []byte {
		return []byte(`{"hcp_version":"1.0","message_id":"550e8400-e29b-41d4-a716-446655440000","timestamp":"` + ts +
			`","session_id":null,"type":"task_submit","payload":{}` + extra + `}`)
	}
	for _, ts := range []string{"2025-01-15T08:30:00.000Z", "2025-01-15T08:30:00Z", "2025-01-15T08:30:00.123456Z", "2025-01-15T08:30:00,5Z",
		"20250115T083000Z", "2025-01-15T08:30Z", "2025-01-15T08:30:00+00:00", "2025-01-15T08:30:00+0000"} {
		if _, err := SpecDecode(body(ts, "")); err != nil {
			t.Errorf("timestamp %s: %v", ts, err)
		}
	}
	for _, ts := range []string{"2025-01-15T08:30:00+01:00", "2025-01-15 08:30:00Z", "2025-02-30T08:30:00Z", "2025-01-15T25:00:00Z", "yesterday", "2025-01-15T08:30:00"} {
		if _, err := SpecDecode(body(ts, "")); err == nil {
			t.Errorf("timestamp %s: accepted", ts)
		}
	}
	if _, err := SpecDecode(body("2025-01-15T08:30:00Z", `,"x_extension":1`)); err != nil {
		t.Errorf("an unknown envelope key (spec-silent): %v", err)
	}
	if _, err := envelope.Decode(body("2025-01-15T08:30:00Z", `,"x_extension":1`)); err == nil {
		t.Error("this project's decoder took an unknown key: the profile check MSG-12 would not tell")
	}
	for name, b := range map[string]string{
		"not JSON":                  "\xff",
		"an array":                  "[]",
		"version 2.0":               strings.Replace(string(body("2025-01-15T08:30:00Z", "")), `"1.0"`, `"2.0"`, 1),
		"version 1":                 strings.Replace(string(body("2025-01-15T08:30:00Z", "")), `"1.0"`, `"1"`, 1),
		"message_id not a UUID v4":  strings.Replace(string(body("2025-01-15T08:30:00Z", "")), "550e8400-e29b-41d4", "550e8400-e29b-11d4", 1),
		"session_id on task_submit": strings.Replace(string(body("2025-01-15T08:30:00Z", "")), `null`, `"550e8400-e29b-41d4-a716-446655440000"`, 1),
		"null session_id on abort":  strings.Replace(string(body("2025-01-15T08:30:00Z", "")), "task_submit", "abort", 1),
		"payload not an object":     strings.Replace(string(body("2025-01-15T08:30:00Z", "")), `"payload":{}`, `"payload":[]`, 1),
		"unknown type":              strings.Replace(string(body("2025-01-15T08:30:00Z", "")), "task_submit", "task_submitted", 1),
	} {
		if _, err := SpecDecode([]byte(b)); err == nil {
			t.Errorf("%s: accepted", name)
		} else if !strings.Contains(err.Error(), "(L1:") {
			t.Errorf("%s: %v: no spec line", name, err)
		}
	}
}

// The reports in JSON and JUnit XML carry every row, the failures with
// their citation.
func TestReportFiles(t *testing.T) {
	rep := newRecorderFor(callerChecks, ProfileSpec).report()
	rep.Kit, rep.Started, rep.Duration = "caller", time.Now(), 1500*time.Millisecond
	rep.Rows[0].Result, rep.Rows[0].Detail = Pass, "ok"
	rep.Rows[1].Result, rep.Rows[1].Detail = Skip, "no URL"
	dir := t.TempDir()
	js, ju := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.xml")
	if err := rep.WriteFiles(js, ju); err != nil {
		t.Fatal(err)
	}
	var back Report
	data, _ := os.ReadFile(js)
	if err := json.Unmarshal(data, &back); err != nil || len(back.Rows) != len(rep.Rows) || back.Rows[2].Cite.File != "L1-transport-encoding.md" || back.Rows[2].Cite.Line != 402 {
		t.Errorf("JSON: %v %+v", err, back.Rows[2])
	}
	var x junitSuites
	data, _ = os.ReadFile(ju)
	if err := xml.Unmarshal(data, &x); err != nil || len(x.Suites) != 1 {
		t.Fatalf("JUnit: %v", err)
	}
	s := x.Suites[0]
	if s.Tests != len(rep.Rows) || s.Failures != len(rep.Rows)-2 || s.Skipped != 1 || s.Cases[2].Failure == nil ||
		!strings.Contains(s.Cases[2].Failure.Message, "L1-transport-encoding.md:402 (Topology Initialization)") {
		t.Errorf("JUnit: tests %d failures %d skipped %d, case 2 %+v", s.Tests, s.Failures, s.Skipped, s.Cases[2].Failure)
	}
}

// specDir is where the specification is at hand: $HCP_SPEC_DIR, else the
// project's shared copy.
func specDir() string {
	if d := os.Getenv("HCP_SPEC_DIR"); d != "" {
		return d
	}
	return "/work/shared/spec"
}

// Every citation's quote is on the line it cites. The specification is not
// part of this repository: without it the test is skipped, saying so.
func TestCitationsMatchTheSpec(t *testing.T) {
	dir := specDir()
	lines := map[string][]string{}
	for _, prefix := range []string{"L1", "L2", "A"} {
		f, err := os.Open(filepath.Join(dir, specFiles[prefix]))
		if err != nil {
			t.Skipf("the specification is not at %s (set HCP_SPEC_DIR): %v", dir, err)
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			lines[prefix] = append(lines[prefix], sc.Text())
		}
		_ = f.Close()
	}
	for _, c := range append(Checks(), CallerChecks()...) {
		cite := c.Cite()
		prefix, _, _ := strings.Cut(c.Ref, ":")
		switch {
		case c.Profile == ProfileSpec && (cite.Line == 0 || c.Quote == ""):
			t.Errorf("%s: a spec check without a line and quote (%s)", c.ID, c.Ref)
		case c.Profile == ProfileSpec && (cite.Line > len(lines[prefix]) || !strings.Contains(lines[prefix][cite.Line-1], c.Quote)):
			t.Errorf("%s: %s does not hold %q", c.ID, cite.File+":"+c.Ref[len(prefix)+1:], c.Quote)
		case c.Profile == ProfileHCPOperator && (cite.File == c.Ref || c.Level != choice):
			t.Errorf("%s: a profile check must cite a project document and be a choice (%+v)", c.ID, c)
		}
	}
}

// The probe's verdict from the broker's answer.
func TestJudgeProbe(t *testing.T) {
	info, res, d := judgeProbe(&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED - message size 8388609 is larger than configured max size 8388608"}, 8388609, 8<<20)
	if res != Pass || info.MaxMessageSize != 8388608 || !strings.Contains(d, "8 MiB") {
		t.Errorf("refused: %v %+v %s", res, info, d)
	}
	if _, res, _ := judgeProbe(&amqp.Error{Code: amqp.AccessRefused, Reason: "ACCESS_REFUSED"}, 1, 0); res != Fail {
		t.Error("another channel error passed")
	}
	if _, res, _ := judgeProbe(nil, 1, 0); res != Fail {
		t.Error("no error passed")
	}
}

// The caller kit's judgements from crafted processing orders.
func TestCallerJudgements(t *testing.T) {
	sid, dup := envelope.NewMessageID(), envelope.NewMessageID()
	ev := func(seq int64, id string) Processed {
		if id == "" {
			id = envelope.NewMessageID()
		}
		return Processed{SessionID: sid, MessageID: id, Type: string(envelope.TypeEvent), Sequence: seq}
	}
	acc := Processed{SessionID: sid, Type: string(envelope.TypeTaskAccepted)}
	done := Processed{SessionID: sid, Type: string(envelope.TypeTaskCompleted)}
	results := func(ps []Processed) map[string]Result {
		r := newRecorderFor(callerChecks, ProfileSpec)
		judgeOrdered(r, sid, "task", dup, 4, ps, nil)
		out := map[string]Result{}
		for _, id := range []string{AccFirst, OrdInOrder, OrdReordered, DdpOnce} {
			out[id] = r.res[id].Result
		}
		return out
	}
	good := []Processed{acc, ev(1, ""), ev(2, dup), ev(3, ""), ev(4, ""), done}
	for name, c := range map[string]struct {
		ps   []Processed
		fail []string
	}{
		"conforming":        {good, nil},
		"arrival order":     {[]Processed{acc, ev(1, ""), ev(2, dup), ev(4, ""), ev(3, ""), done}, []string{OrdInOrder, OrdReordered}},
		"duplicate":         {[]Processed{acc, ev(1, ""), ev(2, dup), ev(2, dup), ev(3, ""), ev(4, ""), done}, []string{DdpOnce}},
		"event 3 dropped":   {[]Processed{acc, ev(1, ""), ev(2, dup), ev(4, ""), done}, []string{OrdReordered}},
		"answer after":      {[]Processed{ev(1, ""), acc, ev(2, dup), ev(3, ""), ev(4, ""), done}, []string{AccFirst}},
		"no task_completed": {good[:5], []string{OrdReordered}},
	} {
		got := results(c.ps)
		for id, res := range got {
			want := Pass
			for _, f := range c.fail {
				if f == id {
					want = Fail
				}
			}
			if res != want {
				t.Errorf("%s: %s %s, want %s", name, id, res, want)
			}
		}
	}
	r := newRecorderFor(callerChecks, ProfileSpec)
	judgeResume(r, sid, 4, []Processed{ev(1, ""), ev(2, ""), ev(2, ""), ev(3, ""), ev(4, "")}, nil)
	if r.res[RcnResumes].Result != Fail {
		t.Error("RCN-2 passed a repeated event")
	}
}
