package envelope_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
)

// Bodies that are not envelopes at all, and the decoder's limits (split
// from decode_test.go to keep files short).

func TestDecodeMalformed(t *testing.T) {
	valid := string(obj(submit))
	tests := []struct {
		name string
		body string
	}{
		{"empty", ""},
		{"whitespace only", " \n\t"},
		{"null", "null"},
		{"array", "[" + valid + "]"},
		{"string", `"{}"`},
		{"number", "1"},
		{"truncated", valid[:len(valid)-1]},
		{"trailing garbage", valid + "x"},
		{"two objects", valid + valid},
		{"trailing comma", valid[:len(valid)-1] + ",}"},
		{"single quotes", strings.ReplaceAll(valid, `"`, `'`)},
		{"comment", "/* c */" + valid},
		{"byte order mark", "\ufeff" + valid},
		{"invalid UTF-8 in payload string", strings.Replace(valid, `"payload":{}`, "\"payload\":{\"a\":\"\xff\"}", 1)},
		{"invalid UTF-8 outside strings", valid + "\xc3"},
		{"overlong UTF-8", strings.Replace(valid, `"payload":{}`, "\"payload\":{\"a\":\"\xc0\xaf\"}", 1)},
		{"UTF-16 surrogate as UTF-8", strings.Replace(valid, `"payload":{}`, "\"payload\":{\"a\":\"\xed\xa0\x80\"}", 1)},
		{"control character in string", strings.Replace(valid, `"payload":{}`, "\"payload\":{\"a\":\"\x01\"}", 1)},
		{"bad escape", strings.Replace(valid, `"payload":{}`, `"payload":{"a":"\x"}`, 1)},
		{"short unicode escape", strings.Replace(valid, `"payload":{}`, `"payload":{"a":"\u12"}`, 1)},
		{"NaN", strings.Replace(valid, `"payload":{}`, `"payload":{"a":NaN}`, 1)},
		{"leading zero number", strings.Replace(valid, `"payload":{}`, `"payload":{"a":01}`, 1)},
		{"plus number", strings.Replace(valid, `"payload":{}`, `"payload":{"a":+1}`, 1)},
		{"bare dot number", strings.Replace(valid, `"payload":{}`, `"payload":{"a":.5}`, 1)},
		{"missing colon", strings.Replace(valid, `"payload":{}`, `"payload" {}`, 1)},
		{"unquoted key", strings.Replace(valid, `"payload":{}`, `payload:{}`, 1)},
		{"nested too deep", string(obj(with(submit, "payload", nested(envelope.DefaultMaxDepth))))},
		{"deep arrays", string(obj(with(submit, "payload", `{"a":`+strings.Repeat("[", 10000)+strings.Repeat("]", 10000)+`}`)))},
		{"unterminated deep arrays", string(obj(with(submit, "payload", `{"a":`+strings.Repeat("[", 100000))))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e, err := envelope.Decode([]byte(tt.body))
			if err == nil {
				t.Fatalf("Decode succeeded: %+v", e)
			}
			if !errors.Is(err, envelope.ErrMalformed) {
				t.Errorf("error %v does not match ErrMalformed", err)
			}
			var se *envelope.SyntaxError
			if !errors.As(err, &se) {
				t.Errorf("error %v (%T) is not a *SyntaxError", err, err)
			}
		})
	}
}

func TestDecodeLimits(t *testing.T) {
	body := obj(with(submit, "payload", `{"pad":"`+strings.Repeat("x", 1000)+`"}`))
	t.Run("at the limit", func(t *testing.T) {
		if _, err := (envelope.Decoder{MaxBytes: len(body)}).Decode(body); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("one byte over", func(t *testing.T) {
		_, err := (envelope.Decoder{MaxBytes: len(body) - 1}).Decode(body)
		if !errors.Is(err, envelope.ErrTooLarge) {
			t.Fatalf("got %v, want ErrTooLarge", err)
		}
	})
	t.Run("size is checked before parsing", func(t *testing.T) {
		junk := []byte(strings.Repeat("\xff", 100))
		_, err := (envelope.Decoder{MaxBytes: 10}).Decode(junk)
		if !errors.Is(err, envelope.ErrTooLarge) {
			t.Fatalf("got %v, want ErrTooLarge", err)
		}
	})
	t.Run("default limit", func(t *testing.T) {
		big := obj(with(submit, "payload", `{"pad":"`+strings.Repeat("x", envelope.MaxEnvelopeBytes)+`"}`))
		_, err := envelope.Decode(big)
		if !errors.Is(err, envelope.ErrTooLarge) {
			t.Fatalf("got %v, want ErrTooLarge", err)
		}
		pad := envelope.MaxEnvelopeBytes - len(obj(with(submit, "payload", `{"pad":""}`)))
		exact := obj(with(submit, "payload", `{"pad":"`+strings.Repeat("x", pad)+`"}`))
		if len(exact) != envelope.MaxEnvelopeBytes {
			t.Fatalf("test bug: %d bytes", len(exact))
		}
		if _, err := envelope.Decode(exact); err != nil {
			t.Fatalf("exactly MaxEnvelopeBytes: %v", err)
		}
	})
	t.Run("custom depth", func(t *testing.T) {
		b := obj(with(submit, "payload", nested(3))) // total depth 4
		if _, err := (envelope.Decoder{MaxDepth: 4}).Decode(b); err != nil {
			t.Fatalf("depth 4 with limit 4: %v", err)
		}
		if _, err := (envelope.Decoder{MaxDepth: 3}).Decode(b); !errors.Is(err, envelope.ErrMalformed) {
			t.Fatalf("depth 4 with limit 3: got %v", err)
		}
		deep := obj(with(submit, "payload", nested(100)))
		if _, err := (envelope.Decoder{MaxDepth: 101}).Decode(deep); err != nil {
			t.Fatalf("depth 101 with limit 101: %v", err)
		}
	})
}

func TestDecodeDoesNotAliasBody(t *testing.T) {
	body := obj(with(submit, "payload", `{"a":"b"}`))
	e, err := envelope.Decode(body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'X'
	}
	if string(e.Payload) != `{"a":"b"}` {
		t.Fatalf("payload changed with the body: %s", e.Payload)
	}
}

func TestErrorMessagesAreBounded(t *testing.T) {
	long := strings.Repeat("k", 10000)
	_, err := envelope.Decode(obj(with(submit, long, "1")))
	var fe *envelope.FieldError
	if !errors.As(err, &fe) {
		t.Fatalf("got %v", err)
	}
	if len(fe.Field) > 64 || len(err.Error()) > 200 {
		t.Errorf("unbounded error: field %d bytes, message %d bytes", len(fe.Field), len(err.Error()))
	}
	_, err = envelope.Decode(obj(with(submit, "message_id", q(long))))
	if err == nil || len(err.Error()) > 200 {
		t.Errorf("unbounded error: %d bytes", len(err.Error()))
	}
}
