// Package envelope implements the HCP L1 message envelope: its JSON wire
// form, strict validation, and its mapping to AMQP 0-9-1 message properties
// (amqp091-go types). It has no Kubernetes dependencies.
//
// An envelope is a JSON object with exactly these six keys:
//
//	{
//	  "hcp_version": "1.0",                                   MAJOR.MINOR, major 1
//	  "message_id":  "550e8400-e29b-41d4-a716-446655440000",  UUID v4
//	  "timestamp":   "2025-01-15T08:30:00.000Z",              ISO 8601, UTC
//	  "session_id":  null,                                    null only for task_submit
//	  "type":        "task_submit",                           one of seven types
//	  "payload":     { }                                      a JSON object
//	}
//
// The rules Decode and Validate enforce, each failure naming its field in a
// *FieldError:
//
//   - hcp_version: digits "MAJOR.MINOR" without leading zeros. Any minor of
//     major 1 is accepted; another major is ErrUnsupportedVersion.
//   - message_id: UUID in canonical 8-4-4-4-12 form, any letter case (see
//     IsUUIDv4 for why), version nibble 4, RFC 4122 variant.
//   - timestamp: YYYY-MM-DDTHH:MM:SS, any number of fraction digits, then Z
//     or +00:00, a real date (ParseTimestamp, the rule payload timestamps
//     share), not before the Unix epoch (the AMQP timestamp property is
//     unsigned POSIX time).
//   - session_id: the key is required; its value is null for task_submit and
//     a UUID v4 for every other type.
//   - type: task_submit or abort (commands, caller → callee); task_accepted,
//     task_rejected, event, task_completed or task_failed (events, callee →
//     caller).
//   - payload: a JSON object (not an array, string or null).
//   - no other top-level keys, no duplicate keys at any depth (L1 is silent
//     on both; Decoder.Decode says why this is refused).
//
// Before parsing, Decode enforces a size limit (MaxEnvelopeBytes, 1 MiB, by
// default) and valid UTF-8; while parsing, a nesting limit
// (DefaultMaxDepth). A Decoder sets other limits. Body-level failures are
// *SyntaxError (errors.Is ErrMalformed) or ErrTooLarge.
//
// Encode writes the canonical compact form, the timestamp with milliseconds;
// Decode(Encode(e)) equals e for an envelope built by New or NewAt, and the
// payload bytes travel unchanged.
//
// On AMQP, ToPublishing sets message_id, timestamp, correlation_id
// (session_id), content_type application/json, content_encoding utf-8,
// delivery_mode 2, type and user_id. FromDelivery decodes a delivery and
// rejects, as *PropertyError, properties that contradict the body. Identity
// returns the broker-validated user_id, the only sender identity L3 may
// trust.
package envelope
