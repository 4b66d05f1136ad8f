package transport

// Metrics receives what a Conn measures. The transport names no metric
// itself: the program that dials decides the series (the hcp-sidecar's
// *metrics.Metrics implements this interface), so this package depends on
// no application package. Every method must be safe for concurrent use.
type Metrics interface {
	// SetConnected reports that the connection of role (Options.Role) is
	// up or down.
	SetConnected(role string, up bool)
	// Reconnected counts a recovery of the connection of role after it
	// was lost (not its first connection).
	Reconnected(role string)
	// Confirmed counts a publisher confirm outcome: one of ConfirmAck,
	// ConfirmNack, ConfirmReturned, ConfirmLost.
	Confirmed(result string)
	// Redelivered counts a delivery that carried the redelivered flag.
	Redelivered()
}

// Publisher confirm outcomes passed to Metrics.Confirmed.
const (
	// ConfirmAck: the broker took responsibility for the message.
	ConfirmAck = "ack"
	// ConfirmNack: the broker refused it (basic.nack).
	ConfirmNack = "nack"
	// ConfirmReturned: it was mandatory and no queue was bound to take it.
	ConfirmReturned = "returned"
	// ConfirmLost: the connection or channel went away before a confirm.
	ConfirmLost = "lost"
)

// noMetrics is the Metrics of a Conn dialled without any.
type noMetrics struct{}

func (noMetrics) SetConnected(string, bool) {}
func (noMetrics) Reconnected(string)        {}
func (noMetrics) Confirmed(string)          {}
func (noMetrics) Redelivered()              {}
