package callee

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"context"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

var podGVK = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}

// recover ends the sessions a previous incarnation of this sidecar (same
// pod name: a container restart) left behind, before any new command is
// consumed. A session must never stay RUNNING with nobody running it.
func (s *Sidecar) recover(ctx context.Context) {
	s.sweep(ctx, true)
}

// sweepLoop periodically takes over the sessions of replicas that are
// gone (their Lease expired, or, without a Lease, their pod no longer
// exists) and the sessions released at a drain (see takeOver); PENDING
// records are deleted, so the redelivered command is decided anew. The
// status write that claims a session is an optimistic-lock write, so one
// replica wins when several sweep at once.
func (s *Sidecar) sweepLoop(ctx context.Context) {
	t := s.clk.NewTicker(s.t.SweepInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			s.sweep(ctx, false)
		}
	}
}

func (s *Sidecar) sweep(ctx context.Context, startup bool) {
	var list v1alpha1.HCPSessionList
	// At startup read the API server: the cache may not have synced.
	var r client.Reader = s.c
	if startup {
		r = s.reader
	}
	if err := r.List(ctx, &list, client.InNamespace(s.ns), client.MatchingLabels{v1alpha1.LabelCalleeID: s.id}); err != nil {
		s.log.Error(err, "Failed to list HCPSessions for recovery")
		return
	}
	alive := map[string]bool{}
	for i := range list.Items {
		hs := &list.Items[i]
		st := hs.Status.State
		if st.IsTerminal() || s.isLocal(hs.Name) {
			continue
		}
		owner := decidingPod(hs)
		orphan := false
		switch {
		case owner == s.pod:
			orphan = true // not in memory: a previous incarnation's
		case released(hs):
			orphan = !s.draining()
		case owner == "":
			// Created, not even PENDING recorded yet: orphaned once old.
			orphan = s.clk.Since(hs.CreationTimestamp.Time) > s.t.PendingWait
		default:
			a, ok := alive[owner]
			if !ok {
				a = s.ownerAlive(ctx, owner)
				alive[owner] = a
			}
			orphan = !a && !s.draining()
		}
		if orphan {
			s.takeOver(ctx, hs)
		}
	}
}

func (s *Sidecar) isLocal(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, deciding := s.deciding[id]
	_, running := s.sessions[id]
	return deciding || running
}

// claiming marks id as being taken over here (isLocal reports it, so no
// second sweep claims it again meanwhile); false when it already is local.
// The returned func ends the mark.
func (s *Sidecar) claiming(id string) (func(), bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, deciding := s.deciding[id]
	_, running := s.sessions[id]
	if deciding || running {
		return nil, false
	}
	done := make(chan struct{})
	s.deciding[id] = done
	return func() {
		s.mu.Lock()
		if s.deciding[id] == done {
			delete(s.deciding, id)
		}
		s.mu.Unlock()
		close(done)
	}, true
}
