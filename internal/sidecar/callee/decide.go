package callee

import (
	"context"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.opentelemetry.io/otel/attribute"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// gateInput reads the Callee, the policies, the caller's labels and the
// active session counts from the cache.
func (s *Sidecar) gateInput(ctx context.Context, callerID string, ts *task.TaskSubmit, now time.Time) (policy.GateInput, *v1alpha1.Callee, error) {
	cl, err := s.callee(ctx)
	if err != nil {
		return policy.GateInput{}, nil, err
	}
	// Read only: the cache's own objects, not copies
	// (client.UnsafeDisableDeepCopy), so the gate's cost does not grow with
	// copying every session and policy of the namespace.
	var pols v1alpha1.CapabilityPolicyList
	if err := s.c.List(ctx, &pols, client.InNamespace(s.ns), client.UnsafeDisableDeepCopy); err != nil {
		return policy.GateInput{}, cl, fmt.Errorf("listing CapabilityPolicies: %w", err)
	}
	// Callers in other namespaces (sharing the vhost) or external programs
	// have no Caller object here: they match rules by id only.
	caller := policy.UnknownCaller(callerID)
	var callers v1alpha1.CallerList
	if err := s.c.List(ctx, &callers, client.InNamespace(s.ns), client.UnsafeDisableDeepCopy); err != nil {
		return policy.GateInput{}, cl, fmt.Errorf("listing Callers: %w", err)
	}
	for i := range callers.Items {
		if callers.Items[i].ID() == callerID {
			caller = policy.KnownCaller(&callers.Items[i])
			break
		}
	}
	// The sessions are counted only where a limit can use the count.
	var active policy.Active
	if policy.CountsSessions(cl, pols.Items) {
		if active, _, err = s.activeSessions(ctx, s.c, callerID, nil); err != nil {
			return policy.GateInput{}, cl, err
		}
	}
	return policy.GateInput{Now: now, Callee: cl, Caller: caller, Policies: pols.Items, Active: active, Task: ts}, cl, nil
}

// activeSessions counts the non-terminal sessions of this callee (all
// replicas) and of the caller on it, as r sees them. Sessions this replica
// started that r has not seen yet are added, so a burst on one replica is
// counted.
//
// With me nil (the gate's first pass, from the cache) every session counts,
// undecided claims (PENDING) included. With me set (recount, from the API
// server) me itself is left out, and so are the undecided claims ranked
// after it, which are counted in waiting instead.
func (s *Sidecar) activeSessions(ctx context.Context, r client.Reader, callerID string, me *v1alpha1.HCPSession) (a, waiting policy.Active, err error) {
	var list v1alpha1.HCPSessionList
	// Read only; from the cache without copies (an API reader ignores it).
	if err := r.List(ctx, &list, client.InNamespace(s.ns), client.MatchingLabels{v1alpha1.LabelCalleeID: s.id}, client.UnsafeDisableDeepCopy); err != nil {
		return a, waiting, fmt.Errorf("listing HCPSessions: %w", err)
	}
	seen := map[string]bool{}
	add := func(to *policy.Active, caller string) {
		to.Callee++
		if caller == callerID {
			to.CallerOnCallee++
		}
	}
	count := func(caller string) { add(&a, caller) }
	for i := range list.Items {
		hs := &list.Items[i]
		seen[hs.Name] = true
		switch {
		case hs.DecidedState().IsTerminal():
		case me != nil && hs.Name == me.Name:
		case s.session(hs.Name) != nil && s.session(hs.Name).ended():
		case me != nil && undecided(hs) && rankedBefore(me, hs):
			add(&waiting, hs.Spec.CallerID)
		default:
			count(hs.Spec.CallerID)
		}
	}
	for _, ss := range s.active() {
		if !seen[ss.id] && (me == nil || ss.id != me.Name) {
			count(ss.callerID)
		}
	}
	return a, waiting, nil
}

// admittedStatusLinger is how long the RUNNING status of a session admitted
// at its creation waits for a state change to share its write with: a
// session that ends within it costs one status write, not two. Well within
// the second in which a state change must show in kubectl get hcpsessions;
// meanwhile the label hcp.io/state already says RUNNING.
const admittedStatusLinger = 200 * time.Millisecond

// recountPoll is how often recount looks again at undecided claims.
const recountPoll = 50 * time.Millisecond

func undecided(hs *v1alpha1.HCPSession) bool {
	st := hs.DecidedState()
	return st == "" || st == v1alpha1.SessionPending
}

// admittedAtCreation: the HCPSession's creation recorded its admission
// (v1alpha1.AnnotationAdmitted).
func admittedAtCreation(hs *v1alpha1.HCPSession) bool {
	return hs.Annotations[v1alpha1.AnnotationAdmitted] == annotationTrue
}

// rankedBefore orders the claims of one callee the same way on every
// replica: by creation, then by name.
func rankedBefore(a, b *v1alpha1.HCPSession) bool {
	if ta, tb := a.CreationTimestamp.Time, b.CreationTimestamp.Time; !ta.Equal(tb) {
		return ta.Before(tb)
	}
	return a.Name < b.Name
}

// recount makes a concurrency limit hold across replicas. The gate counted
// from the cache, which misses what other replicas admitted a moment ago.
// Once this task's HCPSession exists (a claim every replica sees, undecided
// until RUNNING or REJECTED is written), the sessions are counted again
// from the API server and the gate runs again. Claims are ranked (creation
// time, then name); a processor counts every other claim ranked before its
// own, decided or not, and waits for the undecided ones ranked after it,
// counting those that end up admitted.
//
// Why no limit is ever exceeded: every processor creates its claim before
// it lists, and the API server's lists are linearizable. Of any set of
// sessions admitted together, take the one that listed last: it saw every
// other one's claim, and counted each (ranked before it: at once; ranked
// after it: once decided), so it admitted only under the limit. Why a burst
// is still admitted up to the limit: waits only go from a claim to claims
// ranked after it, so they never form a cycle, and the last-ranked claim
// never waits. A claim whose processor vanished is waited for at most
// RecountWait, then counted.
func (s *Sidecar) recount(ctx context.Context, c *command, v policy.Verdict, me *v1alpha1.HCPSession) (policy.Verdict, error) {
	if !v.Admitted || !v.Counted || c.gate == nil {
		return v, nil
	}
	deadline := s.clk.Now().Add(s.t.RecountWait)
	for {
		active, waiting, err := s.activeSessions(ctx, s.reader, c.callerID, me)
		if err != nil {
			return v, err
		}
		if waiting.Callee > 0 && s.clk.Now().Before(deadline) {
			select {
			case <-ctx.Done():
				return v, ctx.Err()
			case <-s.clk.After(recountPoll):
			}
			continue
		}
		in := *c.gate
		in.Active = policy.Active{Callee: active.Callee + waiting.Callee, CallerOnCallee: active.CallerOnCallee + waiting.CallerOnCallee}
		return policy.Gate(in), nil
	}
}

// decideAndReply records the verdict, replies, and acknowledges the command
// once the reply is confirmed. An admission no concurrency limit applies to
// is recorded by the HCPSession's creation (AnnotationAdmitted), and its
// RUNNING status is written afterwards; otherwise the session is created
// undecided (PENDING), recounted, and then turned REJECTED or RUNNING.
func (s *Sidecar) decideAndReply(ctx context.Context, c *command, cl *v1alpha1.Callee, v policy.Verdict, depth int) {
	if c.span.Recording() {
		c.span.SetAttributes(attribute.Bool("hcp.admitted", v.Admitted), attribute.String("hcp.reason_code", string(v.Reason)),
			attribute.String("hcp.risk_level", string(v.Risk)))
	}
	if !v.Admitted {
		s.m.TaskRejected(cl, c.ts.Capability) // hcp_sessions_total{outcome="REJECTED"}
		s.rejectUnrecorded(ctx, c, v)
		return
	}
	if s.replyFirst(c, v) {
		s.acceptFirst(ctx, c, cl, v, depth)
		return
	}
	d, log, callerID, sid, msgID, ts := c.d, c.log, c.callerID, c.sid, c.msgID, c.ts
	now := s.clk.Now().UTC().Truncate(time.Second)
	hs := s.newHCPSession(cl, c, v)
	traceAnnotations(hs, c.trace)
	if err := s.c.Create(ctx, hs, client.FieldOwner(status.FieldOwner)); err != nil {
		if apierrors.IsAlreadyExists(err) {
			s.duplicate(ctx, c, depth)
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
	// Created undecided (no status: PENDING), naming the pod deciding it
	// (AnnotationDecidingPod): a duplicate arriving on another replica
	// meanwhile waits for this one. The decision below is the next write.

	if rv, err := s.recount(ctx, c, v, hs); err != nil {
		log.Error(err, "Failed to count the sessions for the concurrency limit; the command will be retried")
		s.retryLater(ctx, d)
		return
	} else if !rv.Admitted {
		log.V(1).Info("Another replica admitted a session first; the concurrency limit is reached", "message", rv.Message)
		v = rv
	}

	if !v.Admitted {
		if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
			st.State = v1alpha1.SessionRejected
			st.PodName = s.pod
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
		s.event(corev1.EventTypeWarning, EventTaskRejected, "Rejected task %s of caller %s (capability %q): %s: %s",
			msgID, callerID, ts.Capability, v.Reason, oneLine(v.Message, 300))
		s.countReject(string(v.Reason))
		s.m.TaskRejected(cl, ts.Capability)
		s.refuseRecorded(ctx, c, hs)
		s.forgetWhenWritten(sid)
		return
	}

	// The claims come from the object's immutable part (spec.issuedAt or
	// the creation time, spec), so every later duplicate re-issues this
	// very token.
	a, err := s.admit(c, hs)
	if err != nil {
		log.Error(err, "Failed to issue the session token or encode the harness task")
		s.casReject(ctx, c, hs, task.ReasonInternal, "the callee could not issue a session token or encode the task for its harness", depth)
		return
	}
	ss := s.newSession(hs, cl, a.tok, a.claims, a.body)
	s.register(ss)
	if admittedAtCreation(hs) {
		s.seedAdmitted(hs, v, a)
	} else {
		if err := s.casStatus(ctx, hs, admittedStatus(s.pod, v, a)); err != nil {
			s.unregister(ss)
			s.afterCASFailure(ctx, c, err, depth)
			return
		}
		s.st.Seed(sid, hs.Status, s.clk.Now())
	}
	reply, err := s.acceptedReply(hs)
	if err != nil { // cannot happen: the same inputs just issued a token
		log.Error(err, "Failed to build task_accepted")
	}
	// Acknowledge once the reply is confirmed.
	s.settleAfter(ctx, d, log, s.startAdmitted(c, ss, hs, v, &reply))
}

// admission is what an admitted session starts with: its token's claims,
// the token, and the harness task.
type admission struct {
	claims token.Claims
	tok    string
	body   []byte
}

func (s *Sidecar) admit(c *command, hs *v1alpha1.HCPSession) (admission, error) {
	claims, err := sessionClaims(s.id, hs)
	if err != nil {
		return admission{}, err
	}
	tok, err := token.Issue(s.keys.signer(), claims)
	if err != nil {
		return admission{}, err
	}
	body, err := s.taskBody(c.sid, c.msgID, tok, c.callerID, claims.Risk, claims.IssuedAt, claims.ExpiresAt, c.ts)
	return admission{claims: claims, tok: tok, body: body}, err
}

// admittedStatus is the RUNNING status of an admission.
func admittedStatus(pod string, v policy.Verdict, a admission) func(*v1alpha1.HCPSessionStatus) {
	return func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionRunning
		st.PodName = pod
		st.OwnerEpoch = 1 // the first claim (epoch.go)
		st.Reason = "accepted"
		st.Message = truncate(v.Message, 1024)
		// For people and dashboards only: replies never read them back.
		st.StartedAt = &metav1.Time{Time: a.claims.IssuedAt}
		st.TokenExpiresAt = &metav1.Time{Time: a.claims.ExpiresAt}
	}
}

// seedAdmitted: the create was the decision (AnnotationAdmitted), and its
// label says RUNNING already: the status follows through the status
// writer after admittedStatusLinger, in the same write as the session's
// end if that comes first.
func (s *Sidecar) seedAdmitted(hs *v1alpha1.HCPSession, v policy.Verdict, a admission) {
	admit := admittedStatus(s.pod, v, a)
	s.st.Seed(hs.Name, hs.Status, time.Time{})
	s.st.SeedLabel(hs.Name, v1alpha1.SessionRunning)
	s.st.UpdateAfter(hs.Name, admittedStatusLinger, admit)
	admit(&hs.Status)
}

// startAdmitted starts a recorded admission: session_created and
// state_changed (after reply, when not nil: task_accepted), then the
// harness gets the task. It returns the pending reply.
func (s *Sidecar) startAdmitted(c *command, ss *sess, hs *v1alpha1.HCPSession, v policy.Verdict, reply *amqp.Publishing) *pending {
	c.log.Info("Accepted a task", "capability", c.ts.Capability, "risk", v.Risk, "maxDuration", task.FormatDuration(v.MaxDuration))
	s.event(corev1.EventTypeNormal, EventTaskAccepted, "Accepted task %s of caller %s (capability %q, risk %s, at most %s): session %s",
		c.msgID, c.callerID, c.ts.Capability, v.Risk, task.FormatDuration(v.MaxDuration), c.sid)
	accepted := ss.start(reply, hs.Spec.AbortRequested)
	go ss.deliver()
	return accepted
}

// casReject turns a PENDING session REJECTED (optimistic lock) and replies.
func (s *Sidecar) casReject(ctx context.Context, c *command, hs *v1alpha1.HCPSession, code task.ReasonCode, msg string, depth int) {
	sid := c.sid
	now := s.clk.Now().UTC().Truncate(time.Second)
	if err := s.casStatus(ctx, hs, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionRejected
		st.PodName = s.pod
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
	cl, _ := s.callee(ctx) // nil if unreadable: capability ""
	s.m.TaskRejected(cl, hs.Spec.Capability)
	s.refuseRecorded(ctx, c, hs)
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
