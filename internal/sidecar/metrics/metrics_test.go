package metrics_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hcp-io/hcp-operator/internal/sidecar/metrics"
	"github.com/hcp-io/hcp-operator/internal/transport"
)

// The sidecar hands its Metrics to the transport.
var _ transport.Metrics = (*metrics.Metrics)(nil)

// TestTransportSeries checks that what the transport reports lands in the
// series dashboards and alerts read, under their names and labels.
func TestTransportSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	var tm transport.Metrics = metrics.New(reg)
	tm.SetConnected("publish", true)
	tm.SetConnected("consume", true)
	tm.SetConnected("consume", false)
	tm.Reconnected("consume")
	tm.Reconnected("consume")
	tm.Confirmed(transport.ConfirmAck)
	tm.Confirmed(transport.ConfirmAck)
	tm.Confirmed(transport.ConfirmLost)
	tm.Redelivered()

	want := `
# HELP hcp_sidecar_amqp_connected 1 while the AMQP connection is up, by connection.
# TYPE hcp_sidecar_amqp_connected gauge
hcp_sidecar_amqp_connected{connection="consume"} 0
hcp_sidecar_amqp_connected{connection="publish"} 1
# HELP hcp_sidecar_amqp_reconnects_total AMQP connection recoveries, by connection.
# TYPE hcp_sidecar_amqp_reconnects_total counter
hcp_sidecar_amqp_reconnects_total{connection="consume"} 2
# HELP hcp_sidecar_publisher_confirms_total Publisher confirm outcomes.
# TYPE hcp_sidecar_publisher_confirms_total counter
hcp_sidecar_publisher_confirms_total{result="ack"} 2
hcp_sidecar_publisher_confirms_total{result="lost"} 1
# HELP hcp_sidecar_redeliveries_total Deliveries that carried the redelivered flag.
# TYPE hcp_sidecar_redeliveries_total counter
hcp_sidecar_redeliveries_total 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"hcp_sidecar_amqp_connected", "hcp_sidecar_amqp_reconnects_total", "hcp_sidecar_publisher_confirms_total", "hcp_sidecar_redeliveries_total"); err != nil {
		t.Error(err)
	}
}

// TestNilRecordsNothing: a nil *Metrics given to the transport is a no-op,
// as a nil *Metrics was before the transport took an interface.
func TestNilRecordsNothing(t *testing.T) {
	var m *metrics.Metrics
	var tm transport.Metrics = m
	tm.SetConnected("publish", true)
	tm.Reconnected("publish")
	tm.Confirmed(transport.ConfirmNack)
	tm.Redelivered()
}
