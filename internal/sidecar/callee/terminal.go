package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Terminal outcomes are durable before they are published. Ending a
// session is, in this order:
//
//  1. the terminal record (AnnotationTerminalRecord): the exact messages
//     that end it (state_changed, task_completed or task_failed,
//     session_closed, with their sequence numbers and bodies) and the
//     terminal status, written conditional on the owner epoch;
//  2. the messages, published from the record;
//  3. once the broker confirmed them, the terminal status.
//
// A failure at 1 changes nothing (the harness's complete or fail answers
// 503 and is retried; the sidecar's own outcomes are retried). After 1,
// the outcome is decided: whoever holds the session next (this replica
// after a restart, or another after a takeover) finds a record with a
// status that is not terminal yet, republishes the same messages (same
// message ids and sequences: the caller deduplicates) and writes the
// terminal status. It never hands the task to a harness again.

// AnnotationTerminalRecord holds a session's terminal record (JSON).
const AnnotationTerminalRecord = "hcp.io/terminal-record"

// maxTerminalRecord bounds the record (annotations share 256 KiB).
const maxTerminalRecord = 192 << 10

// terminalRecord is what AnnotationTerminalRecord holds.
type terminalRecord struct {
	Epoch    int64                     `json:"epoch"`
	Messages []recordedMessage         `json:"messages"`
	Status   v1alpha1.HCPSessionStatus `json:"status"`
}

// recordedMessage is one message of a terminal record: its routing key,
// event sequence (0 for a result) and envelope.
type recordedMessage struct {
	RoutingKey string          `json:"rk"`
	Seq        int64           `json:"seq,omitempty"`
	Body       json.RawMessage `json:"body"`
}

// errRecordTooLarge: the outcome does not fit a terminal record.
var errRecordTooLarge = errors.New("the outcome is too large to be recorded before it is published")

// terminalOf reads the terminal record of hs; nil when it has none (or it
// cannot be read).
func terminalOf(hs *v1alpha1.HCPSession) *terminalRecord {
	raw := hs.Annotations[AnnotationTerminalRecord]
	if raw == "" {
		return nil
	}
	var r terminalRecord
	if err := json.Unmarshal([]byte(raw), &r); err != nil || len(r.Messages) == 0 {
		return nil
	}
	return &r
}

// buildTerminalLocked prepares the record of outcome o: the messages with
// their sequence numbers (two, reserved once and reused by a retry when
// no event came between) and the terminal status. Called with lock.
func (ss *sess) buildTerminalLocked(from session.State, o outcome, now time.Time) (*terminalRecord, error) {
	if ss.termSeq == 0 || ss.seq.Last() != ss.termSeq+1 {
		first, err := ss.seq.Next()
		if err != nil {
			return nil, err
		}
		if _, err := ss.seq.Next(); err != nil {
			return nil, err
		}
		ss.termSeq = first
	}
	rec := &terminalRecord{Epoch: ss.epoch}
	add := func(t envelope.MessageType, seq int64, payload any) error {
		pub, err := envelope.NewPublishing(now, t, ss.id, payload, ss.sc.username)
		if err != nil {
			return err
		}
		rec.Messages = append(rec.Messages, recordedMessage{RoutingKey: topology.EventRoutingKey(ss.callerID, ss.id, t), Seq: seq, Body: pub.Body})
		return nil
	}
	event := func(seq int64, d session.EventData) error {
		raw, err := json.Marshal(d)
		if err != nil {
			return err
		}
		p := session.EventPayload{EventType: d.EventType(), Sequence: seq, Data: raw}.AppendJSON(nil)
		return add(envelope.TypeEvent, seq, json.RawMessage(p))
	}
	if err := event(ss.termSeq, &session.StateChangedData{FromState: from, ToState: o.final, Reason: o.reason}); err != nil {
		return nil, err
	}
	events := ss.events + 2
	st := &rec.Status
	st.State, st.Reason, st.Message = v1alpha1.SessionState(o.final), o.reason, truncate(o.message, 1024)
	st.CompletedAt = &metav1.Time{Time: now.UTC().Truncate(time.Second)}
	st.LastSequence, st.EventCount = ss.termSeq+1, events
	if o.completed != nil {
		if o.completed.Summary.Duration == 0 {
			o.completed.Summary.Duration = task.Duration(now.Sub(ss.startedAt))
		}
		if o.completed.Summary.EventCount == 0 {
			o.completed.Summary.EventCount = events
		}
		if err := add(envelope.TypeTaskCompleted, 0, o.completed); err != nil {
			return nil, err
		}
		st.Result = resultSummary(o.completed)
	}
	if o.failed != nil {
		if err := add(envelope.TypeTaskFailed, 0, o.failed); err != nil {
			return nil, err
		}
		st.Error = &v1alpha1.SessionError{Code: o.failed.Code, Message: truncate(o.failed.Message, 1024), Recoverable: o.failed.Recoverable}
	}
	if err := event(ss.termSeq+1, &session.SessionClosedData{FinalState: o.final, Reason: o.reason}); err != nil {
		return nil, err
	}
	return rec, nil
}

// recordTerminal stores the record, conditional on the owner epoch, and
// in the same write the final state in the state label: the outcome is
// decided once the record is stored, and the label, which nothing trusts
// and a session never moves away from a terminal state, needs no write of
// its own after the terminal status (one API write fewer per session).
func (ss *sess) recordTerminal(ctx context.Context, rec *terminalRecord) error {
	raw, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if len(raw) > maxTerminalRecord {
		return fmt.Errorf("%w: %d bytes, at most %d (pass large results by reference: artifacts)", errRecordTooLarge, len(raw), maxTerminalRecord)
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	final := rec.Status.State
	ops := []map[string]any{annotationOp(AnnotationTerminalRecord, string(raw)), labelOp(v1alpha1.LabelSessionState, string(final))}
	// No label write of an earlier state may cross this one.
	release := ss.sc.st.Hold(ss.id)
	defer release()
	if err := ss.guardedMetaPatch(ctx, ops, nil); err != nil {
		return err
	}
	ss.sc.st.SeedLabel(ss.id, final)
	return nil
}

// terminalError is the API answer when the outcome could not be recorded.
func terminalError(err error) *apiError {
	switch {
	case errors.Is(err, errRecordTooLarge):
		return &apiError{http.StatusRequestEntityTooLarge, &server.Error{Code: server.CodeTooLarge, Message: err.Error()}}
	case errors.Is(err, errOwnershipLost), errors.Is(err, errFenced):
		return fencedError(err)
	}
	return &apiError{http.StatusServiceUnavailable, &server.Error{Code: codeFenced,
		Message: "the outcome could not be recorded (the API server is unreachable?); nothing was published; retry: " + err.Error()}}
}

// publishRecordLocked publishes the record's messages (after the record
// was written: the write proved the ownership). Called with lock.
func (ss *sess) publishRecordLocked(ctx context.Context, rec *terminalRecord) ([]*pending, error) {
	var ps []*pending
	for _, m := range rec.Messages {
		env, err := envelope.Decode(m.Body)
		if err != nil {
			return ps, err
		}
		pub := envelope.ToPublishing(env, m.Body, ss.sc.username)
		ss.index++
		if err := ss.sc.wal.Append(ss.id, wal.Message{Index: ss.index, Seq: m.Seq, RoutingKey: m.RoutingKey, State: string(ss.machine.State()), Body: m.Body}); err != nil {
			ss.log().Error(err, "Failed to record a terminal message in the write-ahead log; it is in the terminal record")
		}
		p, err := ss.enqueueLocked(ctx, ss.index, env.Type, m.RoutingKey, pub, m.Seq)
		if err != nil {
			return ps, err
		}
		if m.Seq > 0 {
			ss.events++
		}
		ps = append(ps, p)
	}
	return ps, nil
}

// statusAfterConfirms writes the terminal status once the broker confirmed
// the terminal messages; without the confirms it stays as it is, and the
// record is replayed (by this replica's sweep once it has forgotten the
// session, or by the next owner).
func (ss *sess) statusAfterConfirms(ps []*pending, st v1alpha1.HCPSessionStatus) {
	ctx := context.WithoutCancel(ss.sc.life)
	if err := waitAll(ss.sc.life, ps); err != nil {
		ss.log().Error(err, "The terminal messages were not confirmed; the terminal record is replayed later")
		return
	}
	ss.sc.st.Update(ss.id, func(s *v1alpha1.HCPSessionStatus) { applyTerminal(s, &st) })
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := ss.sc.st.Flush(fctx, ss.id); err == nil {
		ss.sc.st.Forget(ss.id)
	}
}

// applyTerminal copies the terminal fields of rec into st.
func applyTerminal(st, rec *v1alpha1.HCPSessionStatus) {
	st.State, st.Reason, st.Message, st.CompletedAt = rec.State, rec.Reason, rec.Message, rec.CompletedAt
	st.Result, st.Error = rec.Result, rec.Error
	st.LastSequence, st.EventCount = rec.LastSequence, rec.EventCount
}

// replayTerminal finishes a session found with a terminal record and a
// status that is not terminal: this replica just claimed it (epoch). It
// republishes the recorded messages (the caller deduplicates what it got
// before) and writes the terminal status; the harness is not involved.
func (s *Sidecar) replayTerminal(ctx context.Context, hs *v1alpha1.HCPSession, rec *terminalRecord, epoch int64) error {
	log := s.log.WithValues("session", hs.Name, "epoch", epoch)
	for _, m := range rec.Messages {
		env, err := envelope.Decode(m.Body)
		if err != nil {
			return fmt.Errorf("a message of the terminal record: %w", err)
		}
		pub := envelope.ToPublishing(env, m.Body, s.username)
		pub.Headers = withEpoch(amqp.Table{}, epoch)
		if m.Seq > 0 {
			// Nobody publishes anything before it any more.
			pub.Headers[envelope.HeaderConfirmedThrough] = m.Seq - 1
		}
		if err := (transport.Retry{Max: republishLimit, After: s.clk.After}).Publish(ctx, s.pub, topology.EventsExchange, m.RoutingKey, pub); err != nil {
			return fmt.Errorf("republishing the terminal record: %w", err)
		}
	}
	s.st.Seed(hs.Name, hs.Status, time.Time{})
	s.st.Update(hs.Name, func(st *v1alpha1.HCPSessionStatus) { applyTerminal(st, &rec.Status) })
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := s.st.Flush(fctx, hs.Name)
	s.st.Forget(hs.Name)
	if err != nil {
		return fmt.Errorf("writing the terminal status: %w", err)
	}
	log.Info("Replayed the terminal record of a session", "state", rec.Status.State, "messages", len(rec.Messages))
	return nil
}
