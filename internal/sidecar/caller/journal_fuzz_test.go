package caller

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/pkg/hcp/envelope"
	"github.com/hcp-io/hcp-operator/pkg/hcp/task"
)

// realJournalLines are lines as the store writes them: a pending task with
// its encoded task_submit and trace context, the same task accepted, its
// session record, and the deletions that end both.
func realJournalLines(tb testing.TB) [][]byte {
	tb.Helper()
	at := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	// Small records (the smallest real task_submit): minimizing an
	// interesting input costs the fuzzer time quadratic in its size.
	env, err := envelope.NewAt(at, envelope.TypeTaskSubmit, "", task.TaskSubmit{CallerID: "alpha", CalleeID: "lab",
		Capability: "a", Inputs: json.RawMessage(`{}`)})
	if err != nil {
		tb.Fatal(err)
	}
	body, err := envelope.Encode(env)
	if err != nil {
		tb.Fatal(err)
	}
	sid := "7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e"
	pending := &TaskRecord{MessageID: env.MessageID, CalleeID: "lab", Capability: "analyze", State: TaskPending,
		SessionID: sid, Envelope: body, Attempts: 1, SubmittedAt: at, Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	accepted := *pending
	accepted.State, accepted.Envelope, accepted.AnsweredAt, accepted.Delivered, accepted.RiskLevel = TaskAccepted, nil, at.Add(time.Second), true, "R1"
	sess := &SessionRecord{SessionID: sid, CalleeID: "lab", LastSeq: 7, State: "RUNNING", TokenExpiresAt: at.Add(time.Hour), UpdatedAt: at}
	return [][]byte{
		encodeLine(journalLine{Task: pending}),
		encodeLine(journalLine{Task: &accepted}),
		encodeLine(journalLine{Session: sess}),
		encodeLine(journalLine{DeleteSession: sid}),
		encodeLine(journalLine{DeleteTask: env.MessageID}),
	}
}

// withCRC makes body a journal line with a correct checksum, so the
// fuzzer reaches the JSON decoding it could never checksum itself.
func withCRC(body []byte) []byte {
	return append(fmt.Appendf(nil, "%08x ", crc32.Checksum(body, crcTable)), append(bytes.Clone(body), '\n')...)
}

// FuzzJournalLine: parseLine never panics; it accepts only a line whose
// checksum matches its JSON body; what it accepts re-encodes (encodeLine
// panics on what it cannot marshal) into a line it accepts again, and
// re-encoding that is byte-identical: the journal's round trip.
func FuzzJournalLine(f *testing.F) {
	for _, l := range realJournalLines(f) {
		f.Add(l, false)
		f.Add(l[9:len(l)-1], true) // the body alone, checksummed by the target
	}
	f.Add([]byte("00000000 {}\n"), false)
	f.Add([]byte(`{"task":{"message_id":"m","submitted_at":"2025-01-15T09:30:00+01:00"},"session":{"session_id":"s","last_seq":-1}}`), true)
	f.Add([]byte(`{"task":{"envelope":null,"attempts":1e3}}`), true)
	f.Fuzz(func(t *testing.T, raw []byte, checksum bool) {
		// Longer lines take no other path through the parser, and
		// minimizing an interesting input costs the fuzzer time quadratic
		// in its size: at a kilobyte, one input took all of the 60 s.
		if len(raw) > 512 {
			return
		}
		line := raw
		if checksum {
			line = withCRC(raw)
		}
		l, ok := parseLine(line)
		if !ok {
			return
		}
		body := bytes.TrimSuffix(line, []byte("\n"))[9:]
		if crc32.Checksum(body, crcTable) != mustHex(t, line[:8]) || !json.Valid(body) {
			t.Fatalf("accepted a line whose checksum or JSON is wrong: %q", line)
		}
		enc := encodeLine(l)
		l2, ok := parseLine(enc)
		if !ok {
			t.Fatalf("a re-encoded line is refused: %q", enc)
		}
		if enc2 := encodeLine(l2); !bytes.Equal(enc, enc2) {
			t.Fatalf("re-encoding is not stable:\n%q\n%q", enc, enc2)
		}
	})
}

func mustHex(t *testing.T, b []byte) uint32 {
	t.Helper()
	var v uint32
	if _, err := fmt.Sscanf(string(b), "%08x", &v); err != nil {
		t.Fatalf("checksum %q: %v", b, err)
	}
	return v
}

// journalProgram turns a fuzz input into journal lines as the store writes
// them: two bytes per line, choosing a task record (of three message ids,
// two callees, any state, with or without its session id), a session
// record, or the deletion of either. A program of a few bytes stands for a
// journal of kilobytes, which keeps the fuzzer's inputs small: minimizing
// an interesting input costs time quadratic in its size.
func journalProgram(prog []byte) (lines [][]byte, recs []journalLine) {
	at := time.Date(2025, 1, 15, 8, 30, 0, 0, time.UTC)
	ids := []string{"550e8400-e29b-41d4-a716-446655440000", "0f8fad5b-d9cb-469f-a165-70867728950e", "7c9e6679-7425-40de-944b-e07fc1f90ae7"}
	sids := []string{"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e", "16fd2706-8baf-433b-82eb-8c7fada847da", "886313e1-3b8a-4372-9b90-0c9aee199e5d"}
	states := []TaskState{TaskPending, TaskAccepted, TaskRejected, TaskUnanswered, TaskExpired}
	for i := 0; i+1 < len(prog) && len(recs) < 64; i += 2 {
		op, a := prog[i], int(prog[i+1])
		var l journalLine
		switch op % 4 {
		case 0:
			t := &TaskRecord{MessageID: ids[a%3], CalleeID: []string{"lab", "lab-2"}[a/3%2], Capability: "analyze",
				State: states[a/6%5], Attempts: a % 9, SubmittedAt: at.Add(time.Duration(a) * time.Second)}
			if a%2 == 0 {
				t.SessionID = sids[a/2%3]
			}
			if t.State == TaskPending {
				t.Envelope = json.RawMessage(`{"type":"task_submit"}`)
			}
			l.Task = t
		case 1:
			l.Session = &SessionRecord{SessionID: sids[a%3], CalleeID: "lab", TaskMessageID: ids[a/3%3], LastSeq: int64(a),
				State: "RUNNING", Closed: a%7 == 0, UpdatedAt: at.Add(time.Duration(a) * time.Millisecond)}
		case 2:
			l.DeleteTask = ids[a%3]
		default:
			l.DeleteSession = sids[a%3]
		}
		recs = append(recs, l)
		lines = append(lines, encodeLine(l))
	}
	return lines, recs
}

// FuzzJournalReplay: a journal as the store writes it (journalProgram),
// torn at any byte and with any one byte corrupted, replays exactly the
// lines before the first torn or corrupt one, last record winning and
// deletions deleting; it reports that prefix as valid; the prefix alone
// replays the same; and the session index points only at tasks that name
// the session. It calls the store's replay (load) without OpenStore's
// committer goroutine, whose scheduling would make coverage vary between
// runs of one input (every input would look new). Arbitrary bytes in a
// line are FuzzJournalLine's part.
func FuzzJournalReplay(f *testing.F) {
	f.Add([]byte{0, 0, 1, 0, 0, 7, 1, 4}, uint16(0xffff), uint16(0xffff))
	f.Add([]byte{0, 2, 0, 9, 2, 0, 1, 1, 3, 1, 0, 2}, uint16(300), uint16(0xffff))
	f.Add([]byte{0, 4, 1, 5, 0, 16, 2, 1, 3, 2}, uint16(0xffff), uint16(120))
	f.Add([]byte{0, 1, 0, 4, 0, 1, 2, 1}, uint16(0xffff), uint16(8))
	// One file for every input of this process (inputs run one at a time),
	// in memory where the machine has a tmpfs: a write and a read on ext4
	// made a run five times slower.
	dir := f.TempDir()
	if shm, err := os.MkdirTemp("/dev/shm", "hcp-journal-fuzz-"); err == nil {
		dir = shm
		f.Cleanup(func() { _ = os.RemoveAll(shm) })
	}
	path := filepath.Join(dir, journalFile)
	replay := func(t *testing.T, data []byte) (*Store, int64) {
		t.Helper()
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s := &Store{tasks: map[string]*TaskRecord{}, sessions: map[string]*SessionRecord{}, bySession: map[string]string{}}
		valid, err := s.load(path)
		if err != nil {
			t.Fatalf("load: %v", err) // content never makes it fail
		}
		for sid, id := range s.bySession {
			tr, ok := s.tasks[id]
			if !ok || !slices.Contains(taskSessionIDs(tr), sid) {
				t.Fatalf("session %q is indexed to task %q, which does not name it", sid, id)
			}
		}
		return s, valid
	}
	f.Fuzz(func(t *testing.T, prog []byte, cut, flip uint16) {
		lines, recs := journalProgram(prog)
		data := bytes.Join(lines, nil)
		if int(flip) < len(data) {
			data[flip] ^= 1 // any single-bit change breaks the line's checksum, hex or frame
		}
		data = data[:min(int(cut), len(data))]

		// What must survive: whole lines before the first torn or corrupt one.
		want := &Store{tasks: map[string]*TaskRecord{}, sessions: map[string]*SessionRecord{}, bySession: map[string]string{}}
		var wantValid int
		for i, l := range lines {
			end := wantValid + len(l)
			if end > len(data) || (int(flip) >= wantValid && int(flip) < end) {
				break
			}
			want.apply(recs[i])
			wantValid = end
		}

		s1, valid := replay(t, data)
		if valid != int64(wantValid) {
			t.Fatalf("valid prefix %d bytes, want %d of %d", valid, wantValid, len(data))
		}
		if !reflect.DeepEqual(s1.tasks, want.tasks) || !reflect.DeepEqual(s1.sessions, want.sessions) {
			t.Fatalf("replayed records differ from the lines written:\n%+v\n%+v", s1.tasks, want.tasks)
		}
		s2, again := replay(t, data[:valid])
		if again != valid || !reflect.DeepEqual(s1.tasks, s2.tasks) || !reflect.DeepEqual(s1.sessions, s2.sessions) ||
			!reflect.DeepEqual(s1.bySession, s2.bySession) {
			t.Fatalf("the valid prefix replays differently")
		}
	})
}
