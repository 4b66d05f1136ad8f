package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// tokenLeeway tolerates clock skew between replicas when verifying tokens.
const tokenLeeway = 5 * time.Second

// abortCommand verifies an abort (the session token signed by this callee,
// for the authenticated caller and the named session, from the session's
// caller) and records it as spec.abortRequested on the HCPSession: the
// replica running the session watches HCPSessions and aborts it, whichever
// replica received the command. Aborts have no reply message; refused ones
// are logged and counted.
func (s *Sidecar) abortCommand(ctx context.Context, d amqp.Delivery, env *envelope.Envelope) {
	sid := strings.ToLower(env.Session())
	log := s.log.WithValues("messageId", env.MessageID, "session", sid)
	refuse := func(msg string, kv ...any) {
		log.Info("Refused an abort: "+msg, kv...)
		s.countReject(rejectAbortRefused)
		s.settle(d, true, false)
	}
	callerID, err := identify(d.UserId, s.cfg.Vhost)
	if err != nil {
		refuse("unauthenticated sender", "reason", err.Error())
		return
	}
	log = log.WithValues("caller", callerID)
	var a task.Abort
	if err := json.Unmarshal(env.Payload, &a); err != nil {
		refuse("invalid payload", "reason", err.Error())
		return
	}
	if err := a.Validate(); err != nil {
		refuse("invalid payload", "reason", err.Error())
		return
	}
	var hs v1alpha1.HCPSession
	if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sid}, &hs); err != nil {
		err = s.reader.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: sid}, &hs)
		if apierrors.IsNotFound(err) {
			// Accepted a moment ago, its create still under way?
			var got *v1alpha1.HCPSession
			if got, err = s.awaitRecord(ctx, callerID, sid, a.SessionToken); err == nil {
				hs = *got
			}
		}
		if errors.Is(err, errNotRecorded) {
			refuse("no such session")
			return
		}
		if err != nil {
			log.Error(err, "Failed to read the session of an abort; the command will be retried")
			s.retryLater(ctx, d)
			return
		}
	}
	if hs.Spec.CalleeID != s.id {
		refuse("the session belongs to another callee", "sessionCallee", hs.Spec.CalleeID)
		return
	}
	// aud is the authenticated sender, so a token stolen from another
	// caller fails here; sub pins the session.
	if _, err := token.VerifySet(s.keys.verifiers(), a.SessionToken, token.Expectations{
		Issuer: s.id, Audience: callerID, Subject: sid, Leeway: tokenLeeway,
	}, s.clk.Now()); err != nil {
		refuse("session token not valid", "reason", err.Error())
		return
	}
	if hs.Spec.CallerID != callerID {
		refuse("the sender is not the session's caller", "sessionCaller", hs.Spec.CallerID)
		return
	}
	if hs.Status.State.IsTerminal() {
		log.Info("Ignored an abort of an ended session", "state", hs.Status.State)
		s.settle(d, true, false)
		return
	}
	reason := "abort requested by the caller"
	if a.Reason != "" {
		reason += ": " + truncate(a.Reason, 400)
	}
	if !hs.Spec.AbortRequested {
		patch := []byte(`{"spec":{"abortRequested":true}}`)
		if err := s.c.Patch(ctx, &hs, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(status.FieldOwner)); err != nil {
			if apierrors.IsNotFound(err) {
				refuse("no such session")
				return
			}
			log.Error(err, "Failed to record the abort; the command will be retried")
			s.retryLater(ctx, d)
			return
		}
	}
	log.Info("Abort requested")
	if ss := s.session(sid); ss != nil {
		ss.requestAbort(reason)
	}
	s.settle(d, true, false)
}

// watchAborts delivers spec.abortRequested (set by the replica that got the
// abort command, or by a user with kubectl) and deletions to the sessions
// this replica runs.
func (s *Sidecar) watchAborts(ctx context.Context) error {
	check := func(obj any) {
		hs, ok := obj.(*v1alpha1.HCPSession)
		if !ok {
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				hs, _ = t.Obj.(*v1alpha1.HCPSession)
			}
		}
		if hs == nil {
			return
		}
		if ss := s.session(hs.Name); ss != nil && !ss.ended() && hs.Spec.AbortRequested && !ss.abortSeen.Load() {
			go ss.requestAbort("abort requested (spec.abortRequested)")
		}
		s.movedAway(hs)
		if released(hs) && !s.draining() && !s.isLocal(hs.Name) {
			// Handed over at a drain: take it at once rather than at the
			// next sweep.
			go s.takeOver(s.life, hs.DeepCopy())
		}
	}
	if s.infs == nil {
		go s.pollAborts(ctx)
		return nil
	}
	inf, err := s.infs.GetInformer(ctx, &v1alpha1.HCPSession{})
	if err != nil {
		return fmt.Errorf("watching HCPSessions: %w", err)
	}
	_, err = inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    check,
		UpdateFunc: func(_, obj any) { check(obj) },
		DeleteFunc: func(obj any) {
			// A deleted HCPSession cannot be tracked any more: abort the
			// session so the harness stops.
			hs, _ := obj.(*v1alpha1.HCPSession)
			if t, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
				hs, _ = t.Obj.(*v1alpha1.HCPSession)
			}
			if hs == nil {
				return
			}
			if ss := s.session(hs.Name); ss != nil && !ss.ended() && ss.uid == hs.UID {
				go ss.requestAbort("the HCPSession was deleted")
			}
		},
	})
	if err != nil {
		return fmt.Errorf("watching HCPSessions: %w", err)
	}
	return nil
}

// pollAborts is the fallback without an informer.
func (s *Sidecar) pollAborts(ctx context.Context) {
	t := s.clk.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
		}
		for _, ss := range s.active() {
			var hs v1alpha1.HCPSession
			if err := s.c.Get(ctx, client.ObjectKey{Namespace: s.ns, Name: ss.id}, &hs); err == nil && hs.Spec.AbortRequested {
				go ss.requestAbort("abort requested (spec.abortRequested)")
			}
		}
	}
}
