package callee

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"runtime/debug"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-logr/logr"
	"github.com/google/uuid"
	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Labels of the rejects metric for messages that get no task_rejected.
const (
	rejectUnanswerable   = "unanswerable"    // no usable user_id: nobody to answer
	rejectUnexpectedType = "unexpected_type" // an event type on the command queue
	rejectAbortRefused   = "abort_refused"   // an abort that failed verification
)

// handle is the consumer's Handler: it must return promptly, so each
// delivery is processed on its own goroutine (the prefetch window bounds how
// many run at once). Every path settles the delivery exactly once.
func (s *Sidecar) handle(ctx context.Context, d amqp.Delivery) {
	s.inflight.Add(1)
	go func() {
		defer s.inflight.Done()
		defer func() {
			if r := recover(); r != nil {
				// A bug must not crash the sidecar nor loop the message.
				s.log.Error(fmt.Errorf("panic: %v", r), "Failed to process a command; discarded it", "messageId", d.MessageId, "stack", string(debug.Stack()))
				s.countReject(string(task.ReasonInternal))
				s.settle(d, true, false)
			}
		}()
		s.process(ctx, d)
	}()
}

func (s *Sidecar) process(ctx context.Context, d amqp.Delivery) {
	env, err := envelope.FromDelivery(d, envelope.MaxEnvelopeBytes)
	if err != nil {
		s.countIn("invalid")
		s.malformed(ctx, d, err)
		return
	}
	s.countIn(string(env.Type))
	switch env.Type {
	case envelope.TypeTaskSubmit:
		s.submit(ctx, d, env)
	case envelope.TypeAbort:
		s.abortCommand(ctx, d, env)
	default:
		s.log.Info("Discarded a message of a type that does not belong on a command queue", "type", env.Type, "messageId", env.MessageID, "userId", d.UserId)
		s.countReject(rejectUnexpectedType)
		s.settle(d, true, false)
	}
}

// malformed answers a message that is not a valid envelope with
// task_rejected(malformed) when a reply address can be derived from its
// user_id, and discards it otherwise. It is never requeued.
func (s *Sidecar) malformed(ctx context.Context, d amqp.Delivery, cause error) {
	callerID, idErr := identify(d.UserId, s.cfg.Vhost)
	log := s.log.WithValues("messageId", truncate(d.MessageId, 64), "userId", truncate(d.UserId, 80), "reason", oneLine(cause.Error(), 300))
	if idErr != nil {
		log.Info("Discarded a malformed command from an unauthenticated sender", "identity", idErr.Error())
		s.countReject(rejectUnanswerable)
		s.settle(d, true, false)
		return
	}
	if d.Type == string(envelope.TypeAbort) {
		// Aborts have no reply message; the sender learns nothing new.
		log.Info("Discarded a malformed abort", "caller", callerID)
		s.countReject(string(task.ReasonMalformed))
		s.settle(d, true, false)
		return
	}
	msgID := d.MessageId
	if msgID == "" {
		msgID = "unknown"
	}
	msgID = truncate(strings.ToLower(msgID), 120)
	sid := topology.SessionID(s.id, msgID)
	log.Info("Rejected a malformed command", "caller", callerID)
	s.replyRejected(ctx, d, callerID, sid, msgID, s.clk.Now(), task.ReasonMalformed, "malformed message: "+oneLine(cause.Error(), 900))
}

// command is a task_submit being processed.
type command struct {
	d        amqp.Delivery
	ts       *task.TaskSubmit
	callerID string // authenticated (user_id)
	sid      string
	msgID    string // lowercase
	log      logr.Logger
}

// submit runs the gate for one task_submit.
func (s *Sidecar) submit(ctx context.Context, d amqp.Delivery, env *envelope.Envelope) {
	msgID := strings.ToLower(env.MessageID)
	log := s.log.WithValues("messageId", msgID)
	callerID, err := identify(d.UserId, s.cfg.Vhost)
	if err != nil {
		log.Info("Discarded a task_submit that cannot be answered", "reason", err.Error())
		s.countReject(rejectUnanswerable)
		s.settle(d, true, false)
		return
	}
	sid := topology.SessionID(s.id, msgID)
	log = log.WithValues("caller", callerID, "session", sid)

	ts, err := decodeSubmit(env.Payload)
	if err != nil {
		log.Info("Rejected a malformed task_submit", "reason", err.Error())
		s.replyRejected(ctx, d, callerID, sid, msgID, s.clk.Now(), task.ReasonMalformed, oneLine(err.Error(), 1000))
		return
	}
	c := &command{d: d, ts: ts, callerID: callerID, sid: sid, msgID: msgID, log: log}

	// A copy of this task_submit being decided on this replica right now:
	// wait for that decision and answer with it.
	s.mu.Lock()
	if s.shuttingDn {
		s.mu.Unlock()
		s.settle(d, false, true) // another replica (or the restarted one) takes it
		return
	}
	if ch, ok := s.deciding[sid]; ok {
		s.mu.Unlock()
		s.waitThen(ctx, ch, func() { s.duplicate(ctx, c, 1) })
		return
	}
	decided := make(chan struct{})
	s.deciding[sid] = decided
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.deciding, sid)
		s.mu.Unlock()
		close(decided)
	}()
	s.decideTask(ctx, c, 0)
}

// decideTask runs expiry, dedup and the gate, then records and answers the
// decision. depth counts re-decisions after an orphaned record was cleared.
func (s *Sidecar) decideTask(ctx context.Context, c *command, depth int) {
	ts, log := c.ts, c.log
	now := s.clk.Now()
	// The cache answers the common case; after an orphaned record was
	// cleared, only the API server is trusted.
	var reader client.Reader = s.c
	if depth > 0 {
		reader = s.reader
	}
	var existing v1alpha1.HCPSession
	exists := reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: c.sid}, &existing) == nil

	// Expiry comes before any side effect. An expired duplicate of a task
	// already answered still gets its original answer: a duplicate starts
	// nothing, and the caller must not see two different answers.
	if ts.Expired(now) && !exists {
		at := "expires_at " + fmtTime(ts.ExpiresAt)
		if ts.ExpiresAt == nil || (ts.Constraints.Deadline != nil && !now.Before(ts.Constraints.Deadline.Time)) {
			at = "constraints.deadline " + fmtTime(ts.Constraints.Deadline)
		}
		s.decideAndReply(ctx, c, nil, verdict{Reason: task.ReasonExpired,
			Message: fmt.Sprintf("the task expired (%s) before it could start (now %s)", at, now.UTC().Format(time.RFC3339))}, depth)
		return
	}
	if exists {
		s.duplicate(ctx, c, depth)
		return
	}

	in, cl, err := s.gateInput(ctx, c.callerID, ts, now)
	if err != nil {
		log.Error(err, "Failed to read what the gate needs")
		s.decideAndReply(ctx, c, cl, verdict{Reason: task.ReasonInternal, Message: "the callee could not evaluate the task: " + oneLine(err.Error(), 300)}, depth)
		return
	}
	v := decide(in)
	if v.Admitted {
		if err := s.harnessReachable(ctx); err != nil {
			v = verdict{Reason: task.ReasonHarnessUnavailable, Risk: v.Risk, Message: "the callee harness is not reachable: " + oneLine(err.Error(), 300)}
		}
	}
	s.decideAndReply(ctx, c, cl, v, depth)
}

// waitThen runs f once ch is closed (or after PendingWait).
func (s *Sidecar) waitThen(ctx context.Context, ch <-chan struct{}, f func()) {
	t := s.clk.NewTimer(s.t.PendingWait)
	defer t.Stop()
	select {
	case <-ch:
	case <-t.C():
	case <-ctx.Done():
		return // the delivery's channel is gone: it will come back
	}
	f()
}

// gateInput reads the Callee, the policies, the caller's labels and the
// active session counts from the cache.
func (s *Sidecar) gateInput(ctx context.Context, callerID string, ts *task.TaskSubmit, now time.Time) (gateInput, *v1alpha1.Callee, error) {
	cl, err := s.callee(ctx)
	if err != nil {
		return gateInput{}, nil, err
	}
	var pols v1alpha1.CapabilityPolicyList
	if err := s.c.List(ctx, &pols, client.InNamespace(s.ns)); err != nil {
		return gateInput{}, cl, fmt.Errorf("listing CapabilityPolicies: %w", err)
	}
	// Callers in other namespaces (sharing the vhost) or external programs
	// have no Caller object here: they match rules by id only.
	caller := policy.UnknownCaller(callerID)
	var callers v1alpha1.CallerList
	if err := s.c.List(ctx, &callers, client.InNamespace(s.ns)); err != nil {
		return gateInput{}, cl, fmt.Errorf("listing Callers: %w", err)
	}
	for i := range callers.Items {
		if callers.Items[i].ID() == callerID {
			caller = policy.KnownCaller(&callers.Items[i])
			break
		}
	}
	active, err := s.activeSessions(ctx, callerID)
	if err != nil {
		return gateInput{}, cl, err
	}
	return gateInput{Now: now, Callee: cl, CallerID: callerID, Caller: caller, Policies: pols.Items, Active: active, Task: ts}, cl, nil
}

// activeSessions counts the non-terminal sessions of this callee (all
// replicas, from the cache) and of the caller on it. Sessions this replica
// started that the cache has not seen yet are added, so a burst on one
// replica is counted; across replicas the count is as fresh as the cache.
func (s *Sidecar) activeSessions(ctx context.Context, callerID string) (policy.Active, error) {
	var list v1alpha1.HCPSessionList
	if err := s.c.List(ctx, &list, client.InNamespace(s.ns), client.MatchingLabels{v1alpha1.LabelCalleeID: s.id}); err != nil {
		return policy.Active{}, fmt.Errorf("listing HCPSessions: %w", err)
	}
	var a policy.Active
	seen := map[string]bool{}
	for i := range list.Items {
		hs := &list.Items[i]
		seen[hs.Name] = true
		if hs.Status.State.IsTerminal() {
			continue
		}
		if ss := s.session(hs.Name); ss != nil && ss.ended() {
			continue
		}
		a.Callee++
		if hs.Spec.CallerID == callerID {
			a.CallerOnCallee++
		}
	}
	for _, ss := range s.active() {
		if !seen[ss.id] {
			a.Callee++
			if ss.callerID == callerID {
				a.CallerOnCallee++
			}
		}
	}
	return a, nil
}

// decideAndReply records the verdict (HCPSession PENDING, then REJECTED or
// RUNNING), replies, and acknowledges the command once the reply is
// confirmed.
func (s *Sidecar) decideAndReply(ctx context.Context, c *command, cl *v1alpha1.Callee, v verdict, depth int) {
	d, log, callerID, sid, msgID, ts := c.d, c.log, c.callerID, c.sid, c.msgID, c.ts
	now := s.clk.Now().UTC().Truncate(time.Second)
	hs := s.newHCPSession(cl, sid, callerID, msgID, ts, v)
	if err := s.c.Create(ctx, hs, client.FieldOwner(status.FieldOwner)); err != nil {
		if apierrors.IsAlreadyExists(err) {
			s.duplicate(ctx, c, depth)
			return
		}
		if !v.Admitted && !apierrors.IsInvalid(err) {
			// The rejection stands without its record.
			log.Error(err, "Failed to record a rejected task as an HCPSession; replying anyway")
			s.replyRejected(ctx, d, callerID, sid, msgID, now, v.Reason, v.Message)
			return
		}
		if apierrors.IsInvalid(err) {
			log.Error(err, "The API server refused the HCPSession; rejecting the task")
			s.replyRejected(ctx, d, callerID, sid, msgID, now, task.ReasonMalformed, "the task cannot be recorded: "+oneLine(err.Error(), 500))
			return
		}
		log.Error(err, "Failed to create the HCPSession; the command will be retried")
		s.retryLater(ctx, d)
		return
	}
	// PENDING, with the pod deciding it: a duplicate arriving on another
	// replica meanwhile waits for this one.
	if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionPending
		st.PodName = s.pod
	}); err != nil {
		s.afterCASFailure(ctx, c, err, depth)
		return
	}

	if !v.Admitted {
		if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
			st.State = v1alpha1.SessionRejected
			st.Reason = string(v.Reason)
			st.Message = truncate(v.Message, 1024)
			st.Error = &v1alpha1.SessionError{Code: string(v.Reason), Message: truncate(v.Message, 1024)}
			st.CompletedAt = &metav1.Time{Time: now}
		}); err != nil {
			s.afterCASFailure(ctx, c, err, depth)
			return
		}
		s.st.Seed(sid, hs.Status, s.clk.Now())
		log.Info("Rejected a task", "reasonCode", v.Reason, "message", v.Message)
		s.countReject(string(v.Reason))
		pub, err := s.rejectedReply(hs)
		if err != nil {
			log.Error(err, "Failed to build task_rejected")
			s.settle(d, true, false)
			return
		}
		s.sendReply(ctx, d, log, callerID, sid, envelope.TypeTaskRejected, pub)
		s.forgetWhenWritten(sid)
		return
	}

	// The claims come from the object's immutable part (creation time,
	// spec), so every later duplicate re-issues this very token.
	claims, err := sessionClaims(s.id, hs)
	var tok string
	if err == nil {
		tok, err = token.Issue(s.key, claims)
	}
	if err != nil {
		log.Error(err, "Failed to issue the session token")
		s.casReject(ctx, c, hs, task.ReasonInternal, "the callee could not issue a session token", depth)
		return
	}
	body, err := s.taskBody(sid, msgID, tok, callerID, v.Risk, claims.IssuedAt, claims.ExpiresAt, ts)
	if err != nil {
		log.Error(err, "Failed to encode the harness task")
		s.casReject(ctx, c, hs, task.ReasonInternal, "the callee could not encode the task for its harness", depth)
		return
	}
	ss := s.newSession(hs, cl, tok, claims, body)
	s.register(ss)
	if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionRunning
		st.Reason = "accepted"
		st.Message = truncate(v.Message, 1024)
		// For people and dashboards only: replies never read them back.
		st.StartedAt = &metav1.Time{Time: claims.IssuedAt}
		st.TokenExpiresAt = &metav1.Time{Time: claims.ExpiresAt}
	}); err != nil {
		s.unregister(ss)
		s.afterCASFailure(ctx, c, err, depth)
		return
	}
	s.st.Seed(sid, hs.Status, s.clk.Now())
	log.Info("Accepted a task", "capability", ts.Capability, "risk", v.Risk, "maxDuration", task.FormatDuration(v.MaxDuration))

	reply, err := s.acceptedReply(hs)
	if err != nil { // cannot happen: the same inputs just issued a token
		log.Error(err, "Failed to build task_accepted")
	}
	accepted := ss.start(reply, hs.Spec.AbortRequested)
	go ss.deliver()
	// Acknowledge once the reply is confirmed.
	s.settleAfter(ctx, d, log, accepted)
}

// casReject turns a PENDING session REJECTED (optimistic lock) and replies.
func (s *Sidecar) casReject(ctx context.Context, c *command, hs *v1alpha1.HCPSession, code task.ReasonCode, msg string, depth int) {
	d, log, callerID, sid := c.d, c.log, c.callerID, c.sid
	now := s.clk.Now().UTC().Truncate(time.Second)
	if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionRejected
		st.Reason = string(code)
		st.Message = msg
		st.Error = &v1alpha1.SessionError{Code: string(code), Message: msg}
		st.CompletedAt = &metav1.Time{Time: now}
	}); err != nil {
		s.afterCASFailure(ctx, c, err, depth)
		return
	}
	s.st.Seed(sid, hs.Status, s.clk.Now())
	defer s.forgetWhenWritten(sid)
	s.countReject(string(code))
	pub, err := s.rejectedReply(hs)
	if err != nil {
		s.settle(d, true, false)
		return
	}
	s.sendReply(ctx, d, log, callerID, sid, envelope.TypeTaskRejected, pub)
}

// forgetWhenWritten drops a session this replica decided but does not run
// (a rejection) from the status writer once the writer has written what it
// still owes (the state label).
func (s *Sidecar) forgetWhenWritten(sid string) {
	go func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.life), 30*time.Second)
		defer cancel()
		if err := s.st.Flush(ctx, sid); err == nil || errors.Is(err, status.ErrNotFound) {
			s.st.Forget(sid)
		}
	}()
}

// afterCASFailure: someone else decided (Conflict) or the object vanished;
// answer as a duplicate, which re-reads the object.
func (s *Sidecar) afterCASFailure(ctx context.Context, c *command, err error, depth int) {
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		c.log.V(1).Info("Another processor changed the HCPSession first; answering as a duplicate", "error", err.Error())
		s.duplicate(ctx, c, depth+1)
		return
	}
	c.log.Error(err, "Failed to record the decision; the command will be retried")
	s.retryLater(ctx, c.d)
}

// duplicate answers a task_submit whose HCPSession exists with the original
// reply, rebuilt from the object. depth bounds the re-processing of an
// orphaned PENDING session.
func (s *Sidecar) duplicate(ctx context.Context, c *command, depth int) {
	d, log, callerID, sid, msgID := c.d, c.log, c.callerID, c.sid, c.msgID
	if s.m != nil {
		s.m.Duplicates.WithLabelValues("message_id").Inc()
	}
	var hs v1alpha1.HCPSession
	if err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sid}, &hs); err != nil {
		if apierrors.IsNotFound(err) && depth < 3 {
			// Deleted meanwhile (an orphan cleared by recovery): decide anew.
			s.redecide(ctx, c, depth+1)
			return
		}
		log.Error(err, "Failed to read the HCPSession of a duplicate; the command will be retried")
		s.retryLater(ctx, d)
		return
	}
	if hs.Spec.CallerID != callerID {
		// Another caller replays someone else's message_id: it must not get
		// that caller's reply (it holds the session token).
		log.Info("Refused a task_submit reusing another caller's message_id", "sessionCaller", hs.Spec.CallerID)
		s.replyRejected(ctx, d, callerID, sid, msgID, s.clk.Now(), task.ReasonNotAuthorized,
			"message_id "+msgID+" already identifies another caller's task; use a fresh message_id")
		return
	}
	switch st := hs.Status.State; {
	case st == v1alpha1.SessionRejected:
		pub, err := s.rejectedReply(&hs)
		if err != nil {
			log.Error(err, "Failed to rebuild task_rejected")
			s.settle(d, true, false)
			return
		}
		log.Info("Answered a duplicate task_submit with its original rejection")
		s.sendReply(ctx, d, log, callerID, sid, envelope.TypeTaskRejected, pub)
	case st == "" || st == v1alpha1.SessionPending: // being decided somewhere, or orphaned
		s.pendingDuplicate(ctx, c, &hs, depth)
	case hs.Spec.MaxDuration != "": // admitted (set at creation only then), and decided
		pub, err := s.acceptedReply(&hs)
		if err != nil {
			log.Error(err, "Failed to rebuild task_accepted")
			s.settle(d, true, false)
			return
		}
		log.Info("Answered a duplicate task_submit with its original acceptance", "state", st)
		s.sendReply(ctx, d, log, callerID, sid, envelope.TypeTaskAccepted, pub)
	default:
		// Past PENDING without having been admitted: only a hand-written
		// status gets here. The immutable spec says the gate refused it.
		log.Info("A session that was never admitted has a non-PENDING state; answering with a rejection", "state", st)
		pub, err := s.rejectedReply(&hs)
		if err != nil {
			log.Error(err, "Failed to rebuild task_rejected")
			s.settle(d, true, false)
			return
		}
		s.sendReply(ctx, d, log, callerID, sid, envelope.TypeTaskRejected, pub)
	}
}

// pendingDuplicate handles a duplicate whose session is still PENDING.
func (s *Sidecar) pendingDuplicate(ctx context.Context, c *command, hs *v1alpha1.HCPSession, depth int) {
	d, log, sid := c.d, c.log, c.sid
	s.mu.Lock()
	ch, local := s.deciding[sid]
	s.mu.Unlock()
	if local {
		s.waitThen(ctx, ch, func() { s.duplicate(ctx, c, depth+1) })
		return
	}
	owner := hs.Status.PodName
	if owner != "" && owner != s.pod && s.podAlive(ctx, owner) {
		// Another live replica is deciding it: wait for its decision.
		deadline := s.clk.Now().Add(s.t.PendingWait)
		for s.clk.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return
			case <-s.clk.After(250 * time.Millisecond):
			}
			var cur v1alpha1.HCPSession
			if err := s.reader.Get(ctx, client.ObjectKeyFromObject(hs), &cur); err != nil {
				break
			}
			if cur.Status.State != v1alpha1.SessionPending && cur.Status.State != "" {
				s.duplicate(ctx, c, depth+1)
				return
			}
		}
		log.Info("Another replica has not decided a task in time; the command will be retried", "owner", owner)
		s.retryLater(ctx, d)
		return
	}
	// Orphaned: the deciding process is gone before any reply or harness
	// call (both come after PENDING is left). Remove the record, guarded by
	// its uid and resourceVersion, and decide anew.
	if depth >= 2 {
		s.retryLater(ctx, d)
		return
	}
	log.Info("Cleared an orphaned PENDING session; deciding the task anew", "owner", owner)
	if err := s.c.Delete(ctx, hs, client.Preconditions{UID: &hs.UID, ResourceVersion: &hs.ResourceVersion}); err != nil && !apierrors.IsNotFound(err) {
		if apierrors.IsConflict(err) {
			s.duplicate(ctx, c, depth+1)
			return
		}
		log.Error(err, "Failed to delete an orphaned PENDING session")
		s.retryLater(ctx, d)
		return
	}
	s.redecide(ctx, c, depth+1)
}

// redecide decides the task again after its orphaned record was removed.
func (s *Sidecar) redecide(ctx context.Context, c *command, depth int) {
	if depth > 3 {
		s.retryLater(ctx, c.d)
		return
	}
	s.decideTask(ctx, c, depth)
}

// newHCPSession builds the HCPSession recording a decision.
func (s *Sidecar) newHCPSession(cl *v1alpha1.Callee, sid, callerID, msgID string, ts *task.TaskSubmit, v verdict) *v1alpha1.HCPSession {
	hs := &v1alpha1.HCPSession{
		ObjectMeta: metav1.ObjectMeta{
			Name:      sid,
			Namespace: s.ns,
			Labels: map[string]string{
				v1alpha1.LabelCalleeID:  s.id,
				v1alpha1.LabelCallerID:  callerID,
				v1alpha1.LabelCallee:    s.cfg.ObjectName,
				v1alpha1.LabelManagedBy: v1alpha1.ManagedByValue,
				// The status writer keeps it in step from here on.
				v1alpha1.LabelSessionState: string(v1alpha1.SessionPending),
			},
		},
		Spec: v1alpha1.HCPSessionSpec{
			SessionID:          sid,
			CalleeID:           s.id,
			CallerID:           callerID,
			Capability:         truncateRunes(ts.Capability, 128),
			TaskMessageID:      msgID,
			RiskLevel:          v1alpha1.RiskLevel(v.Risk),
			DataClassification: v1alpha1.DataClass(ts.Constraints.DataClassification),
			Intent:             truncateRunes(ts.Intent, 1024),
		},
	}
	if v.Admitted {
		hs.Spec.MaxDuration = v1alpha1.ISO8601Duration(task.FormatDuration(v.MaxDuration))
		hs.Annotations = map[string]string{AnnotationSequenceCeiling: strconv.Itoa(DefaultSequenceBlock)}
	}
	if cl != nil {
		hs.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: v1alpha1.GroupVersion.String(),
			Kind:       "Callee",
			Name:       cl.Name,
			UID:        cl.UID,
			Controller: ptr.To(true),
		}}
	}
	return hs
}

// casStatus patches the status of hs with an optimistic lock: it fails with
// Conflict when anyone changed the object since hs was read. hs is updated
// from the response.
func (s *Sidecar) casStatus(ctx context.Context, hs *v1alpha1.HCPSession, mutate func(*v1alpha1.HCPSessionStatus)) error {
	base := hs.DeepCopy()
	mutate(&hs.Status)
	err := s.c.Status().Patch(ctx, hs, client.MergeFromWithOptions(base, client.MergeFromWithOptimisticLock{}), client.FieldOwner(status.FieldOwner))
	if s.m != nil {
		switch {
		case err == nil:
			s.m.StatusWrites.WithLabelValues("ok").Inc()
		case apierrors.IsConflict(err):
			s.m.StatusWrites.WithLabelValues("conflict").Inc()
		default:
			s.m.StatusWrites.WithLabelValues("error").Inc()
		}
	}
	if err != nil {
		*hs = *base
	}
	return err
}

// sessionClaims are the session token's claims, derived only from what
// nobody can change after the HCPSession's creation: its creation time
// (iat, whole seconds, set by the API server) and its spec (callee id,
// caller, capability, risk, and maxDuration for exp; CEL keeps them
// immutable). Nothing comes from status, which the sidecar's
// ServiceAccount (and so anyone who holds its token) may write: a
// re-issued token is the original byte for byte, and writing
// status.tokenExpiresAt cannot extend it.
func sessionClaims(calleeID string, hs *v1alpha1.HCPSession) (token.Claims, error) {
	if hs.CreationTimestamp.IsZero() {
		return token.Claims{}, errors.New("the HCPSession has no creationTimestamp")
	}
	if hs.Spec.MaxDuration == "" {
		return token.Claims{}, errors.New("the HCPSession has no spec.maxDuration: it was not admitted")
	}
	d, err := task.ParseDuration(string(hs.Spec.MaxDuration))
	if err != nil {
		return token.Claims{}, fmt.Errorf("spec.maxDuration: %w", err)
	}
	return token.NewClaims(calleeID, hs.Spec.CallerID, hs.Name, hs.Spec.Capability, task.RiskLevel(hs.Spec.RiskLevel), hs.CreationTimestamp.Time, d), nil
}

// acceptedReply rebuilds the task_accepted of an accepted session from the
// stored object's immutable part (sessionClaims); the original and every
// duplicate are byte for byte equal.
func (s *Sidecar) acceptedReply(hs *v1alpha1.HCPSession) (amqp.Publishing, error) {
	claims, err := sessionClaims(s.id, hs)
	if err != nil {
		return amqp.Publishing{}, err
	}
	tok, err := token.Issue(s.key, claims)
	if err != nil {
		return amqp.Publishing{}, err
	}
	payload := task.TaskAccepted{
		TaskMessageID: hs.Spec.TaskMessageID,
		SessionID:     hs.Name,
		SessionToken:  tok,
		RiskLevel:     claims.Risk,
		ExpiresAt:     task.NewTimestamp(claims.ExpiresAt),
	}
	return s.replyPublishing(hs.Name, envelope.TypeTaskAccepted, claims.IssuedAt, payload)
}

// rejectedReply rebuilds the task_rejected of a rejected session.
func (s *Sidecar) rejectedReply(hs *v1alpha1.HCPSession) (amqp.Publishing, error) {
	code, msg := task.ReasonInternal, "rejected"
	if e := hs.Status.Error; e != nil {
		code, msg = task.ReasonCode(e.Code), e.Message
	}
	at := hs.CreationTimestamp.Time
	if hs.Status.CompletedAt != nil {
		at = hs.Status.CompletedAt.Time
	}
	return s.rejectedPublishing(hs.Name, hs.Spec.TaskMessageID, at, code, msg)
}

func (s *Sidecar) rejectedPublishing(sid, msgID string, at time.Time, code task.ReasonCode, msg string) (amqp.Publishing, error) {
	if strings.TrimSpace(msg) == "" {
		msg = string(code)
	}
	return s.replyPublishing(sid, envelope.TypeTaskRejected, at, task.TaskRejected{TaskMessageID: msgID, ReasonCode: code, Message: msg})
}

// replyPublishing builds the envelope of a reply with a message id derived
// from the session id, so a re-sent reply is the same message.
func (s *Sidecar) replyPublishing(sid string, t envelope.MessageType, at time.Time, payload any) (amqp.Publishing, error) {
	raw, err := json.Marshal(payload)
	if err != nil {
		return amqp.Publishing{}, err
	}
	env := &envelope.Envelope{
		HCPVersion: envelope.Version,
		MessageID:  derivedID("reply", sid),
		Timestamp:  at.UTC().Truncate(time.Millisecond),
		SessionID:  &sid,
		Type:       t,
		Payload:    raw,
	}
	return envelope.EncodePublishing(env, s.username)
}

// derivedID is a deterministic id in UUID v4 form.
func derivedID(parts ...string) string {
	h := sha256.New()
	h.Write([]byte("hcp.io/callee-sidecar/v1"))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	var u uuid.UUID
	copy(u[:], h.Sum(nil))
	u[6] = (u[6] & 0x0f) | 0x40
	u[8] = (u[8] & 0x3f) | 0x80
	return u.String()
}

// replyRejected publishes a task_rejected with no HCPSession behind it.
func (s *Sidecar) replyRejected(ctx context.Context, d amqp.Delivery, callerID, sid, msgID string, at time.Time, code task.ReasonCode, msg string) {
	pub, err := s.rejectedPublishing(sid, msgID, at, code, msg)
	if err != nil {
		s.log.Error(err, "Failed to build task_rejected")
		s.settle(d, true, false)
		return
	}
	s.countReject(string(code))
	s.sendReply(ctx, d, s.log.WithValues("caller", callerID, "session", sid), callerID, sid, envelope.TypeTaskRejected, pub)
}

// sendReply publishes a reply to the authenticated caller and settles the
// command: ack once confirmed; ack too when the caller's queue does not
// exist (retrying cannot help and would block the queue); requeue after a
// pause on transient failures.
func (s *Sidecar) sendReply(ctx context.Context, d amqp.Delivery, log logr.Logger, callerID, sid string, t envelope.MessageType, pub amqp.Publishing) {
	rk := topology.EventRoutingKey(callerID, sid, t)
	err := s.publishConfirmed(s.life, rk, pub)
	s.countOut(string(t))
	switch {
	case err == nil:
		s.settle(d, true, false)
	case errors.Is(err, transport.ErrUnroutable):
		log.Error(err, "Reply unroutable: the caller's event queue does not exist; discarded the command", "routingKey", rk)
		s.settle(d, true, false)
	default:
		log.Error(err, "Failed to publish the reply; the command will be retried")
		s.retryLater(ctx, d)
	}
}

// settleAfter acks d once p is confirmed.
func (s *Sidecar) settleAfter(ctx context.Context, d amqp.Delivery, log logr.Logger, p *pending) {
	if p == nil {
		s.settle(d, true, false)
		return
	}
	select {
	case <-p.done:
	case <-s.life.Done():
		s.settle(d, false, true)
		return
	}
	switch {
	case p.err == nil:
		s.settle(d, true, false)
	case errors.Is(p.err, transport.ErrUnroutable):
		log.Error(p.err, "task_accepted unroutable: the caller's event queue does not exist")
		s.settle(d, true, false)
	default:
		// The session is recorded RUNNING: a redelivery re-sends the
		// same task_accepted.
		log.Error(p.err, "Failed to publish task_accepted; the command will be redelivered")
		s.retryLater(ctx, d)
	}
}

// publishConfirmed publishes and waits for the confirm, republishing (same
// message) while the connection is lost and retrying nacks with backoff.
func (s *Sidecar) publishConfirmed(ctx context.Context, rk string, pub amqp.Publishing) error {
	backoff := 100 * time.Millisecond
	for attempt := 0; ; attempt++ {
		err := s.pub.Publish(ctx, topology.EventsExchange, rk, pub)
		if err == nil || errors.Is(err, transport.ErrUnroutable) || errors.Is(err, transport.ErrClosed) || ctx.Err() != nil || attempt >= 8 {
			return err
		}
		if !errors.Is(err, transport.ErrConnectionLost) && !errors.Is(err, transport.ErrNacked) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.clk.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// retryLater returns the command to the queue after a pause, so a transient
// failure neither loses it nor spins. (Quorum queues count redeliveries:
// spec.commandQueue.deliveryLimit bounds a command that always fails.)
func (s *Sidecar) retryLater(ctx context.Context, d amqp.Delivery) {
	select {
	case <-ctx.Done():
		return // channel gone: the broker requeues it anyway
	case <-s.clk.After(time.Second):
	}
	s.settle(d, false, true)
}

// settle acks (ack=true) or nacks (requeue) a delivery, logging failures: a
// stale delivery (its channel closed) is redelivered by the broker.
func (s *Sidecar) settle(d amqp.Delivery, ack, requeue bool) {
	var err error
	if ack {
		err = d.Ack(false)
	} else {
		err = d.Nack(false, requeue)
	}
	if err != nil {
		if errors.Is(err, transport.ErrStaleDelivery) || errors.Is(err, amqp.ErrClosed) {
			s.log.V(1).Info("Could not settle a delivery from a closed channel; the broker redelivers it", "messageId", d.MessageId)
			return
		}
		s.log.Error(err, "Failed to settle a delivery", "messageId", d.MessageId)
	}
}

// podAlive reports whether a pod of the namespace exists. Without
// permission to read pods it assumes so (and says so once).
func (s *Sidecar) podAlive(ctx context.Context, name string) bool {
	if name == s.pod {
		return true
	}
	var p metav1.PartialObjectMetadata
	p.SetGroupVersionKind(podGVK)
	err := s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: name}, &p)
	switch {
	case err == nil:
		return true // a terminating pod still runs its sidecar
	case apierrors.IsNotFound(err):
		return false
	default:
		s.podGoneWarn.Do(func() {
			s.log.Info("Cannot read pods; sessions of vanished replicas are left to their own recovery", "error", err.Error(), "pod", klog.KRef(s.ns, name))
		})
		return true
	}
}

func (s *Sidecar) countIn(t string) {
	if s.m != nil {
		s.m.MessagesIn.WithLabelValues(t).Inc()
	}
}

func (s *Sidecar) countOut(t string) {
	if s.m != nil {
		s.m.MessagesOut.WithLabelValues(t).Inc()
	}
}

func (s *Sidecar) countReject(reason string) {
	if s.m != nil {
		s.m.Rejects.WithLabelValues(reason).Inc()
	}
}

func fmtTime(t *task.Timestamp) string {
	if t == nil {
		return "-"
	}
	return t.String()
}

func truncateRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
