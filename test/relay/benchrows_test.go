package relay

import (
	"fmt"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
)

// benchRow is one scenario of the summary table BenchmarkRelay prints.
type benchRow struct {
	scenario   string
	sc         scenario
	raw, relay benchutil.Summary
	// floor is the harness API's floor (floorRun), where it was run.
	floor benchutil.Summary
	paced bool
}

var benchRows []benchRow

// verdict marks the ratios of sut against base ✓ or ✗ against their
// targets (the one that applies to the scenario: throughput unpaced, p99
// paced).
func verdict(sut, base benchutil.Summary, paced bool) (thr, p99 string) {
	mark := func(ok bool) string {
		if ok {
			return "✓"
		}
		return "✗"
	}
	t := sut.Throughput / base.Throughput
	p := float64(sut.P99) / float64(base.P99)
	if paced {
		return fmt.Sprintf("%.2f", t), fmt.Sprintf("%.2f %s", p, mark(p <= targetP99))
	}
	return fmt.Sprintf("%.2f %s", t, mark(t >= targetThroughput)), fmt.Sprintf("%.2f", p)
}

func (r benchRow) verdict() (thr, p99 string) { return verdict(r.relay, r.raw, r.paced) }

func formatRows(rows []benchRow) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-48s %10s %10s %8s %12s %12s %12s %12s %8s %22s %22s\n", "scenario", "raw ev/s", "relay ev/s", "ratio", "raw p50 ms", "raw p99 ms", "relay p50", "relay p99", "p99×",
		"raw CPU µs/ev cl+brk", "relay CPU µs/ev us+brk")
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	us := func(c benchutil.CPU) string {
		return fmt.Sprintf("%.0f + %.0f", float64(c.Self)/float64(time.Microsecond), float64(c.Broker)/float64(time.Microsecond))
	}
	for _, r := range rows {
		thr, p99 := r.verdict()
		fmt.Fprintf(&b, "%-48s %10.0f %10.0f %8s %12.2f %12.2f %12.2f %12.2f %8s %22s %22s\n", r.scenario, r.raw.Throughput, r.relay.Throughput, thr,
			ms(r.raw.P50), ms(r.raw.P99), ms(r.relay.P50), ms(r.relay.P99), p99, us(r.raw.CPUPerMessage), us(r.relay.CPUPerMessage))
	}
	floorHeader := true
	for _, r := range rows {
		if r.floor.Runs == 0 {
			continue
		}
		if floorHeader {
			fmt.Fprintf(&b, "the harness API's floor (raw amqp091-go behind the same harness and app, HTTP on both sides, nothing else), against raw and the relay against it, same targets:\n%-48s %10s %10s %12s %12s %12s %12s %22s\n",
				"scenario", "floor ev/s", "floor/raw", "relay/floor", "floor p99 ms", "p99× raw", "relay p99×", "floor CPU µs/ev us+brk")
			floorHeader = false
		}
		floorThr, floorP99 := verdict(r.floor, r.raw, r.paced)
		relayThr, relayP99 := verdict(r.relay, r.floor, r.paced)
		fmt.Fprintf(&b, "%-48s %10.0f %10s %12s %12.2f %12s %12s %22s\n", r.scenario, r.floor.Throughput, floorThr, relayThr,
			ms(r.floor.P99), floorP99, relayP99, us(r.floor.CPUPerMessage))
	}
	self, broker := benchutil.PeakRSS()
	fmt.Fprintf(&b, "CPU per event: \"cl\" the raw client, \"us\" this process (both sidecars, the harness and the app), \"brk\" the RabbitMQ node; peak RSS: this process %d MiB, the RabbitMQ node %d MiB\n",
		self>>20, broker>>20)
	return b.String()
}
