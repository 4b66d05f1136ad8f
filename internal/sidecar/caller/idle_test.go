package caller

import (
	"bytes"
	"fmt"
	"runtime/pprof"
	"strings"
	"testing"
	"time"
)

// TestIdleWorkerResumesWithoutARead: a session's worker exits once idle
// for Options.WorkerIdle, and the session's next event starts a new one.
// While the consumer channel it delivered from lives, no other pod can
// have delivered the session, so the new worker resumes from the local
// record without reading the HCPSession from the API server; once that
// channel was lost it reads it again (another pod may have been the
// queue's active consumer meanwhile). An ended session's worker parks
// nothing. Every event reaches the app once, and callerAckedSequence
// follows.
func TestIdleWorkerResumesWithoutARead(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	reads := &downReader{Reader: a.env.Client}
	p := b.start(a.withAPI(a.writer(b)), func(o *Options) {
		o.Reader = reads
		o.WorkerIdle = 300 * time.Millisecond
	})
	v := p.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 4)
	hs := a.hcpSession("lab", b.callerID, v.MessageID)
	c := b.callee("lab")
	deliver := func(i int) {
		t.Helper()
		c.publish(s.msgs[i])
		seqAtApp(t, b, s.sessionID, int64(i))
	}
	gone := func() {
		t.Helper()
		eventually(t, 10*time.Second, "the session's worker gone", func() error { return workerGone(p, s.sessionID) })
	}
	c.publish(s.msgs[0]) // task_accepted
	deliver(1)
	gone()

	before := reads.reads.Load()
	deliver(2)
	if got := reads.reads.Load() - before; got != 0 {
		t.Errorf("%d API reads to resume the session on the same channel; want none", got)
	}
	gone()

	p.proxy.Cut() // the channel is lost; the transport reconnects
	before = reads.reads.Load()
	deliver(3)
	if got := reads.reads.Load() - before; got == 0 {
		t.Errorf("no API read to resume the session after its channel was lost; want the HCPSession read")
	}
	gone()

	// An ended session's worker leaves nothing parked.
	c.publish(s.msgs[4]) // task_completed
	c.publish(s.msgs[5]) // session_closed
	eventually(t, 20*time.Second, "the session complete at the app", func() error { return b.complete(s.sessionID, 4) })
	gone()
	p.sc.mu.Lock()
	_, parked := p.sc.parked[s.sessionID]
	p.sc.mu.Unlock()
	if parked {
		t.Errorf("the ended session's worker parked its positions; want nothing kept")
	}
	stopClean(t, a, b, p, hs.Name, 4)
}

// TestQuietWorkerHoldsNoGoroutine: once a live session's worker holds
// nothing (its events delivered, fsynced, acked and reported), its
// goroutine ends well before Options.WorkerIdle, while the worker's state
// stays: the next event is delivered in order without reading the
// HCPSession, and the worker still exits after WorkerIdle. A thousand
// quiet live sessions hold no goroutine.
func TestQuietWorkerHoldsNoGoroutine(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	reads := &downReader{Reader: a.env.Client}
	p := b.start(a.withAPI(a.writer(b)), func(o *Options) {
		o.Reader = reads
		o.WorkerIdle = 6 * time.Second
	})
	v := p.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 3)
	hs := a.hcpSession("lab", b.callerID, v.MessageID)
	c := b.callee("lab")
	asleep := func() {
		t.Helper()
		eventually(t, 4*time.Second, "the quiet session's worker asleep", func() error { return workerAsleep(p, s.sessionID) })
	}
	c.publish(s.msgs[0]) // task_accepted
	c.publish(s.msgs[1])
	seqAtApp(t, b, s.sessionID, 1)
	asleep()
	eventually(t, 10*time.Second, "callerAckedSequence 1", func() error {
		if got := a.acked(hs.Name); got != 1 {
			return fmt.Errorf("callerAckedSequence %d", got)
		}
		return nil
	})

	before := reads.reads.Load()
	c.publish(s.msgs[2])
	seqAtApp(t, b, s.sessionID, 2)
	if got := reads.reads.Load() - before; got != 0 {
		t.Errorf("%d API reads to wake the session's worker; want none", got)
	}
	asleep()
	eventually(t, 15*time.Second, "the session's worker gone after WorkerIdle", func() error { return workerGone(p, s.sessionID) })
	stopClean(t, a, b, p, hs.Name, 2)
}

// TestStopDrainsSleepingWorkers: a stop with sleeping workers wakes and
// drains them: Run returns, and no worker goroutine or worker is left.
func TestStopDrainsSleepingWorkers(t *testing.T) {
	if testing.Short() {
		t.Skip("envtest and RabbitMQ")
	}
	a := newAPIBed(t)
	b := newBed(t, "lab")
	p := b.start(a.withAPI(a.writer(b)), func(o *Options) { o.WorkerIdle = time.Minute })
	v := p.submit(t, taskReq("lab"))
	s := newScript(t, "lab", v.MessageID, 2)
	hs := a.hcpSession("lab", b.callerID, v.MessageID)
	c := b.callee("lab")
	c.publish(s.msgs[0])
	c.publish(s.msgs[1])
	seqAtApp(t, b, s.sessionID, 1)
	eventually(t, 4*time.Second, "the worker asleep after event 1", func() error { return workerAsleep(p, s.sessionID) })
	p.stop(t)
	if n := workerGoroutines(); n != 0 {
		t.Errorf("%d worker goroutines after the stop, want 0", n)
	}
	p.sc.mu.Lock()
	left := len(p.sc.streams)
	p.sc.mu.Unlock()
	if left != 0 {
		t.Errorf("%d workers left after the stop, want 0", left)
	}
	if got := a.acked(hs.Name); got != 1 {
		t.Errorf("callerAckedSequence %d after the stop, want 1", got)
	}
}

// workerGoroutines counts the goroutines running a session worker.
func workerGoroutines() int {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	n := 0
	for _, block := range strings.Split(b.String(), "\n\n") {
		if strings.Contains(block, "caller.(*stream).run+") {
			var c int
			if _, err := fmt.Sscanf(block, "%d @", &c); err == nil {
				n += c
			}
		}
	}
	return n
}

// seqAtApp waits until the app has the session's events up to seq.
func seqAtApp(t *testing.T, b *bed, sid string, seq int64) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("event %d at the app", seq), func() error {
		if got := b.lastSeq(sid); got != seq {
			return fmt.Errorf("last sequence %d", got)
		}
		return nil
	})
}

// workerAsleep reports why the session's worker is not asleep, if it is not.
func workerAsleep(p *running, sid string) error {
	if n := workerGoroutines(); n != 0 {
		return fmt.Errorf("%d worker goroutines", n)
	}
	p.sc.mu.Lock()
	defer p.sc.mu.Unlock()
	if w := p.sc.streams[sid]; w == nil || !w.asleep {
		return fmt.Errorf("the worker is gone or awake")
	}
	return nil
}

// workerGone reports whether the session's worker is gone.
func workerGone(p *running, sid string) error {
	p.sc.mu.Lock()
	defer p.sc.mu.Unlock()
	if p.sc.streams[sid] != nil {
		return fmt.Errorf("still there")
	}
	return nil
}

// stopClean checks that the app saw no duplicate and no problem, stops the
// sidecar and checks the session's callerAckedSequence.
func stopClean(t *testing.T, a *apiBed, b *bed, p *running, hsName string, acked int64) {
	t.Helper()
	if snap := b.app.Snapshot(); snap.Duplicates != 0 || snap.Problems != 0 {
		t.Errorf("the app saw %d duplicates, %d problems; want none", snap.Duplicates, snap.Problems)
	}
	p.stop(t)
	if got := a.acked(hsName); got != acked {
		t.Errorf("callerAckedSequence %d after the stop, want %d", got, acked)
	}
}
