package checker

import (
	"strings"
	"testing"
)

func TestReadHarnessLog(t *testing.T) {
	log := `{"kind":"step","session":"s1","step":1,"pod":"a","start":"2026-11-28T12:00:00Z","end":"2026-11-28T12:00:01Z"}
{"kind":"step","session":"other","step":1,"pod":"a","start":"2026-11-28T12:00:00Z","end":"2026-11-28T12:00:01Z"}
{"kind":"resume","session":"s1","after_step":0,"pod":"b","at":"2026-11-28T12:00:05Z"}
`
	steps, recs, err := ReadHarnessLog(strings.NewReader(log), map[string]bool{"s1": true})
	if err != nil {
		t.Fatal(err)
	}
	if len(steps) != 1 || steps[0].Pod != "a" || steps[0].Step != 1 || len(recs) != 1 || recs[0].AfterStep != 0 {
		t.Fatalf("read %+v and %+v", steps, recs)
	}
	for name, bad := range map[string]string{
		"not JSON":           "{",
		"unknown kind":       `{"kind":"nap","session":"s1"}`,
		"step ends too soon": `{"kind":"step","session":"s1","step":1,"start":"2026-11-28T12:00:01Z","end":"2026-11-28T12:00:00Z"}`,
		"resume, no step":    `{"kind":"resume","session":"s1"}`,
	} {
		if _, _, err := ReadHarnessLog(strings.NewReader(bad+"\n"), nil); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
