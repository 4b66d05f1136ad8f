package callee

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Acceptance without an API write on the path. An admission no
// concurrency limit applies to cannot be overturned, and all its answer
// holds derives from the task_submit: the session id from its message_id
// (topology.SessionID), the reply's message id from the session id
// (derivedID), the token's iat from its timestamp (submitIAT, stored as
// spec.issuedAt), the rest from the verdict. So the answer goes out first:
//
//  1. the gate decides (from the cache);
//  2. task_accepted is published, and the HCPSession created, at once;
//  3. once the create succeeded, the session starts (session_created,
//     state_changed) and the harness gets the task, never before;
//  4. the command is acknowledged once the reply is confirmed.
//
// A crash between 2 and 3 leaves no record and an unacknowledged command:
// it is redelivered and decided again, on any replica, with the same
// answer byte for byte. If that decision differs (the Callee's policy or
// the harness changed in between), its refusal comes with a task_failed
// that ends the acceptance the caller may hold (mayHaveAccepted). A create
// the API server refuses, or cannot take within Timeouts.RecordWait, ends
// the session with task_failed session_not_recorded, and nothing runs; a
// create that finds the record there (another replica decided a copy)
// answers as a duplicate.
//
// Admissions under a concurrency limit keep the create on the path
// (decide.go: the claim must exist before the recount), and so does a
// submit stamped ahead of the callee's clock (its iat is the creation
// time) and, with Options.RecordBeforeReply, every admission.

// codeNotRecorded is the task_failed code of an accepted task whose
// HCPSession could not be created: nothing ran.
const codeNotRecorded = "session_not_recorded"

// submitIAT is the session token's iat for a task_submit stamped at: its
// timestamp in whole seconds, or zero when it is ahead of now by more than
// tokenLeeway (a clock ahead, or a made-up stamp): such a token would not
// be valid yet, so the session is recorded first and its creation time is
// iat.
func submitIAT(at, now time.Time) time.Time {
	iat := at.UTC().Truncate(time.Second)
	if iat.After(now.Add(tokenLeeway)) {
		return time.Time{}
	}
	return iat
}

// outlived refuses an admission whose session, counted from iat, would
// end before it could start (a submit that waited longer than its
// maximum duration).
func outlived(v policy.Verdict, iat, now time.Time) policy.Verdict {
	if !v.Admitted || iat.IsZero() {
		return v
	}
	end := iat.Add(v.MaxDuration).Truncate(time.Second)
	if end.Sub(now) >= time.Second {
		return v
	}
	return policy.Verdict{Reason: task.ReasonExpired, Risk: v.Risk, DataClass: v.DataClass,
		Message: fmt.Sprintf("the session's maximum duration %s counts from the task_submit's timestamp %s and ended at %s, before the task could start (now %s)",
			task.FormatDuration(v.MaxDuration), iat.Format(time.RFC3339), end.Format(time.RFC3339), now.UTC().Format(time.RFC3339))}
}

// replyFirst reports whether an admission is answered before its create.
func (s *Sidecar) replyFirst(c *command, v policy.Verdict) bool {
	return !v.Counted && !c.iat.IsZero() && !s.recordFirst && !s.issuedAtDropped.Load()
}

// acceptFirst answers an admission, then records and starts it (see
// above).
func (s *Sidecar) acceptFirst(ctx context.Context, c *command, cl *v1alpha1.Callee, v policy.Verdict, depth int) {
	hs := s.newHCPSession(cl, c, v)
	traceAnnotations(hs, c.trace)
	a, err := s.admit(c, hs)
	var reply amqp.Publishing
	if err == nil {
		reply, err = s.acceptedReply(hs)
	}
	if err != nil {
		c.log.Error(err, "Failed to issue the session token")
		s.rejectUnrecorded(ctx, c, policy.Verdict{Reason: task.ReasonInternal, Message: "the callee could not issue a session token"})
		return
	}
	// The session (not registered: nothing reaches it before the create)
	// gives the reply its trace, as to every message of the session.
	ss := s.newSession(hs, cl, a.tok, a.claims, a.body)
	reply.Headers = withEpoch(ss.trace.headers, storedEpoch(hs))
	created := make(chan error, 1)
	go func() { created <- s.createRecord(hs) }()
	c.replied = true
	replied := s.publishAsync(c.callerID, c.sid, envelope.TypeTaskAccepted, reply)
	if err := <-created; err != nil {
		ss.endTrace(string(v1alpha1.SessionFailed), codeNotRecorded, true)
		s.notRecorded(ctx, c, hs, reply, replied, err, depth)
		return
	}
	ss.uid = hs.UID
	s.register(ss)
	s.seedAdmitted(hs, v, a)
	s.startAdmitted(c, ss, hs, v, nil)
	if cur, err := s.readCached(ctx, hs.Name); err == nil && cur.Spec.AbortRequested {
		go ss.requestAbort("abort requested (spec.abortRequested)") // set before the session was registered
	}
	s.settleReply(ctx, c.d, c.log, topology.EventRoutingKey(c.callerID, c.sid, envelope.TypeTaskAccepted), <-replied)
}

// createRecord creates hs, retrying what may pass later (the API server
// unreachable, overloaded) for Timeouts.RecordWait; it gives up at once on
// what will not (invalid, forbidden, AlreadyExists) and when the sidecar
// stops. It does not end with the delivery's context: a create under way
// at a drain completes, and the session is handed over.
func (s *Sidecar) createRecord(hs *v1alpha1.HCPSession) error {
	deadline := s.clk.Now().Add(s.t.RecordWait)
	backoff := 100 * time.Millisecond
	for {
		err := s.c.Create(s.life, hs, client.FieldOwner(status.FieldOwner))
		if err == nil {
			if s.issuedAtChecked.CompareAndSwap(false, true) {
				go s.checkIssuedAt(hs.Name)
			}
			return nil
		}
		if permanent(err) || s.life.Err() != nil || !s.clk.Now().Add(backoff).Before(deadline) {
			return err
		}
		select {
		case <-s.life.Done():
			return s.life.Err()
		case <-s.clk.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// checkIssuedAt reads the first session this process recorded back from
// the API server: a CRD of an earlier release prunes spec.issuedAt, and a
// copy of the submit would then be answered with another token (iat the
// creation time). From then on every admission is recorded first.
func (s *Sidecar) checkIssuedAt(name string) {
	ctx, cancel := context.WithTimeout(s.life, 30*time.Second)
	defer cancel()
	var hs v1alpha1.HCPSession
	if err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &hs); err != nil {
		s.issuedAtChecked.Store(false) // the next create checks again
		return
	}
	if hs.Spec.IssuedAt == nil && s.issuedAtDropped.CompareAndSwap(false, true) {
		s.log.Error(nil, "The API server dropped spec.issuedAt from an HCPSession: its CRD predates this sidecar (update the CRDs); until this sidecar restarts, every admission is recorded before it is answered", "session", name)
	}
}

// permanent: the API server refused the create for a reason a retry
// does not change.
func permanent(err error) bool {
	return apierrors.IsAlreadyExists(err) || apierrors.IsInvalid(err) || apierrors.IsForbidden(err) ||
		apierrors.IsBadRequest(err) || apierrors.IsNotFound(err) || apierrors.IsRequestEntityTooLargeError(err)
}

// notRecorded handles an acceptance whose create failed (err).
func (s *Sidecar) notRecorded(ctx context.Context, c *command, hs *v1alpha1.HCPSession, reply amqp.Publishing, replied <-chan error, err error, depth int) {
	switch {
	case apierrors.IsAlreadyExists(err):
		// Another processor of a copy recorded it first: it runs the
		// session. The reply just sent is the one its record gives (both
		// derive from the submit) unless that processor decided
		// otherwise: then answer from its record (a refusal there also
		// ends this acceptance).
		if s.sameAcceptance(ctx, c, reply) {
			s.settleReply(ctx, c.d, c.log, topology.EventRoutingKey(c.callerID, c.sid, envelope.TypeTaskAccepted), <-replied)
			return
		}
		s.duplicate(ctx, c, depth)
		return
	case s.life.Err() != nil:
		// Stopping: the next replica decides the command again, the same
		// way.
		c.log.Info("Stopped before the accepted session was recorded; the command returns to the queue")
		s.settle(c.d, false, true)
		return
	}
	recoverable := !permanent(err)
	msg := fmt.Sprintf("the callee accepted the task but could not record its session (HCPSession create: %s); nothing ran; submit it again with a new message_id",
		oneLine(err.Error(), 400))
	c.log.Error(err, "Failed to record an accepted session; ending it", "code", codeNotRecorded, "recoverable", recoverable)
	r := rejection{at: s.clk.Now().UTC().Truncate(time.Second), code: codeNotRecorded, msg: msg, accepted: &reply, recoverable: recoverable}
	s.rejections.Add(c.sid, r)
	s.event(corev1.EventTypeWarning, EventSessionFailed, "Session %s of caller %s (capability %q) was accepted but could not be recorded: %s",
		c.sid, c.callerID, hs.Spec.Capability, oneLine(err.Error(), 300))
	s.m.SessionEnded(hs.Spec.Capability, string(v1alpha1.SessionFailed), codeNotRecorded, 0)
	if err := <-replied; err != nil {
		c.log.Error(err, "Failed to publish task_accepted")
	}
	s.answerNotRecorded(ctx, c, r, false)
}

// sameAcceptance reports whether the recorded session of c is admitted and
// its task_accepted is the reply this processor sent: then the caller has
// its answer, and sending it again would only repeat it.
func (s *Sidecar) sameAcceptance(ctx context.Context, c *command, sent amqp.Publishing) bool {
	var hs v1alpha1.HCPSession
	if err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: c.sid}, &hs); err != nil ||
		hs.Spec.CallerID != c.callerID || hs.Spec.MaxDuration == "" || hs.DecidedState() == v1alpha1.SessionRejected {
		return false
	}
	pub, err := s.acceptedReply(&hs)
	return err == nil && bytes.Equal(pub.Body, sent.Body)
}

// answerNotRecorded sends the answers of an accepted task that has no
// record (r): task_accepted again when again (a copy), then task_failed;
// the command is acknowledged once they are confirmed.
func (s *Sidecar) answerNotRecorded(ctx context.Context, c *command, r rejection, again bool) {
	var err error
	if again && r.accepted != nil {
		err = <-s.publishAsync(c.callerID, c.sid, envelope.TypeTaskAccepted, *r.accepted)
	}
	if err == nil {
		err = s.sendFailed(c.callerID, c.sid, r.at, string(r.code), r.msg, r.recoverable)
	}
	s.settleReply(ctx, c.d, c.log, topology.EventRoutingKey(c.callerID, c.sid, envelope.TypeTaskFailed), err)
}

// mayHaveAccepted reports whether the caller may hold a task_accepted for
// c's task that no HCPSession backs: this processor sent one, or the
// command was delivered before (a replica that answered it may have died
// before its create). A refusal of such a task also ends that acceptance.
func (s *Sidecar) mayHaveAccepted(c *command) bool {
	return c.replied || c.d.Redelivered || deliveryCount(c.d) > 0
}

// refuse publishes the task_rejected pub for c and, if the caller may
// hold an acceptance of the task (mayHaveAccepted), a task_failed with the
// same reason after it, which ends that session (a caller that got no
// acceptance takes the rejection and drops the task_failed of a rejected
// task); then it settles the command.
func (s *Sidecar) refuse(ctx context.Context, c *command, pub amqp.Publishing, at time.Time, code task.ReasonCode, msg string) {
	if !s.mayHaveAccepted(c) {
		s.sendReply(ctx, c.d, c.log, c.callerID, c.sid, envelope.TypeTaskRejected, pub)
		return
	}
	err := <-s.publishAsync(c.callerID, c.sid, envelope.TypeTaskRejected, traced(pub, c.d))
	if err == nil {
		c.log.Info("The task may have been accepted by a replica that stopped before recording it; its refusal ends that acceptance too", "reasonCode", code)
		err = s.sendFailed(c.callerID, c.sid, at, string(code), msg, false)
	}
	s.settleReply(ctx, c.d, c.log, topology.EventRoutingKey(c.callerID, c.sid, envelope.TypeTaskRejected), err)
}

// sendFailed publishes, confirmed, the task_failed of a session that has
// no record (the same message for every copy: its id derives from the
// session id).
func (s *Sidecar) sendFailed(callerID, sid string, at time.Time, code, msg string, recoverable bool) error {
	raw, err := json.Marshal(task.TaskFailed{Code: code, Message: msg, Recoverable: recoverable})
	if err != nil {
		return err
	}
	pub, err := envelope.EncodePublishing(&envelope.Envelope{HCPVersion: envelope.Version, MessageID: derivedID("failed", sid),
		Timestamp: at.UTC().Truncate(time.Millisecond), SessionID: &sid, Type: envelope.TypeTaskFailed, Payload: raw}, s.username)
	if err != nil {
		return err
	}
	pub.Headers = withEpoch(pub.Headers, 1)
	return <-s.publishAsync(callerID, sid, envelope.TypeTaskFailed, pub)
}

// publishAsync publishes a message of session sid now and returns where
// its confirm (after republishes, as publishConfirmed) will be reported.
func (s *Sidecar) publishAsync(callerID, sid string, t envelope.MessageType, pub amqp.Publishing) <-chan error {
	rk := topology.EventRoutingKey(callerID, sid, t)
	conf, err := s.pub.PublishAsync(s.life, topology.EventsExchange, rk, pub)
	if err != nil {
		conf = nil // republished below
	}
	s.countOut(string(t))
	out := make(chan error, 1)
	go func() { out <- s.retry().Confirm(s.life, s.pub, topology.EventsExchange, rk, pub, conf) }()
	return out
}

// admittedRecord reports whether the API server holds an admitted
// HCPSession named sid.
func (s *Sidecar) admittedRecord(sid string) bool {
	ctx, cancel := context.WithTimeout(s.life, 5*time.Second)
	defer cancel()
	var hs v1alpha1.HCPSession
	err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sid}, &hs)
	return err == nil && hs.Spec.MaxDuration != "" && hs.DecidedState() != v1alpha1.SessionRejected
}

// readCached reads a session from the cache.
func (s *Sidecar) readCached(ctx context.Context, name string) (*v1alpha1.HCPSession, error) {
	var hs v1alpha1.HCPSession
	err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &hs)
	return &hs, err
}

// errNotRecorded: no HCPSession, and none is on its way.
var errNotRecorded = errors.New("no such session")

// awaitRecord waits for the HCPSession of an abort whose session has no
// record yet, if tok shows it was accepted (a token of this callee for
// the session and the sender): its create may still be under way
// (acceptFirst). At most Timeouts.PendingWait; errNotRecorded when it does
// not appear, or tok proves nothing.
func (s *Sidecar) awaitRecord(ctx context.Context, callerID, sid, tok string) (*v1alpha1.HCPSession, error) {
	if _, err := token.VerifySet(s.keys.verifiers(), tok, token.Expectations{
		Issuer: s.id, Audience: callerID, Subject: sid, Leeway: tokenLeeway,
	}, s.clk.Now()); err != nil {
		return nil, errNotRecorded
	}
	deadline := s.clk.Now().Add(s.t.PendingWait)
	for s.clk.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.clk.After(100 * time.Millisecond):
		}
		hs, err := s.readSession(ctx, sid)
		if !apierrors.IsNotFound(err) {
			return hs, err
		}
	}
	return nil, errNotRecorded
}
