package transport

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
)

// TestConnectionFailed: a publish that failed on the socket (the write
// error amqp091-go returns before it closes the channel) waits for the
// next channel instead of failing its event; a refusal of the message
// itself does not.
func TestConnectionFailed(t *testing.T) {
	reset := &net.OpError{Op: "write", Net: "tcp", Err: os.NewSyscallError("write", syscall.ECONNRESET)}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{reset, true},
		{fmt.Errorf("wrapped: %w", reset), true},
		{syscall.EPIPE, true},
		{amqp.ErrClosed, true},
		{&amqp.Error{Code: amqp.PreconditionFailed, Reason: "PRECONDITION_FAILED"}, false},
		{errors.New("message too large"), false},
	} {
		if got := connectionFailed(tc.err); got != tc.want {
			t.Errorf("connectionFailed(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
