package kubectlhcp

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

// What -o json|yaml prints (docs/kubectl-plugin.md#output):
//
//	sessions  a List of the HCPSessions as stored, each with the table's
//	          columns under "columns" (SessionColumns)
//	describe  a SessionDescription (cli.hcp.io/v1alpha1): the session, its
//	          columns, the L3 decision, the pod, the timeline
//	topology  a List of HarnessTopology (cli.hcp.io/v1alpha1), one per
//	          Callee or Caller
//
// -o name prints the API objects: hcpsession.hcp.io/NAME,
// callee.hcp.io/NAME, caller.hcp.io/NAME.

// SessionColumns are the sessions table's computed columns, as of when
// the command ran, with the times also in seconds for scripts.
type SessionColumns struct {
	// State is STATE: status.state, PENDING while the gate has not
	// decided.
	State string `json:"state"`
	// Progress is PROGRESS as shown ("40%", "-" before the first progress
	// event); Percent the number.
	Progress string `json:"progress"`
	Percent  *int32 `json:"percent,omitempty"`
	Stage    string `json:"stage,omitempty"`
	// Age is AGE, since creation; AgeSeconds the same in seconds.
	Age        string `json:"age"`
	AgeSeconds int64  `json:"ageSeconds"`
	// Duration is DURATION: status.startedAt to completedAt, or to now
	// while it runs; "-" (and no durationSeconds) when it never ran.
	Duration        string `json:"duration"`
	DurationSeconds *int64 `json:"durationSeconds,omitempty"`
	// LastEvent is LAST EVENT ("#14 3s ago"); LastEventAgoSeconds how
	// long ago status.lastEventAt was.
	LastEvent           string `json:"lastEvent"`
	LastEventAgoSeconds *int64 `json:"lastEventAgoSeconds,omitempty"`
}

// columnsOf computes a session's columns at now.
func columnsOf(hs *hcpv1alpha1.HCPSession, now time.Time) SessionColumns {
	c := SessionColumns{
		State:     string(stateOf(hs)),
		Progress:  percentText(hs.Status.Progress),
		Age:       age(hs.CreationTimestamp.Time, now),
		Duration:  sessionDuration(hs, now),
		LastEvent: lastEvent(hs, now),
	}
	if p := hs.Status.Progress; p != nil {
		c.Percent, c.Stage = p.Percent, p.Stage
	}
	if !hs.CreationTimestamp.IsZero() {
		c.AgeSeconds = seconds(now.Sub(hs.CreationTimestamp.Time))
	}
	if c.Duration != "-" {
		end := now
		if hs.Status.CompletedAt != nil {
			end = hs.Status.CompletedAt.Time
		}
		d := seconds(end.Sub(hs.Status.StartedAt.Time))
		c.DurationSeconds = &d
	}
	if t := hs.Status.LastEventAt; t != nil {
		d := seconds(now.Sub(t.Time))
		c.LastEventAgoSeconds = &d
	}
	return c
}

func seconds(d time.Duration) int64 { return max(int64(d/time.Second), 0) }

// sessionObject is the HCPSession as stored, with its columns beside
// spec and status.
func sessionObject(hs *hcpv1alpha1.HCPSession, now time.Time, keepManagedFields bool) (*unstructured.Unstructured, error) {
	u, err := apiObject(hs, keepManagedFields)
	if err != nil {
		return nil, err
	}
	cols, err := toMap(columnsOf(hs, now))
	if err != nil {
		return nil, err
	}
	u.Object["columns"] = cols
	return u, nil
}

// sessionsObject is what sessions -o prints: a List of sessionObjects;
// for -o name, of the bare HCPSessions.
func sessionsObject(sessions []hcpv1alpha1.HCPSession, now time.Time, keepManagedFields, bare bool) (runtime.Object, error) {
	items := make([]unstructured.Unstructured, 0, len(sessions))
	for i := range sessions {
		var u *unstructured.Unstructured
		var err error
		if bare {
			u, err = apiObject(&sessions[i], keepManagedFields)
		} else {
			u, err = sessionObject(&sessions[i], now, keepManagedFields)
		}
		if err != nil {
			return nil, err
		}
		items = append(items, *u)
	}
	return list(items), nil
}

// SessionDescription is what describe -o json|yaml prints
// (cli.hcp.io/v1alpha1, kind SessionDescription).
type SessionDescription struct {
	Metadata viewMeta `json:"metadata"`
	// Session is the HCPSession as stored.
	Session  map[string]any      `json:"session"`
	Columns  SessionColumns      `json:"columns"`
	Decision DecisionDescription `json:"decision"`
	// Pod is the owning pod (status.podName); absent when none owns it.
	Pod      *PodDescription `json:"pod,omitempty"`
	Timeline []TimelineItem  `json:"timeline"`
	// EventsError says why the Events could not be listed.
	EventsError string `json:"eventsError,omitempty"`
}

type viewMeta struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace,omitempty"`
}

// DecisionDescription is the L3 decision.
type DecisionDescription struct {
	// Verdict: admitted, rejected or undecided.
	Verdict string `json:"verdict"`
	// Rule names the admitting policy and rule, or the rejection's code
	// and message; empty when no longer recorded (then Policies are the
	// CapabilityPolicies selecting the callee now).
	Rule        string   `json:"rule,omitempty"`
	Policies    []string `json:"policies,omitempty"`
	Risk        string   `json:"risk,omitempty"`
	DataClass   string   `json:"dataClass,omitempty"`
	MaxDuration string   `json:"maxDuration,omitempty"`
	DecidedBy   string   `json:"decidedBy,omitempty"`
}

// PodDescription is the owning pod as describe shows it.
type PodDescription struct {
	Name string `json:"name"`
	// Status: phase, readiness, restarts ("Running, ready").
	Status string `json:"status,omitempty"`
	Node   string `json:"node,omitempty"`
	IP     string `json:"ip,omitempty"`
	// Error: "gone", or why the pod could not be read.
	Error string `json:"error,omitempty"`
}

// TimelineItem is one line of the timeline.
type TimelineItem struct {
	At     string `json:"at"`
	Source string `json:"source"`
	What   string `json:"what"`
}

// descriptionObject is d as a SessionDescription.
func descriptionObject(d Description, now time.Time, keepManagedFields bool) (runtime.Object, error) {
	hs := d.Session
	session, err := apiObject(hs, keepManagedFields)
	if err != nil {
		return nil, err
	}
	dec := DecisionOf(hs, d.Events)
	verdict, _, _ := strings.Cut(dec.Verdict, " ")
	v := SessionDescription{
		Metadata: viewMeta{Name: hs.Name, Namespace: hs.Namespace},
		Session:  session.Object,
		Columns:  columnsOf(hs, now),
		Decision: DecisionDescription{Verdict: verdict, Rule: dec.Detail, Risk: string(hs.Spec.RiskLevel),
			DataClass: string(hs.Spec.DataClassification), MaxDuration: string(hs.Spec.MaxDuration), DecidedBy: dec.DecidedBy},
		Timeline:    []TimelineItem{},
		EventsError: d.EventsErr,
	}
	if dec.Detail == "" && verdict == verdictAdmitted {
		v.Decision.Policies = d.Policies
	}
	if name := hs.Status.PodName; name != "" {
		p := &PodDescription{Name: name, Error: d.PodErr}
		if d.Pod != nil {
			p.Status, p.Node, p.IP = podStatus(d.Pod), d.Pod.Spec.NodeName, d.Pod.Status.PodIP
		}
		v.Pod = p
	}
	for _, e := range Timeline(hs, d.Events) {
		v.Timeline = append(v.Timeline, TimelineItem{At: e.At.UTC().Format(time.RFC3339), Source: e.Source, What: e.What})
	}
	return toObject(v, ViewGroupVersion.WithKind("SessionDescription"))
}
