package session_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/session"
)

func ExampleTransition() {
	fmt.Println(session.Transition(session.StateRunning, session.StatePaused))
	fmt.Println(session.Transition(session.StateCompleted, session.StateRunning))
	fmt.Println(session.Transition(session.StatePaused, session.StateFailed))
	// Output:
	// <nil>
	// invalid session state transition COMPLETED -> RUNNING: COMPLETED is terminal; terminal states never reopen
	// invalid session state transition PAUSED -> FAILED: from PAUSED only [RUNNING ABORTING] are allowed
}

// A timeout while PAUSED: the table has no PAUSED→FAILED, so the callee
// resumes and then fails.
func ExampleMachine_Apply() {
	t0 := time.Date(2025, 1, 15, 8, 0, 0, 0, time.UTC)
	m := session.New(t0)
	m, _ = m.Apply(session.StateRunning, "approved", t0.Add(time.Second))
	m, _ = m.Apply(session.StatePaused, "waiting for furnace", t0.Add(time.Hour))
	m, _ = m.Apply(session.StateRunning, session.ReasonTimeout, t0.Add(72*time.Hour))
	m, _ = m.Apply(session.StateFailed, session.ReasonTimeout, t0.Add(72*time.Hour))
	for _, r := range m.History() {
		fmt.Println(r.From, "->", r.To, r.Reason)
	}
	// Output:
	// PENDING -> RUNNING approved
	// RUNNING -> PAUSED waiting for furnace
	// PAUSED -> RUNNING timeout
	// RUNNING -> FAILED timeout
}

func ExampleEventPayload_Validate() {
	var p session.EventPayload
	_ = json.Unmarshal([]byte(`{"event_type":"progress","sequence":0,"data":{"percent":"half"}}`), &p)
	fmt.Println(p.Validate())
	_ = json.Unmarshal([]byte(`{"event_type":"progress","sequence":3,"data":{"percent":140}}`), &p)
	fmt.Println(p.Validate())
	_ = json.Unmarshal([]byte(`{"event_type":"heartbeat","sequence":4,"data":{}}`), &p)
	fmt.Println(p.Validate())
	// Output:
	// invalid event: sequence: must be at least 1, got 0; data.percent: must be a JSON number, got string
	// invalid event: data.stage: required; data.percent: 140 is outside [0, 100]
	// invalid event: event_type: unknown event type "heartbeat" (the nine standard types only)
}

func ExampleTracker() {
	tr, _ := session.NewTracker[string]("s1", session.TrackerOptions{Store: session.NewMemoryStore(), MaxBuffer: 8})
	for _, seq := range []int64{1, 3, 2, 2} {
		out := tr.Offer(seq, fmt.Sprint("event ", seq))
		fmt.Printf("offer %d: %s", seq, out.Verdict)
		if out.Gap != nil {
			fmt.Printf(", gap %s", out.Gap)
		}
		fmt.Println()
		for _, e := range out.Ready {
			// ... deliver e.Item to the application; on success:
			_ = tr.Commit(e.Seq)
			fmt.Println("  processed", e.Item)
		}
	}
	fmt.Println("last processed:", tr.LastProcessed())
	// Output:
	// offer 1: deliver
	//   processed event 1
	// offer 3: buffered, gap 2
	// offer 2: deliver
	//   processed event 2
	//   processed event 3
	// offer 2: duplicate
	// last processed: 3
}
