package samplecaller

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// post sends one event to an app as the caller sidecar does.
func post(t *testing.T, url string, seq int64, msgID string) int {
	t.Helper()
	body, _ := json.Marshal(Message{SessionID: "s1", MessageID: msgID, Type: typeEvent, CalleeID: "c", Sequence: seq, EventType: "progress"})
	resp, err := http.Post(url+"/hcp/v1/events", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Two apps (the old caller pod's and its replacement's) share one receipt
// log: replayed, it is every message either received, one stream per
// session, so what the old app got in its last moments counts, and a
// message both got is a duplicate.
func TestReceiptLogJoinsApps(t *testing.T) {
	path := filepath.Join(t.TempDir(), "receipts.jsonl")
	app := func(pod string) *httptest.Server {
		l, err := OpenReceiptLog(path, pod)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = l.Close() })
		rec := NewRecorder()
		rec.SetReceiptLog(l)
		srv := httptest.NewServer(rec.Handler())
		t.Cleanup(srv.Close)
		return srv
	}
	old, next := app("old"), app("new")
	for seq := int64(1); seq <= 3; seq++ {
		if code := post(t, old.URL, seq, "m"+string(rune('0'+seq))); code != http.StatusNoContent {
			t.Fatalf("old app answered %d", code)
		}
	}
	old.Close() // gone, and its in-memory record with it
	post(t, next.URL, 4, "m4")
	post(t, next.URL, 5, "m5")
	read := func() Snapshot {
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		snap, err := ReadReceipts(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return snap
	}
	s := read().Sessions["s1"]
	if s == nil || s.Events != 5 || s.LastSequence != 5 || len(s.Problems) != 0 {
		t.Fatalf("joined record: %+v, want events 1-5 in order", s)
	}
	post(t, next.URL, 3, "m3")
	if snap := read(); snap.Duplicates != 1 {
		t.Fatalf("a message both apps received: %d duplicates, want 1", snap.Duplicates)
	}
}

// An app that cannot record a message does not acknowledge it; a log line
// that is not a receipt is an error, not a silently shorter record.
func TestReceiptLogFailures(t *testing.T) {
	path := filepath.Join(t.TempDir(), "receipts.jsonl")
	l, err := OpenReceiptLog(path, "p")
	if err != nil {
		t.Fatal(err)
	}
	rec := NewRecorder()
	rec.SetReceiptLog(l)
	srv := httptest.NewServer(rec.Handler())
	defer srv.Close()
	_ = l.Close()
	if code := post(t, srv.URL, 1, "m1"); code != http.StatusInternalServerError {
		t.Fatalf("app with a closed receipt log answered %d, want 500", code)
	}
	if snap := rec.Snapshot(); snap.Total != 0 {
		t.Fatalf("unacknowledged message recorded: %+v", snap)
	}
	if _, err := ReadReceipts(strings.NewReader("{\"pod\":\"p\"}\nnot json\n"), nil); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("ReadReceipts of a torn log: %v, want an error naming line 2", err)
	}
}
