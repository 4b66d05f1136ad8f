package envelope

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// scanAll runs the scanner over a whole document without duplicate checks,
// which makes it comparable with json.Valid.
func scanAll(b []byte) error {
	s := scanner{data: b, maxDepth: hardMaxDepth}
	s.skipWS()
	if err := s.value(0); err != nil {
		return err
	}
	s.skipWS()
	if s.pos != len(b) {
		return s.syntaxErr("trailing data")
	}
	return nil
}

// refDupKeys reports whether a valid JSON document has an object with a
// repeated key, using encoding/json's tokenizer as an independent reference.
func refDupKeys(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct {
		obj     bool
		keys    map[string]bool
		wantKey bool
	}
	var stack []*frame
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return false
		}
		if err != nil {
			return false // not valid JSON; not this function's question
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:len(stack)-1]
			if len(stack) > 0 && stack[len(stack)-1].obj {
				stack[len(stack)-1].wantKey = true
			}
			continue
		}
		if top != nil && top.obj && top.wantKey {
			k := tok.(string)
			if top.keys[k] {
				return true
			}
			top.keys[k] = true
			top.wantKey = false
			continue
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, &frame{obj: d == '{', keys: map[string]bool{}, wantKey: d == '{'})
			continue
		}
		if top != nil && top.obj {
			top.wantKey = true
		}
	}
}

func FuzzDecode(f *testing.F) {
	// More seeds live in testdata/fuzz/FuzzDecode.
	f.Add([]byte(`{"hcp_version":"1.0","message_id":"550e8400-e29b-41d4-a716-446655440000","timestamp":"2025-01-15T08:30:00.000Z","session_id":null,"type":"task_submit","payload":{}}`))
	f.Add([]byte(`{"hcp_version":"1.0","message_id":"550e8400-e29b-41d4-a716-446655440000","timestamp":"2025-01-15T08:30:00.000Z","session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","type":"event","payload":{"event_type":"progress","sequence":42,"data":{}}}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, body []byte) {
		// The scanner agrees with encoding/json on what JSON is.
		if utf8.Valid(body) {
			if got, want := scanAll(body) == nil, json.Valid(body); got != want {
				t.Fatalf("scanner says valid=%v, json.Valid says %v: %q (%v)", got, want, body, scanAll(body))
			}
		}

		e, err := Decode(body)
		if err != nil {
			var fe *FieldError
			var se *SyntaxError
			if !errors.As(err, &fe) && !errors.As(err, &se) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("untyped error %T: %v", err, err)
			}
			if errors.As(err, &se) && utf8.Valid(body) && json.Valid(body) && !strings.Contains(se.Reason, "depth") && !strings.Contains(se.Reason, "must be a JSON object") {
				t.Fatalf("SyntaxError %v for JSON that encoding/json accepts: %q", err, body)
			}
			return
		}

		// Whatever decodes is valid UTF-8 JSON without duplicate keys,
		// with exactly the six fields.
		if !utf8.Valid(body) || !json.Valid(body) {
			t.Fatalf("Decode accepted invalid input %q", body)
		}
		if refDupKeys(body) {
			t.Fatalf("Decode accepted duplicate keys: %q", body)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil || len(m) != 6 {
			t.Fatalf("encoding/json sees %d members (%v) in %q", len(m), err, body)
		}
		if err := e.Validate(); err != nil {
			t.Fatalf("decoded envelope fails Validate: %v\n%q", err, body)
		}

		// ...and survives a round trip unchanged but for the timestamp,
		// which Encode writes with milliseconds: finer digits are
		// truncated, and a timestamp written without a fraction gains
		// ".000" (so the canonical form may be 4 bytes longer).
		enc, err := Encode(e)
		if err != nil {
			t.Fatalf("Encode of a decoded envelope: %v\n%q", err, body)
		}
		if len(enc) > len(body)+len(".000") {
			t.Fatalf("canonical form is longer than the input (%d > %d+4): %q", len(enc), len(body), body)
		}
		e2, err := Decode(enc)
		if err != nil {
			t.Fatalf("re-decode: %v\n%q", err, enc)
		}
		want := *e
		want.Timestamp = e.Timestamp.Truncate(time.Millisecond)
		if !reflect.DeepEqual(&want, e2) {
			t.Fatalf("re-decoded envelope differs:\n%#v\n%#v", &want, e2)
		}
		enc2, err := Encode(e2)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not stable (%v):\n%q\n%q", err, enc, enc2)
		}
	})
}

func TestScannerMatchesEncodingJSON(t *testing.T) {
	cases := []string{
		``, ` `, `{}`, `[]`, `""`, `0`, `-0`, `-`, `01`, `1.`, `1.0`, `.1`, `1e`, `1e+`, `1e+1`, `1E-01`, `-1.5e3`,
		`true`, `tru`, `truex`, `nul`, `null `, `[1,]`, `[,1]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`, `{"a":1 "b":2}`,
		`"\u00e9"`, `"\u00g9"`, `"\x"`, `"a` + "\x01" + `"`, `"a` + "\x7f" + `"`, `"\/"`, `[1 2]`, `{"a":[{"b":{}}]}`,
		`{"a":1}{}`, "\t\n\r{}\r\n", "\v{}", `[` + strings.Repeat(`[`, 9999) + strings.Repeat(`]`, 10000),
		`[` + strings.Repeat(`[`, 10000) + strings.Repeat(`]`, 10001), `{"a":"\ud800"}`, `"` + "\u2028" + `"`,
	}
	for _, c := range cases {
		if got, want := scanAll([]byte(c)) == nil, json.Valid([]byte(c)); got != want {
			name := c
			if len(name) > 40 {
				name = name[:40] + "..."
			}
			t.Errorf("%q: scanner valid=%v, json.Valid=%v (%v)", name, got, want, scanAll([]byte(c)))
		}
	}
}

func TestRefDupKeys(t *testing.T) {
	for in, want := range map[string]bool{
		`{"a":1,"b":{"a":1}}`:            false,
		`{"a":1,"a":2}`:                  true,
		`{"a":{"b":1,"b":1}}`:            true,
		`[{"a":1},{"a":1}]`:              false,
		`{"a":[1,{"c":1}],"c":1}`:        false,
		`{"a":[{"c":1,"c":1}]}`:          true,
		`{"\u0061":1,"a":1}`:             true,
		`{"x":{"a":[]},"y":{},"x":null}`: true,
	} {
		if got := refDupKeys([]byte(in)); got != want {
			t.Errorf("refDupKeys(%s) = %v, want %v", in, got, want)
		}
	}
}

// TestFuzzSeedOutcomes pins what the committed seeds mean: "valid_*" seeds
// decode, "bad_*" seeds do not. (Crashers the fuzzer adds have hash names and
// are only run by FuzzDecode.)
func TestFuzzSeedOutcomes(t *testing.T) {
	dir := filepath.Join("testdata", "fuzz", "FuzzDecode")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var valid, bad int
	for _, ent := range entries {
		name := ent.Name()
		wantOK := strings.HasPrefix(name, "valid_")
		if !wantOK && !strings.HasPrefix(name, "bad_") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 2)
		if len(lines) != 2 || lines[0] != "go test fuzz v1" || !strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
			t.Fatalf("%s: not a corpus file", name)
		}
		body, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, err = Decode([]byte(body))
		if (err == nil) != wantOK {
			t.Errorf("%s: Decode error = %v", name, err)
		}
		if wantOK {
			valid++
		} else {
			bad++
		}
	}
	for _, typ := range Types() {
		if _, err := os.Stat(filepath.Join(dir, "valid_"+string(typ))); err != nil {
			t.Errorf("no valid seed for %s: %v", typ, err)
		}
	}
	t.Logf("%d valid and %d bad seeds", valid, bad)
}
