// Package task holds the L3 (safety and contract) and L4 (task) vocabulary of
// HCP as this project designs it (see docs and DESIGN.md section 4; the HCP
// specification has no L3/L4 document): risk levels R1–R5, data classes
// T1–T4, rejection reason codes, ISO 8601 durations and UTC timestamps, and
// the payloads of the task_submit, task_accepted, task_rejected,
// task_completed, task_failed and abort messages.
//
// The package is plain Go with no Kubernetes imports so that the sidecar, the
// operator and tests share one definition of the wire format.
//
// # Validation
//
// Every payload has a Validate method. It checks the payload on its own
// (shape, formats, ranges); checks that need context (is the caller the one
// the broker authenticated, does the capability exist, does a policy admit
// it) belong to the L3 gate. Validate reports every problem it finds as a
// [ValidationError], a list of [FieldError] values each naming the offending
// JSON field (for example "constraints.max_duration"). All validation errors
// match [ErrInvalid] with errors.Is, which maps to [ReasonMalformed].
//
// # Decisions where the design is silent
//
//   - Identifiers (caller_id, callee_id) follow the routing-key-safe id rule
//     topology.IDPattern. Capability names may also contain
//     '.', ':' and '/' (but never whitespace or the glob characters used by
//     policy patterns) and are at most 253 characters.
//   - Message and session ids are UUID v4 in canonical 8-4-4-4-12 form,
//     either letter case, by the same rule as the envelope
//     (envelope.IsUUIDv4). task_rejected quotes task_message_id as any
//     non-empty string up to 128 characters, so that a task_submit rejected
//     as malformed can still be answered.
//   - constraints are optional, as in the spec. A task without
//     data_classification is judged by the callee as the most sensitive
//     data its capability may handle (assuming T1 would be unsafe); without
//     max_duration, max_risk_level or deadline the callee's defaults and the
//     policy apply.
//   - inputs must be a JSON object (possibly empty). Binary data travels by
//     URI only (L1). Validate rejects the one unambiguous form of inline
//     binary, a base64 data: URI anywhere in inputs; it deliberately does not
//     guess at base64-looking strings, which would reject legitimate tokens,
//     hashes and ids. Artifact URIs may not use the data: scheme either.
//   - output_format is optional and may be a JSON string (for example a media
//     type) or a JSON object (for example a JSON Schema).
//   - Unknown JSON fields are ignored (tolerant reader) so that newer peers
//     can add fields.
//   - Durations: see [ParseDuration]. Timestamps: see [Timestamp].
package task
