package testbed

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
)

// VhostOpTimeout bounds CreateVhost and DeleteVhost, every attempt included.
//
// RabbitMQ starts and stops each vhost's process tree under one supervisor
// for all vhosts (rabbit_vhost_sup_sup), so a vhost that is slow to stop
// (its queues terminating, a message store flushing) holds up every other
// vhost's creation and deletion on the node. On two shared cores with two
// test packages at work that has taken minutes, past any one request's
// timeout: the operations are retried, as PUT and DELETE of a vhost are
// idempotent, until this much time has passed.
const VhostOpTimeout = 4 * time.Minute

// CreateVhost creates vhost (PUT; an existing one is fine), retrying a
// timed-out or failed attempt (see VhostOpTimeout). Its error says what the
// broker's log showed last, when this process may read it.
func (b *Broker) CreateVhost(vhost string) error {
	return b.vhostOp("create", vhost, func() error {
		return Answered(b.API.PutVhost(vhost, rabbithole.VhostSettings{}))
	})
}

// DeleteVhost deletes vhost and everything in it; a missing vhost is fine.
// It retries like CreateVhost.
func (b *Broker) DeleteVhost(vhost string) error {
	return b.vhostOp("delete", vhost, func() error {
		r, err := b.API.DeleteVhost(vhost) // rabbit-hole takes a 404 as done
		if err == nil {
			_ = r.Body.Close()
		}
		return err
	})
}

func (b *Broker) vhostOp(what, vhost string, op func() error) error {
	deadline := time.Now().Add(b.vhostOpTimeout())
	for attempts := 1; ; attempts++ {
		err := op()
		if err == nil {
			return nil
		}
		if !retryable(err) || time.Now().After(deadline) {
			return fmt.Errorf("testbed: %s vhost %s: %d attempts in %s, the last: %w%s",
				what, vhost, attempts, b.vhostOpTimeout(), err, b.logTail())
		}
		time.Sleep(time.Second)
	}
}

func (b *Broker) vhostOpTimeout() time.Duration {
	if b.VhostOpTimeout > 0 {
		return b.VhostOpTimeout
	}
	return VhostOpTimeout
}

// retryable: the request timed out, the connection failed, or the broker
// answered 5xx (the management API's 500 for a vhost whose start timed out
// on the node; rabbit-hole returns any answer from 400 up as an
// ErrorResponse).
func retryable(err error) bool {
	var ne net.Error
	if errors.As(err, &ne) || errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var er rabbithole.ErrorResponse
	return errors.As(err, &er) && er.StatusCode >= http.StatusInternalServerError
}

// logTail is the broker's last log lines, for an error message, when this
// process may use the CLI (see rabbitmqctl) and b is the broker it talks to;
// else "".
func (b *Broker) logTail() string {
	ctl, ok := rabbitmqctl()
	if !ok || b.ManagementURL != envOr("RABBITMQ_MANAGEMENT_URL", DefaultManagementURL) {
		return ""
	}
	diag := strings.TrimSuffix(ctl, "rabbitmqctl") + "rabbitmq-diagnostics"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, diag, "-q", "log_tail", "-N", "30")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Sprintf("\nthe broker's log: rabbitmq-diagnostics log_tail: %v: %s", err, out)
	}
	return "\nthe broker's log, last 30 lines:\n" + string(out)
}

// CleanupVhost deletes vhost, and the users named for it, when the test
// ends. Register it before DumpOnFailure so the dump still sees the vhost
// (cleanups run last first).
func (b *Broker) CleanupVhost(t testing.TB, vhost string) {
	t.Helper()
	t.Cleanup(func() {
		if err := b.DeleteVhost(vhost); err != nil {
			t.Error(err)
		}
		// Users named for it (role.id@vhost) that the test left, for
		// instance when the topology operator stopped before their
		// finalizers ran: deleting a vhost does not delete users.
		// Best effort: the test's own subject is not at stake here.
		users, err := b.Users()
		if err != nil {
			t.Logf("testbed: list users: %v", err)
			return
		}
		var left []string
		for _, u := range users {
			if strings.HasSuffix(u.Name, "@"+vhost) {
				left = append(left, u.Name)
			}
		}
		if err := b.DeleteUsers(left...); err != nil {
			t.Logf("testbed: %v", err)
		}
	})
}
