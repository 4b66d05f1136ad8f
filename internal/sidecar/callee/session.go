package callee

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	amqp "github.com/rabbitmq/amqp091-go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/policy"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
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
// confirm; beyond it publishing waits. The transport's window bounds the
// confirms in flight to as many, so a longer queue would only hold more
// (confirmQueue allocates the slots in use only).
const confirmQueueSize = transport.DefaultWindow

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
// confirm loop, so publishing never waits for the previous confirm.
type sess struct {
	sc         *Sidecar
	id         string
	callerID   string
	capability string
	taskMsgID  string
	risk       task.RiskLevel
	// token is the session token until session_created has carried it
	// (start): then nothing reads it, and the task keeps its one copy.
	token     string
	startedAt time.Time
	expiresAt time.Time
	uid       types.UID

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
	// confirms are the publishes waiting for their confirm; confirmFailed
	// is set once one failed (confirm loop only).
	confirms      confirmQueue
	confirmFailed bool
	// confirmed is the highest sequence up to which every event of the
	// session has been confirmed by the broker (or, after a takeover, is
	// beyond recovery); each event carries it (envelope.HeaderConfirmedThrough)
	// so that the caller can tell a gap that will fill from one that never
	// will. Advanced by the confirm loop.
	confirmed atomic.Int64
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
	// epoch is the owner epoch this replica claimed the session with
	// (epoch.go); lost is set once a higher one is seen. leaseGen is the
	// Lease generation under which the claim was last confirmed (fence).
	epoch    int64
	lost     atomic.Bool
	leaseGen atomic.Int64
	// harnessStopped: the harness was told to stop while the Lease had
	// lapsed (fenceWatch); ending: an outcome is being recorded.
	harnessStopped, ending atomic.Bool
	// termSeq is the first of the two sequence numbers reserved for the
	// terminal record (terminal.go); 0 until one was built.
	termSeq int64
	// recovering is set while the harness's loss of the session is being
	// recovered.
	recovering atomic.Bool
	// confirmDone is closed when the confirm loop has finished.
	confirmDone chan struct{}
	// trace is the session's W3C trace context (see startTrace).
	trace sessTrace
	// shared is the header table of the last message published without
	// headers of its own, reused while it still holds (headersLocked);
	// under lock.
	shared sharedHeaders
}

// log is the session's logger, made when something is logged: a logger
// kept per session holds its encoded fields (about 1.4 KiB with zap) for
// the session's life.
func (ss *sess) log() logr.Logger {
	return ss.sc.log.WithValues("session", ss.id, "caller", ss.callerID)
}

func (s *Sidecar) newSession(hs *v1alpha1.HCPSession, cl *v1alpha1.Callee, tok string, claims token.Claims, body []byte) *sess {
	abortTimeout := DefaultAbortTimeout
	if cl != nil {
		abortTimeout = policy.CalleeDuration(cl.Spec.Sessions.AbortTimeout, DefaultAbortTimeout)
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
		abortTimeout: abortTimeout,
		lock:         make(chan struct{}, 1),
		machine:      session.New(claims.IssuedAt),
		confirmDone:  make(chan struct{}),
		task:         body,
	}
	ss.epoch = 1 // the decision is the first claim
	ss.confirmedUnder()
	ss.seq = session.NewReservingSequencer(0, DefaultSequenceBlock, ss.reserver(DefaultSequenceBlock))
	ss.seq.ReserveAhead() // the ceiling patch off the events' path
	ss.startTrace(hs, false)
	return ss
}

func (s *Sidecar) register(ss *sess) {
	s.mu.Lock()
	s.sessions[ss.id] = ss
	s.mu.Unlock()
	s.sessionsWG.Add(1) // done by finishConfirms
	if ss.confirms.own() {
		go ss.confirmLoop()
	}
}

// unregister drops a session that never started.
func (s *Sidecar) unregister(ss *sess) {
	s.mu.Lock()
	delete(s.sessions, ss.id)
	s.mu.Unlock()
	ss.closeConfirms()
	ss.endTrace("", "not_started", false)
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
