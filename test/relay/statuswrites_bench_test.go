package relay

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// benchStatusWrites counts HCPSession status writes while sessions receive
// 100 events/s each.
func benchStatusWrites(b *testing.B) {
	if b.N == 1 {
		return // the framework's probe run (see benchRelayVsRaw)
	}
	const sessions, perSession = 3, 100.0
	secs := envInt("HCP_BENCH_STATUS_SECONDS", 10)
	loadBefore := loadavg()
	r := newRelayRun(b, modeSimple, sessions)
	defer r.close()
	hist := watchSessions(b, r.bed)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(secs)*time.Second+5*time.Minute)
	defer cancel()
	sids, err := r.startSessions(ctx)
	if err != nil {
		b.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // the start-up writes are done
	calleeW, callerW := objectWrites(r.bed.CalleeReg), objectWrites(r.bed.CallerReg)

	n := int(perSession) * sessions * secs
	rec := benchutil.NewRecorder(benchutil.NewRunID("status"), n)
	r.app.setRecorder(rec)
	start := time.Now()
	if err := r.emit(ctx, sids, n, perSession*sessions, rec); err != nil {
		b.Fatal(err)
	}
	if err := waitRecorder(ctx, rec); err != nil {
		b.Fatal(err)
	}
	elapsed := time.Since(start)
	calleeRun, callerRun := objectWrites(r.bed.CalleeReg)-calleeW, objectWrites(r.bed.CallerReg)-callerW
	// Idle: after one interval of each writer for its trailing coalesced
	// write (the caller sidecar's is caller.DefaultStatusInterval, 5 s),
	// nothing changes, so nothing may be written.
	time.Sleep(max(1500*time.Millisecond, caller.DefaultStatusInterval+500*time.Millisecond))
	calleeIdle0, callerIdle0 := objectWrites(r.bed.CalleeReg), objectWrites(r.bed.CallerReg)
	idleStart := time.Now()
	time.Sleep(3 * time.Second)
	idleEnd := time.Now()
	calleeIdle, callerIdle := objectWrites(r.bed.CalleeReg)-calleeIdle0, objectWrites(r.bed.CallerReg)-callerIdle0
	completeAt := time.Now()
	if err := r.finish(ctx, sids); err != nil {
		b.Fatal(err)
	}
	// Terminal states are written at once; callerAckedSequence follows
	// within an interval.
	testbed.Eventually(b, 15*time.Second, "final status", func(ctx context.Context) error {
		for _, sid := range sids {
			hs, err := r.bed.hcpSession(ctx, sid)
			if err != nil {
				return err
			}
			if hs.Status.State != "COMPLETED" || hs.Status.CallerAckedSequence != hs.Status.LastSequence {
				return fmt.Errorf("%s: state %s lastSequence %d callerAckedSequence %d", sid, hs.Status.State, hs.Status.LastSequence, hs.Status.CallerAckedSequence)
			}
		}
		return nil
	})
	time.Sleep(1500 * time.Millisecond)
	res := rec.Result()

	sessionSecs := float64(sessions) * elapsed.Seconds()
	// Versions the API server stored per session during the run (a write
	// that changes nothing stores no new version).
	var stored, storedIdle int
	for _, sid := range sids {
		for _, l := range hist.of(sid) {
			switch {
			case l.At.After(start) && l.At.Before(start.Add(elapsed)):
				stored++
			case l.At.After(idleStart) && l.At.Before(idleEnd):
				storedIdle++
			}
		}
	}
	b.Logf("status writes during the run: callee sidecar %.0f, caller sidecar %.0f (%.2f and %.2f per session-second); versions stored by the API server %d (%.2f per session-second)",
		calleeRun, callerRun, calleeRun/sessionSecs, callerRun/sessionSecs, stored, float64(stored)/sessionSecs)
	b.Logf("status writes while idle for 3s: callee %.0f, caller %.0f; versions stored %d", calleeIdle, callerIdle, storedIdle)
	b.Logf("status writes in all (decision, run, terminal): callee %.0f, caller %.0f for %d sessions",
		objectWrites(r.bed.CalleeReg), objectWrites(r.bed.CallerReg), sessions)
	var terminalDelay time.Duration // complete → COMPLETED stored, slowest session
	for _, sid := range sids {
		for _, l := range hist.of(sid) {
			if l.State == "COMPLETED" {
				terminalDelay = max(terminalDelay, l.At.Sub(completeAt))
				break
			}
		}
	}
	b.Logf("COMPLETED stored within %s of the harness's complete calls", terminalDelay.Round(time.Millisecond))
	b.Logf("%d sessions × %.0f events/s for %s (%d events, %s); load average before %s, after %s",
		sessions, perSession, elapsed.Round(time.Millisecond), n, res, loadBefore, loadavg())
	b.Logf("HCPSession %s as the API server stored it:\n%s", sids[0], formatHistory(hist.of(sids[0])))
	b.ReportMetric(float64(terminalDelay)/float64(time.Millisecond), "terminal-write-ms")
	b.ReportMetric(calleeRun/sessionSecs, "callee-writes/session-s")
	b.ReportMetric(callerRun/sessionSecs, "caller-writes/session-s")
	b.ReportMetric(float64(stored)/sessionSecs, "stored-versions/session-s")
	b.ReportMetric(calleeIdle+callerIdle, "idle-writes")
	// DESIGN.md section 7: at most one write per session per interval (1 s)
	// per writer; one more for the interval the run started in.
	if limit := float64(sessions) * (elapsed.Seconds() + 1); calleeRun > limit || callerRun > limit {
		b.Errorf("more status writes than one per session per second: callee %.0f, caller %.0f, limit %.0f", calleeRun, callerRun, limit)
	}
	if calleeIdle+callerIdle != 0 {
		b.Errorf("status writes while nothing changed: callee %.0f, caller %.0f", calleeIdle, callerIdle)
	}
}

// objectWrites is what a sidecar wrote to HCPSessions, all results:
// hcp_sidecar_status_writes_total, plus the metadata patches of
// hcp_sidecar_state_label_writes_total where the sidecar has them.
func objectWrites(reg *prometheus.Registry) float64 {
	return gathered(reg, "hcp_sidecar_status_writes_total") + gathered(reg, "hcp_sidecar_state_label_writes_total")
}

// gathered sums every series of the counter name in reg.
func gathered(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
