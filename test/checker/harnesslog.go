package checker

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"time"
)

// harnessLine is one line of the sample harness's step log
// (internal/samplecallee.StepLog), read here on its own terms.
type harnessLine struct {
	Kind      string    `json:"kind"`
	Session   string    `json:"session"`
	Step      int       `json:"step"`
	AfterStep *int      `json:"after_step"`
	Pod       string    `json:"pod"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	At        time.Time `json:"at"`
}

// ReadHarnessLog reads a step log: the steps executed and the resumptions,
// of the sessions in want (all when want is nil). A line it cannot read is
// an error: the record is the checker's evidence.
func ReadHarnessLog(r io.Reader, want map[string]bool) ([]Step, []Recovery, error) {
	var steps []Step
	var recs []Recovery
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		var l harnessLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, nil, fmt.Errorf("step log line %d: %w", n, err)
		}
		if want != nil && !want[l.Session] {
			continue
		}
		switch {
		case l.Kind == "step" && l.Step > 0 && !l.End.Before(l.Start):
			steps = append(steps, Step{Session: l.Session, Step: l.Step, Pod: l.Pod, Start: l.Start, End: l.End})
		case l.Kind == "resume" && l.AfterStep != nil:
			recs = append(recs, Recovery{Session: l.Session, AfterStep: *l.AfterStep, At: l.At})
		default:
			return nil, nil, fmt.Errorf("step log line %d: not a step or resume record: %s", n, sc.Text())
		}
	}
	return steps, recs, sc.Err()
}
