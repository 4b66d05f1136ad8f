package benchutil

import (
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
)

// Recorder collects the latency of each distinct message of a run.
type Recorder struct {
	run   string
	n     int
	mu    sync.Mutex
	start time.Time
	end   time.Time
	seen  []bool
	lat   []time.Duration
	dups  int
	done  chan struct{}
	// cpu0 and cpu1 are the processor counters at Start and when the last
	// message arrived: the run's CPU is sampled over the timed window only.
	cpu0, cpu1 CPU
}

// NewRecorder expects messages 0…n-1 of run.
func NewRecorder(run string, n int) *Recorder {
	return &Recorder{run: run, n: n, seen: make([]bool, n), lat: make([]time.Duration, 0, n), done: make(chan struct{})}
}

// Start marks the beginning of the run.
// It also samples the CPU counters (SampleCPU), which the last message's
// arrival samples again: Result's CPU covers the timed window, no set-up
// or tear-down.
func (r *Recorder) Start() {
	cpu := SampleCPU()
	r.mu.Lock()
	r.start = time.Now()
	r.cpu0 = cpu
	r.mu.Unlock()
}

// Stamp returns headers marking message seq of the run as sent now; merge
// them into the publishing's headers just before publishing.
func (r *Recorder) Stamp(seq int) amqp.Table {
	return amqp.Table{HeaderRun: r.run, HeaderSeq: int64(seq), HeaderSent: time.Now().UnixNano()}
}

// ObserveHeaders records a message from its stamp headers; messages of
// other runs are ignored. It reports whether the message belonged to the
// run.
func (r *Recorder) ObserveHeaders(h amqp.Table) bool {
	run, _ := h[HeaderRun].(string)
	seq, ok1 := h[HeaderSeq].(int64)
	sent, ok2 := h[HeaderSent].(int64)
	if run != r.run || !ok1 || !ok2 {
		return false
	}
	r.Observe(int(seq), time.Unix(0, sent))
	return true
}

// Observe records message seq, sent at sent, as received now.
func (r *Recorder) Observe(seq int, sent time.Time) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if seq < 0 || seq >= r.n {
		return
	}
	if r.seen[seq] {
		r.dups++
		return
	}
	r.seen[seq] = true
	r.lat = append(r.lat, now.Sub(sent))
	if len(r.lat) == r.n {
		r.end = now
		// Sampled under the lock so that Result never sees the end
		// without it; once per run.
		r.cpu1 = SampleCPU()
		close(r.done)
	}
}

// Done is closed once every message was observed.
func (r *Recorder) Done() <-chan struct{} { return r.done }

// Received is the number of distinct messages observed.
func (r *Recorder) Received() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.lat)
}

// Missing returns up to max messages not observed yet, lowest first.
func (r *Recorder) Missing(limit int) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int
	for seq, ok := range r.seen {
		if !ok && len(out) < limit {
			out = append(out, seq)
		}
	}
	return out
}

// Result summarises the run; call it after Done.
func (r *Recorder) Result() Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	lat := slices.Clone(r.lat)
	slices.Sort(lat)
	end := r.end
	if end.IsZero() {
		end = time.Now()
	}
	res := Result{Messages: len(lat), Duplicates: r.dups, Elapsed: end.Sub(r.start), Latencies: lat}
	if !r.end.IsZero() && r.cpu0 != (CPU{}) {
		res.CPU = r.cpu1.Sub(r.cpu0)
	}
	return res
}

var runSeq struct {
	sync.Mutex
	n int
}

// NewRunID returns an id unique in the process, for Recorder.
func NewRunID(prefix string) string {
	runSeq.Lock()
	defer runSeq.Unlock()
	runSeq.n++
	return prefix + "-" + strconv.FormatInt(time.Now().UnixNano(), 36) + "-" + strconv.Itoa(runSeq.n)
}
