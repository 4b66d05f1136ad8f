package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/wal"
	"github.com/hcp-io/hcp-operator/internal/transport"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

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
	pub.Headers = ss.headersLocked(pub.Headers, seq)
	conf, err := ss.sc.pub.PublishAsync(ctx, topology.EventsExchange, rk, pub)
	if err != nil {
		// Logged: a restart republishes it; in this process the confirm
		// loop retries it below.
		conf = failedConfirmation{err}
	}
	p := &pending{index: index, rk: rk, pub: pub, kind: t, seq: seq, conf: conf, done: make(chan struct{})}
	if ss.confirms.push(p) {
		go ss.confirmLoop()
	}
	ss.sc.countOut(string(t))
	return p, nil
}

// emitLocked sequences, publishes and records one event. Called with lock.
func (ss *sess) emitLocked(ctx context.Context, et session.EventType, data json.RawMessage) (*pending, error) {
	return ss.emitKeyedLocked(ctx, et, data, "")
}

// emitKeyedLocked is emitLocked with the harness's idempotency key.
func (ss *sess) emitKeyedLocked(ctx context.Context, et session.EventType, data json.RawMessage, key string) (*pending, error) {
	p, err := ss.publishEventLocked(ctx, et, data, key)
	if err != nil {
		return nil, err
	}
	ss.noteEventsLocked(p, nil)
	return p, nil
}

// publishEventLocked sequences and publishes one event; the caller records
// it in the status (noteEventsLocked). data must be valid JSON (it goes
// into the payload as it is).
// Called with lock.
func (ss *sess) publishEventLocked(ctx context.Context, et session.EventType, data json.RawMessage, key string) (*pending, error) {
	o, err := ss.sequenceEventLocked(et, data, key)
	if err != nil {
		return nil, err
	}
	ps, err := ss.publishEventsLocked(ctx, []outgoing{o})
	if err != nil {
		return nil, err
	}
	return ps[0], nil
}

// outgoing is an event with its sequence and its encoded message, not yet
// in the write-ahead log.
type outgoing struct {
	seq int64
	key string
	pub amqp.Publishing
}

// sequenceEventLocked gives an event the session's next sequence and
// encodes it. Called with lock.
func (ss *sess) sequenceEventLocked(et session.EventType, data json.RawMessage, key string) (outgoing, error) {
	seq, payload, err := ss.nextPayloadLocked(et, data)
	if err != nil {
		return outgoing{}, err
	}
	pub, err := envelope.NewPublishing(ss.sc.clk.Now(), envelope.TypeEvent, ss.id, payload, ss.sc.username)
	if err != nil {
		return outgoing{}, err
	}
	return outgoing{seq: seq, key: key, pub: pub}, nil
}

// sequenceHarnessEventLocked is sequenceEventLocked for an event of the
// harness that parseEvent or parseEvents accepted: its type is one the
// harness emits, and its data passed what the envelope's validation
// checks of it (envelope.CheckObject); the session id and the sequence
// are the sidecar's own. The envelope is then valid by construction and
// is not validated again (a scan of the whole event per event on the
// sidecar's hot path). Called with lock.
func (ss *sess) sequenceHarnessEventLocked(ev *harnessEvent) (outgoing, error) {
	seq, payload, err := ss.nextPayloadLocked(ev.EventType, ev.Data)
	if err != nil {
		return outgoing{}, err
	}
	pub := envelope.NewPublishingUnchecked(ss.sc.clk.Now(), envelope.TypeEvent, ss.id, payload, ss.sc.username)
	return outgoing{seq: seq, key: ev.IdempotencyKey, pub: pub}, nil
}

// nextPayloadLocked takes the session's next sequence for an event and
// builds its payload (data as it is). Called with lock.
func (ss *sess) nextPayloadLocked(et session.EventType, data json.RawMessage) (int64, json.RawMessage, error) {
	if err := ss.sc.fence(ss); err != nil {
		return 0, nil, err
	}
	seq, err := ss.seq.Next()
	if err != nil {
		return 0, nil, err
	}
	return seq, session.EventPayload{EventType: et, Sequence: seq, Data: data}.AppendJSON(make([]byte, 0, 64+len(data))), nil
}

// publishEventsLocked records sequenced events in the write-ahead log, all
// of them in one write, then publishes them in order (see publishLocked).
// Called with lock.
func (ss *sess) publishEventsLocked(ctx context.Context, os []outgoing) ([]*pending, error) {
	if err := ss.sc.fence(ss); err != nil {
		return nil, err
	}
	rk := topology.EventRoutingKey(ss.callerID, ss.id, envelope.TypeEvent)
	state := string(ss.machine.State())
	ms := make([]wal.Message, len(os))
	for i, o := range os {
		ms[i] = wal.Message{Index: ss.index + int64(i) + 1, Seq: o.seq, Key: o.key, RoutingKey: rk, State: state, Body: o.pub.Body}
	}
	if err := ss.sc.wal.Append(ss.id, ms...); err != nil {
		return nil, err
	}
	ps := make([]*pending, 0, len(os))
	var err error
	// The events go to the socket in one write (transport.InBatch).
	transport.InBatch(ss.sc.pub, func() {
		for _, o := range os {
			ss.index++
			if o.key != "" {
				ss.keys.Put(o.key, o.seq)
			}
			var p *pending
			if p, err = ss.enqueueLocked(ctx, ss.index, envelope.TypeEvent, rk, o.pub, o.seq); err != nil {
				return
			}
			ss.events++
			ps = append(ps, p)
		}
	})
	return ps, err
}

// noteEventsLocked records in the status the events published up to last
// (its sequence and time, the count so far) and, if given, the latest
// progress. Called with lock.
func (ss *sess) noteEventsLocked(last *pending, progress *v1alpha1.SessionProgress) {
	seq, events, at := last.seq, ss.events, last.pub.Timestamp
	ss.sc.st.Update(ss.id, func(st *v1alpha1.HCPSessionStatus) {
		st.LastSequence = seq
		st.EventCount = events
		st.LastEventAt = &metav1.Time{Time: at.Truncate(time.Second)}
		if progress != nil {
			st.Progress = progress
		}
	})
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
// message_id and sequence: the caller deduplicates) and retrying nacks. It
// runs while the session's confirm queue has something (confirmQueue):
// one run at a time, started by a publish or by the queue's close.
//
// Confirmed positions go to the write-ahead log at most wal.ConfirmEvery
// messages behind (a lagging mark only means more republishing after a
// restart, which the caller deduplicates); once the session ended or
// moved and everything was confirmed, the log forgets it
// (finishConfirms).
func (ss *sess) confirmLoop() {
	for {
		p, over, ok := ss.confirms.pop()
		if !ok {
			if over {
				ss.finishConfirms()
			}
			return
		}
		ss.confirmOne(p)
	}
}

// confirmOne awaits p's confirm and marks it in the write-ahead log
// (wal.Log.MarkConfirmed). A failure stops the session's confirmed mark
// for good (confirmFailed).
func (ss *sess) confirmOne(p *pending) {
	p.err = ss.awaitConfirm(p)
	if p.err != nil {
		ss.confirmFailed = true
		ss.log().Error(p.err, "Event not delivered", "type", p.kind, "sequence", p.seq, "routingKey", p.rk)
		if errors.Is(p.err, transport.ErrConnectionLost) && !errors.Is(p.err, errOwnershipLost) && !ss.ended() && ss.sc.life.Err() == nil {
			// Given up after republishLimit lost connections (an
			// unroutable event is the harness's 502, not this): the
			// stream has a hole it cannot fill, so end the session
			// (its terminal record is replayed if this fails too).
			go ss.terminate(codePublishFailed, fmt.Sprintf("event %d could not be delivered to the caller: %v", p.seq, p.err), true)
		}
	} else if !ss.confirmFailed && p.seq > ss.confirmed.Load() {
		// In order: everything queued before p was confirmed too.
		ss.confirmed.Store(p.seq)
	}
	if !ss.confirmFailed {
		if err := ss.sc.wal.MarkConfirmed(ss.id, p.index); err != nil {
			ss.log().Error(err, "Failed to record a confirm in the write-ahead log")
		}
	}
	close(p.done)
}

// finishConfirms runs once the session's confirm queue is closed and
// empty: the log forgets the session (unless a confirm failed: the next
// owner republishes from it), and confirmDone is closed.
func (ss *sess) finishConfirms() {
	defer ss.sc.sessionsWG.Done()
	defer close(ss.confirmDone)
	if !ss.confirmFailed {
		if err := ss.sc.wal.Close(ss.id); err != nil {
			ss.log().Error(err, "Failed to close the session in the write-ahead log")
		}
	}
}

// closeConfirms ends the session's publishes: the confirm loop finishes
// what is queued, then the session (finishConfirms).
func (ss *sess) closeConfirms() {
	if ss.confirms.close() {
		go ss.confirmLoop()
	}
}

// failedConfirmation is the confirmation of a publish that failed at once;
// the confirm loop retries it like a lost one.
type failedConfirmation struct{ err error }

func (f failedConfirmation) Wait(context.Context) error { return f.err }

// awaitConfirm waits for an event's confirm and republishes it until the
// broker takes it (or the sidecar stops: the write-ahead log still holds
// it unconfirmed, and the next owner republishes it). Events are never given
// up for a count of attempts: a full event queue (reject-publish) holds the
// session back rather than losing an event.
//
// A republish passes the fence first (mayRepublish: it waits while the
// Lease has lapsed, and stops for a session lost to another replica), and
// republishes after a lost connection are bounded (republishLimit): a
// message the broker keeps closing the channel over is given up, and the
// session fails (publish_failed) rather than stalling forever.
func (ss *sess) awaitConfirm(p *pending) error {
	return transport.Retry{After: ss.sc.clk.After, MaxLost: republishLimit, Check: ss.mayRepublish, OnRetry: func(attempt int, err error) {
		if attempt == 1 || attempt%20 == 0 {
			ss.log().Info("Republishing an unconfirmed event", "type", p.kind, "sequence", p.seq, "attempt", attempt, "reason", err.Error())
		}
	}, Resent: ss.resendQueued}.Confirm(ss.sc.life, ss.sc.pub, topology.EventsExchange, p.rk, p.pub, p.conf)
}

// resendQueued publishes again, in order, every publish queued behind the
// one the confirm loop just republished; the loop then awaits their new
// confirms. Their first copies went out on the same channel, which was
// lost or nacked the one ahead of them (a quorum queue without a leader
// nacks them all), and each would otherwise be republished only at its
// turn, one confirm round trip and nack backoff after another, while the
// session's newer events went out at once: the caller would hold a gap of
// up to confirmQueueSize events for as long, and return its later events
// to the queue meanwhile (measured: a broker node's loss left 256 events
// of each session republished over 37 s). The caller drops the copies it
// already has (same message_id and sequence). Publishes made while this
// runs may still go ahead of the resent ones: a gap of a few events.
func (ss *sess) resendQueued() {
	queued := ss.confirms.queued()
	transport.InBatch(ss.sc.pub, func() {
		for _, q := range queued {
			conf, err := ss.sc.pub.PublishAsync(ss.sc.life, topology.EventsExchange, q.rk, q.pub)
			if err != nil {
				conf = failedConfirmation{err}
			}
			q.conf = conf // read by this loop only, when it pops q
		}
	})
	if len(queued) > 0 {
		ss.log().Info("Republished the unconfirmed messages queued behind it", "count", len(queued))
	}
}

// republishLimit bounds the republishes of one message after lost
// connections (each waits for a new channel).
const republishLimit = 30

// codePublishFailed is the failure code of a session whose message could
// not be delivered.
const codePublishFailed = "publish_failed"

// mayRepublish is the fence of a republish: it waits while this replica
// cannot vouch for the session (its Lease lapsed, not re-read since), and
// refuses once the session is lost. A session being handed over (moved)
// still owes its last messages: they go out before the release.
func (ss *sess) mayRepublish() error {
	for {
		if ss.lost.Load() {
			return errOwnershipLost
		}
		l := ss.sc.lease
		if l == nil || (l.Valid() && ss.leaseGen.Load() == l.Generation()) {
			return nil
		}
		select {
		case <-ss.sc.life.Done():
			return ss.sc.life.Err()
		case <-ss.sc.clk.After(time.Second):
		}
	}
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
