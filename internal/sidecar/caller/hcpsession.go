package caller

import (
	"context"
	"errors"
	"fmt"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// lookupRetry is how long a missing HCPSession is not looked up again.
const lookupRetry = 10 * time.Second

// lookupTimeout bounds one HCPSession read.
const lookupTimeout = 5 * time.Second

// lookup is what an HCPSession read said about a session.
type lookup struct {
	// found: an HCPSession of this caller is in the sidecar's namespace.
	found bool
	// foreign: the HCPSession names another caller.
	foreign  bool
	calleeID string
	// namespace and uid of the HCPSession read (for its Events).
	namespace string
	uid       types.UID
	at        time.Time
	// err is a read failure that says nothing (never cached).
	err error
}

// errAbsent says that the API server has no HCPSession of that name where
// the sidecar looked: definitive, unlike a read failure or a refusal
// (Forbidden), which say nothing about the session.
var errAbsent = errors.New("no HCPSession of that name")

// readHCPSession reads the HCPSession sid. fresh prefers the uncached
// Reader (a position must not come from a cache that has not seen the last
// write yet) and falls back to the cache only if the API server cannot be
// reached: a cached callerAckedSequence is older, so lower, never higher
// than the stored one, which is safe to resume from. Otherwise the cache is
// asked first and a miss is checked through the Reader (a new HCPSession may
// not be in the cache yet). It returns errAbsent when the API server has
// no HCPSession sid in the sidecar's namespace, and its Forbidden error
// when the sidecar may not read it.
func (s *Sidecar) readHCPSession(ctx context.Context, sid string, fresh bool) (*v1alpha1.HCPSession, error) {
	key := types.NamespacedName{Namespace: s.cfg.Namespace, Name: sid}
	var readers []client.Reader
	authoritative := map[int]bool{}
	add := func(r client.Reader, auth bool) {
		if r != nil {
			authoritative[len(readers)] = auth
			readers = append(readers, r)
		}
	}
	if fresh {
		add(s.o.Reader, true)
		add(s.o.Client, s.o.Reader == nil)
	} else {
		add(s.o.Client, s.o.Reader == nil)
		add(s.o.Reader, true)
	}
	if len(readers) == 0 {
		return nil, errAbsent
	}
	var failure error
	for i, r := range readers {
		var hs v1alpha1.HCPSession
		err := r.Get(ctx, key, &hs)
		switch {
		case err == nil:
			return &hs, nil
		case apierrors.IsNotFound(err) || apierrors.IsForbidden(err):
			if authoritative[i] && apierrors.IsForbidden(err) {
				return nil, err
			}
			if authoritative[i] {
				return nil, fmt.Errorf("%w (%s)", errAbsent, apierrors.ReasonForError(err))
			}
			// A cache miss: the API server decides (next reader), or, if it
			// could not be reached, nothing is known.
		default:
			failure = errors.Join(failure, err)
		}
	}
	if failure == nil {
		return nil, errAbsent
	}
	return nil, failure
}

// findHCPSession reads the HCPSession sid in the sidecar's namespace
// (readHCPSession) and, if it is not there or not readable there, in the
// namespaces the operator lets the sidecar read (findElsewhere). It
// returns errAbsent only when every place looked at said so, and the
// Forbidden error of the sidecar's own namespace when that was the only
// answer there and the others had none.
func (s *Sidecar) findHCPSession(ctx context.Context, sid string, fresh bool) (*v1alpha1.HCPSession, error) {
	hs, err := s.readHCPSession(ctx, sid, fresh)
	if here := err; errors.Is(here, errAbsent) || apierrors.IsForbidden(here) {
		hs, err = s.findElsewhere(ctx, sid)
		if errors.Is(err, errAbsent) && apierrors.IsForbidden(here) {
			err = here // absent elsewhere, unreadable here: nothing known
		}
	}
	return hs, err
}

// lookupSession reads the HCPSession named sid, in the sidecar's namespace
// or one the operator granted (findHCPSession). A hit is kept; a miss is
// re-checked after lookupRetry, or at once with fresh. A read failure is
// returned in lookup.err and not kept.
func (s *Sidecar) lookupSession(sid string, fresh bool) lookup {
	s.mu.Lock()
	l, ok := s.lookups[sid]
	if ok && fresh && !l.found && !l.foreign {
		delete(s.lookups, sid)
		ok = false
	}
	s.mu.Unlock()
	if ok && (l.found || l.foreign || s.clk.Since(l.at) < lookupRetry) {
		return l
	}
	if s.o.Client == nil && s.o.Reader == nil {
		return lookup{}
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx()), lookupTimeout)
	defer cancel()
	hs, err := s.findHCPSession(ctx, sid, false)
	switch {
	case err == nil:
		l = s.lookupOf(hs)
	case errors.Is(err, errAbsent) || apierrors.IsForbidden(err):
		l = lookup{at: s.clk.Now()}
		s.elsewhere.Do(func() {
			s.log.Info("An HCPSession is not readable in this namespace nor in those the operator granted (RBAC does not allow it yet, or the callee has not recorded it yet); until it is, callerAckedSequence is not recorded and positions are durable in the local store only",
				"namespace", s.cfg.Namespace, "session", sid, "reason", err.Error())
		})
		s.log.V(1).Info("No readable HCPSession for this session; callerAckedSequence is not recorded",
			"session", sid, "namespace", s.cfg.Namespace, "reason", err.Error())
	default:
		s.log.Error(err, "Failed to read the HCPSession", "session", sid)
		return lookup{err: err}
	}
	s.mu.Lock()
	s.lookups[sid] = l
	s.mu.Unlock()
	return l
}

// lookupOf turns a read HCPSession into a lookup (and remembers it).
func (s *Sidecar) lookupOf(hs *v1alpha1.HCPSession) lookup {
	l := lookup{found: hs.Spec.CallerID == s.cfg.ID, foreign: hs.Spec.CallerID != s.cfg.ID, calleeID: hs.Spec.CalleeID,
		namespace: hs.Namespace, uid: hs.UID, at: s.clk.Now()}
	s.mu.Lock()
	s.lookups[hs.Name] = l
	s.mu.Unlock()
	return l
}
