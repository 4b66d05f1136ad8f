//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/samplecaller"
)

// What a chaos run's stream shows, as the sample caller app received it
// (chaos_test.go).

// streamMeasure is what one session's stream shows.
type streamMeasure struct {
	lost, renumbered, twice int
	pause                   time.Duration
	pauseFrom, pauseTo      time.Time // the longest pause's bounds
	notes                   []string
}

var stepRE = regexp.MustCompile(`^step (\d+)/`)

func measure(s *samplecaller.SessionLog, fault time.Time) streamMeasure {
	var m streamMeasure
	seqs := map[int64]string{} // sequence → event type
	var last time.Time
	maxStep, ckpt, resumed := 0, false, false
	for _, msg := range s.Messages {
		if msg.Type != "event" {
			continue
		}
		seqs[msg.Sequence] = msg.EventType
		if !last.IsZero() && msg.At.After(fault) {
			from := last
			if from.Before(fault) {
				from = fault
			}
			if p := msg.At.Sub(from); p > m.pause {
				m.pause, m.pauseFrom, m.pauseTo = p, from, msg.At
			}
		}
		last = msg.At
		switch msg.EventType {
		case "checkpoint":
			ckpt = true
		case "state_changed":
			var sc struct {
				To     string `json:"to_state"`
				Reason string `json:"reason"`
			}
			_ = json.Unmarshal(msg.Data, &sc)
			if sc.To == string(hcpv1alpha1.SessionRunning) && sc.Reason == "recovered_from_checkpoint" {
				resumed = true
			}
			if sc.To == string(hcpv1alpha1.SessionPaused) {
				m.notes = append(m.notes, "PAUSED "+sc.Reason)
			}
		case "progress":
			var p struct{ Stage string }
			_ = json.Unmarshal(msg.Data, &p)
			sm := stepRE.FindStringSubmatch(p.Stage)
			if sm == nil {
				continue
			}
			step, _ := strconv.Atoi(sm[1])
			switch {
			case resumed:
				// A resumed run repeats the steps after its checkpoint.
				if step == 1 && ckpt && maxStep > 1 {
					m.twice++ // resumed from scratch although checkpointed
				}
				resumed, maxStep = false, step
			case step <= maxStep:
				m.twice++ // another run of the same task at the same time
			default:
				maxStep = step
			}
		}
	}
	// A gap closed by a state change is a renumbering the new owner
	// announced (a lost pod's last numbers are unknown; L2 lets a recovery
	// skip them); any other gap is lost events.
	for seq := int64(1); seq <= s.LastSequence; seq++ {
		if _, ok := seqs[seq]; ok {
			continue
		}
		next := seq + 1
		for ; next <= s.LastSequence; next++ {
			if _, ok := seqs[next]; ok {
				break
			}
		}
		if seqs[next] == "state_changed" {
			m.renumbered += int(next - seq)
		} else {
			m.lost += int(next - seq)
		}
		seq = next
	}
	return m
}

// gapProblem is how the sample app reports a sequence gap.
var gapProblem = regexp.MustCompile(`^event sequence \d+ after \d+ \(want \d+\)$`)

// unexplained drops the sample app's gap reports when the gaps are an
// announced renumbering.
func unexplained(problems []string, renumbered int) []string {
	var out []string
	for _, p := range problems {
		if renumbered > 0 && gapProblem.MatchString(p) {
			continue
		}
		out = append(out, p)
	}
	return out
}

func describeStream(s *samplecaller.SessionLog) string {
	var parts []string
	for _, m := range s.Messages {
		p := m.Type
		if m.Type == "event" {
			p = fmt.Sprintf("%d:%s", m.Sequence, m.EventType)
			if m.EventType == "state_changed" || m.EventType == "progress" {
				p += string(m.Data)
			}
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, " ")
}
