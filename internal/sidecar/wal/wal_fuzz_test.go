package wal

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// The fuzz inputs here are short programs that drive the log as the
// callee sidecar does, not log files: a log of real envelopes is
// kilobytes, and minimizing an interesting input costs the fuzzer time
// quadratic in its size (with file I/O in every run, a kilobyte input took
// all of the 60 s a target gets).

// fuzzEnvelope is the body of a real event the callee sidecar logs before
// publishing (an encoded envelope).
func fuzzEnvelope(seq int64) []byte {
	return fmt.Appendf(nil, `{"hcp_version":"1.0","message_id":"550e8400-e29b-41d4-a716-44665544%04d","timestamp":"2025-01-15T08:30:00.000Z","session_id":"7d444840-9dc0-41f1-a9d8-bd0e1b9a2c5e","type":"event","payload":{"event_type":"progress","sequence":%d,"data":{"stage":"s"}}}`, seq, seq)
}

// runOps applies a program to log(), two bytes per operation, as the callee
// sidecar issues them: open a session with its harness task, append a
// message (index increasing per session, a routing key, a state, maybe an
// idempotency key, a real envelope), confirm up to an index, close; op 5
// calls check (nil: nothing), which may reopen the log (hence log()); op 6
// adopts a session (a takeover: its indices start again), op 7 sets its
// task.
func runOps(t *testing.T, log func() *Log, ops []byte, check func()) {
	t.Helper()
	index := map[string]int64{}
	for i := 0; i+1 < len(ops) && i < 400; i += 2 {
		op, arg := ops[i], ops[i+1]
		id := fmt.Sprintf("s%d", arg%4)
		l := log()
		var err error
		switch op % 8 {
		case 0:
			err = l.Open(id, fmt.Appendf(nil, `{"capability":"cvd.run-synthesis","inputs":{"steps":%d}}`, arg))
		case 1, 2:
			index[id]++
			key := ""
			if arg%3 == 0 {
				key = fmt.Sprintf("k%d", arg)
			}
			seq := index[id]
			if arg%5 == 0 {
				seq = 0 // a task result: no event sequence
			}
			err = l.Append(id, Message{Index: index[id], Seq: seq, Key: key, RoutingKey: "alpha." + id + ".event",
				State: []string{"RUNNING", "PAUSED", ""}[arg%3], Body: fuzzEnvelope(seq)})
		case 3:
			err = l.Confirm(id, index[id]-int64(arg%3))
		case 4:
			err = l.Close(id)
			delete(index, id)
		case 5:
			if check != nil {
				check()
			}
		case 6:
			err = l.Adopt(id, fmt.Appendf(nil, `{"taken_over":%d}`, arg), int64(arg)*10)
			delete(index, id)
		case 7:
			err = l.SetTask(id, fmt.Appendf(nil, `{"set":%d}`, arg))
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

// memDir is one directory for every input of this fuzz process (inputs
// run one at a time), on a tmpfs where the machine has one: a directory
// per input on ext4 made each run cost a mkdir and a journalled create.
func memDir(f *testing.F) string {
	if shm, err := os.MkdirTemp("/dev/shm", "hcp-wal-fuzz-"); err == nil {
		f.Cleanup(func() { _ = os.RemoveAll(shm) })
		return shm
	}
	return f.TempDir()
}

func openAt(t *testing.T, dir string) (*Log, map[string]*Session) {
	t.Helper()
	l, ss, err := Open(dir)
	if err != nil {
		t.Fatalf("Open: %v", err) // content never makes Open fail
	}
	return l, ss
}

func release(t *testing.T, l *Log) {
	t.Helper()
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
}

// normalize makes empty and nil alike where they mean the same: a session
// appended to without an Open has a nil task, and a compaction writes an
// open record for it whose replay gives an empty one; a confirm of every
// message leaves an empty pending list, a replay nil.
func normalize(ms ...map[string]*Session) {
	for _, m := range ms {
		for _, s := range m {
			if len(s.Task) == 0 {
				s.Task = nil
			}
			if len(s.Pending) == 0 {
				s.Pending = nil
			}
		}
	}
}

// frameAll turns data into CRC-valid records: it is split at 0xFF bytes
// and each piece framed with its length and checksum, so the fuzzer reaches
// the record decoder with payloads it could never checksum itself.
func frameAll(data []byte) []byte {
	var out []byte
	for _, p := range bytes.Split(data, []byte{0xFF}) {
		if len(p) != 0 {
			out = frame(out, func(b []byte) []byte { return append(b, p...) })
		}
	}
	return out
}

// boundaries are the offsets at which the records of a well-formed log end.
func boundaries(data []byte) []int {
	var ends []int
	for off := 0; off+8 <= len(data); {
		off += 8 + int(binary.LittleEndian.Uint32(data[off:]))
		ends = append(ends, off)
	}
	return ends
}

// FuzzWALReplay: a log the program wrote, followed by arbitrary record
// payloads given correct checksums (extra, split at 0xFF), then torn at any
// byte and with any one bit flipped. Open never fails or panics; it keeps
// a prefix that ends on a record boundary, before the torn or damaged
// record (and all of the program's records before it, when extra is
// empty); that prefix reopens to the same sessions; and a session appended
// after it reads back, next to them.
func FuzzWALReplay(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 1, 1, 3, 1, 0, 2, 1, 2, 4, 2}, []byte(nil), uint16(0xffff), uint16(0xffff))
	f.Add([]byte{0, 1, 1, 1, 2, 3, 1, 1}, []byte(nil), uint16(200), uint16(0xffff))
	f.Add([]byte{0, 1, 1, 1, 2, 3, 1, 1}, []byte(nil), uint16(0xffff), uint16(40))
	f.Add([]byte{0, 1}, []byte("O\x04sess\x02{}\xffM\x04sess\x02\x02\x00\x02rk\x00\x00\xffC\x04sess\x02\xffX\x04sess"), uint16(0xffff), uint16(0xffff))
	f.Add([]byte(nil), []byte("M\x01s\x00\x00\x00\x00\x00\x00\xffC\x01s\x7f\xffZ\xffM\x01s\x01\x02\x00\x00\x00\x00"), uint16(0xffff), uint16(0xffff))
	dir := memDir(f)
	path := filepath.Join(dir, FileName)
	f.Fuzz(func(t *testing.T, prog, extra []byte, cut, flip uint16) {
		if err := os.WriteFile(path, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		l, _ := openAt(t, dir)
		runOps(t, func() *Log { return l }, prog, nil)
		release(t, l)
		written, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		data := append(written, frameAll(extra)...)
		ends := boundaries(data)
		if int(flip) < len(data) {
			data[flip] ^= 1 << (flip % 8)
		}
		data = data[:min(int(cut), len(data))]
		limit := 0 // the end of the last record before the tear and the flip
		for _, e := range ends {
			if e > len(data) || int(flip) < e {
				break
			}
			limit = e
		}
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}

		l, first := openAt(t, dir)
		release(t, l)
		kept, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		onBoundary := len(kept) == 0
		for _, e := range ends {
			onBoundary = onBoundary || e == len(kept)
		}
		if !bytes.HasPrefix(data, kept) || len(kept) > limit || !onBoundary || (len(extra) == 0 && len(kept) != limit) {
			t.Fatalf("kept %d of %d bytes; the records before the damage end at %d", len(kept), len(data), limit)
		}

		l, again := openAt(t, dir)
		if !reflect.DeepEqual(first, again) {
			t.Fatalf("the kept prefix replays differently:\n%s", diffSessions(first, again))
		}
		const id = "fuzz-appended-session"
		m := Message{Index: 1, Seq: 1, Key: "k", RoutingKey: "alpha." + id + ".event", State: "RUNNING", Body: fuzzEnvelope(1)}
		if err := l.Open(id, []byte(`{"task":1}`)); err != nil {
			t.Fatal(err)
		}
		if err := l.Append(id, m); err != nil {
			t.Fatal(err)
		}
		release(t, l)
		_, after := openAt(t, dir)
		got := after[id]
		if got == nil || got.LastSeq != 1 || len(got.Pending) != 1 || !reflect.DeepEqual(got.Pending[0], m) || string(got.Task) != `{"task":1}` {
			t.Fatalf("appended session reads back as %+v", got)
		}
		delete(after, id)
		delete(first, id)
		if !reflect.DeepEqual(first, after) {
			t.Fatalf("appending changed the other sessions:\n%s", diffSessions(first, after))
		}
	})
}

// FuzzWALRoundTrip drives a fresh log with a program, compacting often;
// after every reopen (op 5, and at the end) the replayed sessions equal the
// log's live view.
func FuzzWALRoundTrip(f *testing.F) {
	f.Add([]byte{0, 1, 1, 1, 2, 3, 1, 1, 4})
	f.Add([]byte{0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 7, 5, 0, 9, 1, 1, 3, 4, 2})
	f.Add([]byte("\x00\x10\x01\x11\x01\x21\x02\x03\x05\x00\x01\x03\x15\x04"))
	dir := memDir(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if err := os.WriteFile(filepath.Join(dir, FileName), nil, 0o600); err != nil {
			t.Fatal(err)
		}
		l, _ := openAt(t, dir)
		l.SetCompactAt(2 << 10)
		check := func() {
			t.Helper()
			l.mu.Lock()
			want := make(map[string]*Session, len(l.sessions))
			for id, s := range l.sessions {
				want[id] = s.clone()
			}
			l.mu.Unlock()
			release(t, l)
			var got map[string]*Session
			l, got = openAt(t, dir)
			l.SetCompactAt(2 << 10)
			normalize(want, got)
			if !reflect.DeepEqual(want, got) {
				t.Fatalf("replay differs from the live log:\n%s", diffSessions(want, got))
			}
		}
		runOps(t, func() *Log { return l }, ops, check)
		check()
		release(t, l)
	})
}

// diffSessions describes the sessions that differ.
func diffSessions(want, got map[string]*Session) string {
	var b bytes.Buffer
	for id, w := range want {
		if g := got[id]; !reflect.DeepEqual(w, g) {
			fmt.Fprintf(&b, "%s want %#v\n%s got  %#v\n", id, w, id, g)
		}
	}
	for id, g := range got {
		if want[id] == nil {
			fmt.Fprintf(&b, "%s only in the second: %+v\n", id, g)
		}
	}
	return b.String()
}
