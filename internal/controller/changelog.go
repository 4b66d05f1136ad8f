package controller

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

// changeLog collects the children one reconcile created, updated and
// deleted, for one Event per verb instead of one per child (emitChanges),
// and the first child of each verb, the Event's related object.
type changeLog struct {
	byVerb map[string][]string
	first  map[string]client.Object
}

// The verbs of a changeLog, in the order emitChanges records them.
const (
	verbCreated = "Created"
	verbUpdated = "Updated"
	verbDeleted = "Deleted"
)

var changeVerbs = []string{verbCreated, verbUpdated, verbDeleted}

// actionOf is an Event's action for a changeLog verb.
func actionOf(verb string) string {
	if verb == verbDeleted {
		return "Delete"
	}
	return "Apply"
}

type changeLogKey struct{}

// withChangeLog returns ctx carrying a new changeLog.
func withChangeLog(ctx context.Context) (context.Context, *changeLog) {
	l := &changeLog{byVerb: map[string][]string{}, first: map[string]client.Object{}}
	return context.WithValue(ctx, changeLogKey{}, l), l
}

// verbOf is the changeLog verb of an apply's result ("" for none).
func verbOf(op controllerutil.OperationResult) string {
	switch op {
	case controllerutil.OperationResultNone:
		return ""
	case controllerutil.OperationResultCreated:
		return verbCreated
	default:
		return verbUpdated
	}
}

// noteChange records that obj (a child of owner) was created, updated or
// deleted (verb): in the reconcile's changeLog, or, outside a reconcile
// that keeps one, as an Event of its own.
func (c *core) noteChange(ctx context.Context, owner, obj client.Object, kind, verb string) {
	if owner == nil || verb == "" {
		return
	}
	what := kind + " " + obj.GetName()
	if ns := obj.GetNamespace(); ns != "" && ns != owner.GetNamespace() {
		what = kind + " " + ns + "/" + obj.GetName()
	}
	if l, ok := ctx.Value(changeLogKey{}).(*changeLog); ok {
		l.byVerb[verb] = append(l.byVerb[verb], what)
		if l.first[verb] == nil {
			l.first[verb] = obj
		}
		return
	}
	c.recorder.Eventf(owner, obj, corev1.EventTypeNormal, verb, actionOf(verb), "%s %s", verb, what)
}

// maxEventNote is an Event's note limit (events.k8s.io: 1 KiB).
const maxEventNote = 1024

// emitChanges records one Event per verb for what the reconcile of owner
// created, updated and deleted. The first of those children is the Event's
// related object: client-go's events recorder takes two Events alike in
// all but their note (same type, reason, action, regarding object at the
// same resourceVersion, and related object) for one recurring Event, and
// only counts the second in the first's series, so without it a later
// reconcile's "Created Binding x" on an owner not written in between
// would be lost in the first reconcile's Event.
//
// With rollout (the owner's first rollout: firstRollout), no Created Event:
// a new object's children are all created, and one API write per object
// for an Event that says so is the largest cost of an Event at scale;
// Ready's conditions say how the rollout goes. Updates, deletions, and
// children created later (re-created after a deletion, added by a spec
// change) keep their Events.
func (c *core) emitChanges(owner client.Object, l *changeLog, rollout bool) {
	for _, verb := range changeVerbs {
		if rollout && verb == verbCreated {
			continue
		}
		if children := l.byVerb[verb]; len(children) > 0 {
			c.recorder.Eventf(owner, l.first[verb], corev1.EventTypeNormal, verb, actionOf(verb), "%s", changeNote(verb, children))
		}
	}
}

// changeNote names the children after verb, as many as fit in an Event's
// note, and counts the rest.
func changeNote(verb string, children []string) string {
	note := verb
	for i, ch := range children {
		sep := " "
		if i > 0 {
			sep = ", "
		}
		more := fmt.Sprintf(" and %d more", len(children)-i)
		if len(note)+len(sep)+len(ch)+len(more) > maxEventNote && i < len(children)-1 ||
			len(note)+len(sep)+len(ch) > maxEventNote {
			return note + more
		}
		note += sep + ch
	}
	return note
}
