package benchutil

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// BenchmarkRawClientCPU is the anchor of the sidecars' own CPU per event
// (BenchmarkCalleeCPU, BenchmarkCallerCPU): raw amqp091-go making the same
// journey in processes of their own, one processor each (GOMAXPROCS=1, the
// sidecars' default), fed and read the way the sidecars are. This process
// writes b.N lines of DefaultBodySize bytes at rate=1000 a second to the
// publisher process's stdin (a harness streaming events); the publisher
// publishes each line as a persistent, mandatory message with publisher
// confirms (a window of DefaultWindow) to a quorum queue; the consumer
// process consumes them with prefetch 10 (the caller sidecar benchmark's)
// and cumulative acks, one per burst taken, and writes each body as a line
// to its stdout (an app stream), which this process counts. No HTTP, no
// log, no journal: what the AMQP client and one pipe each way cost per
// event here. cpu-µs/event of each process is its user+sys time
// (/proc/PID/stat) from the first line written until the last line is read
// back and 100 ms more, divided by b.N; pair-cpu-µs/event is their sum.
// The framework's probe run (b.N = 1) does nothing.
//
//	go test -run '^$' -bench BenchmarkRawClientCPU -benchtime 10000x ./internal/benchutil
func BenchmarkRawClientCPU(b *testing.B) {
	b.Run("rate=1000", func(b *testing.B) {
		if b.N == 1 {
			return
		}
		r := runRawPair(b, b.N, 1000, b.ResetTimer)
		b.StopTimer()
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(b.N) }
		b.ReportMetric(per(r.publisher), "publisher-cpu-µs/event")
		b.ReportMetric(per(r.consumer), "consumer-cpu-µs/event")
		b.ReportMetric(per(r.publisher+r.consumer), "pair-cpu-µs/event")
		b.ReportMetric(float64(b.N)/r.took.Seconds(), "events/s")
	})
}

// TestRawClientCPUSmoke runs BenchmarkRawClientCPU's pair on 300 lines (make
// test): every line comes back once and in order, and both processes'
// CPU is measured.
func TestRawClientCPUSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("RabbitMQ")
	}
	r := runRawPair(t, 300, 1000, func() {})
	if r.publisher <= 0 || r.consumer <= 0 {
		t.Errorf("CPU measured: publisher %s, consumer %s; want both above zero", r.publisher, r.consumer)
	}
}

// rawPair is what runRawPair measured: each process's CPU over the timed
// window, and the time until the last line came back.
type rawPair struct {
	publisher, consumer, took time.Duration
}

// runRawPair starts the consumer and publisher processes, calls started,
// writes n numbered lines to the publisher at rate a second and reads
// them back from the consumer, failing tb unless each comes back once, in
// order.
func runRawPair(tb testing.TB, n int, rate float64, started func()) rawPair {
	url := rawVhost(tb)
	cons := spawnRaw(tb, "consumer", url, n)
	pub := spawnRaw(tb, "publisher", url, n)
	pad := Body(DefaultBodySize - 10)
	line := func(i int) []byte { return fmt.Appendf(nil, "%08d %s\n", i, pad) }
	pace := NewPacer(rate)
	started()
	c0, p0, start := rawCPU(tb, cons), rawCPU(tb, pub), time.Now()
	go func() {
		w := bufio.NewWriter(pub.stdin)
		for i := range n {
			if pace.Wait(context.Background()) != nil {
				return
			}
			if _, err := w.Write(line(i)); err != nil || w.Flush() != nil {
				return
			}
		}
	}()
	for i := range n {
		if got, want := cons.next(tb, 5*time.Minute), strings.TrimSpace(string(line(i))); got != want {
			tb.Fatalf("line %d from the consumer: %.20q…, want %.20q…", i, got, want)
		}
	}
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	return rawPair{publisher: rawCPU(tb, pub) - p0, consumer: rawCPU(tb, cons) - c0, took: took}
}

// The environment of TestHelperRawClientProcess, set by spawnRaw.
const (
	rawRoleEnv  = "HCP_RAW_CLIENT_HELPER"
	rawURLEnv   = "HCP_RAW_CLIENT_HELPER_URL"
	rawCountEnv = "HCP_RAW_CLIENT_HELPER_COUNT"
)

// rawTopology is the benchmark's exchange, queue and binding in its vhost.
var rawTopology = Topology{Exchange: "raw.events", RoutingKey: "raw.event", Queue: "raw.events"}

// rawPrefetch is the consumer's prefetch, as BenchmarkCallerCPU's sidecar.
const rawPrefetch = 10

// TestHelperRawClientProcess is not a test on its own: BenchmarkRawClientCPU
// runs the test binary with this test selected to get a raw publisher or
// consumer in a process of its own. It prints READY once connected; the
// publisher publishes the lines of its stdin, the consumer prints the body
// of each message; both stop after the count they were given, then wait
// for SIGTERM.
func TestHelperRawClientProcess(t *testing.T) {
	role := os.Getenv(rawRoleEnv)
	if role == "" {
		t.Skip("helper process of BenchmarkRawClientCPU")
	}
	n, err := strconv.Atoi(os.Getenv(rawCountEnv))
	if err != nil {
		t.Fatal(err)
	}
	conn, ch, err := DialChannel(os.Getenv(rawURLEnv), "bench-raw-"+role)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	if role == "consumer" {
		err = rawConsume(ch, n)
	} else {
		err = rawPublish(ch, n)
	}
	if err != nil {
		t.Fatal(err)
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	<-term
}

// rawConsume takes n messages and acks them, cumulatively, once per burst.
func rawConsume(ch *amqp.Channel, n int) error {
	if err := ch.Qos(rawPrefetch, 0, false); err != nil {
		return err
	}
	deliveries, err := ch.Consume(rawTopology.Queue, "", false, false, false, false, nil)
	if err != nil {
		return err
	}
	fmt.Println("READY")
	out := bufio.NewWriter(os.Stdout)
	for got := 0; got < n; {
		d, ok := <-deliveries
		if !ok {
			return errors.New("the consumer's channel closed")
		}
		got++
		if _, err := out.Write(append(d.Body, '\n')); err != nil {
			return err
		}
		if len(deliveries) == 0 || got == n {
			if err := out.Flush(); err != nil {
				return err
			}
			if err := d.Ack(true); err != nil {
				return err
			}
		}
	}
	return nil
}

// rawPublish publishes the first n lines of stdin as they arrive, with a
// window of DefaultWindow unconfirmed, and waits for every confirm.
func rawPublish(ch *amqp.Channel, n int) error {
	if err := ch.Confirm(false); err != nil {
		return err
	}
	fmt.Println("READY")
	ctx := context.Background()
	in := bufio.NewReaderSize(os.Stdin, 64<<10)
	window := make([]*amqp.DeferredConfirmation, 0, DefaultWindow)
	confirm := func(dc *amqp.DeferredConfirmation) error {
		if ok, err := dc.WaitContext(ctx); err != nil || !ok {
			return fmt.Errorf("publish not confirmed (nacked: %v): %v", !ok, err)
		}
		return nil
	}
	for i := range n {
		line, err := in.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(window) == DefaultWindow {
			if err := confirm(window[0]); err != nil {
				return err
			}
			window = window[1:]
		}
		dc, err := ch.PublishWithDeferredConfirmWithContext(ctx, rawTopology.Exchange, rawTopology.RoutingKey, true, false, amqp.Publishing{
			ContentType: "application/json", DeliveryMode: amqp.Persistent, CorrelationId: runCorrelation,
			MessageId: messageID(i), Timestamp: time.Now().UTC(), Type: "event", Body: line[:len(line)-1],
		})
		if err != nil {
			return err
		}
		window = append(window, dc)
	}
	for _, dc := range window {
		if err := confirm(dc); err != nil {
			return err
		}
	}
	return nil
}

// rawProc is a running TestHelperRawClientProcess.
type rawProc struct {
	cmd   *exec.Cmd
	role  string
	stdin io.WriteCloser
	lines chan string
}

// spawnRaw starts a helper process in role and waits for its READY; it is
// stopped when b ends.
func spawnRaw(tb testing.TB, role, url string, n int) *rawProc {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperRawClientProcess$")
	cmd.Env = append(os.Environ(), "GOMAXPROCS=1", rawRoleEnv+"="+role, rawURLEnv+"="+url, rawCountEnv+"="+strconv.Itoa(n))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	must(tb, err)
	out, err := cmd.StdoutPipe()
	must(tb, err)
	must(tb, cmd.Start())
	p := &rawProc{cmd: cmd, role: role, stdin: stdin, lines: make(chan string, 1024)}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(make([]byte, 0, 64<<10), 64<<10)
		for sc.Scan() {
			p.lines <- strings.TrimSpace(sc.Text())
		}
		close(p.lines)
	}()
	if l := p.next(tb, 30*time.Second); l != "READY" {
		tb.Fatalf("the raw client process (%s) printed %q, want READY", role, l)
	}
	return p
}

// next returns the next line the process prints.
func (p *rawProc) next(tb testing.TB, limit time.Duration) string {
	select {
	case l, ok := <-p.lines:
		if !ok {
			tb.Fatalf("the raw client process (%s) ended", p.role)
		}
		return l
	case <-time.After(limit):
		tb.Fatalf("the raw client process (%s) printed nothing within %s", p.role, limit)
	}
	return ""
}

func rawCPU(tb testing.TB, p *rawProc) time.Duration {
	d, err := ProcessCPU(p.cmd.Process.Pid)
	must(tb, err)
	return d
}

// rawVhost makes a vhost of the benchmark's own on the local broker with
// rawTopology declared, deleted when b ends, and returns its AMQP URL.
func rawVhost(tb testing.TB) string {
	broker := testbed.EnsureRabbitMQ(tb)
	vhost := testbed.RandomName("hcp-raw-cpu-")
	must(tb, broker.CreateVhost(vhost))
	tb.Cleanup(func() {
		if err := broker.DeleteVhost(vhost); err != nil {
			tb.Errorf("delete vhost %s: %v", vhost, err)
		}
	})
	must(tb, testbed.Answered(broker.API.UpdatePermissionsIn(vhost, broker.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"})))
	url := broker.AMQPURI(broker.Username, broker.Password, vhost)
	must(tb, DeclareTopology(url, rawTopology))
	return url
}

func must(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}
