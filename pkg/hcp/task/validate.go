package task

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// ErrInvalid is matched (errors.Is) by every validation error of this
// package and of the session package's event validation.
var ErrInvalid = errors.New("invalid payload")

// jsonNull is a JSON null, which optional fields may hold instead of a value.
const jsonNull = "null"

// FieldError is one validation failure, naming the JSON field (a dotted
// path such as "constraints.max_duration" or "artifacts[2].sha256").
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Message }

// Is makes every FieldError match ErrInvalid.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

// ValidationError collects the FieldErrors of one payload. Kind names the
// payload ("task_submit", "progress event", ...). The zero value is ready to
// use; Err returns nil while nothing was added.
type ValidationError struct {
	Kind   string
	Fields []*FieldError
}

func (e *ValidationError) Error() string {
	var b strings.Builder
	b.WriteString("invalid ")
	if e.Kind != "" {
		b.WriteString(e.Kind)
	} else {
		b.WriteString("payload")
	}
	for i, f := range e.Fields {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString("; ")
		}
		b.WriteString(f.Error())
	}
	return b.String()
}

// Is makes a ValidationError match ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// Unwrap exposes the field errors to errors.Is / errors.As.
func (e *ValidationError) Unwrap() []error {
	out := make([]error, len(e.Fields))
	for i, f := range e.Fields {
		out[i] = f
	}
	return out
}

// Add records a failure of field.
func (e *ValidationError) Add(field, format string, args ...any) {
	e.Fields = append(e.Fields, &FieldError{Field: field, Message: fmt.Sprintf(format, args...)})
}

// Merge records err as failures under prefix: the fields of a
// ValidationError are prefixed ("data" + "." + "percent"); any other error
// becomes one failure of prefix. A nil err is ignored.
func (e *ValidationError) Merge(prefix string, err error) {
	if err == nil {
		return
	}
	var ve *ValidationError
	if errors.As(err, &ve) {
		for _, f := range ve.Fields {
			e.Fields = append(e.Fields, &FieldError{Field: joinField(prefix, f.Field), Message: f.Message})
		}
		return
	}
	e.Add(prefix, "%s", err.Error())
}

// Err returns e when it holds failures and nil otherwise.
func (e *ValidationError) Err() error {
	if len(e.Fields) == 0 {
		return nil
	}
	return e
}

func joinField(prefix, field string) string {
	switch {
	case prefix == "":
		return field
	case field == "" || strings.HasPrefix(field, "["):
		return prefix + field
	}
	return prefix + "." + field
}

var (
	// idRE is the routing-key-safe id rule of DESIGN.md section 2, owned by
	// package topology.
	idRE         = regexp.MustCompile(topology.IDPattern)
	capabilityRE = regexp.MustCompile(CapabilityPattern)
	codeRE       = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
	sha256RE     = regexp.MustCompile(`^[0-9a-f]{64}$`)
	jwtRE        = regexp.MustCompile(`^[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$`)
)

// CapabilityPattern is the capability name rule, shared with the Callee CRD's
// validation marker (api/v1alpha1 repeats it literally; a test keeps them equal):
// 1–128 characters of [a-z0-9._-], starting and ending with a letter or digit.
const CapabilityPattern = `^[a-z0-9]([a-z0-9._-]{0,126}[a-z0-9])?$`

// ValidCapability reports whether s is a valid capability name (CapabilityPattern).
func ValidCapability(s string) bool { return capabilityRE.MatchString(s) }

// ValidCode reports whether s is a valid error or warning code: 1–128
// characters of [A-Za-z0-9_.:-], starting with a letter or digit.
func ValidCode(s string) bool { return codeRE.MatchString(s) }

func (e *ValidationError) id(field, v string) {
	switch {
	case v == "":
		e.Add(field, "required")
	case !idRE.MatchString(v):
		e.Add(field, "%q is not a valid id (lowercase letters, digits, '-' and '_', 1-63 characters, starting and ending with a letter or digit)", truncate(v, 70))
	}
}

func (e *ValidationError) uuid(field, v string) {
	switch {
	case v == "":
		e.Add(field, "required")
	case !envelope.IsUUIDv4(v):
		e.Add(field, "%q is not a UUID v4 in canonical 8-4-4-4-12 form", truncate(v, 40))
	}
}

func (e *ValidationError) text(field, v string) {
	if strings.TrimSpace(v) == "" {
		e.Add(field, "required")
	}
}

func (e *ValidationError) code(field, v string) {
	switch {
	case v == "":
		e.Add(field, "required")
	case !ValidCode(v):
		e.Add(field, "%q is not a valid code (letters, digits, '_', '.', ':' and '-', at most 128 characters)", truncate(v, 40))
	}
}

// rawAbsent reports whether a json.RawMessage field was missing or null.
func rawAbsent(r json.RawMessage) bool {
	t := bytes.TrimSpace(r)
	return len(t) == 0 || string(t) == jsonNull
}

// rawKind returns the JSON kind of r ('{', '[', '"', 'n', 't', 'f' or a
// digit/'-') after checking it is valid JSON, or 0 when it is not.
func rawKind(r json.RawMessage) byte {
	t := bytes.TrimSpace(r)
	if len(t) == 0 || !json.Valid(t) {
		return 0
	}
	return t[0]
}

// jsonObject validates a required JSON object field.
func (e *ValidationError) jsonObject(field string, r json.RawMessage) bool {
	if rawAbsent(r) {
		e.Add(field, "required (a JSON object)")
		return false
	}
	switch rawKind(r) {
	case 0:
		e.Add(field, "not valid JSON")
		return false
	case '{':
		return true
	}
	e.Add(field, "must be a JSON object")
	return false
}

// noInlineBinary walks a JSON value and reports every string that is a
// base64 data: URI, the one unambiguous form of inline binary data.
func (e *ValidationError) noInlineBinary(field string, r json.RawMessage) {
	var v any
	if err := json.Unmarshal(r, &v); err != nil {
		return // reported by the caller's shape check
	}
	var walk func(path string, v any)
	walk = func(path string, v any) {
		switch x := v.(type) {
		case string:
			if isBase64DataURI(x) {
				e.Add(path, "inline binary data (a base64 data: URI) is not allowed; reference binary data by URI")
			}
		case []any:
			for i, el := range x {
				walk(path+"["+strconv.Itoa(i)+"]", el)
			}
		case map[string]any:
			for _, k := range slices.Sorted(maps.Keys(x)) {
				walk(joinField(path, k), x[k])
			}
		}
	}
	walk(field, v)
}

// isBase64DataURI reports whether s is an RFC 2397 data URI with ;base64.
func isBase64DataURI(s string) bool {
	if len(s) < 5 || !strings.EqualFold(s[:5], "data:") {
		return false
	}
	header, _, ok := strings.Cut(s[5:], ",")
	return ok && strings.HasSuffix(strings.ToLower(header), ";base64")
}
