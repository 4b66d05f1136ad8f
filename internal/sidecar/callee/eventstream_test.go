package callee

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/harnessclient"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// runningSession submits a task whose sample harness sleeps through one
// long step and waits until it runs: the test posts the events itself.
func (b *bed) runningSession() string {
	b.t.Helper()
	_, sid, _ := b.submit(newSubmit(func(ts *task.TaskSubmit) { ts.Inputs = json.RawMessage(`{"steps":1,"step_ms":600000}`) }))
	b.waitMessage(sid, 20*time.Second, "state_changed", isEvent(session.EventStateChanged))
	return sid
}

func logLine(i int, key string) string {
	k := ""
	if key != "" {
		k = `,"idempotency_key":"` + key + `"`
	}
	return fmt.Sprintf(`{"event_type":"log","data":{"level":"info","message":"m%d"}%s}`, i, k)
}

// TestEventStream: events streamed in one request are published in the
// order written, with consecutive sequences, acknowledged cumulatively
// once confirmed, with the same idempotency as requests; a bad line ends
// the stream with the lines before it done and nothing after it
// published; a stream to a session that is not running is refused.
func TestEventStream(t *testing.T) {
	b := newBed(t, bedOptions{})
	hc := harnessclient.New("http://"+b.sc.cfg.APIAddr, "the callee sidecar")
	ctx := t.Context()

	if _, err := hc.OpenEventStream(ctx, envelope.NewMessageID(), false); !isAPIError(err, 404, "not_found") {
		t.Fatalf("a stream to no session: %v, want 404 not_found", err)
	}

	sid := b.runningSession() // session_created and state_changed are 1 and 2
	es, err := hc.OpenEventStream(ctx, sid, false)
	must(t, err)
	const n = 600 // past half the first block of sequences: the next is reserved ahead
	for i := range n {
		must(t, es.SendLine([]byte(logLine(i, fmt.Sprintf("k%d", i)))))
		if i%7 == 0 {
			must(t, es.Flush())
		}
	}
	must(t, es.Flush())
	if a, err := es.Wait(ctx, n); err != nil || a.Sequence != n+2 {
		t.Fatalf("waiting for %d lines: %+v %v, want sequence %d", n, a, err, n+2)
	}
	// The block 1001-2000 was reserved in the background once half the
	// first was used, before any of it is needed.
	testbed.Eventually(t, 5*time.Second, "the ceiling reserved ahead", func(context.Context) error {
		if c := storedCeiling(b.hcpSession(sid)); c != 2*DefaultSequenceBlock {
			return fmt.Errorf("ceiling %d at sequence %d, want %d", c, n+2, 2*DefaultSequenceBlock)
		}
		return nil
	})
	// A retried line (a key already used) gets its sequence back and is not
	// published again; a fresh one follows.
	must(t, es.SendLine([]byte(logLine(5, "k5"))))
	must(t, es.SendLine([]byte(logLine(n, ""))))
	last, err := es.Close(ctx)
	if err != nil || !last.Done || last.Through != n+2 || last.Sequence != n+3 {
		t.Fatalf("closing: %+v %v, want done through %d at sequence %d", last, err, n+2, n+3)
	}
	b.waitMessage(sid, 10*time.Second, fmt.Sprintf("sequence %d", n+3), func(m received) bool {
		return m.env.Type == envelope.TypeEvent && eventOf(m).Sequence == n+3
	})
	evs := b.events(sid)
	checkSequences(t, evs)
	for i, e := range evs[2:] {
		if want := fmt.Sprintf(`"m%d"`, i); !strings.Contains(string(e.Data), want) {
			t.Fatalf("event %d carries %s, want message %s", e.Sequence, e.Data, want)
		}
	}

	// A bad line: the lines before it are done, the stream ends with the
	// error naming it, and nothing after it is published.
	es, err = hc.OpenEventStream(ctx, sid, true)
	must(t, err)
	for _, l := range []string{logLine(1000, ""), "", logLine(1001, ""), `{"event_type":"progress","data":{"stage":"x","percent":200}}`, logLine(1002, "")} {
		must(t, es.SendLine([]byte(l)))
	}
	last, err = es.Close(ctx)
	var ae *harnessclient.APIError
	if !errors.As(err, &ae) || ae.Code != "bad_request" || !strings.Contains(ae.Message, "line 3") || last.Through != 2 || last.Sequence != n+5 {
		t.Fatalf("a bad third line: %+v %v, want through 2 at sequence %d and bad_request naming line 3", last, err, n+5)
	}
	time.Sleep(300 * time.Millisecond)
	for _, e := range b.events(sid) {
		if strings.Contains(string(e.Data), "m1002") {
			t.Fatalf("the line after the bad one was published as %d", e.Sequence)
		}
	}

	// A line for a session that ended is refused as a request would be.
	es, err = hc.OpenEventStream(ctx, sid, false)
	must(t, err)
	if a := b.call("POST", "/hcp/v1/sessions/"+sid+"/complete", "application/json", `{}`); a.status != 200 {
		t.Fatalf("complete: %d %v", a.status, a.body)
	}
	must(t, es.SendLine([]byte(logLine(2000, ""))))
	last, err = es.Close(ctx)
	if !errors.As(err, &ae) || ae.Code != "invalid_transition" || last.Through != 0 {
		t.Fatalf("a line after complete: %+v %v, want invalid_transition with nothing done", last, err)
	}
	if _, err := hc.OpenEventStream(ctx, envelope.NewMessageID(), false); err == nil {
		t.Fatal("a stream to no session was opened")
	}
}

// TestEventStreamHostileInput: an oversized line, a batch on a line,
// binary garbage and a body cut off mid-line each end the stream with a
// clear error (or, cut off, with what came before it done), and the
// sidecar serves on.
func TestEventStreamHostileInput(t *testing.T) {
	b := newBed(t, bedOptions{})
	hc := harnessclient.New("http://"+b.sc.cfg.APIAddr, "")
	ctx := t.Context()
	sid := b.runningSession()
	for _, c := range []struct {
		name, body, code string
		through          int
	}{
		{"oversized line", logLine(1, "") + "\n" + strings.Repeat("x", envelope.MaxEnvelopeBytes+10) + "\n", "too_large", 1},
		{"a batch on a line", `[` + logLine(1, "") + `]` + "\n", "bad_request", 0},
		{"garbage", "\x00\xff\xfe{{{\n", "bad_request", 0},
		{"cut mid-line", logLine(1, "") + "\n" + `{"event_type":"log","da`, "bad_request", 1},
	} {
		es, err := hc.OpenEventStream(ctx, sid, false)
		must(t, err)
		must(t, es.SendLine([]byte(strings.TrimSuffix(c.body, "\n"))))
		last, err := es.Close(ctx)
		var ae *harnessclient.APIError
		if !errors.As(err, &ae) || ae.Code != c.code || last.Through != c.through {
			t.Fatalf("%s: %+v %v, want %s through %d", c.name, last, err, c.code, c.through)
		}
	}
	if a := b.call("POST", "/hcp/v1/sessions/"+sid+"/events", "application/json", logLine(9, "")); a.status != 200 {
		t.Fatalf("a request after the hostile streams: %d %v", a.status, a.body)
	}
	checkSequences(t, b.events(sid))
}

func isAPIError(err error, status int, code string) bool {
	var ae *harnessclient.APIError
	return errors.As(err, &ae) && ae.Status == status && ae.Code == code
}
