package task

import (
	"encoding/json"
	"testing"
)

// TestInlineBinaryScope pins exactly how far L1's "binary data MUST be
// referenced by URI" is enforced (docs/conformance.md row 20): a base64
// data: URI anywhere in a task_submit's inputs is refused, and an artifact
// URI must not be data:; everything else is the sender's duty and passes,
// so the document cannot claim more than the code does.
func TestInlineBinaryScope(t *testing.T) {
	const b64 = "data:image/png;base64,iVBORw0KGgo="
	refused := []struct {
		name   string
		err    func() error
		fields []string
	}{
		{"inputs top level", func() error {
			s := validSubmit()
			s.Inputs = json.RawMessage(`{"image":"` + b64 + `"}`)
			return s.Validate()
		}, []string{"inputs.image"}},
		{"inputs nested in arrays and objects", func() error {
			s := validSubmit()
			s.Inputs = json.RawMessage(`{"a":[1,{"b":"DATA:x;BASE64,AA=="}]}`)
			return s.Validate()
		}, []string{"inputs.a[1].b"}},
		{"artifact data: URI, base64 or not", func() error {
			c := validCompleted()
			c.Artifacts[0].URI = "data:,hello"
			return c.Validate()
		}, []string{"artifacts[0].uri"}},
	}
	for _, tc := range refused {
		t.Run("refused/"+tc.name, func(t *testing.T) { checkFields(t, tc.err(), tc.fields...) })
	}

	passes := []struct {
		name string
		err  func() error
	}{
		{"inputs data: URI without base64", func() error {
			s := validSubmit()
			s.Inputs = json.RawMessage(`{"note":"data:,hello"}`)
			return s.Validate()
		}},
		{"inputs bare base64 string", func() error {
			s := validSubmit()
			s.Inputs = json.RawMessage(`{"blob":"iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"}`)
			return s.Validate()
		}},
		{"task_submit metadata", func() error {
			s := validSubmit()
			s.Metadata = json.RawMessage(`{"thumb":"` + b64 + `"}`)
			return s.Validate()
		}},
		{"task_completed result", func() error {
			c := validCompleted()
			c.Result = json.RawMessage(`{"image":"` + b64 + `"}`)
			return c.Validate()
		}},
		{"task_failed message", func() error {
			f := validFailed()
			f.Message = b64
			return f.Validate()
		}},
	}
	for _, tc := range passes {
		t.Run("passes/"+tc.name, func(t *testing.T) { checkFields(t, tc.err()) })
	}
}
