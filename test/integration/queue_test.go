package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// liveQueue is what the management API says of a queue, including what
// rabbit-hole leaves out: the policies applied to it and their merged
// definition.
type liveQueue struct {
	Name           string         `json:"name"`
	Arguments      map[string]any `json:"arguments"`
	Policy         string         `json:"policy"`
	OperatorPolicy string         `json:"operator_policy"`
	// EffectivePolicyDefinition merges the policy and the operator policy
	// (not the queue's arguments).
	EffectivePolicyDefinition map[string]any `json:"effective_policy_definition"`
	Messages                  int            `json:"messages"`
	MessagesReady             int            `json:"messages_ready"`
}

// getQueue reads GET /api/queues/{vhost}/{name}.
func getQueue(ctx context.Context, b *testbed.Broker, vhost, name string) (*liveQueue, error) {
	u := strings.TrimSuffix(b.ManagementURL, "/") + "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(name)
	// Not ctx's deadline: a poll's last error must say what was wrong,
	// not that the poll ran out of time.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(b.Username, b.Password)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	q := &liveQueue{}
	return q, json.NewDecoder(resp.Body).Decode(q)
}
