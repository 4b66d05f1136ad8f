// Package metrics defines the hcp-sidecar's Prometheus metrics, shared by
// both modes so dashboards and alerts see one set of names.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the sidecar's collectors. Create them once with New and
// register them on the registry served at /metrics.
type Metrics struct {
	// MessagesIn counts deliveries consumed, by message type.
	MessagesIn *prometheus.CounterVec
	// MessagesOut counts messages published, by message type.
	MessagesOut *prometheus.CounterVec
	// Confirms counts publisher confirm outcomes: ack, nack, returned, lost.
	Confirms *prometheus.CounterVec
	// Redeliveries counts deliveries with the redelivered flag set.
	Redeliveries prometheus.Counter
	// Rejects counts task rejections and discarded messages, by reason code.
	Rejects *prometheus.CounterVec
	// Duplicates counts deliveries skipped as duplicates, by kind
	// (message_id for task_submit, sequence for events).
	Duplicates *prometheus.CounterVec
	// Sessions is the number of sessions this sidecar tracks, by L2 state.
	Sessions *prometheus.GaugeVec
	// StatusWrites counts HCPSession writes, by result (ok, conflict, error).
	StatusWrites *prometheus.CounterVec
	// LabelWrites counts the metadata patches that keep an HCPSession's
	// hcp.io/state label in step with status.state (callee mode; at most
	// one per state change), by result (ok, error).
	LabelWrites *prometheus.CounterVec
	// Reconnects counts AMQP connection recoveries, by connection
	// (publish, consume: the sidecar keeps one of each, so that flow
	// control on publishing never holds up consuming).
	Reconnects *prometheus.CounterVec
	// Connected is 1 while the AMQP connection is up, by connection.
	Connected *prometheus.GaugeVec
	// AppDeliveries counts events handed to the local app/harness over HTTP,
	// by result (ok, error).
	AppDeliveries *prometheus.CounterVec
	// AppBatchMax is how many events one request to the app may carry
	// (caller): the Caller's appMaxBatch when above 1, otherwise what the
	// app offers (HCP-Batch-Max), 1 without an offer.
	AppBatchMax prometheus.Gauge
	// Released counts deliveries a caller sidecar returned to the queue
	// because their session could not use them yet (its app was failing,
	// or it waited for a gap) and such sessions already held their share
	// of the prefetch window, or the window was full of them (per-session
	// isolation).
	Released prometheus.Counter
	// Latency observes the time from an event's envelope timestamp to its
	// delivery to the app (caller mode), in seconds.
	Latency prometheus.Histogram
	// SessionsTotal counts the tasks this callee sidecar brought to an
	// end, by capability and outcome (session.go: SessionEnded,
	// TaskRejected): the numerator and denominator of a session SLO.
	SessionsTotal *prometheus.CounterVec
	// SessionDuration observes how long the sessions this callee sidecar
	// ended ran, from their acceptance to their terminal state, by
	// capability and outcome (rejected tasks never ran: not observed).
	SessionDuration *prometheus.HistogramVec
	// Contradictions counts two copies of one message of a session with
	// different bodies (caller: the same sequence, or a second terminal
	// message), by kind (sequence, terminal). The first body delivered is
	// kept.
	Contradictions *prometheus.CounterVec
	// DeadLetters counts messages moved to a dead-letter queue, by reason
	// (caller: max_attempts).
	DeadLetters *prometheus.CounterVec
}

// ConnectionLabel names the AMQP connection (publish, consume) of
// Reconnects and Connected.
const ConnectionLabel = "connection"

// resultLabel is the label of the counters that count outcomes.
const resultLabel = "result"

// New creates the collectors and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		MessagesIn:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_messages_in_total", Help: "AMQP deliveries consumed, by HCP message type."}, []string{"type"}),
		MessagesOut:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_messages_out_total", Help: "Messages published, by HCP message type."}, []string{"type"}),
		Confirms:      prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_publisher_confirms_total", Help: "Publisher confirm outcomes."}, []string{resultLabel}),
		Redeliveries:  prometheus.NewCounter(prometheus.CounterOpts{Name: "hcp_sidecar_redeliveries_total", Help: "Deliveries that carried the redelivered flag."}),
		Rejects:       prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_rejects_total", Help: "Tasks rejected and messages discarded, by reason code."}, []string{"reason"}),
		Duplicates:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_duplicates_total", Help: "Deliveries skipped as duplicates."}, []string{"kind"}),
		Sessions:      prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hcp_sidecar_sessions", Help: "Sessions tracked by this sidecar, by L2 state."}, []string{"state"}),
		StatusWrites:  prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_status_writes_total", Help: "HCPSession writes, by result."}, []string{resultLabel}),
		LabelWrites:   prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_state_label_writes_total", Help: "HCPSession hcp.io/state label updates, by result."}, []string{resultLabel}),
		Reconnects:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_amqp_reconnects_total", Help: "AMQP connection recoveries, by connection."}, []string{ConnectionLabel}),
		Connected:     prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "hcp_sidecar_amqp_connected", Help: "1 while the AMQP connection is up, by connection."}, []string{ConnectionLabel}),
		AppDeliveries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_app_deliveries_total", Help: "Events and tasks handed to the local harness or app over HTTP, by result."}, []string{resultLabel}),
		AppBatchMax:   prometheus.NewGauge(prometheus.GaugeOpts{Name: "hcp_sidecar_app_batch_max", Help: "Events one request to the app may carry: the Caller's appMaxBatch above 1, else the app's HCP-Batch-Max offer, 1 without one (caller)."}),
		Released:      prometheus.NewCounter(prometheus.CounterOpts{Name: "hcp_sidecar_released_total", Help: "Deliveries returned to the queue because their session could not use them yet: its app was failing or it waited for a gap (caller)."}),
		Latency:       prometheus.NewHistogram(prometheus.HistogramOpts{Name: "hcp_sidecar_event_latency_seconds", Help: "Event timestamp to app delivery.", Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16)}),
		SessionsTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sessions_total",
			Help: "Tasks a callee brought to an end, by capability and outcome (COMPLETED, FAILED, TIMED_OUT, ABORTED, REJECTED)."}, []string{capabilityLabel, outcomeLabel}),
		SessionDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "hcp_session_duration_seconds",
			Help: "Sessions a callee ended, from acceptance to terminal state, by capability and outcome.", Buckets: SessionDurationBuckets}, []string{capabilityLabel, outcomeLabel}),
		Contradictions: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_contradictions_total", Help: "Copies of one message of a session with different bodies (caller), by kind; the first delivered is kept."}, []string{"kind"}),
		DeadLetters:    prometheus.NewCounterVec(prometheus.CounterOpts{Name: "hcp_sidecar_dead_letters_total", Help: "Messages moved to a dead-letter queue, by reason."}, []string{"reason"}),
	}
	reg.MustRegister(m.MessagesIn, m.MessagesOut, m.Confirms, m.Redeliveries, m.Rejects, m.Duplicates,
		m.Sessions, m.StatusWrites, m.LabelWrites, m.Reconnects, m.Connected, m.AppDeliveries, m.AppBatchMax, m.Released, m.Latency,
		m.SessionsTotal, m.SessionDuration, m.Contradictions, m.DeadLetters)
	return m
}

// The methods below make *Metrics the Metrics of internal/transport
// (transport.Options.Metrics): the transport reports what happened and
// the series stay named here. A nil *Metrics records nothing.

// SetConnected sets hcp_sidecar_amqp_connected{connection=role} to 1 or 0.
func (m *Metrics) SetConnected(role string, up bool) {
	if m == nil {
		return
	}
	v := 0.0
	if up {
		v = 1
	}
	m.Connected.WithLabelValues(role).Set(v)
}

// Reconnected counts hcp_sidecar_amqp_reconnects_total{connection=role}.
func (m *Metrics) Reconnected(role string) {
	if m == nil {
		return
	}
	m.Reconnects.WithLabelValues(role).Inc()
}

// Confirmed counts hcp_sidecar_publisher_confirms_total{result}.
func (m *Metrics) Confirmed(result string) {
	if m == nil {
		return
	}
	m.Confirms.WithLabelValues(result).Inc()
}

// Redelivered counts hcp_sidecar_redeliveries_total.
func (m *Metrics) Redelivered() {
	if m == nil {
		return
	}
	m.Redeliveries.Inc()
}
