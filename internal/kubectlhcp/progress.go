package kubectlhcp

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// What watch shows. A view gets every version of a session the watch sees;
// the changes between two versions are computed by diffSession (pure), and
// each view renders them its own way: progress bars on a terminal
// (barView, mpb), plain lines otherwise (plainView).

// changeKind is what changed between two versions of a session.
type changeKind int

const (
	changeState changeKind = iota
	changeProgress
	changeCheckpoint
	changeAbortRequested
)

// change is one thing that changed in a session's status.
type change struct {
	kind     changeKind
	from, to hcpv1alpha1.SessionState
	reason   string
	at       time.Time
}

// diffSession lists what changed from prev to cur (prev nil: cur is new;
// nothing is reported but its state). Progress, checkpoint and abort come
// before a state change seen in the same version: they happened before it.
// Times come from the status where it records them, else now.
func diffSession(prev, cur *hcpv1alpha1.HCPSession, now time.Time) []change {
	var out []change
	if prev != nil {
		if progressKey(prev.Status.Progress) != progressKey(cur.Status.Progress) && cur.Status.Progress != nil {
			at := now
			if cur.Status.LastEventAt != nil {
				at = cur.Status.LastEventAt.Time
			}
			out = append(out, change{kind: changeProgress, at: at})
		}
		if cp := cur.Status.LastCheckpoint; cp != nil && (prev.Status.LastCheckpoint == nil || prev.Status.LastCheckpoint.ID != cp.ID) {
			at := now
			if cp.CreatedAt != nil {
				at = cp.CreatedAt.Time
			}
			out = append(out, change{kind: changeCheckpoint, at: at})
		}
		if cur.Spec.AbortRequested && !prev.Spec.AbortRequested {
			out = append(out, change{kind: changeAbortRequested, at: now})
		}
	}
	from := hcpv1alpha1.SessionState("")
	if prev != nil {
		from = stateOf(prev)
	}
	if to := stateOf(cur); to != from {
		at := now
		switch {
		case to.IsTerminal() && cur.Status.CompletedAt != nil:
			at = cur.Status.CompletedAt.Time
		case to == hcpv1alpha1.SessionRunning && from == hcpv1alpha1.SessionPending && cur.Status.StartedAt != nil:
			at = cur.Status.StartedAt.Time
		case to == hcpv1alpha1.SessionPending:
			at = cur.CreationTimestamp.Time
		}
		out = append(out, change{kind: changeState, from: from, to: to, reason: cur.Status.Reason, at: at})
	}
	return out
}

func progressKey(p *hcpv1alpha1.SessionProgress) string {
	if p == nil {
		return ""
	}
	return fmt.Sprintf("%s\x00%s\x00%s", percentText(p), p.Stage, p.Message)
}

// shortID is the first 8 characters of a session name (the UUID's first
// group), enough to tell sessions apart on one screen.
func shortID(name string) string {
	if len(name) > 8 {
		return name[:8]
	}
	return name
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05Z") }

// headerLine introduces a session: its id, callee, capability, caller and
// current state.
func headerLine(hs *hcpv1alpha1.HCPSession) string {
	s := fmt.Sprintf("session %s: %s on %s for %s, %s", hs.Name, hs.Spec.Capability, hs.Spec.CalleeID, hs.Spec.CallerID, stateOf(hs))
	if p := hs.Status.Progress; p != nil && p.Percent != nil {
		s += " " + percentText(p)
	}
	return s
}

// changeLine is one line for a change, as the plain output prints it (and
// the bars print above themselves).
func changeLine(hs *hcpv1alpha1.HCPSession, c change) string {
	id := shortID(hs.Name)
	switch c.kind {
	case changeState:
		s := fmt.Sprintf("%s %s %s → %s", clock(c.at), id, orDash(string(c.from)), c.to)
		if c.from == "" {
			s = fmt.Sprintf("%s %s %s", clock(c.at), id, c.to)
		}
		if c.reason != "" {
			s += " (" + c.reason + ")"
		}
		return s
	case changeProgress:
		return fmt.Sprintf("%s %s %s %s", clock(c.at), id, padPercent(hs.Status.Progress), progressText(hs.Status.Progress))
	case changeCheckpoint:
		cp := hs.Status.LastCheckpoint
		s := fmt.Sprintf("%s %s checkpoint %s", clock(c.at), id, cp.ID)
		if cp.Description != "" {
			s += ": " + cp.Description
		}
		return s
	case changeAbortRequested:
		return fmt.Sprintf("%s %s abort requested", clock(c.at), id)
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func padPercent(p *hcpv1alpha1.SessionProgress) string {
	return fmt.Sprintf("%4s", percentText(p))
}

// progressText is "stage: message", either alone, or "" without progress.
func progressText(p *hcpv1alpha1.SessionProgress) string {
	if p == nil {
		return ""
	}
	switch {
	case p.Stage != "" && p.Message != "":
		return p.Stage + ": " + p.Message
	case p.Stage != "":
		return p.Stage
	}
	return p.Message
}

// outcomeLine sums up an ended session: its state, how long it ran, and
// the result summary or the error.
func outcomeLine(hs *hcpv1alpha1.HCPSession) string {
	st := hs.Status
	s := fmt.Sprintf("session %s %s", hs.Name, stateOf(hs))
	if st.StartedAt != nil && st.CompletedAt != nil {
		s += " after " + spanText(st.CompletedAt.Sub(st.StartedAt.Time))
	}
	if st.EventCount > 0 {
		s += fmt.Sprintf(", %d events", st.EventCount)
	}
	switch {
	case st.Result != nil && st.Result.Summary != "":
		s += ": " + oneLine(st.Result.Summary, 200)
	case st.Error != nil && (st.Error.Code != "" || st.Error.Message != ""):
		s += ": " + strings.TrimPrefix(st.Error.Code+": "+oneLine(st.Error.Message, 200), ": ")
	case st.Reason != "":
		s += " (" + st.Reason + ")"
	}
	if st.Result != nil && len(st.Result.Artifacts) > 0 {
		s += fmt.Sprintf(" [%d artifacts]", len(st.Result.Artifacts))
	}
	return s
}

// outcomeCode is the exit code of an ended session.
func outcomeCode(s hcpv1alpha1.SessionState) int {
	switch s {
	case hcpv1alpha1.SessionCompleted:
		return ExitOK
	case hcpv1alpha1.SessionFailed:
		return ExitFailed
	case hcpv1alpha1.SessionAborted:
		return ExitAborted
	case hcpv1alpha1.SessionRejected:
		return ExitRejected
	}
	return ExitFailure
}

func oneLine(s string, max int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > max {
		return string(r[:max-1]) + "…"
	}
	return s
}

// view renders what watch sees.
type view interface {
	// add shows a session for the first time.
	add(hs *hcpv1alpha1.HCPSession)
	// update shows a new version and what changed.
	update(hs *hcpv1alpha1.HCPSession, changes []change)
	// end shows an ended session's outcome (or, gone, its deletion).
	end(hs *hcpv1alpha1.HCPSession, gone bool)
	// note prints a line of its own.
	note(line string)
	// close stops rendering; nothing may be called after it.
	close()
}

// plainView prints one line per change: for logs, pipes and CI.
type plainView struct {
	w   io.Writer
	now func() time.Time
}

func (v *plainView) add(hs *hcpv1alpha1.HCPSession) {
	v.println(headerLine(hs))
	if p := hs.Status.Progress; p != nil && !stateOf(hs).IsTerminal() {
		v.println(changeLine(hs, change{kind: changeProgress, at: v.now()}))
	}
}

func (v *plainView) update(hs *hcpv1alpha1.HCPSession, changes []change) {
	for _, c := range changes {
		v.println(changeLine(hs, c))
	}
}

func (v *plainView) end(hs *hcpv1alpha1.HCPSession, gone bool) {
	if gone {
		v.println(fmt.Sprintf("%s %s deleted before it ended (last seen %s)", clock(v.now()), hs.Name, stateOf(hs)))
		return
	}
	v.println(outcomeLine(hs))
}

func (v *plainView) note(line string) { v.println(line) }
func (v *plainView) close()           {}

func (v *plainView) println(s string) { _, _ = fmt.Fprintln(v.w, s) }

// barView draws one progress bar per session (mpb) and prints state
// transitions above the bars as they happen.
type barView struct {
	p    *mpb.Progress
	now  func() time.Time
	mu   sync.Mutex
	bars map[string]*sessionBar
}

// sessionBar is one session's bar and what its decorators show.
type sessionBar struct {
	bar *mpb.Bar
	mu  sync.Mutex
	hs  *hcpv1alpha1.HCPSession
}

func (b *sessionBar) get() *hcpv1alpha1.HCPSession {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hs
}

func (b *sessionBar) set(hs *hcpv1alpha1.HCPSession) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.hs = hs
}

func newBarView(w io.Writer, now func() time.Time) *barView {
	return &barView{
		p:    mpb.New(mpb.WithOutput(w), mpb.WithWidth(100), mpb.WithRefreshRate(120*time.Millisecond), mpb.WithAutoRefresh()),
		now:  now,
		bars: map[string]*sessionBar{},
	}
}

func (v *barView) add(hs *hcpv1alpha1.HCPSession) {
	v.note(headerLine(hs))
	sb := &sessionBar{hs: hs}
	label := shortID(hs.Name) + " " + hs.Spec.Capability
	// total 0: the bar completes only when told (SetTotal with force), not
	// when a harness reports 100% before it calls complete.
	sb.bar = v.p.AddBar(0,
		mpb.PrependDecorators(
			decor.Name(label, decor.WCSyncSpaceR),
			decor.Any(func(decor.Statistics) string { return string(stateOf(sb.get())) }, decor.WCSyncSpaceR),
		),
		mpb.AppendDecorators(
			decor.Any(func(decor.Statistics) string { return padPercent(sb.get().Status.Progress) }, decor.WCSyncSpace),
			decor.Any(func(decor.Statistics) string { return oneLine(progressText(sb.get().Status.Progress), 48) }, decor.WCSyncSpace),
		),
	)
	sb.bar.SetTotal(100, false)
	sb.bar.SetCurrent(int64(percentOf(hs)))
	v.mu.Lock()
	v.bars[hs.Name] = sb
	v.mu.Unlock()
}

func percentOf(hs *hcpv1alpha1.HCPSession) int32 {
	if p := hs.Status.Progress; p != nil && p.Percent != nil {
		return *p.Percent
	}
	return 0
}

func (v *barView) bar(name string) *sessionBar {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.bars[name]
}

func (v *barView) update(hs *hcpv1alpha1.HCPSession, changes []change) {
	sb := v.bar(hs.Name)
	if sb == nil {
		return
	}
	sb.set(hs)
	sb.bar.SetCurrent(int64(percentOf(hs)))
	for _, c := range changes {
		// Progress is the bar's to show; the rest goes above the bars.
		if c.kind != changeProgress {
			v.note(changeLine(hs, c))
		}
	}
}

func (v *barView) end(hs *hcpv1alpha1.HCPSession, gone bool) {
	sb := v.bar(hs.Name)
	if sb == nil {
		return
	}
	sb.set(hs)
	if gone {
		v.note(fmt.Sprintf("%s %s deleted before it ended (last seen %s)", clock(v.now()), hs.Name, stateOf(hs)))
		sb.bar.Abort(false)
		return
	}
	v.note(outcomeLine(hs))
	if stateOf(hs) == hcpv1alpha1.SessionCompleted {
		sb.bar.SetTotal(100, true)
	} else {
		sb.bar.Abort(false)
	}
}

func (v *barView) note(line string) { _, _ = v.p.Write([]byte(line + "\n")) }

func (v *barView) close() {
	v.mu.Lock()
	for _, sb := range v.bars {
		if !sb.bar.Completed() && !sb.bar.Aborted() {
			sb.bar.Abort(false)
		}
	}
	v.mu.Unlock()
	v.p.Wait()
}
