package caller

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
)

// BenchmarkJournal is the caller journal's cost per event as the session
// workers use it (commitEvents): the session record queued with
// RecordSession and the event's ack as a callback of its ticket, run after
// the fsync that covers it. rate=1000 paces the events at 1,000/s over
// sessions=N sessions round robin (each event committed alone, as a
// paced stream delivers them); rate=max commits as fast as the journal
// takes them; memory is the floor of rate=1000: the same without a state
// directory (the pacing's own wake-ups and the callbacks). cpu-µs/event is this process's user+sys time (getrusage)
// over the timed window divided by the events, the last fsync included;
// lines/event is the records written to the journal per event (at one
// session, one per group commit: its fsyncs). ns/op is the pace at
// rate=1000: ignore it there.
//
//	go test -run '^$' -bench BenchmarkJournal -benchtime 2000x -count 6 ./internal/sidecar/caller
func BenchmarkJournal(b *testing.B) {
	for _, rate := range []float64{1000, 0} {
		for _, sessions := range []int{1, 10} {
			name := "max"
			if rate > 0 {
				name = fmt.Sprint(rate)
			}
			b.Run(fmt.Sprintf("rate=%s/sessions=%d", name, sessions), func(b *testing.B) {
				benchJournal(b, rate, sessions, b.TempDir())
			})
		}
		if rate > 0 {
			// The floor: the same without a state directory (no journal).
			b.Run(fmt.Sprintf("rate=%v/sessions=1/memory", rate), func(b *testing.B) {
				benchJournal(b, rate, 1, "")
			})
		}
	}
}

func benchJournal(b *testing.B, rate float64, sessions int, dir string) {
	st, err := OpenStore(dir)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = st.Close() }()
	ids := make([]string, sessions)
	for i := range ids {
		ids[i] = fmt.Sprintf("4b1c8f0e-2d7a-4c55-9a0e-%012d", i)
	}
	var acked atomic.Int64
	pace := benchutil.NewPacer(rate)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	lines0 := journalLines(b, dir)
	cpu0 := benchutil.SampleCPU().Self
	var last *Ticket
	for i := range b.N {
		if err := pace.Wait(ctx); err != nil {
			b.Fatal(err)
		}
		seq := int64(i/sessions + 1)
		_, t := st.RecordSession(ids[i%sessions], func(r *SessionRecord) bool {
			r.LastSeq = max(r.LastSeq, seq)
			r.CalleeID, r.TaskMessageID, r.Capability = "lab", "550e8400-e29b-41d4-a716-446655440000", "analyze"
			r.UpdatedAt = time.Now()
			return true
		})
		t.Then(func(err error) {
			if err != nil {
				b.Error(err)
			}
			acked.Add(1)
		})
		last = t
	}
	if err := last.Wait(); err != nil {
		b.Fatal(err)
	}
	cpu := benchutil.SampleCPU().Self - cpu0
	b.StopTimer()
	lines := journalLines(b, dir) - lines0
	if n := acked.Load(); n != int64(b.N) {
		b.Fatalf("%d of %d events acked", n, b.N)
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/event")
	b.ReportMetric(float64(lines)/float64(b.N), "lines/event")
}

// journalLines counts the lines of the journal in dir.
func journalLines(b *testing.B, dir string) int {
	if dir == "" {
		return 0
	}
	data, err := os.ReadFile(filepath.Join(dir, journalFile))
	if err != nil && !os.IsNotExist(err) {
		b.Fatal(err)
	}
	return bytes.Count(data, []byte("\n"))
}
