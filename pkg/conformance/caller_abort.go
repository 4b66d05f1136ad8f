package conformance

import (
	"context"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

// abort: a running task the caller is asked to abort; the kit answers the
// abort as L2:188–192 says.
func (s *crun) abort(ctx context.Context) {
	r := s.r
	notRun := func(format string, args ...any) {
		for _, id := range []string{AbrSession, AbrToken, AbrTransient} {
			r.fail(id, format, args...)
		}
	}
	c, err := s.submit(ctx, "abort")
	if err != nil {
		notRun("not run: %v", err)
		return
	}
	sid, token, err := s.accept(ctx, c)
	if err == nil {
		err = s.events(ctx, sid, streamOf(token, 5), 1, 2, 3)
	}
	if err != nil {
		notRun("not run: %v", err)
		return
	}
	if err := s.waitProcessed(ctx, "event 3 of "+sid, func(ps []Processed) bool { return hasSeq(ps, sid, 3) }); err != nil {
		notRun("not run: %v", err)
		return
	}
	sent := len(s.k.commands())
	if err := s.d.Abort(ctx, sid); err != nil {
		notRun("the driver could not make the caller abort session %s: %v", sid, err)
		return
	}
	cmd, err := s.k.waitCommand(ctx, "an abort", func(cmds []*Command) *Command {
		for _, c := range cmds[min(sent, len(cmds)):] {
			if c.Env != nil && c.Env.Type == envelope.TypeAbort {
				return c
			}
		}
		return nil
	})
	if err != nil {
		notRun("asked to abort session %s, the caller sent no abort: %v", sid, err)
		return
	}
	judgeAbortCommand(r, cmd, sid, token)
	evs := map[int64]session.EventData{
		4: &session.StateChangedData{FromState: session.StateRunning, ToState: session.StateAborting, Reason: "abort requested"},
		5: &session.StateChangedData{FromState: session.StateAborting, ToState: session.StateAborted, Reason: "aborted"},
		6: &session.SessionClosedData{FinalState: session.StateAborted, Reason: "aborted"},
	}
	if err := s.events(ctx, sid, evs, 4, 5, 6); err != nil {
		r.fail(AbrTransient, "publish the abort's events: %v", err)
		return
	}
	werr := s.waitProcessed(ctx, "session_closed of "+sid, func(ps []Processed) bool { return hasClosed(ps, sid) })
	judgeAbortStream(r, sid, s.d.Processed(), werr)
}

// judgeAbortCommand is ABR-1 and ABR-2 on the abort the caller sent.
func judgeAbortCommand(r *recorder, cmd *Command, sid, token string) {
	switch {
	case !strings.EqualFold(cmd.Env.Session(), sid):
		r.fail(AbrSession, "abort %s names session %q, want %s", cmd.Env.MessageID, cmd.Env.Session(), sid)
	case !strings.EqualFold(cmd.D.CorrelationId, sid):
		r.fail(AbrSession, "abort %s: correlation_id %q, want %s (L1:49)", cmd.Env.MessageID, cmd.D.CorrelationId, sid)
	default:
		r.pass(AbrSession, "abort %s for session %s (session_id and correlation_id)", cmd.Env.MessageID, sid)
	}
	if strings.Contains(string(cmd.Env.Payload), token) {
		r.pass(AbrToken, "abort %s carries the token of task_accepted", cmd.Env.MessageID)
	} else {
		r.fail(AbrToken, "abort %s: the payload %s does not carry the session token of task_accepted", cmd.Env.MessageID, short(string(cmd.Env.Payload)))
	}
}

// judgeAbortStream is ABR-3: the caller processed the abort's states in
// order and the session's end.
func judgeAbortStream(r *recorder, sid string, ps []Processed, werr error) {
	var states []string
	for _, p := range ofProcessed(ps, sid) {
		switch p.EventType {
		case string(session.EventStateChanged):
			states = append(states, stateOf(p.Data, "to_state"))
		case string(session.EventSessionClosed):
			states = append(states, "closed "+stateOf(p.Data, "final_state"))
		}
	}
	got := strings.Join(states, " → ")
	if werr != nil || !strings.HasSuffix(got, "ABORTING → ABORTED → closed ABORTED") {
		r.fail(AbrTransient, "session %s: processed %q; want … ABORTING → ABORTED → closed ABORTED (%v)", sid, got, werr)
		return
	}
	r.pass(AbrTransient, "session %s: processed %s", sid, got)
}

// reconnect: the broker closes the caller's connection (through the
// management API) in the middle of a stream; the kit publishes on while
// the caller is away.
func (s *crun) reconnect(ctx context.Context) {
	r, cfg := s.r, s.k.cfg
	ids := []string{RcnReconnects, RcnResumes}
	switch {
	case cfg.ManagementURL == "":
		for _, id := range ids {
			r.skip(id, "no management URL given (--management-url): the kit closes the caller's connections through it")
		}
		return
	case cfg.CallerUser == "":
		for _, id := range ids {
			r.skip(id, "the caller's broker user is unknown (--caller-user): the kit closes its connections")
		}
		return
	}
	notRun := func(format string, args ...any) {
		for _, id := range ids {
			r.fail(id, format, args...)
		}
	}
	c, err := s.submit(ctx, "reconnect")
	if err != nil {
		notRun("not run: %v", err)
		return
	}
	const n = 10
	sid, token, err := s.accept(ctx, c)
	evs := streamOf(token, n)
	if err == nil {
		err = s.events(ctx, sid, evs, 1, 2, 3)
	}
	if err == nil {
		err = s.waitProcessed(ctx, "event 3 of "+sid, func(ps []Processed) bool { return hasSeq(ps, sid, 3) })
	}
	if err != nil {
		notRun("not run: %v", err)
		return
	}
	closedAt := time.Now()
	names, err := closeConnections(cfg, cfg.CallerUser)
	if err != nil {
		notRun("close the connections of %s: %v", cfg.CallerUser, err)
		return
	}
	// Published while the caller is away (L1:153).
	if err := s.events(ctx, sid, evs, 4, 5, 6, 7, 8); err != nil {
		notRun("%v", err)
		return
	}
	back, err := s.waitConsumer(ctx, names)
	if err != nil {
		r.fail(RcnReconnects, "closed %d connection(s) of %s (%s); %v", len(names), cfg.CallerUser, strings.Join(names, ", "), err)
	} else {
		r.pass(RcnReconnects, "closed %d connection(s) of %s; a consumer on a new connection was on %s %s later (the management API's view, which lags by its statistics interval)", len(names), cfg.CallerUser, cfg.evtQueue, back.Sub(closedAt).Round(100*time.Millisecond))
	}
	if err := s.complete(ctx, sid, evs, n); err != nil {
		r.fail(RcnResumes, "%v", err)
		return
	}
	werr := s.waitProcessed(ctx, "session_closed of "+sid, func(ps []Processed) bool { return hasClosed(ps, sid) })
	time.Sleep(300 * time.Millisecond)
	judgeResume(r, sid, n, s.d.Processed(), werr)
}

// waitConsumer waits until the management API shows a consumer on
// hcp.evt.{caller} on a connection other than the closed ones: the
// caller's new connection (a passive declare could still count the old
// consumer while the broker closes it).
func (s *crun) waitConsumer(ctx context.Context, closed []string) (time.Time, error) {
	cfg := s.k.cfg
	api, err := managementClient(cfg.mgmtConfig())
	if err != nil {
		return time.Time{}, err
	}
	path := "/api/queues/" + url.PathEscape(cfg.Vhost) + "/" + url.PathEscape(cfg.evtQueue)
	deadline := time.Now().Add(cfg.Timeout)
	for {
		var q struct {
			Consumers []consumerInfo `json:"consumer_details"`
		}
		if mgmtGet(api, path, &q) == nil {
			for _, c := range q.Consumers {
				if c.Channel.Connection != "" && !slices.Contains(closed, c.Channel.Connection) {
					return time.Now(), nil
				}
			}
		}
		if time.Now().After(deadline) {
			return time.Time{}, fmt.Errorf("no consumer on %s from a new connection within %s", cfg.evtQueue, cfg.Timeout)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}
