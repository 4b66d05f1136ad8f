package caller

import (
	"sync"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
)

// recordingSink counts the loggers derived from it and keeps the values of
// each line logged.
type recordingSink struct {
	mu      sync.Mutex
	derived int
	lines   [][]any
	values  []any
}

func (r *recordingSink) Init(logr.RuntimeInfo)  {}
func (r *recordingSink) Enabled(level int) bool { return true }
func (r *recordingSink) Info(_ int, _ string, kv ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, append(append([]any{}, r.values...), kv...))
}
func (r *recordingSink) Error(_ error, msg string, kv ...any) { r.Info(0, msg, kv...) }
func (r *recordingSink) WithName(string) logr.LogSink         { return r }
func (r *recordingSink) WithValues(kv ...any) logr.LogSink {
	r.mu.Lock()
	r.derived++
	r.mu.Unlock()
	return &derivedSink{recordingSink: r, values: kv}
}

type derivedSink struct {
	*recordingSink
	values []any
}

func (d *derivedSink) Info(level int, msg string, kv ...any) {
	d.recordingSink.Info(level, msg, append(append([]any{}, d.values...), kv...)...)
}
func (d *derivedSink) Error(err error, msg string, kv ...any) { d.Info(0, msg, kv...) }

// A session worker keeps no logger of its own: one holds its encoded
// fields for the session's life (1.4 KiB with the sidecar's zap logger),
// so it is made when a line is logged, and that line still names the
// session.
func TestSessionWorkersKeepNoLogger(t *testing.T) {
	sink := &recordingSink{}
	s := &Sidecar{log: logr.New(sink), clk: clock.RealClock{}, cfg: &config.Config{Prefetch: 10}}
	workers := make([]*stream, 100)
	for i := range workers {
		workers[i] = s.newStream("0f8fad5b-d9cb-469f-a165-70867728950e")
	}
	if sink.derived != 0 {
		t.Fatalf("%d loggers made for %d session workers that logged nothing", sink.derived, len(workers))
	}
	workers[0].log().Info("WARNING: something")
	if len(sink.lines) != 1 || len(sink.lines[0]) < 2 || sink.lines[0][0] != "session" || sink.lines[0][1] != "0f8fad5b-d9cb-469f-a165-70867728950e" {
		t.Errorf("a worker's line does not name its session: %v", sink.lines)
	}
}
