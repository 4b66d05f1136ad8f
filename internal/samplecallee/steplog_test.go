package samplecallee

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Every record is one JSON line; two logs (two pods) share one file.
func TestStepLogAppends(t *testing.T) {
	path := filepath.Join(t.TempDir(), "steps.jsonl")
	a, err := OpenStepLog(path, "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := OpenStepLog(path, "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	a.Step("s1", 1, now, now.Add(time.Second))
	b.Resumed("s1", 1, now.Add(2*time.Second))
	b.Step("s1", 2, now.Add(2*time.Second), now.Add(3*time.Second))
	var nilLog *StepLog
	nilLog.Step("s1", 9, now, now) // a harness without a log records nothing

	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []map[string]any
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 3 || got[0]["pod"] != "pod-a" || got[1]["kind"] != "resume" || got[1]["after_step"] != 1.0 || got[2]["step"] != 2.0 {
		t.Fatalf("log reads %v", got)
	}
}
