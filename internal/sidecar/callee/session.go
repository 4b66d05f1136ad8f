package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Failure codes the sidecar itself reports in task_failed.
const (
	codeTimeout            = session.ReasonTimeout
	codeHarnessLost        = "harness_lost"
	codeHarnessUnavailable = string(task.ReasonHarnessUnavailable)
	codeHarnessRefused     = "harness_refused"
	codeCalleeShutdown     = "callee_shutdown"
	reasonAbortTimeout     = "abort_timeout"
	reasonAborted          = "aborted"
)

// confirmQueueSize bounds the publishes of one session waiting for their
// confirm; beyond it publishing waits (the transport's window bounds the
// total anyway).
const confirmQueueSize = 1024

// pending is one published message waiting for its confirm.
type pending struct {
	index int64 // position in the session's write-ahead log
	rk    string
	pub   amqp.Publishing
	kind  envelope.MessageType
	seq   int64 // event sequence; 0 for replies and results
	conf  transport.Confirmation
	done  chan struct{}
	err   error
}

// sess is one session this replica runs. Sequencing and publishing happen
// under lock, so the sequence order is the publish order on the one
// publisher channel; confirms are awaited in order by the session's
// confirmer goroutine, so publishing never waits for the previous confirm.
type sess struct {
	sc         *Sidecar
	id         string
	callerID   string
	capability string
	taskMsgID  string
	risk       task.RiskLevel
	token      string
	startedAt  time.Time
	expiresAt  time.Time
	uid        types.UID
	log        logr.Logger

	abortTimeout time.Duration
	terminal     atomic.Bool
	// abortSeen short-cuts repeated abort requests (every HCPSession
	// update carries spec.abortRequested once it is set).
	abortSeen atomic.Bool
	// delivered is set once the harness took the task.
	delivered atomic.Bool
	endedAt   atomic.Int64 // unix nanos

	// lock is a one-slot semaphore (so waiting honours a context).
	lock           chan struct{}
	machine        session.Machine
	seq            *session.Sequencer
	events         int64
	abortRequested bool
	abortSent      bool
	timeout        clock.Timer
	abortTimer     clock.Timer
	confirmQ       chan *pending
	// index numbers the session's published messages (write-ahead log).
	index int64
	// task is the harness task (JSON) the session was started with; a
	// resume hands it over again with the checkpoint.
	task []byte
	// keys are the idempotency keys of the harness's events.
	keys wal.Keys
	// moved is set when the session left this replica (handed over, or
	// taken over by another): it publishes nothing more.
	moved atomic.Bool
	// recovering is set while the harness's loss of the session is being
	// recovered.
	recovering atomic.Bool
	// confirmDone is closed when the confirm loop has finished.
	confirmDone chan struct{}
}

func (s *Sidecar) newSession(hs *v1alpha1.HCPSession, cl *v1alpha1.Callee, tok string, claims token.Claims, body []byte) *sess {
	abortTimeout := DefaultAbortTimeout
	if cl != nil {
		abortTimeout = calleeDuration(cl.Spec.Sessions.AbortTimeout, DefaultAbortTimeout)
	}
	ss := &sess{
		sc:           s,
		id:           hs.Name,
		callerID:     hs.Spec.CallerID,
		capability:   hs.Spec.Capability,
		taskMsgID:    hs.Spec.TaskMessageID,
		risk:         task.RiskLevel(hs.Spec.RiskLevel),
		token:        tok,
		startedAt:    claims.IssuedAt,
		expiresAt:    claims.ExpiresAt,
		uid:          hs.UID,
		log:          s.log.WithValues("session", hs.Name, "caller", hs.Spec.CallerID),
		abortTimeout: abortTimeout,
		lock:         make(chan struct{}, 1),
		machine:      session.New(claims.IssuedAt),
		confirmQ:     make(chan *pending, confirmQueueSize),
		confirmDone:  make(chan struct{}),
		task:         body,
	}
	ss.seq = session.NewReservingSequencer(0, DefaultSequenceBlock, ss.reserver(DefaultSequenceBlock))
	return ss
}

// reserver persists the sequence ceiling in an annotation, skipping what was
// reserved already (preReserved: the block written at creation).
func (ss *sess) reserver(preReserved int64) session.ReserveFunc {
	return func(ceiling int64) error {
		if ceiling <= preReserved {
			return nil
		}
		hs := &v1alpha1.HCPSession{ObjectMeta: metav1.ObjectMeta{Name: ss.id, Namespace: ss.sc.ns}}
		patch := fmt.Appendf(nil, `{"metadata":{"annotations":{%q:%q}}}`, AnnotationSequenceCeiling, strconv.FormatInt(ceiling, 10))
		ctx, cancel := context.WithTimeout(ss.sc.life, 10*time.Second)
		defer cancel()
		err := ss.sc.c.Patch(ctx, hs, client.RawPatch(types.MergePatchType, patch), client.FieldOwner(status.FieldOwner))
		if apierrors.IsNotFound(err) {
			return nil // the object is gone (deleted by a user); nobody can take over
		}
		return err
	}
}

func (s *Sidecar) register(ss *sess) {
	s.mu.Lock()
	s.sessions[ss.id] = ss
	s.mu.Unlock()
	s.sessionsWG.Add(1)
	go ss.confirmLoop()
}

// unregister drops a session that never started.
func (s *Sidecar) unregister(ss *sess) {
	s.mu.Lock()
	delete(s.sessions, ss.id)
	s.mu.Unlock()
	close(ss.confirmQ)
}

func (s *Sidecar) session(id string) *sess {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sessions[id]
}

func (ss *sess) ended() bool { return ss.terminal.Load() }

func (ss *sess) acquire(ctx context.Context) error {
	select {
	case ss.lock <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (ss *sess) release() { <-ss.lock }

func (ss *sess) gauge(state session.State, delta float64) {
	if ss.sc.m != nil && state != "" {
		ss.sc.m.Sessions.WithLabelValues(string(state)).Add(delta)
	}
}

// start publishes task_accepted, session_created and state_changed
// (PENDING → RUNNING), and arms the max-duration timer. It returns the
// pending task_accepted, whose confirm acknowledges the command.
func (ss *sess) start(reply amqp.Publishing, abortRequested bool) *pending {
	_ = ss.acquire(context.Background())
	defer ss.release()
	ctx := ss.sc.life
	ss.gauge(session.StatePending, 1)
	if err := ss.sc.wal.Open(ss.id, ss.task); err != nil {
		ss.log.Error(err, "Failed to record the session in the write-ahead log")
	}
	accepted, err := ss.publishLocked(ctx, envelope.TypeTaskAccepted, reply, 0, "")
	if err != nil {
		ss.log.Error(err, "Failed to publish task_accepted")
	}
	if _, err := ss.emitTyped(ctx, &session.SessionCreatedData{State: session.StateRunning, RiskLevel: ss.risk, SessionToken: ss.token}); err != nil {
		ss.log.Error(err, "Failed to publish session_created")
	}
	if _, err := ss.transitionLocked(ctx, session.StateRunning, "accepted"); err != nil {
		ss.log.Error(err, "Failed to publish state_changed")
	}
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) { st.PodName = ss.sc.pod })
	ss.timeout = ss.sc.clk.AfterFunc(ss.expiresAt.Sub(ss.sc.clk.Now()), ss.onTimeout)
	if abortRequested || ss.abortRequested {
		ss.toAbortingLocked(ctx, "abort requested before the session started")
	}
	return accepted
}

// publishLocked publishes one message of the session, after recording it
// in the write-ahead log; key is the harness's idempotency key ("" for
// none). It refuses while this replica cannot vouch that it still owns the
// session (fencing). Called with lock.
func (ss *sess) publishLocked(ctx context.Context, t envelope.MessageType, pub amqp.Publishing, seq int64, key string) (*pending, error) {
	if err := ss.sc.fence(ss); err != nil {
		return nil, err
	}
	rk := topology.EventRoutingKey(ss.callerID, ss.id, t)
	ss.index++
	if err := ss.sc.wal.Append(ss.id, wal.Message{Index: ss.index, Seq: seq, Key: key, RoutingKey: rk, State: string(ss.machine.State()), Body: pub.Body}); err != nil {
		ss.index--
		return nil, err
	}
	if key != "" {
		ss.keys.Put(key, seq)
	}
	return ss.enqueueLocked(ctx, ss.index, t, rk, pub, seq)
}

// enqueueLocked publishes a message already in the log and queues it for
// its confirm. Called with lock.
func (ss *sess) enqueueLocked(ctx context.Context, index int64, t envelope.MessageType, rk string, pub amqp.Publishing, seq int64) (*pending, error) {
	conf, err := ss.sc.pub.PublishAsync(ctx, topology.EventsExchange, rk, pub)
	if err != nil {
		// Logged: a restart republishes it; in this process the confirm
		// loop retries it below.
		conf = failedConfirmation{err}
	}
	p := &pending{index: index, rk: rk, pub: pub, kind: t, seq: seq, conf: conf, done: make(chan struct{})}
	ss.confirmQ <- p
	ss.sc.countOut(string(t))
	return p, nil
}

// emitLocked sequences, publishes and records one event. Called with lock.
func (ss *sess) emitLocked(ctx context.Context, et session.EventType, data json.RawMessage) (*pending, error) {
	return ss.emitKeyedLocked(ctx, et, data, "")
}

// emitKeyedLocked is emitLocked with the harness's idempotency key.
func (ss *sess) emitKeyedLocked(ctx context.Context, et session.EventType, data json.RawMessage, key string) (*pending, error) {
	if err := ss.sc.fence(ss); err != nil {
		return nil, err
	}
	seq, err := ss.seq.Next()
	if err != nil {
		return nil, err
	}
	now := ss.sc.clk.Now()
	payload := session.EventPayload{EventType: et, Sequence: seq, Data: data}
	env, err := envelope.NewAt(now, envelope.TypeEvent, ss.id, payload)
	if err != nil {
		return nil, err
	}
	pub, err := envelope.EncodePublishing(env, ss.sc.username)
	if err != nil {
		return nil, err
	}
	p, err := ss.publishLocked(ctx, envelope.TypeEvent, pub, seq, key)
	if err != nil {
		return nil, err
	}
	ss.events++
	events := ss.events
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		st.LastSequence = seq
		st.EventCount = events
		st.LastEventAt = &metav1.Time{Time: now.UTC().Truncate(time.Second)}
	})
	return p, nil
}

func (ss *sess) emitTyped(ctx context.Context, d session.EventData) (*pending, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	raw, err := json.Marshal(d)
	if err != nil {
		return nil, err
	}
	return ss.emitLocked(ctx, d.EventType(), raw)
}

// transitionLocked applies a non-terminal transition and emits its
// state_changed event. Called with lock.
func (ss *sess) transitionLocked(ctx context.Context, to session.State, reason string) (*pending, error) {
	from := ss.machine.State()
	m, err := ss.machine.Apply(to, reason, ss.sc.clk.Now())
	if err != nil {
		return nil, err
	}
	ss.machine = m
	ss.gauge(from, -1)
	ss.gauge(to, 1)
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionState(to)
		st.Reason = reason
		if from != session.StatePending {
			st.Message = "" // PENDING → RUNNING keeps the admission message
		}
	})
	return ss.emitTyped(ctx, &session.StateChangedData{FromState: from, ToState: to, Reason: reason})
}

// outcome is what ends a session.
type outcome struct {
	final     session.State
	reason    string
	message   string
	completed *task.TaskCompleted
	failed    *task.TaskFailed
}

// finishLocked moves the session to its terminal state: task_completed or
// task_failed (if any), then session_closed; stops the timers; writes the
// terminal status at once; closes the confirm queue. Called with lock.
func (ss *sess) finishLocked(ctx context.Context, o outcome) ([]*pending, error) {
	from := ss.machine.State()
	now := ss.sc.clk.Now()
	m, err := ss.machine.Apply(o.final, o.reason, now)
	if err != nil {
		return nil, err
	}
	ss.machine = m
	ss.gauge(from, -1)
	var ps []*pending
	if o.completed != nil {
		if o.completed.Summary.Duration == 0 {
			o.completed.Summary.Duration = task.Duration(now.Sub(ss.startedAt))
		}
		if o.completed.Summary.EventCount == 0 {
			o.completed.Summary.EventCount = ss.events
		}
		if p, err := ss.resultLocked(ctx, envelope.TypeTaskCompleted, o.completed); err != nil {
			ss.log.Error(err, "Failed to publish task_completed")
		} else {
			ps = append(ps, p)
		}
	}
	if o.failed != nil {
		if p, err := ss.resultLocked(ctx, envelope.TypeTaskFailed, o.failed); err != nil {
			ss.log.Error(err, "Failed to publish task_failed")
		} else {
			ps = append(ps, p)
		}
	}
	if p, err := ss.emitTyped(ctx, &session.SessionClosedData{FinalState: o.final, Reason: o.reason}); err != nil {
		ss.log.Error(err, "Failed to publish session_closed")
	} else {
		ps = append(ps, p)
	}
	if ss.timeout != nil {
		ss.timeout.Stop()
	}
	if ss.abortTimer != nil {
		ss.abortTimer.Stop()
	}
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		st.State = v1alpha1.SessionState(o.final)
		st.Reason = o.reason
		st.Message = truncate(o.message, 1024)
		st.CompletedAt = &metav1.Time{Time: now.UTC().Truncate(time.Second)}
		if o.completed != nil {
			st.Result = resultSummary(o.completed)
		}
		if o.failed != nil {
			st.Error = &v1alpha1.SessionError{Code: o.failed.Code, Message: truncate(o.failed.Message, 1024), Recoverable: o.failed.Recoverable}
		}
	})
	ss.terminal.Store(true)
	ss.endedAt.Store(now.UnixNano())
	close(ss.confirmQ)
	ss.log.Info("Session ended", "state", o.final, "reason", o.reason, "events", ss.events)
	// Keep the session in memory for a while, so late harness calls get a
	// clear 409 instead of 404; then forget it.
	ss.sc.forgetLater(ss)
	go func() {
		// Terminal states are written at once; afterwards the writer can
		// forget the session.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ss.sc.life), 30*time.Second)
		defer cancel()
		if err := ss.sc.st.Flush(ctx, ss.id); err == nil {
			ss.sc.st.Forget(ss.id)
		}
	}()
	return ps, nil
}

// resultLocked publishes task_completed or task_failed. Called with lock.
func (ss *sess) resultLocked(ctx context.Context, t envelope.MessageType, payload any) (*pending, error) {
	env, err := envelope.NewAt(ss.sc.clk.Now(), t, ss.id, payload)
	if err != nil {
		return nil, err
	}
	pub, err := envelope.EncodePublishing(env, ss.sc.username)
	if err != nil {
		return nil, err
	}
	return ss.publishLocked(ctx, t, pub, 0, "")
}

func resultSummary(tc *task.TaskCompleted) *v1alpha1.SessionResult {
	r := &v1alpha1.SessionResult{}
	if len(tc.Result) > 0 && string(tc.Result) != "null" {
		var str string
		if json.Unmarshal(tc.Result, &str) == nil {
			r.Summary = truncate(str, 1024)
		} else {
			r.Summary = truncate(string(tc.Result), 1024)
		}
	}
	for i, a := range tc.Artifacts {
		if i == 64 {
			break
		}
		r.Artifacts = append(r.Artifacts, v1alpha1.Artifact{URI: a.URI, SHA256: a.SHA256, MediaType: a.MediaType, Size: a.Size})
	}
	return r
}

// confirmLoop awaits the confirms of the session's publishes in order,
// republishing a message whose confirm was lost with the connection (same
// message_id and sequence: the caller deduplicates) and retrying nacks.
//
// Confirmed positions go to the write-ahead log now and then (a lagging
// mark only means more republishing after a restart, which the caller
// deduplicates); once the session ended or moved and everything was
// confirmed, the log forgets it.
func (ss *sess) confirmLoop() {
	defer ss.sc.sessionsWG.Done()
	defer close(ss.confirmDone)
	var failed bool
	for p := range ss.confirmQ {
		p.err = ss.awaitConfirm(p)
		if p.err != nil {
			failed = true
			ss.log.Error(p.err, "Event not delivered", "type", p.kind, "sequence", p.seq, "routingKey", p.rk)
		} else if !failed && (len(ss.confirmQ) == 0 || p.index%64 == 0) {
			if err := ss.sc.wal.Confirm(ss.id, p.index); err != nil {
				ss.log.Error(err, "Failed to record a confirm in the write-ahead log")
			}
		}
		close(p.done)
	}
	if !failed {
		if err := ss.sc.wal.Close(ss.id); err != nil {
			ss.log.Error(err, "Failed to close the session in the write-ahead log")
		}
	}
}

// failedConfirmation is the confirmation of a publish that failed at once;
// the confirm loop retries it like a lost one.
type failedConfirmation struct{ err error }

func (f failedConfirmation) Wait(context.Context) error { return f.err }

func (ss *sess) awaitConfirm(p *pending) error {
	ctx := ss.sc.life
	err := p.conf.Wait(ctx)
	backoff := 100 * time.Millisecond
	for attempt := 0; err != nil && attempt < 30; attempt++ {
		switch {
		case ctx.Err() != nil, errors.Is(err, transport.ErrUnroutable), errors.Is(err, transport.ErrClosed):
			return err
		case errors.Is(err, transport.ErrConnectionLost):
			ss.log.V(1).Info("Republishing after a lost connection", "type", p.kind, "sequence", p.seq)
		case errors.Is(err, transport.ErrNacked):
			select {
			case <-ctx.Done():
				return err
			case <-ss.sc.clk.After(backoff):
			}
			backoff = min(backoff*2, 5*time.Second)
		default:
			return err
		}
		conf, perr := ss.sc.pub.PublishAsync(ctx, topology.EventsExchange, p.rk, p.pub)
		if perr != nil {
			err = perr
			continue
		}
		err = conf.Wait(ctx)
	}
	return err
}

// waitAll waits for the confirms of ps and returns the first error.
func waitAll(ctx context.Context, ps []*pending) error {
	for _, p := range ps {
		if p == nil {
			continue
		}
		select {
		case <-p.done:
			if p.err != nil {
				return p.err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// apiError is an error answer of the local API.
type apiError struct {
	status int
	body   *server.Error
}

func (e *apiError) Error() string { return e.body.Error() }

func conflict(state session.State, format string, args ...any) *apiError {
	return &apiError{http.StatusConflict, &server.Error{Code: server.CodeInvalidTransition, Message: fmt.Sprintf(format, args...), State: string(state)}}
}

func badRequest(err error) *apiError {
	e := &server.Error{Code: server.CodeBadRequest, Message: err.Error()}
	var ve *task.ValidationError
	if errors.As(err, &ve) {
		for _, f := range ve.Fields {
			e.Fields = append(e.Fields, server.FieldError{Field: f.Field, Message: f.Message})
		}
	}
	return &apiError{http.StatusBadRequest, e}
}

func transitionConflict(err error, state session.State) *apiError {
	return &apiError{http.StatusConflict, &server.Error{Code: server.CodeInvalidTransition, Message: err.Error(), State: string(state)}}
}

// lockFor acquires the lock for an API call.
func (ss *sess) lockFor(ctx context.Context) *apiError {
	if err := ss.acquire(ctx); err != nil {
		return &apiError{http.StatusServiceUnavailable, &server.Error{Code: server.CodeUnavailable, Message: "the session is busy (publishing is blocked): " + err.Error()}}
	}
	return nil
}

// events publishes harness events (already validated, data as sent) with
// consecutive sequence numbers.
func (ss *sess) publishEvents(ctx context.Context, evs []harnessEvent) ([]*pending, []int64, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, nil, e
	}
	defer ss.release()
	switch st := ss.machine.State(); st {
	case session.StateRunning, session.StatePaused, session.StateAborting:
	default:
		return nil, nil, conflict(st, "events are accepted while the session is RUNNING, PAUSED or ABORTING; it is %s", st)
	}
	var ps []*pending
	var seqs []int64
	for _, ev := range evs {
		if ev.IdempotencyKey != "" {
			if seq, ok := ss.keys.Get(ev.IdempotencyKey); ok {
				seqs = append(seqs, seq) // a retry: already published
				continue
			}
		}
		p, err := ss.emitKeyedLocked(ss.sc.life, ev.EventType, ev.Data, ev.IdempotencyKey)
		if err != nil {
			return ps, seqs, fencedError(err)
		}
		ps = append(ps, p)
		seqs = append(seqs, p.seq)
		if ev.EventType == session.EventProgress {
			ss.recordProgress(ev.Data)
		}
	}
	return ps, seqs, nil
}

func (ss *sess) recordProgress(raw json.RawMessage) {
	var d session.ProgressData
	if json.Unmarshal(raw, &d) != nil {
		return
	}
	p := &v1alpha1.SessionProgress{Stage: truncate(d.Stage, 256), Message: truncate(d.Message, 512)}
	if d.Percent != nil && !math.IsNaN(*d.Percent) {
		v := int32(math.Round(max(0, min(100, *d.Percent))))
		p.Percent = &v
	}
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) { st.Progress = p })
}

func unavailable(err error) *apiError {
	return &apiError{http.StatusServiceUnavailable, &server.Error{Code: server.CodeUnavailable, Message: "the event could not be published: " + err.Error()}}
}

// pause: RUNNING → PAUSED.
func (ss *sess) pause(ctx context.Context, reason string) ([]*pending, *apiError) {
	return ss.simpleTransition(ctx, session.StatePaused, orDefault(reason, "paused by the harness"))
}

// resume: PAUSED → RUNNING.
func (ss *sess) resume(ctx context.Context, reason string) ([]*pending, *apiError) {
	return ss.simpleTransition(ctx, session.StateRunning, orDefault(reason, "resumed by the harness"))
}

func (ss *sess) simpleTransition(ctx context.Context, to session.State, reason string) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	st := ss.machine.State()
	if err := session.Transition(st, to); err != nil {
		return nil, transitionConflict(err, st)
	}
	p, err := ss.transitionLocked(ss.sc.life, to, reason)
	if err != nil {
		return nil, fencedError(err)
	}
	return []*pending{p}, nil
}

// checkpoint stores the harness's checkpoint (with the task, so another
// replica can resume the session) and emits checkpoint_created (RUNNING or
// PAUSED). The store write comes first and outside the lock: the event
// announces a checkpoint that exists.
func (ss *sess) checkpoint(ctx context.Context, d *session.CheckpointCreatedData, state []byte) ([]*pending, *apiError) {
	if st := ss.currentState(); st != session.StateRunning && st != session.StatePaused {
		return nil, conflict(st, "checkpoints are accepted while the session is RUNNING or PAUSED; it is %s", st)
	}
	if d.CreatedAt.IsZero() {
		d.CreatedAt = task.NewTimestamp(ss.sc.clk.Now())
	}
	if len(state) > 0 || d.Resumable {
		err := ss.sc.ckpt.Save(ctx, checkpoint.Owner{Name: ss.id, UID: ss.uid}, ss.task, checkpoint.Checkpoint{
			ID: d.CheckpointID, Description: d.Description, Resumable: d.Resumable,
			Sequence: ss.seq.Last(), CreatedAt: d.CreatedAt.Time, State: state,
		})
		if errors.Is(err, checkpoint.ErrTooLarge) {
			return nil, &apiError{http.StatusRequestEntityTooLarge, &server.Error{Code: server.CodeTooLarge, Message: err.Error()}}
		}
		if err != nil {
			return nil, unavailable(err)
		}
	}
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		return nil, conflict(st, "checkpoints are accepted while the session is RUNNING or PAUSED; it is %s", st)
	}
	p, err := ss.emitTyped(ss.sc.life, d)
	if err != nil {
		return nil, fencedError(err)
	}
	cp := &v1alpha1.SessionCheckpoint{ID: truncate(d.CheckpointID, 253), Description: truncate(d.Description, 512), Resumable: d.Resumable, CreatedAt: &metav1.Time{Time: d.CreatedAt.Time}}
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) { st.LastCheckpoint = cp })
	return []*pending{p}, nil
}

// currentState reads the state without waiting for a busy session.
func (ss *sess) currentState() session.State {
	if err := ss.acquire(context.Background()); err != nil {
		return ""
	}
	defer ss.release()
	return ss.machine.State()
}

// complete: RUNNING → COMPLETED with task_completed. While ABORTING the
// abort wins: the session ends ABORTED and the result is not forwarded.
func (ss *sess) complete(ctx context.Context, tc *task.TaskCompleted) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	switch st := ss.machine.State(); st {
	case session.StateRunning:
		ps, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateCompleted, reason: "completed", completed: tc})
		if err != nil {
			return nil, unavailable(err)
		}
		return ps, nil
	case session.StateAborting:
		_, _ = ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAborted, message: "the harness completed the task while it was being aborted; the result was discarded"})
		return nil, conflict(session.StateAborted, "the session was being aborted: it is now ABORTED and the result was not forwarded")
	case session.StatePaused:
		return nil, conflict(st, "the session is PAUSED: resume it before completing it (L2 has no PAUSED -> COMPLETED)")
	default:
		return nil, conflict(st, "the session is %s", st)
	}
}

// fail: RUNNING → FAILED with task_failed (from PAUSED through RUNNING,
// since L2 has no PAUSED → FAILED). While ABORTING the abort wins.
func (ss *sess) fail(ctx context.Context, tf *task.TaskFailed) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	switch st := ss.machine.State(); st {
	case session.StatePaused, session.StateRunning:
		var ps []*pending
		if st == session.StatePaused {
			p, err := ss.transitionLocked(ss.sc.life, session.StateRunning, "resumed to fail: "+tf.Code)
			if err != nil {
				return nil, unavailable(err)
			}
			ps = append(ps, p)
		}
		more, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateFailed, reason: tf.Code, message: tf.Message, failed: tf})
		if err != nil {
			return nil, unavailable(err)
		}
		return append(ps, more...), nil
	case session.StateAborting:
		_, _ = ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAborted, message: "the harness reported a failure while the task was being aborted: " + tf.Message})
		return nil, conflict(session.StateAborted, "the session was being aborted: it is now ABORTED")
	default:
		return nil, conflict(st, "the session is %s", st)
	}
}

// aborted: ABORTING → ABORTED (the harness finished its cleanup).
func (ss *sess) aborted(ctx context.Context, reason string) ([]*pending, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return nil, e
	}
	defer ss.release()
	st := ss.machine.State()
	if st != session.StateAborting {
		if err := session.Transition(st, session.StateAborted); err != nil {
			return nil, transitionConflict(err, st)
		}
	}
	ps, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAborted, message: orDefault(reason, "the harness finished cleaning up")})
	if err != nil {
		return nil, unavailable(err)
	}
	return ps, nil
}

// requestAbort starts an abort (RUNNING or PAUSED → ABORTING); a no-op in
// any other state.
func (ss *sess) requestAbort(reason string) {
	if ss.terminal.Load() || !ss.abortSeen.CompareAndSwap(false, true) {
		return
	}
	_ = ss.acquire(context.Background())
	defer ss.release()
	ss.abortRequested = true
	ss.toAbortingLocked(ss.sc.life, reason)
}

func (ss *sess) toAbortingLocked(ctx context.Context, reason string) {
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		return
	}
	if _, err := ss.transitionLocked(ctx, session.StateAborting, reason); err != nil {
		ss.log.Error(err, "Failed to publish state_changed to ABORTING")
	}
	ss.log.Info("Aborting session", "reason", reason)
	now := metav1.NewTime(ss.sc.clk.Now())
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		setCondition(st, metav1.Condition{Type: v1alpha1.ConditionAbortRequested, Status: metav1.ConditionTrue, Reason: "AbortRequested", Message: truncate(reason, 512), LastTransitionTime: now})
	})
	ss.abortTimer = ss.sc.clk.AfterFunc(ss.abortTimeout, ss.onAbortTimeout)
	ss.notifyHarnessAbortLocked(reason)
}

// notifyHarnessAbortLocked tells the harness to stop, once, in the
// background. Called with lock.
func (ss *sess) notifyHarnessAbortLocked(reason string) {
	if ss.abortSent {
		return
	}
	ss.abortSent = true
	go ss.sc.harnessAbort(ss.id, reason)
}

func (ss *sess) onAbortTimeout() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	if ss.machine.State() != session.StateAborting {
		return
	}
	msg := fmt.Sprintf("the harness did not report the end of its cleanup within the abort timeout %s", task.FormatDuration(ss.abortTimeout))
	if _, err := ss.finishLocked(ss.sc.life, outcome{final: session.StateAborted, reason: reasonAbortTimeout, message: msg}); err != nil {
		ss.log.Error(err, "Failed to end an aborting session")
	}
}

// onTimeout fails the session that exceeded its max duration (resuming it
// first when PAUSED) and tells the harness to stop.
func (ss *sess) onTimeout() {
	_ = ss.acquire(context.Background())
	defer ss.release()
	st := ss.machine.State()
	if st != session.StateRunning && st != session.StatePaused {
		return
	}
	msg := fmt.Sprintf("the session exceeded its maximum duration (%s, until %s)", task.FormatDuration(ss.expiresAt.Sub(ss.startedAt)), ss.expiresAt.Format(time.RFC3339))
	ss.failLocked(codeTimeout, msg, false)
	ss.notifyHarnessAbortLocked("timeout")
}

// failLocked ends a RUNNING or PAUSED session FAILED, or an ABORTING one
// ABORTED. Called with lock.
func (ss *sess) failLocked(code, msg string, recoverable bool) {
	ctx := ss.sc.life
	switch ss.machine.State() {
	case session.StatePaused:
		if _, err := ss.transitionLocked(ctx, session.StateRunning, code); err != nil {
			ss.log.Error(err, "Failed to publish state_changed")
		}
		fallthrough
	case session.StateRunning:
		if _, err := ss.finishLocked(ctx, outcome{final: session.StateFailed, reason: code, message: msg,
			failed: &task.TaskFailed{Code: code, Message: msg, Recoverable: recoverable}}); err != nil {
			ss.log.Error(err, "Failed to end a session")
		}
	case session.StateAborting:
		if _, err := ss.finishLocked(ctx, outcome{final: session.StateAborted, reason: code, message: msg}); err != nil {
			ss.log.Error(err, "Failed to end a session")
		}
	}
}

// terminate ends the session from outside (harness unreachable, shutdown).
func (ss *sess) terminate(code, msg string, recoverable bool) {
	_ = ss.acquire(context.Background())
	defer ss.release()
	ss.failLocked(code, msg, recoverable)
}

// info is the GET /hcp/v1/sessions/{id} answer.
type info struct {
	SessionID      string         `json:"session_id"`
	State          session.State  `json:"state"`
	CallerID       string         `json:"caller_id"`
	Capability     string         `json:"capability"`
	TaskMessageID  string         `json:"task_message_id"`
	RiskLevel      task.RiskLevel `json:"risk_level"`
	LastSequence   int64          `json:"last_sequence"`
	EventCount     int64          `json:"event_count"`
	StartedAt      task.Timestamp `json:"started_at"`
	ExpiresAt      task.Timestamp `json:"expires_at"`
	AbortRequested bool           `json:"abort_requested"`
}

func (ss *sess) info(ctx context.Context) (info, *apiError) {
	if e := ss.lockFor(ctx); e != nil {
		return info{}, e
	}
	defer ss.release()
	return info{
		SessionID: ss.id, State: ss.machine.State(), CallerID: ss.callerID, Capability: ss.capability,
		TaskMessageID: ss.taskMsgID, RiskLevel: ss.risk, LastSequence: ss.seq.Last(), EventCount: ss.events,
		StartedAt: task.NewTimestamp(ss.startedAt), ExpiresAt: task.NewTimestamp(ss.expiresAt), AbortRequested: ss.abortRequested,
	}, nil
}

func setCondition(st *v1alpha1.HCPSessionStatus, c metav1.Condition) {
	for i := range st.Conditions {
		if st.Conditions[i].Type == c.Type {
			if st.Conditions[i].Status == c.Status {
				c.LastTransitionTime = st.Conditions[i].LastTransitionTime
			}
			st.Conditions[i] = c
			return
		}
	}
	st.Conditions = append(st.Conditions, c)
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
