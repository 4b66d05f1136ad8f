package caller

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// adoptTask records the task of an HCPSession of this caller that the
// store does not know (submitted by an earlier pod), so that its answer is
// recognised as this caller's and the GET endpoints show it. Its state is
// the HCPSession's decision; an adopted task is never republished.
func (s *Sidecar) adoptTask(hs *v1alpha1.HCPSession) (TaskRecord, error) {
	tid := strings.ToLower(hs.Spec.TaskMessageID)
	st := TaskAccepted
	switch hs.DecidedState() {
	case "", v1alpha1.SessionPending:
		st = TaskPending
	case v1alpha1.SessionRejected:
		st = TaskRejected
	}
	created := false
	rec, err := s.store.UpdateTask(tid, func(t *TaskRecord) bool {
		if t.CalleeID != "" {
			return false // known: this store's record stands
		}
		created = true
		*t = TaskRecord{MessageID: tid, CalleeID: hs.Spec.CalleeID, Capability: hs.Spec.Capability, State: st,
			SessionID: hs.Name, SubmittedAt: hs.CreationTimestamp.Time, RiskLevel: string(hs.Spec.RiskLevel), Adopted: true}
		if st.answered() {
			t.AnsweredAt = hs.CreationTimestamp.Time
		}
		if st == TaskRejected && hs.Status.Error != nil {
			t.ReasonCode, t.ReasonMessage = hs.Status.Error.Code, hs.Status.Error.Message
		}
		return true
	})
	if created {
		if st.answered() {
			s.markAnswered(tid)
		}
		s.log.Info("Adopted a task submitted by an earlier pod of this caller, from its HCPSession", "task", tid,
			"callee", hs.Spec.CalleeID, "state", st)
	}
	return rec, err
}

// adoptTaskByID finds the HCPSession of task id (submitted by an earlier
// pod of this caller) and adopts the task. With calleeID the session's name
// is known and only the cache is asked (a submit); without it, HCPSessions
// of this caller are listed, cache first.
func (s *Sidecar) adoptTaskByID(ctx context.Context, id, calleeID string) (TaskRecord, bool) {
	if s.o.Client == nil && s.o.Reader == nil {
		return TaskRecord{}, false
	}
	ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	var found *v1alpha1.HCPSession
	if calleeID != "" {
		if s.o.Client == nil {
			return TaskRecord{}, false
		}
		// Sessions decided by callees of earlier releases carry the legacy id.
		for _, name := range []string{topology.SessionID(calleeID, s.cfg.ID, id), topology.LegacySessionID(calleeID, id)} {
			var hs v1alpha1.HCPSession
			if err := s.o.Client.Get(ctx, types.NamespacedName{Namespace: s.cfg.Namespace, Name: name}, &hs); err == nil && hs.Spec.CallerID == s.cfg.ID {
				found = &hs
				break
			}
		}
		if found == nil {
			return TaskRecord{}, false
		}
	} else {
		// The cache holds only this caller's HCPSessions, without their
		// labels (cachetrim.CallerSession): it is listed whole.
		for i, r := range []client.Reader{s.o.Client, s.o.Reader} {
			if r == nil {
				continue
			}
			opts := []client.ListOption{client.InNamespace(s.cfg.Namespace)}
			if i == 1 {
				opts = append(opts, client.MatchingLabels{v1alpha1.LabelCallerID: s.cfg.ID})
			}
			var list v1alpha1.HCPSessionList
			if err := r.List(ctx, &list, opts...); err != nil {
				continue
			}
			for i := range list.Items {
				if list.Items[i].Spec.CallerID == s.cfg.ID && strings.EqualFold(list.Items[i].Spec.TaskMessageID, id) {
					found = &list.Items[i]
					break
				}
			}
			if found != nil {
				break
			}
		}
	}
	if found == nil || found.Spec.CallerID != s.cfg.ID || !strings.EqualFold(found.Spec.TaskMessageID, id) {
		return TaskRecord{}, false
	}
	rec, err := s.adoptTask(found)
	if err != nil {
		s.log.Error(err, "Failed to record an adopted task", "task", id)
	}
	return rec, rec.CalleeID != ""
}
