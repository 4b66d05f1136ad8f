package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// pendingPace is how long a status that only waits (Ready False
// TopologyPending or DeploymentProgressing) keeps the message it was
// written with when only the messages changed: the list of what is not
// declared yet shrinks child by child during a rollout, and each step
// would be a status write (the API server's most costly write of the
// rollout). The outcome (every condition's status and reason, and every
// other status field) is written at once; the detail at most this late.
const pendingPace = 5 * time.Second

// DefaultFirstStatusWait is how long a Callee or Caller whose status was
// never written may stay without one while its first rollout only waits
// (Ready False TopologyPending or DeploymentProgressing: for the topology
// operator, the Deployment controller) and nothing moves
// (Options.FirstStatusWait). The clock starts at the first reconcile that
// would have written that wait, and again at each one whose wait says
// something else (a child of its own came up: the message changed), and
// whenever a topology child of any object of its kind becomes Ready (the
// topology operator is working through its queue, which this object is
// in). So a rollout that keeps converging writes its status once, Ready,
// instead of once for the wait, once per step (pendingPace) and once for
// Ready (a status patch is the API server's most costly write of a
// rollout). That matters most when many objects come at once: the
// topology operator declares them one at a time with one worker per kind,
// so the last of 1,000 + 1,000 wait over ten minutes for theirs, and
// writes for each wait slow every other (docs/performance.md, Scale). A
// hold ends after maxFirstHolds FirstStatusWaits in any case. Anything
// else (an error, a problem to fix, a failed child, Ready) is written at
// once, and a wait during which nothing moved for FirstStatusWait (the
// topology operator stalled or stopped) is written then. Meanwhile the
// object reads as not yet observed: the CRDs default
// status.observedGeneration to 0, below metadata.generation, so kstatus
// says InProgress and Argo CD Progressing; Ready is absent, so `kubectl
// wait --for=condition=Ready` waits. A minute: a burst of new objects
// waits in the manager's queue and the topology operator's (13 to 27 s
// per object for 20 Callees + 20 Callers on envtest sharing two busy
// cores), and a minute with no progress at all is worth saying.
const DefaultFirstStatusWait = time.Minute

// maxFirstHolds bounds a first status's hold, in FirstStatusWaits since
// the first reconcile that held it (15 minutes by default), however the
// rollouts around it progress.
const maxFirstHolds = 15

// statusPace (nil: none) remembers when each Callee's or Caller's status
// was last written, for pendingPace, and since when its first write has
// been held, for Options.FirstStatusWait.
type statusPace struct {
	mu    sync.Mutex
	at    map[types.UID]time.Time
	first map[types.UID]heldWait
	swept time.Time
	// progressed is when a topology child of this kind last became Ready
	// (progress).
	progressed time.Time
	now        func() time.Time
	// firstWait is Options.FirstStatusWait.
	firstWait time.Duration
}

// heldWait is an object's first status held back: since when, the wait's
// message and since when it has said that, and whether the hold is over.
type heldWait struct {
	first, since time.Time
	detail       string
	over         bool
}

func newStatusPace(firstWait time.Duration) *statusPace {
	return &statusPace{at: map[types.UID]time.Time{}, first: map[types.UID]heldWait{}, now: time.Now, firstWait: firstWait}
}

// wrote records a status write of uid.
func (p *statusPace) wrote(uid types.UID) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.sweep(now)
	p.at[uid] = now
	delete(p.first, uid)
}

// progress records that a topology child of this kind became Ready.
func (p *statusPace) progress() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.progressed = p.now()
}

// forgetHeldAfter is how long a first write's hold is remembered when no
// write ends it (the object was deleted meanwhile), or twice its longest
// hold if that is longer: so that the hold of an object whose reconcile
// comes late after it does not start again. (A restart of the manager
// forgets them all: a hold then starts again, once.)
const forgetHeldAfter = 10 * time.Minute

// sweep forgets, at most every pendingPace, the writes older than
// pendingPace and the holds older than forgetHeldAfter. Call it with mu
// held.
func (p *statusPace) sweep(now time.Time) {
	if now.Sub(p.swept) <= pendingPace {
		return
	}
	for k, t := range p.at {
		if now.Sub(t) > pendingPace {
			delete(p.at, k)
		}
	}
	for k, h := range p.first {
		if now.Sub(h.first) > max(forgetHeldAfter, 2*maxFirstHolds*p.firstWait) {
			delete(p.first, k)
		}
	}
	p.swept = now
}

// holdFirst returns how long the first status write of obj, from before to
// after, may still wait (0: write now): only when before has no Ready
// condition (no status was ever written), after only waits, the reconcile
// returned no error, less than firstWait has passed since the first
// reconcile that held it, the last whose wait said something else, or the
// last progress of its kind, whichever came last, and less than
// maxFirstHolds firstWaits since the first. Once over, a hold does not
// start again until a write.
func (p *statusPace) holdFirst(obj client.Object, before, after view, err error) time.Duration {
	if p == nil || p.firstWait <= 0 || err != nil || meta.FindStatusCondition(*before.conditions, hcpv1alpha1.ConditionReady) != nil {
		return 0
	}
	r := meta.FindStatusCondition(*after.conditions, hcpv1alpha1.ConditionReady)
	if r == nil || r.Status == metav1.ConditionTrue || !waiting(r) {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	p.sweep(now)
	h, ok := p.first[obj.GetUID()]
	switch {
	case !ok:
		h = heldWait{first: now, since: now, detail: r.Message}
	case !h.over && p.holdLeft(h, now) <= 0:
		h.over = true
	case h.detail != r.Message:
		// A step of the rollout: it goes on, so the hold does.
		h.since, h.detail = now, r.Message
	}
	p.first[obj.GetUID()] = h
	if h.over {
		return 0
	}
	return p.holdLeft(h, now) // > 0: a hold not over has time left
}

// holdLeft is what is left at now of h's hold. Call it with mu held.
func (p *statusPace) holdLeft(h heldWait, now time.Time) time.Duration {
	moved := h.since
	if p.progressed.After(moved) {
		moved = p.progressed
	}
	return min(p.firstWait-now.Sub(moved), maxFirstHolds*p.firstWait-now.Sub(h.first))
}

// hold returns how long the write of obj's status from before to after
// may wait (0: write now): only when both wait, differ in condition
// messages alone, and the last write was less than pendingPace ago.
func (p *statusPace) hold(obj client.Object, before, after view) time.Duration {
	if p == nil || !onlyWaitingDetail(obj, before, after) {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	last, ok := p.at[obj.GetUID()]
	if !ok {
		return 0
	}
	if left := pendingPace - p.now().Sub(last); left > 0 {
		return left
	}
	return 0
}

// onlyWaitingDetail reports whether before and after (statuses of obj's
// kind) both have a waiting Ready and differ only in conditions' messages.
func onlyWaitingDetail(obj client.Object, before, after view) bool {
	for _, v := range []view{before, after} {
		r := meta.FindStatusCondition(*v.conditions, hcpv1alpha1.ConditionReady)
		if r == nil || r.Status == metav1.ConditionTrue || !waiting(r) {
			return false
		}
	}
	strip := func(v view) any {
		c := obj.DeepCopyObject().(client.Object)
		cv, _ := viewOf(c)
		cv.setStatus(v.status)
		for i := range *cv.conditions {
			(*cv.conditions)[i].Message = ""
		}
		return cv.status
	}
	return equality.Semantic.DeepEqual(strip(before), strip(after))
}
