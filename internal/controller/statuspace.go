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

// statusPace (nil: none) remembers when each Callee's or Caller's status
// was last written, for pendingPace.
type statusPace struct {
	mu    sync.Mutex
	at    map[types.UID]time.Time
	swept time.Time
	now   func() time.Time
}

func newStatusPace() *statusPace {
	return &statusPace{at: map[types.UID]time.Time{}, now: time.Now}
}

// wrote records a status write of uid.
func (p *statusPace) wrote(uid types.UID) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if now.Sub(p.swept) > pendingPace {
		for k, t := range p.at {
			if now.Sub(t) > pendingPace {
				delete(p.at, k)
			}
		}
		p.swept = now
	}
	p.at[uid] = now
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
