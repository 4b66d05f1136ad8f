//go:build e2e

package scale

import (
	"fmt"
	"slices"
	"strings"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// leftover is what the broker still holds of a run's vhost: users named
// for it ({role}.{id}@{vhost}; users are global, so a vhost's deletion
// would not remove them), queues and HCP exchanges in it, and permissions
// on it of anyone but the connection's own user.
type leftover struct {
	users, queues, permissions, exchanges int
	examples                              []string
}

func (l leftover) total() int { return l.users + l.queues + l.permissions + l.exchanges }

func (l leftover) String() string {
	s := fmt.Sprintf("%d users, %d queues, %d permissions, %d exchanges", l.users, l.queues, l.permissions, l.exchanges)
	if len(l.examples) > 0 {
		s += " (e.g. " + strings.Join(l.examples, ", ") + ")"
	}
	return s
}

func (l *leftover) example(s string) {
	if len(l.examples) < 5 {
		l.examples = append(l.examples, s)
	}
}

// onBroker counts what the broker holds of vhost. A vhost that does not
// exist holds nothing.
func onBroker(b *testbed.Broker, vhost string) (leftover, error) {
	var l leftover
	users, err := b.Users()
	if err != nil {
		return l, fmt.Errorf("list users: %w", err)
	}
	for _, u := range users {
		if strings.HasSuffix(u.Name, "@"+vhost) {
			l.users++
			l.example("user " + u.Name)
		}
	}
	queues, err := b.Queues(vhost)
	if err != nil && !testbed.IsNotFound(err) {
		return l, fmt.Errorf("list queues: %w", err)
	}
	for _, q := range queues {
		l.queues++
		l.example("queue " + q.Name)
	}
	perms, err := b.Permissions(vhost)
	if err != nil {
		return l, fmt.Errorf("list permissions: %w", err)
	}
	for _, p := range perms {
		if p.User != b.Username {
			l.permissions++
			l.example("permission of " + p.User)
		}
	}
	xs, err := b.Exchanges(vhost)
	if err != nil && !testbed.IsNotFound(err) {
		return l, fmt.Errorf("list exchanges: %w", err)
	}
	for _, x := range xs {
		if slices.Contains([]string{"hcp.commands", "hcp.events"}, x.Name) {
			l.exchanges++
			l.example("exchange " + x.Name)
		}
	}
	return l, nil
}

// cleanBroker removes what a run left of vhost (on failure, and the
// retained vhost itself).
func cleanBroker(b *testbed.Broker, vhost string) error {
	users, err := b.Users()
	if err != nil {
		return err
	}
	var names []string
	for _, u := range users {
		if strings.HasSuffix(u.Name, "@"+vhost) {
			names = append(names, u.Name)
		}
	}
	if err := b.DeleteUsers(names...); err != nil {
		return err
	}
	if err := b.DeleteVhost(vhost); err != nil && !testbed.IsNotFound(err) {
		return err
	}
	return nil
}
