package callee

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
	"github.com/hcp-io/hcp-operator/internal/testbed"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// BenchmarkCalleeCPU is the callee sidecar's own CPU per harness event: the
// sidecar runs as a process of its own (TestHelperCalleeSidecarProcess: the
// real harness API handler, write-ahead log on disk and ConfirmPublisher on
// RabbitMQ, one RUNNING session with a trace context), and this process
// plays the harness, posting b.N progress events (about 300 bytes of data)
// at rate=1000 events/s or as fast as the sidecar takes them (rate=max),
// and the caller, a raw amqp091-go consumer draining its event queue (a
// quorum queue, as the operator declares it). The harness posts over
// api=stream, one NDJSON event stream whose acks come after the broker's
// confirms, or api=async, one POST …/events per event with Prefer:
// respond-async on a kept-alive connection. cpu-µs/event is the sidecar
// process's user+sys time (/proc/PID/stat) from the first event posted
// until the caller has them all and 100 ms more (the last confirms),
// divided by b.N; events/s is b.N over the time until the caller has
// them all. The framework's probe run (b.N = 1) does nothing. With
// HCP_CALLEE_SIDECAR_HELPER_CPUPROFILE=file the sidecar process writes its
// CPU profile there (run one sub-benchmark).
//
//	go test -run '^$' -bench BenchmarkCalleeCPU -benchtime 5000x -count 6 ./internal/sidecar/callee
func BenchmarkCalleeCPU(b *testing.B) {
	url, user := benchVhost(b) // one for the sub-benchmarks: a broker shared with others
	for _, api := range []string{"stream", "async"} {
		for _, rate := range []float64{1000, 0} {
			name := "rate=max"
			if rate > 0 {
				name = fmt.Sprintf("rate=%g", rate)
			}
			b.Run("api="+api+"/"+name, func(b *testing.B) { benchCalleeCPU(b, url, user, api, rate) })
		}
	}
}

func benchCalleeCPU(b *testing.B, url, user, api string, rate float64) {
	if b.N == 1 {
		return
	}
	sid := deriveSID(fmt.Sprintf("%036d", time.Now().UnixNano()))
	p := spawnCalleeProcess(b, url, user, sid)
	if path := os.Getenv(cpuProfileEnv); path != "" {
		b.Logf("the sidecar process writes its CPU profile to %s", path)
	}
	conn, err := amqp.Dial(url)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	got := drainEvents(b, conn, b.N)
	lines := benchEventLines(b.N)
	endpoint := "http://" + p.addr + "/hcp/v1/sessions/" + sid + "/events"
	pace := benchutil.NewPacer(rate)
	pid := p.cmd.Process.Pid
	b.ResetTimer()
	cpu0, start := procCPU(b, pid), time.Now()
	errc := make(chan error, 1)
	go func() {
		if api == "stream" {
			errc <- postStream(endpoint, lines, pace)
		} else {
			errc <- postAsync(endpoint, lines, pace)
		}
	}()
	deadline := time.After(5 * time.Minute)
	for got.Load() < int64(b.N) {
		select {
		case err := <-errc:
			if err != nil {
				b.Fatal(err)
			}
			errc = nil
		case <-deadline:
			b.Fatalf("the caller got %d of %d events", got.Load(), b.N)
		case <-time.After(time.Millisecond):
		}
	}
	took := time.Since(start)
	time.Sleep(100 * time.Millisecond)
	cpu := procCPU(b, pid) - cpu0
	b.StopTimer()
	if errc != nil {
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/event")
	b.ReportMetric(float64(b.N)/took.Seconds(), "events/s")
	p.stop()
}

// benchVhost makes a vhost of the benchmark's own on the local broker with
// the caller's event queue and the events exchange, and returns an AMQP
// URL for it and the broker user's name (the sidecar's user_id). The vhost
// is deleted when b ends, retried while a busy broker times out (a vhost
// left behind keeps its quorum queue running on a shared broker).
func benchVhost(b *testing.B) (url, user string) {
	broker := testbed.EnsureRabbitMQ(b)
	vhost := testbed.RandomName("hcp-callee-cpu-")
	must(b, broker.CreateVhost(vhost))
	b.Cleanup(func() {
		if err := broker.DeleteVhost(vhost); err != nil { // retried for minutes
			b.Error(err)
		}
	})
	must(b, testbed.Answered(broker.API.UpdatePermissionsIn(vhost, broker.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"})))
	url = broker.AMQPURI(broker.Username, broker.Password, vhost)
	conn, err := amqp.Dial(url)
	must(b, err)
	defer func() { _ = conn.Close() }()
	ch, err := conn.Channel()
	must(b, err)
	must(b, ch.ExchangeDeclare(topology.EventsExchange, "topic", true, false, false, false, nil))
	_, err = ch.QueueDeclare(topology.EventQueue(callerID), true, false, false, false, amqp.Table{
		"x-queue-type": "quorum", "x-message-ttl": int64(86400000), "x-max-length": int64(100000), "x-overflow": "drop-head",
	})
	must(b, err)
	must(b, ch.QueueBind(topology.EventQueue(callerID), topology.EventBindingKey(callerID), topology.EventsExchange, false, nil))
	return url, broker.Username
}

// drainEvents consumes the caller's event queue (acknowledged in groups)
// and counts the deliveries.
func drainEvents(b *testing.B, conn *amqp.Connection, n int) *atomic.Int64 {
	ch, err := conn.Channel()
	must(b, err)
	_, err = ch.QueuePurge(topology.EventQueue(callerID), false) // what an earlier sub-benchmark left
	must(b, err)
	must(b, ch.Qos(1000, 0, false))
	ds, err := ch.Consume(topology.EventQueue(callerID), "bench-caller", false, false, false, false, nil)
	must(b, err)
	var got atomic.Int64
	go func() {
		for d := range ds {
			if c := got.Add(1); c%100 == 0 || c == int64(n) {
				_ = d.Ack(true)
			}
		}
	}()
	return &got
}

// benchEventLines are n progress events, each a line of JSON.
func benchEventLines(n int) [][]byte {
	msg := strings.Repeat("x", 200)
	lines := make([][]byte, n)
	for i := range lines {
		lines[i] = fmt.Appendf(nil, `{"event_type":"progress","data":{"stage":"step %d","percent":%g,"message":"%s"}}`+"\n",
			i, float64(i*100/n), msg)
	}
	return lines
}

// postStream posts the lines on one NDJSON event stream, paced, and reads
// its acks until the last line's.
func postStream(endpoint string, lines [][]byte, pace *benchutil.Pacer) error {
	pr, pw := io.Pipe()
	go func() {
		for _, l := range lines {
			if pace.Wait(context.Background()) != nil {
				break
			}
			if _, err := pw.Write(l); err != nil {
				return
			}
		}
		_ = pw.Close()
	}()
	req, err := http.NewRequest(http.MethodPost, endpoint, pr)
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", server.ContentTypeNDJSON)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = res.Body.Close() }()
	sc := bufio.NewScanner(res.Body)
	var last []byte
	for sc.Scan() {
		last = append(last[:0], sc.Bytes()...)
	}
	if !bytes.Contains(last, []byte(`"done":true`)) || !bytes.Contains(last, []byte(`"through":`+strconv.Itoa(len(lines)))) {
		return fmt.Errorf("the stream ended with %s", last)
	}
	return nil
}

// postAsync posts the lines one per request with Prefer: respond-async,
// paced, on one kept-alive connection.
func postAsync(endpoint string, lines [][]byte, pace *benchutil.Pacer) error {
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	for _, l := range lines {
		if err := pace.Wait(context.Background()); err != nil {
			return err
		}
		req, err := http.NewRequest(http.MethodPost, endpoint, bytes.NewReader(l))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Prefer", "respond-async")
		res, err := c.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if res.StatusCode != http.StatusAccepted {
			return fmt.Errorf("POST events: %s %s", res.Status, body)
		}
	}
	return nil
}

// procCPU is the user+sys time of process pid so far.
func procCPU(b *testing.B, pid int) time.Duration {
	d, err := benchutil.ProcessCPU(pid)
	if err != nil {
		b.Fatal(err)
	}
	return d
}
