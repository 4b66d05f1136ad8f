package callee

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/checkpoint"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
	"github.com/hcp-io/hcp-operator/pkg/hcp/token"
)

// codeCheckpointRejected ends a session whose stored checkpoint failed
// verification on a takeover or a recovery: nothing was handed to a
// harness (docs/security.md, "Checkpoints and takeovers").
const codeCheckpointRejected = "checkpoint_rejected"

// EventCheckpointRejected (Warning, on the HCPSession): its stored
// checkpoint failed verification; the session failed and nothing ran.
const EventCheckpointRejected = "CheckpointRejected"

// AnnotationSignedCheckpoints marks an HCPSession created by a sidecar
// that signs its checkpoint records: an unsigned record is never accepted
// for it. Sessions without it were admitted by an earlier release, whose
// unsigned records are accepted on the conditions of acceptLegacy.
const AnnotationSignedCheckpoints = "hcp.io/signed-checkpoints"

// annotationTrue is the value of the boolean annotations the callee sets.
const annotationTrue = "true"

// decisionOf is the gate's decision as the HCPSession records it.
func decisionOf(hs *v1alpha1.HCPSession) checkpoint.Decision {
	d := checkpoint.Decision{
		CallerID: hs.Spec.CallerID, Capability: hs.Spec.Capability, Risk: string(hs.Spec.RiskLevel),
		DataClass: string(hs.Spec.DataClassification), MaxDuration: string(hs.Spec.MaxDuration),
	}
	if dur, err := task.ParseDuration(d.MaxDuration); err == nil {
		d.MaxDuration = task.FormatDuration(dur)
	}
	return d
}

// decisionOfTask is the gate's decision as the harness task carries it,
// with the session and callee it names.
func decisionOfTask(raw []byte) (d checkpoint.Decision, sessionID, calleeID string, err error) {
	var t harnessTask
	if err := json.Unmarshal(raw, &t); err != nil {
		return d, "", "", fmt.Errorf("the stored task cannot be read: %w", err)
	}
	return checkpoint.Decision{
		CallerID: t.CallerID, Capability: t.Capability, Risk: string(t.RiskLevel),
		DataClass: string(t.DataClassification), MaxDuration: task.FormatDuration(t.MaxDuration.Std()),
	}, t.SessionID, t.CalleeID, nil
}

// ckptOwner is what a session's record is bound to, from its HCPSession.
func ckptOwner(hs *v1alpha1.HCPSession) checkpoint.Owner {
	return checkpoint.Owner{Name: hs.Name, UID: hs.UID, Decision: decisionOf(hs)}
}

// ckptOwner is what the session's record is bound to, from what this
// replica holds: the task it runs carries the decision it was admitted
// with (a takeover verified it against the HCPSession first).
func (ss *sess) ckptOwner() (checkpoint.Owner, error) {
	d, _, _, err := decisionOfTask(ss.task)
	return checkpoint.Owner{Name: ss.id, UID: ss.uid, Decision: d}, err
}

// loadVerified reads a session's record for a takeover: Load checks the
// binding and the signature, and the decision against the HCPSession's;
// here the task the harness would get must name this session and Callee
// and carry that same decision. An error matching
// checkpoint.ErrUnverified means nothing in the record may be used.
func (s *Sidecar) loadVerified(rec *checkpoint.Record, err error, hs *v1alpha1.HCPSession) (*checkpoint.Record, error) {
	var le *checkpoint.LegacyError
	if errors.As(err, &le) {
		if lerr := s.acceptLegacy(le.Record, hs); lerr != nil {
			return nil, fmt.Errorf("%w; %w", err, lerr)
		}
		rec, err = le.Record, nil
		rec.Decision = decisionOf(hs)
	}
	if err != nil || rec == nil {
		return rec, err
	}
	d, sid, callee, terr := decisionOfTask(rec.Task)
	switch {
	case terr != nil:
		return nil, fmt.Errorf("%w: %w", checkpoint.ErrUnverified, terr)
	case sid != hs.Name || callee != s.id:
		return nil, fmt.Errorf("%w: the stored task is for session %q of callee %q, not %q of %q", checkpoint.ErrUnverified, sid, callee, hs.Name, s.id)
	case d != rec.Decision:
		return nil, fmt.Errorf("%w: the stored task carries %+v, not the gate's decision %+v", checkpoint.ErrUnverified, d, rec.Decision)
	}
	return rec, nil
}

func unverified(err error) bool { return errors.Is(err, checkpoint.ErrUnverified) }

// acceptLegacy accepts an unsigned record saved by a sidecar of an earlier
// release (a session running across the upgrade, handed over at its
// drain) only for a session that release admitted (no
// AnnotationSignedCheckpoints), and only if the task it holds carries the
// session token this Callee issued for this very session, caller,
// capability, risk and lifetime. The token does not cover the task's
// inputs: docs/security.md states this upgrade window.
func (s *Sidecar) acceptLegacy(rec *checkpoint.Record, hs *v1alpha1.HCPSession) error {
	if hs.Annotations[AnnotationSignedCheckpoints] == annotationTrue {
		return errors.New("the session was created by a release that signs its checkpoints")
	}
	var t harnessTask
	if err := json.Unmarshal(rec.Task, &t); err != nil {
		return fmt.Errorf("the stored task cannot be read: %w", err)
	}
	want, err := sessionClaims(s.id, hs)
	if err != nil {
		return err
	}
	got, err := token.VerifySet(s.keys.verifiers(), t.SessionToken,
		token.Expectations{Issuer: s.id, Audience: hs.Spec.CallerID, Subject: hs.Name}, s.clk.Now())
	if err != nil {
		return fmt.Errorf("the stored task's session token: %w", err)
	}
	if got.Capability != want.Capability || got.Risk != want.Risk || !got.IssuedAt.Equal(want.IssuedAt) || !got.ExpiresAt.Equal(want.ExpiresAt) {
		return errors.New("the stored task's session token is not the one issued for this session")
	}
	return nil
}
