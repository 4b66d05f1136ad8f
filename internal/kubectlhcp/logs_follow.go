package kubectlhcp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// logFollower shows a session's harness log: one pod's at a time.
type logFollower struct {
	env      *Env
	c        client.WithWatch
	src      LogSource
	o        LogsOptions
	ns, name string
}

// endLinger is how long the log of the pod a session ended on is still
// shown: what the harness writes as it finishes.
const endLinger = 2 * time.Second

// follow shows the session's log until it ends: a watch on the session
// says which pod runs it (followPlan); each pod's log is streamed in turn,
// the next one once the one before has ended (its container exited) or
// HandoverGrace passed.
func (f *logFollower) follow(ctx context.Context, hs *hcpv1alpha1.HCPSession) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	plan := &followPlan{}
	steps := make(chan followStep, 16)
	watchErr := make(chan error, 1)
	first := plan.start(hs)
	go func() { watchErr <- f.watchSession(ctx, hs.ResourceVersion, plan, steps) }()

	var (
		cur       *logStream
		pending   *logTarget // the pod to show once cur has ended
		latest    logTarget  // the pod the session is on, as last seen
		retry     logStream  // the target and last line of a stream to reopen
		cut       <-chan time.Time
		reopen    <-chan time.Time
		backoff   = time.Second
		finishing bool
		lastErr   string // said once while a stream keeps failing alike
		tail      = tailOf(f.o.Tail)
	)
	start := func(t logTarget, after time.Time) {
		cur, cut, reopen = f.open(ctx, t, after, true, tail), nil, nil
		tail = nil
	}
	handle := func(st followStep) {
		if st.Note != "" {
			f.note(st.Note)
		}
		if st.Left {
			latest = logTarget{} // the stream of the pod it left is not reopened
		}
		if st.Next != nil {
			latest = *st.Next
			if cur == nil {
				start(latest, time.Time{})
			} else {
				pending = st.Next
				cut = time.After(f.o.HandoverGrace)
			}
		}
		if st.Done {
			finishing = true
			if cur != nil && pending == nil {
				cut = time.After(endLinger)
			}
		}
	}
	handle(first)
	for {
		if finishing && cur == nil && pending == nil {
			return nil
		}
		var ended chan struct{}
		if cur != nil {
			ended = cur.ended
		}
		select {
		case <-ctx.Done():
			return nil
		case err := <-watchErr:
			if err != nil {
				return &ExitError{Code: ExitFailure, Err: err}
			}
			watchErr = nil // ended with the session: its last step says so
		case st := <-steps:
			handle(st)
		case <-cut:
			if cur != nil {
				cur.cancel()
			}
		case <-ended:
			done := cur
			cur, cut = nil, nil
			if done.err != nil && done.err.Error() != lastErr {
				f.note(done.err.Error())
			}
			lastErr = ""
			if done.err != nil {
				lastErr = done.err.Error()
			}
			switch {
			case pending != nil:
				t := *pending
				pending = nil
				start(t, time.Time{})
				if finishing {
					cut = time.After(endLinger)
				}
			case finishing:
			case done.target.Pod == latest.Pod:
				// The stream ended while the session still runs there (the
				// container restarted, the connection broke): again, from
				// the last line shown.
				if done.err == nil {
					backoff = time.Second
				}
				retry = logStream{target: latest, last: done.last}
				reopen = time.After(backoff)
				backoff = min(2*backoff, 10*time.Second)
			}
		case <-reopen:
			start(retry.target, retry.last)
		}
	}
}

// note writes a line about the session on stderr.
func (f *logFollower) note(s string) {
	_, _ = fmt.Fprintf(f.env.Streams.ErrOut, "==> %s\n", s)
}

// watchSession watches the session from resourceVersion rv and sends
// plan's steps; it returns once the session ended or was deleted (nil),
// or on an error.
func (f *logFollower) watchSession(ctx context.Context, rv string, plan *followPlan, steps chan<- followStep) error {
	send := func(st followStep) bool {
		if st.Note == "" && st.Next == nil && !st.Done {
			return true
		}
		select {
		case steps <- st:
		case <-ctx.Done():
		}
		return !st.Done
	}
	sel := client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", f.name)}
	for ctx.Err() == nil {
		if rv == "" {
			// (Re)read: what a broken watch missed.
			hs := &hcpv1alpha1.HCPSession{}
			if err := f.c.Get(ctx, client.ObjectKey{Namespace: f.ns, Name: f.name}, hs); err != nil {
				if apierrors.IsNotFound(err) {
					send(plan.gone(f.name))
					return nil
				}
				if ctx.Err() != nil {
					return nil
				}
				return apiError("reading HCPSession "+f.name, err)
			}
			if !send(plan.observe(hs, f.env.now())) {
				return nil
			}
			rv = hs.ResourceVersion
		}
		w, err := f.c.Watch(ctx, &hcpv1alpha1.HCPSessionList{}, client.InNamespace(f.ns), sel,
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true}})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return apiError("watching HCPSession "+f.name, err)
		}
		more, err := f.consume(ctx, w, plan, send)
		w.Stop()
		if !more || err != nil {
			return err
		}
		rv = ""
	}
	return nil
}

// consume reads one watch; more: it ended before the session did.
func (f *logFollower) consume(ctx context.Context, w watch.Interface, plan *followPlan, send func(followStep) bool) (more bool, err error) {
	for {
		select {
		case <-ctx.Done():
			return false, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return true, nil
			}
			switch ev.Type {
			case watch.Error:
				if st, ok := ev.Object.(*metav1.Status); ok && st.Code == 410 {
					return true, nil
				}
				return false, fmt.Errorf("watching HCPSession %s: %v", f.name, apierrors.FromObject(ev.Object))
			case watch.Bookmark:
				continue
			case watch.Deleted:
				send(plan.gone(f.name))
				return false, nil
			}
			hs, ok := ev.Object.(*hcpv1alpha1.HCPSession)
			if !ok || hs.Name != f.name {
				continue
			}
			if !send(plan.observe(hs, f.env.now())) {
				return false, nil
			}
		}
	}
}

// lineWriter copies log lines ("TIME text") to out: those from since
// only, and when reopening a stream, those after skip (what the stream
// before showed); without their time unless timestamps.
type lineWriter struct {
	out        io.Writer
	prefix     string
	timestamps bool
	since      time.Time
	skip       time.Time
	// last is the time of the last line written.
	last time.Time
}

func (l *lineWriter) copy(r io.Reader) error {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			l.write(line)
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

func (l *lineWriter) write(line string) {
	text := line
	if ts, rest, ok := strings.Cut(line, " "); ok {
		if at, err := time.Parse(time.RFC3339Nano, ts); err == nil {
			if at.Before(l.since) || (!l.skip.IsZero() && !at.After(l.skip)) {
				return
			}
			if at.After(l.last) {
				l.last = at
			}
			if !l.timestamps {
				text = rest
			}
		}
	}
	if !strings.HasSuffix(text, "\n") {
		text += "\n"
	}
	_, _ = io.WriteString(l.out, l.prefix+text)
}
