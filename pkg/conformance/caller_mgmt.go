package conformance

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
)

var consumerChecks = []string{CnsManualAck, CnsPrefetch, CnsExclusive, CnsHeartbeat}

// consumerInfo is what the management API says of a consumer.
type consumerInfo struct {
	AckRequired   bool `json:"ack_required"`
	Exclusive     bool `json:"exclusive"`
	PrefetchCount int  `json:"prefetch_count"`
	Channel       struct {
		Name       string `json:"name"`
		Connection string `json:"connection_name"`
	} `json:"channel_details"`
}

// mgmtGet GETs a management API path (already escaped) into out.
func mgmtGet(api *rabbithole.Client, path string, out any) error {
	u := strings.TrimSuffix(api.Endpoint, "/") + path
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.SetBasicAuth(api.Username, api.Password)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", path, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// consumer is CNS-1..3: the caller's consumer as the management API shows
// it (consumer_details lags by the statistics interval: waited for).
func (s *crun) consumer(ctx context.Context) {
	r, cfg := s.r, s.k.cfg
	if cfg.ManagementURL == "" {
		for _, id := range consumerChecks {
			r.skip(id, "no management URL given (--management-url)")
		}
		return
	}
	api, err := managementClient(cfg.mgmtConfig())
	if err != nil {
		for _, id := range consumerChecks {
			r.fail(id, "management API: %v", err)
		}
		return
	}
	path := "/api/queues/" + url.PathEscape(cfg.Vhost) + "/" + url.PathEscape(cfg.evtQueue)
	var q struct {
		Consumers []consumerInfo `json:"consumer_details"`
	}
	deadline := time.Now().Add(cfg.Timeout)
	for {
		err = mgmtGet(api, path, &q)
		if (err == nil && len(q.Consumers) > 0) || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if err != nil || len(q.Consumers) == 0 {
		for _, id := range consumerChecks {
			r.fail(id, "no consumer of %s in the management API within %s (%v)", cfg.evtQueue, cfg.Timeout, err)
		}
		return
	}
	heartbeatCheck(r, api, cfg)
	for _, c := range q.Consumers {
		if c.PrefetchCount == 0 && c.Channel.Name != "" {
			// basic.qos global: the channel's limit applies.
			var ch struct {
				Global int `json:"global_prefetch_count"`
			}
			if mgmtGet(api, "/api/channels/"+url.PathEscape(c.Channel.Name), &ch) == nil {
				c.PrefetchCount = ch.Global
			}
		}
		judgeConsumer(r, cfg.evtQueue, c)
	}
}

// judgeConsumer is CNS-1..3 for one consumer.
func judgeConsumer(r *recorder, queue string, c consumerInfo) {
	if c.AckRequired {
		r.pass(CnsManualAck, "the consumer of %s acknowledges manually (ack_required true)", queue)
	} else {
		r.fail(CnsManualAck, "the consumer of %s has ack_required false (no_ack true): events are gone once sent", queue)
	}
	if c.PrefetchCount >= 1 && c.PrefetchCount <= 100 {
		r.pass(CnsPrefetch, "prefetch_count %d", c.PrefetchCount)
	} else {
		r.fail(CnsPrefetch, "prefetch_count %d (0 is unlimited)", c.PrefetchCount)
	}
	if c.Exclusive {
		r.fail(CnsExclusive, "the consumer of %s is exclusive", queue)
	} else {
		r.pass(CnsExclusive, "the consumer of %s is not exclusive", queue)
	}
}

// heartbeatCheck is CNS-4: the heartbeat (timeout, in seconds) each
// connection of the caller's user in the vhost negotiated.
func heartbeatCheck(r *recorder, api *rabbithole.Client, cfg *callerResolved) {
	if cfg.CallerUser == "" {
		r.skip(CnsHeartbeat, "the caller's broker user is unknown (--caller-user)")
		return
	}
	// The per-user listing has no details: each connection is read by name.
	var conns []struct {
		Name    string `json:"name"`
		Vhost   string `json:"vhost"`
		Timeout int    `json:"timeout"`
	}
	if err := mgmtGet(api, "/api/connections/username/"+url.PathEscape(cfg.CallerUser), &conns); err != nil {
		r.fail(CnsHeartbeat, "list the connections of %s: %v", cfg.CallerUser, err)
		return
	}
	for i := range conns {
		if err := mgmtGet(api, "/api/connections/"+url.PathEscape(conns[i].Name), &conns[i]); err != nil {
			r.fail(CnsHeartbeat, "connection %s: %v", conns[i].Name, err)
			return
		}
	}
	var seen, bad []string
	for _, c := range conns {
		if c.Vhost != cfg.Vhost {
			continue
		}
		seen = append(seen, fmt.Sprintf("%ds", c.Timeout))
		if c.Timeout < 30 || c.Timeout > 60 {
			bad = append(bad, fmt.Sprintf("%s: heartbeat %ds", c.Name, c.Timeout))
		}
	}
	switch {
	case len(seen) == 0:
		r.fail(CnsHeartbeat, "the management API lists no connection of %s in vhost %q", cfg.CallerUser, cfg.Vhost)
	case len(bad) > 0:
		r.fail(CnsHeartbeat, "%s (0 is none; L1:301 recommends 30–60 s)", strings.Join(bad, "; "))
	default:
		r.pass(CnsHeartbeat, "%d connection(s) of %s, heartbeat %s", len(seen), cfg.CallerUser, strings.Join(seen, ", "))
	}
}

// closeConnections has the broker close every connection of user in the
// kit's vhost (DELETE /api/connections/{name}); it needs a management
// user allowed to close other users' connections (administrator or
// monitoring with management rights on the vhost).
func closeConnections(cfg *callerResolved, user string) ([]string, error) {
	api, err := managementClient(cfg.mgmtConfig())
	if err != nil {
		return nil, err
	}
	var names []string
	deadline := time.Now().Add(cfg.Timeout)
	for len(names) == 0 {
		conns, err := api.ListConnectionsOfUser(user)
		if err != nil {
			return nil, fmt.Errorf("list the connections of %s: %w", user, err)
		}
		for _, c := range conns {
			if c.Vhost != cfg.Vhost {
				continue
			}
			if _, err := api.CloseConnection(c.Name); err != nil {
				return names, fmt.Errorf("close %s: %w", c.Name, err)
			}
			names = append(names, c.Name)
		}
		if len(names) == 0 {
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("the management API lists no connection of %s in vhost %q", user, cfg.Vhost)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	return names, nil
}

// drained is ACK-1: once every session has ended, the caller's queue holds
// nothing, ready or unacknowledged (the management API's counts lag by the
// statistics interval: waited for).
func (s *crun) drained(ctx context.Context) {
	r, cfg := s.r, s.k.cfg
	if cfg.ManagementURL == "" {
		r.skip(AckAll, "no management URL given (--management-url)")
		return
	}
	api, err := managementClient(cfg.mgmtConfig())
	if err != nil {
		r.fail(AckAll, "management API: %v", err)
		return
	}
	path := "/api/queues/" + url.PathEscape(cfg.Vhost) + "/" + url.PathEscape(cfg.evtQueue)
	var q struct {
		Messages int `json:"messages"`
		Ready    int `json:"messages_ready"`
		Unacked  int `json:"messages_unacknowledged"`
	}
	deadline := time.Now().Add(cfg.Timeout)
	for ctx.Err() == nil {
		err = mgmtGet(api, path, &q)
		if err == nil && q.Messages == 0 && q.Unacked == 0 {
			r.pass(AckAll, "%s: 0 messages ready, 0 unacknowledged after every session ended", cfg.evtQueue)
			return
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second)
	}
	r.fail(AckAll, "%s still holds %d ready and %d unacknowledged messages %s after every session ended (%v)", cfg.evtQueue, q.Ready, q.Unacked, cfg.Timeout, err)
}
