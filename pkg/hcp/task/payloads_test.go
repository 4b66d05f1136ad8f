package task

import (
	"encoding/json"
	"errors"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

var (
	testTime  = time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	testUUID  = "550e8400-e29b-41d4-a716-446655440000"
	testUUID2 = "6ba7b810-9dad-41d1-80b4-00c04fd430c8"
	testJWT   = "eyJhbGciOiJFZERTQSJ9.eyJzdWIiOiJ4In0.c2ln"
	testSHA   = strings.Repeat("ab", 32)
)

func validSubmit() TaskSubmit {
	return TaskSubmit{
		CallerID:   "alpha",
		CalleeID:   "lab-cvd",
		Capability: "cvd.grow",
		Intent:     "Grow a 2 inch graphene film",
		Inputs:     json.RawMessage(`{"recipe":"s3://bucket/recipe.json","temperature_c":1000}`),
		Constraints: Constraints{
			MaxDuration:        Duration(72 * time.Hour),
			MaxRiskLevel:       R3,
			DataClassification: T2,
			Deadline:           TimestampPtr(testTime.Add(96 * time.Hour)),
		},
		OutputFormat: json.RawMessage(`"application/json"`),
		ExpiresAt:    TimestampPtr(testTime.Add(time.Hour)),
		Metadata:     json.RawMessage(`{"trace":"abc"}`),
	}
}

func validAccepted() TaskAccepted {
	return TaskAccepted{TaskMessageID: testUUID, SessionID: testUUID2, SessionToken: testJWT,
		RiskLevel: R2, ExpiresAt: NewTimestamp(testTime.Add(72 * time.Hour))}
}

func validRejected() TaskRejected {
	return TaskRejected{TaskMessageID: testUUID, ReasonCode: ReasonNotAuthorized, Message: "no policy admits caller alpha"}
}

func validCompleted() TaskCompleted {
	return TaskCompleted{
		Result: json.RawMessage(`{"yield":0.93}`),
		Artifacts: []Artifact{
			{URI: "s3://results/run-1/film.tiff", SHA256: testSHA, MediaType: "image/tiff", Size: 1 << 20},
			{URI: "https://example.org/log.txt", SHA256: testSHA, Size: 0},
		},
		Summary: Summary{Duration: Duration(3 * time.Hour), EventCount: 420},
	}
}

func validFailed() TaskFailed {
	return TaskFailed{Code: "timeout", Message: "exceeded PT72H", Recoverable: true}
}

func validAbort() Abort { return Abort{SessionToken: testJWT, Reason: "operator request"} }

type validator interface{ Validate() error }

// checkFields asserts err is a ValidationError naming exactly the fields in
// want (in order) and that it matches ErrInvalid.
func checkFields(t *testing.T, err error, want ...string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Fatalf("unexpected error: %v", err)
		}
		return
	}
	if err == nil {
		t.Fatalf("no error, want failures of %v", want)
	}
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("error %v does not match ErrInvalid", err)
	}
	var ve *ValidationError
	if !errors.As(err, &ve) {
		t.Fatalf("error %T is not a *ValidationError", err)
	}
	var got []string
	for _, f := range ve.Fields {
		got = append(got, f.Field)
		if !strings.Contains(err.Error(), f.Field+": ") {
			t.Errorf("message %q does not name %s", err, f.Field)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("failed fields %v, want %v (error: %v)", got, want, err)
	}
}

func TestTaskSubmitValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*TaskSubmit)
		fields []string
	}{
		{"valid", func(*TaskSubmit) {}, nil},
		{"minimal", func(s *TaskSubmit) {
			*s = TaskSubmit{CallerID: "a", CalleeID: "b", Capability: "c", Intent: "x",
				Inputs: json.RawMessage(`{}`), Constraints: Constraints{DataClassification: T1}}
		}, nil},
		{"output_format object", func(s *TaskSubmit) { s.OutputFormat = json.RawMessage(`{"type":"object"}`) }, nil},
		{"null optionals", func(s *TaskSubmit) {
			s.OutputFormat, s.Metadata = json.RawMessage(`null`), json.RawMessage(`null`)
		}, nil},
		{"caller_id missing", func(s *TaskSubmit) { s.CallerID = "" }, []string{"caller_id"}},
		{"caller_id upper", func(s *TaskSubmit) { s.CallerID = "Alpha" }, []string{"caller_id"}},
		{"caller_id dot", func(s *TaskSubmit) { s.CallerID = "a.b" }, []string{"caller_id"}},
		{"caller_id trailing dash", func(s *TaskSubmit) { s.CallerID = "a-" }, []string{"caller_id"}},
		{"caller_id too long", func(s *TaskSubmit) { s.CallerID = strings.Repeat("a", 64) }, []string{"caller_id"}},
		{"callee_id missing", func(s *TaskSubmit) { s.CalleeID = "" }, []string{"callee_id"}},
		{"callee_id wildcard", func(s *TaskSubmit) { s.CalleeID = "lab#" }, []string{"callee_id"}},
		{"capability missing", func(s *TaskSubmit) { s.Capability = "" }, []string{"capability"}},
		{"capability glob", func(s *TaskSubmit) { s.Capability = "cvd.*" }, []string{"capability"}},
		{"capability space", func(s *TaskSubmit) { s.Capability = "cvd grow" }, []string{"capability"}},
		{"capability too long", func(s *TaskSubmit) { s.Capability = strings.Repeat("c", 254) }, []string{"capability"}},
		{"intent missing", func(s *TaskSubmit) { s.Intent = "" }, []string{"intent"}},
		{"intent blank", func(s *TaskSubmit) { s.Intent = " \n\t" }, []string{"intent"}},
		{"inputs missing", func(s *TaskSubmit) { s.Inputs = nil }, []string{"inputs"}},
		{"inputs null", func(s *TaskSubmit) { s.Inputs = json.RawMessage(`null`) }, []string{"inputs"}},
		{"inputs array", func(s *TaskSubmit) { s.Inputs = json.RawMessage(`[1]`) }, []string{"inputs"}},
		{"inputs string", func(s *TaskSubmit) { s.Inputs = json.RawMessage(`"x"`) }, []string{"inputs"}},
		{"inputs invalid JSON", func(s *TaskSubmit) { s.Inputs = json.RawMessage(`{"a":`) }, []string{"inputs"}},
		{"inputs inline binary", func(s *TaskSubmit) {
			s.Inputs = json.RawMessage(`{"z":"ok","img":"data:image/png;base64,iVBORw0KGgo=","list":[1,"DATA:;BASE64,AAAA"]}`)
		}, []string{"inputs.img", "inputs.list[1]"}},
		{"inputs plain data URI allowed", func(s *TaskSubmit) { s.Inputs = json.RawMessage(`{"t":"data:,hello"}`) }, nil},
		{"max_duration negative", func(s *TaskSubmit) { s.Constraints.MaxDuration = -1 }, []string{"constraints.max_duration"}},
		{"max_risk_level bad", func(s *TaskSubmit) { s.Constraints.MaxRiskLevel = "R9" }, []string{"constraints.max_risk_level"}},
		{"data_classification missing (optional in the spec)", func(s *TaskSubmit) { s.Constraints.DataClassification = "" }, nil},
		{"data_classification bad", func(s *TaskSubmit) { s.Constraints.DataClassification = "T5" }, []string{"constraints.data_classification"}},
		{"deadline zero", func(s *TaskSubmit) { s.Constraints.Deadline = &Timestamp{} }, []string{"constraints.deadline"}},
		{"output_format number", func(s *TaskSubmit) { s.OutputFormat = json.RawMessage(`42`) }, []string{"output_format"}},
		{"output_format invalid", func(s *TaskSubmit) { s.OutputFormat = json.RawMessage(`{`) }, []string{"output_format"}},
		{"expires_at zero", func(s *TaskSubmit) { s.ExpiresAt = &Timestamp{} }, []string{"expires_at"}},
		{"metadata array", func(s *TaskSubmit) { s.Metadata = json.RawMessage(`["x"]`) }, []string{"metadata"}},
		{"everything wrong", func(s *TaskSubmit) { *s = TaskSubmit{} }, []string{"caller_id", "callee_id", "capability", "intent", "inputs"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := validSubmit()
			tc.mutate(&s)
			checkFields(t, s.Validate(), tc.fields...)
		})
	}
}

func TestTaskSubmitExpired(t *testing.T) {
	s := validSubmit()
	if s.Expired(testTime) {
		t.Error("expired before expires_at")
	}
	if !s.Expired(testTime.Add(time.Hour)) {
		t.Error("not expired at expires_at")
	}
	s.ExpiresAt = nil
	if s.Expired(testTime.Add(95 * time.Hour)) {
		t.Error("expired before deadline")
	}
	if !s.Expired(testTime.Add(96 * time.Hour)) {
		t.Error("not expired at deadline")
	}
	s.Constraints.Deadline = nil
	if s.Expired(testTime.Add(1000 * time.Hour)) {
		t.Error("expired without expires_at or deadline")
	}
}

func TestTaskAcceptedValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*TaskAccepted)
		fields []string
	}{
		{"valid", func(*TaskAccepted) {}, nil},
		{"task_message_id missing", func(a *TaskAccepted) { a.TaskMessageID = "" }, []string{"task_message_id"}},
		{"task_message_id not uuid", func(a *TaskAccepted) { a.TaskMessageID = "msg-1" }, []string{"task_message_id"}},
		{"task_message_id uppercase", func(a *TaskAccepted) { a.TaskMessageID = strings.ToUpper(testUUID) }, nil},
		{"task_message_id v1", func(a *TaskAccepted) { a.TaskMessageID = "550e8400-e29b-11d4-a716-446655440000" }, []string{"task_message_id"}},
		{"session_id missing", func(a *TaskAccepted) { a.SessionID = "" }, []string{"session_id"}},
		{"session_id bad variant", func(a *TaskAccepted) { a.SessionID = "550e8400-e29b-41d4-c716-446655440000" }, []string{"session_id"}},
		{"session_id braces", func(a *TaskAccepted) { a.SessionID = "{" + testUUID[1:35] + "}" }, []string{"session_id"}},
		{"session_token missing", func(a *TaskAccepted) { a.SessionToken = "" }, []string{"session_token"}},
		{"session_token not jws", func(a *TaskAccepted) { a.SessionToken = "abc.def" }, []string{"session_token"}},
		{"risk_level missing", func(a *TaskAccepted) { a.RiskLevel = "" }, []string{"risk_level"}},
		{"risk_level bad", func(a *TaskAccepted) { a.RiskLevel = "high" }, []string{"risk_level"}},
		{"expires_at missing", func(a *TaskAccepted) { a.ExpiresAt = Timestamp{} }, []string{"expires_at"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := validAccepted()
			tc.mutate(&a)
			checkFields(t, a.Validate(), tc.fields...)
		})
	}
}

func TestTaskRejectedValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*TaskRejected)
		fields []string
	}{
		{"valid", func(*TaskRejected) {}, nil},
		{"non-uuid message id quoted", func(r *TaskRejected) { r.TaskMessageID = "not-a-uuid"; r.ReasonCode = ReasonMalformed }, nil},
		{"task_message_id missing", func(r *TaskRejected) { r.TaskMessageID = "" }, []string{"task_message_id"}},
		{"task_message_id too long", func(r *TaskRejected) { r.TaskMessageID = strings.Repeat("x", 129) }, []string{"task_message_id"}},
		{"reason_code missing", func(r *TaskRejected) { r.ReasonCode = "" }, []string{"reason_code"}},
		{"reason_code unknown", func(r *TaskRejected) { r.ReasonCode = "duplicate" }, []string{"reason_code"}},
		{"message missing", func(r *TaskRejected) { r.Message = "" }, []string{"message"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := validRejected()
			tc.mutate(&r)
			checkFields(t, r.Validate(), tc.fields...)
		})
	}
	for _, code := range ReasonCodes() {
		r := validRejected()
		r.ReasonCode = code
		checkFields(t, r.Validate())
	}
}

func TestTaskCompletedValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*TaskCompleted)
		fields []string
	}{
		{"valid", func(*TaskCompleted) {}, nil},
		{"no result no artifacts", func(c *TaskCompleted) { c.Result, c.Artifacts = nil, nil }, nil},
		{"result scalar", func(c *TaskCompleted) { c.Result = json.RawMessage(`"done"`) }, nil},
		{"result invalid JSON", func(c *TaskCompleted) { c.Result = json.RawMessage(`{x}`) }, []string{"result"}},
		{"uri missing", func(c *TaskCompleted) { c.Artifacts[1].URI = "" }, []string{"artifacts[1].uri"}},
		{"uri relative", func(c *TaskCompleted) { c.Artifacts[0].URI = "results/film.tiff" }, []string{"artifacts[0].uri"}},
		{"uri unparsable", func(c *TaskCompleted) { c.Artifacts[0].URI = "http://[::1" }, []string{"artifacts[0].uri"}},
		{"uri data", func(c *TaskCompleted) { c.Artifacts[0].URI = "data:text/plain;base64,aGk=" }, []string{"artifacts[0].uri"}},
		{"uri urn ok", func(c *TaskCompleted) { c.Artifacts[0].URI = "urn:hcp:artifact:1" }, nil},
		{"sha256 missing", func(c *TaskCompleted) { c.Artifacts[0].SHA256 = "" }, []string{"artifacts[0].sha256"}},
		{"sha256 short", func(c *TaskCompleted) { c.Artifacts[0].SHA256 = testSHA[:63] }, []string{"artifacts[0].sha256"}},
		{"sha256 upper", func(c *TaskCompleted) { c.Artifacts[0].SHA256 = strings.ToUpper(testSHA) }, []string{"artifacts[0].sha256"}},
		{"sha256 non-hex", func(c *TaskCompleted) { c.Artifacts[0].SHA256 = strings.Repeat("g", 64) }, []string{"artifacts[0].sha256"}},
		{"media_type bad", func(c *TaskCompleted) { c.Artifacts[0].MediaType = "not a type" }, []string{"artifacts[0].media_type"}},
		{"media_type params ok", func(c *TaskCompleted) { c.Artifacts[0].MediaType = "text/plain; charset=utf-8" }, nil},
		{"size negative", func(c *TaskCompleted) { c.Artifacts[0].Size = -1 }, []string{"artifacts[0].size"}},
		{"summary.duration negative", func(c *TaskCompleted) { c.Summary.Duration = -1 }, []string{"summary.duration"}},
		{"summary.event_count negative", func(c *TaskCompleted) { c.Summary.EventCount = -1 }, []string{"summary.event_count"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := validCompleted()
			tc.mutate(&c)
			checkFields(t, c.Validate(), tc.fields...)
		})
	}
}

func TestTaskFailedValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*TaskFailed)
		fields []string
	}{
		{"valid", func(*TaskFailed) {}, nil},
		{"code missing", func(f *TaskFailed) { f.Code = "" }, []string{"code"}},
		{"code with space", func(f *TaskFailed) { f.Code = "time out" }, []string{"code"}},
		{"code too long", func(f *TaskFailed) { f.Code = strings.Repeat("x", 129) }, []string{"code"}},
		{"message missing", func(f *TaskFailed) { f.Message = "" }, []string{"message"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := validFailed()
			tc.mutate(&f)
			checkFields(t, f.Validate(), tc.fields...)
		})
	}
}

func TestAbortValidate(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Abort)
		fields []string
	}{
		{"valid", func(*Abort) {}, nil},
		{"no reason", func(a *Abort) { a.Reason = "" }, nil},
		{"token missing", func(a *Abort) { a.SessionToken = "" }, []string{"session_token"}},
		{"token garbage", func(a *Abort) { a.SessionToken = "a.b.c.d" }, []string{"session_token"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := validAbort()
			tc.mutate(&a)
			checkFields(t, a.Validate(), tc.fields...)
		})
	}
}

// TestPayloadRoundTrip: decode(encode(x)) == x for every payload, and the
// JSON uses exactly the field names of DESIGN.md section 4.
func TestPayloadRoundTrip(t *testing.T) {
	cases := []struct {
		v    any
		keys []string
	}{
		{validSubmit(), []string{"callee_id", "caller_id", "capability", "constraints", "expires_at", "inputs", "intent", "metadata", "output_format"}},
		{validAccepted(), []string{"expires_at", "risk_level", "session_id", "session_token", "task_message_id"}},
		{validRejected(), []string{"message", "reason_code", "task_message_id"}},
		{validCompleted(), []string{"artifacts", "result", "summary"}},
		{validFailed(), []string{"code", "message", "recoverable"}},
		{validAbort(), []string{"reason", "session_token"}},
	}
	for _, tc := range cases {
		typ := reflect.TypeOf(tc.v)
		t.Run(typ.Name(), func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			var keys map[string]json.RawMessage
			if err := json.Unmarshal(b, &keys); err != nil {
				t.Fatal(err)
			}
			if got := slices.Sorted(maps.Keys(keys)); !slices.Equal(got, tc.keys) {
				t.Errorf("JSON keys %v, want %v", got, tc.keys)
			}
			back := reflect.New(typ)
			if err := json.Unmarshal(b, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(back.Elem().Interface(), tc.v) {
				t.Fatalf("round trip changed the value:\n got %+v\nwant %+v\njson %s", back.Elem().Interface(), tc.v, b)
			}
			if err := back.Interface().(validator).Validate(); err != nil {
				t.Fatalf("decoded payload invalid: %v", err)
			}
		})
	}
}

func TestWireNames(t *testing.T) {
	b, _ := json.Marshal(validSubmit().Constraints)
	want := `{"max_duration":"PT72H","max_risk_level":"R3","data_classification":"T2","deadline":"2025-01-19T08:30:00.000Z"}`
	if string(b) != want {
		t.Errorf("constraints = %s, want %s", b, want)
	}
	b, _ = json.Marshal(validCompleted().Artifacts[0])
	want = `{"uri":"s3://results/run-1/film.tiff","sha256":"` + testSHA + `","media_type":"image/tiff","size":1048576}`
	if string(b) != want {
		t.Errorf("artifact = %s, want %s", b, want)
	}
	b, _ = json.Marshal(validCompleted().Summary)
	if want := `{"duration":"PT3H","event_count":420}`; string(b) != want {
		t.Errorf("summary = %s, want %s", b, want)
	}
	for _, m := range []struct {
		got  envelope.MessageType
		want string
	}{
		{TaskSubmit{}.MessageType(), "task_submit"}, {TaskAccepted{}.MessageType(), "task_accepted"},
		{TaskRejected{}.MessageType(), "task_rejected"}, {TaskCompleted{}.MessageType(), "task_completed"},
		{TaskFailed{}.MessageType(), "task_failed"}, {Abort{}.MessageType(), "abort"},
	} {
		if string(m.got) != m.want {
			t.Errorf("MessageType %q, want %q", m.got, m.want)
		}
	}
}

func TestDecodeRejectsWrongTypes(t *testing.T) {
	for _, in := range []string{
		`{"constraints":{"max_duration":"P1Y"}}`,
		`{"constraints":{"max_duration":3600}}`,
		`{"expires_at":"2025-01-15T08:30:00+02:00"}`,
	} {
		var s TaskSubmit
		if err := json.Unmarshal([]byte(in), &s); err == nil {
			t.Errorf("Unmarshal(%s) succeeded", in)
		}
	}
}

func TestValidationErrorHelpers(t *testing.T) {
	var e ValidationError
	if e.Err() != nil {
		t.Fatal("empty ValidationError is an error")
	}
	inner := &ValidationError{Kind: "inner"}
	inner.Add("percent", "out of range")
	inner.Add("[0]", "bad")
	e.Merge("data", inner)
	e.Merge("other", errors.New("boom"))
	e.Merge("none", nil)
	checkFields(t, e.Err(), "data.percent", "data[0]", "other")
	if got := e.Error(); got != "invalid payload: data.percent: out of range; data[0]: bad; other: boom" {
		t.Errorf("Error() = %q", got)
	}
	var fe *FieldError
	if !errors.As(e.Err(), &fe) || fe.Field != "data.percent" {
		t.Errorf("errors.As FieldError = %v", fe)
	}
}

// TestIDRuleMatchesTopology: ids are validated with topology's pattern;
// this pins a few cases so a change there is noticed here.
func TestIDRuleMatchesTopology(t *testing.T) {
	for s, want := range map[string]bool{"a": true, "a-b_c": true, "0": true, strings.Repeat("a", 63): true,
		"": false, "-a": false, "a_": false, "A": false, "a.b": false, "a*": false, "a#": false, strings.Repeat("a", 64): false} {
		sub := TaskSubmit{CallerID: s}
		e := &ValidationError{}
		e.id("caller_id", sub.CallerID)
		if got := e.Err() == nil; got != want {
			t.Errorf("id %q valid = %v, want %v", s, got, want)
		}
		if got := topology.ValidateID(s) == nil; got != want {
			t.Errorf("topology.ValidateID(%q) valid = %v, want %v", s, got, want)
		}
	}
}

func TestUUIDRuleMatchesEnvelope(t *testing.T) {
	for s, want := range map[string]bool{testUUID: true, testUUID2: true, strings.ToUpper(testUUID): true, "": false,
		"550e8400e29b41d4a716446655440000": false, "550e8400-e29b-41d4-a716-44665544000g": false,
		"550e8400-e29b-11d4-a716-446655440000": false, "urn:uuid:" + testUUID: false} {
		e := &ValidationError{}
		e.uuid("id", s)
		if got := e.Err() == nil; got != want {
			t.Errorf("uuid %q valid = %v, want %v", s, got, want)
		}
		if envelope.IsUUIDv4(s) != want {
			t.Errorf("envelope.IsUUIDv4(%q) = %v", s, !want)
		}
	}
	// A session id derived by topology passes.
	e := &ValidationError{}
	e.uuid("session_id", topology.SessionID("lab-cvd", "alpha", testUUID))
	if err := e.Err(); err != nil {
		t.Error(err)
	}
}
