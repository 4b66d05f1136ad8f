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

	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

var mgmtChecks = []string{MgmtExchanges, MgmtCommandQueue, MgmtEventQueue, MgmtEventQueueTTL, MgmtEventQueueMax}

// management checks types, bindings and queue arguments through the
// RabbitMQ management API, when one is configured.
func (s *run) management(context.Context) {
	r, cfg := s.r, s.k.cfg
	if cfg.ManagementURL == "" {
		for _, id := range mgmtChecks {
			r.skip(id, "no management URL given (--management-url)")
		}
		return
	}
	api, err := managementClient(cfg)
	if err != nil {
		for _, id := range mgmtChecks {
			r.fail(id, "management API %s: %v", redactURL(cfg.ManagementURL), err)
		}
		return
	}
	exchangesCheck(r, api, cfg.Vhost)
	cmdQueueCheck(r, api, cfg)
	evtQueueChecks(r, api, cfg)
}

func managementClient(cfg *resolved) (*rabbithole.Client, error) {
	u, err := url.Parse(cfg.ManagementURL)
	if err != nil {
		return nil, err
	}
	user, pass := cfg.uri.Username, cfg.uri.Password
	if u.User != nil {
		user = u.User.Username()
		pass, _ = u.User.Password()
	}
	u.User = nil
	api, err := rabbithole.NewClient(u.String(), user, pass)
	if err != nil {
		return nil, err
	}
	api.SetTimeout(15 * time.Second)
	return api, nil
}

// exchangesCheck is MGMT-1.
func exchangesCheck(r *recorder, api *rabbithole.Client, vhost string) {
	for _, x := range []struct{ name, kind string }{
		{topology.CommandsExchange, topology.CommandsExchangeType},
		{topology.EventsExchange, topology.EventsExchangeType},
	} {
		info, err := api.GetExchange(vhost, x.name)
		switch {
		case err != nil:
			r.fail(MgmtExchanges, "exchange %s: %v", x.name, err)
			return
		case info.Type != x.kind || !info.Durable || info.AutoDelete:
			r.fail(MgmtExchanges, "exchange %s: type %s durable %t auto_delete %t, want %s, durable", x.name, info.Type, info.Durable, info.AutoDelete, x.kind)
			return
		}
	}
	r.pass(MgmtExchanges, "%s direct durable, %s topic durable", topology.CommandsExchange, topology.EventsExchange)
}

func hasBinding(bs []rabbithole.BindingInfo, source, key string) bool {
	for _, b := range bs {
		if b.Source == source && b.RoutingKey == key {
			return true
		}
	}
	return false
}

func cmdQueueCheck(r *recorder, api *rabbithole.Client, cfg *resolved) {
	q, err := api.GetQueue(cfg.Vhost, cfg.cmdQueue)
	if err != nil {
		r.fail(MgmtCommandQueue, "queue %s: %v", cfg.cmdQueue, err)
		return
	}
	bs, err := api.ListQueueBindings(cfg.Vhost, cfg.cmdQueue)
	if err != nil {
		r.fail(MgmtCommandQueue, "bindings of %s: %v", cfg.cmdQueue, err)
		return
	}
	res, d := commandQueueResult(q.Durable, q.Arguments, hasBinding(bs, topology.CommandsExchange, cfg.commandKey), cfg)
	r.set(MgmtCommandQueue, res, "%s", d)
}

func evtQueueChecks(r *recorder, api *rabbithole.Client, cfg *resolved) {
	q, err := api.GetQueue(cfg.Vhost, cfg.evtQueue)
	if err != nil {
		for _, id := range []string{MgmtEventQueue, MgmtEventQueueTTL, MgmtEventQueueMax} {
			r.fail(id, "queue %s: %v", cfg.evtQueue, err)
		}
		return
	}
	bs, err := api.ListQueueBindings(cfg.Vhost, cfg.evtQueue)
	key := topology.EventBindingKey(cfg.CallerID)
	switch {
	case err != nil:
		r.fail(MgmtEventQueue, "bindings of %s: %v", cfg.evtQueue, err)
	case !q.Durable:
		r.fail(MgmtEventQueue, "%s is not durable", cfg.evtQueue)
	case !hasBinding(bs, topology.EventsExchange, key):
		r.fail(MgmtEventQueue, "%s is not bound to %s with %s", cfg.evtQueue, topology.EventsExchange, key)
	default:
		r.pass(MgmtEventQueue, "%s durable (%s), bound to %s with %s", cfg.evtQueue, orClassic(q.Type), topology.EventsExchange, key)
	}
	limits := q.Arguments
	if def, err := effectivePolicy(api, cfg.Vhost, cfg.evtQueue); err == nil {
		limits = effectiveLimits(q.Arguments, def)
	}
	res, d := eventQueueTTLResult(limits)
	r.set(MgmtEventQueueTTL, res, "%s", d)
	res, d = eventQueueMaxResult(limits)
	r.set(MgmtEventQueueMax, res, "%s", d)
}

// effectivePolicy reads the definition of the policies that apply to a
// queue (effective_policy_definition: its policy and operator policy
// merged by the broker), which rabbit-hole's QueueInfo does not carry.
func effectivePolicy(api *rabbithole.Client, vhost, queue string) (map[string]any, error) {
	u := strings.TrimSuffix(api.Endpoint, "/") + "/api/queues/" + url.PathEscape(vhost) + "/" + url.PathEscape(queue)
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(api.Username, api.Password)
	resp, err := (&http.Client{Timeout: 15 * time.Second}).Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	var q struct {
		Definition map[string]any `json:"effective_policy_definition"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&q); err != nil {
		return nil, err
	}
	return q.Definition, nil
}

// effectiveLimits are the queue's limits as the broker applies them to a
// quorum queue, as queue arguments (x- keys): for a numeric limit set both
// as an argument and by policy the lower value, for overflow the policy's.
// The project's operator sets its limits by policy, so that they can
// change on a live queue; other deployments declare them as arguments.
func effectiveLimits(args, policy map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range args {
		out[k] = v
	}
	for _, k := range []string{"message-ttl", "max-length", "max-length-bytes"} {
		p, okP := number(policy[k])
		if !okP {
			continue
		}
		if a, okA := number(args["x-"+k]); !okA || p < a {
			out["x-"+k] = float64(p)
		}
	}
	if ov, ok := policy["overflow"].(string); ok {
		out["x-overflow"] = ov
	}
	return out
}

func orClassic(t string) string {
	if t == "" {
		return "classic"
	}
	return t
}

// commandQueueResult judges the command queue (MGMT-2) from what the
// management API says.
func commandQueueResult(durable bool, args map[string]any, bound bool, cfg *resolved) (Result, string) {
	switch {
	case !durable:
		return Fail, cfg.cmdQueue + " is not durable"
	case !bound:
		return Fail, fmt.Sprintf("%s is not bound to %s with %s", cfg.cmdQueue, topology.CommandsExchange, cfg.commandKey)
	case args["x-message-ttl"] != nil:
		return Fail, fmt.Sprintf("%s has x-message-ttl %v: commands must not expire", cfg.cmdQueue, args["x-message-ttl"])
	}
	return Pass, fmt.Sprintf("%s durable, bound with %s, no TTL; arguments %v", cfg.cmdQueue, cfg.commandKey, args)
}

// eventQueueTTLResult judges MGMT-4 from the event queue's arguments.
func eventQueueTTLResult(args map[string]any) (Result, string) {
	ttl, ok := number(args["x-message-ttl"])
	switch {
	case !ok:
		return Fail, fmt.Sprintf("no numeric x-message-ttl (arguments %v)", args)
	case ttl <= 0:
		return Fail, fmt.Sprintf("x-message-ttl %v", ttl)
	}
	return Pass, fmt.Sprintf("x-message-ttl %s", time.Duration(ttl)*time.Millisecond)
}

// eventQueueMaxResult judges MGMT-5 from the event queue's arguments.
func eventQueueMaxResult(args map[string]any) (Result, string) {
	n, okN := number(args["x-max-length"])
	b, okB := number(args["x-max-length-bytes"])
	ov, _ := args["x-overflow"].(string)
	switch {
	case !okN && !okB:
		return Fail, fmt.Sprintf("neither x-max-length nor x-max-length-bytes (arguments %v)", args)
	case ov != "drop-head" && ov != "":
		return Fail, fmt.Sprintf("x-overflow %q, want drop-head", ov)
	}
	d := "x-overflow drop-head"
	if ov == "" {
		d = "x-overflow unset (the broker's default, drop-head)"
	}
	if okN {
		d = fmt.Sprintf("x-max-length %d, %s", n, d)
	}
	if okB {
		d = fmt.Sprintf("x-max-length-bytes %d, %s", b, d)
	}
	return Pass, d
}

// number reads a JSON number (float64) or an integer.
func number(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		return int64(n), true
	case int:
		return int64(n), true
	case int64:
		return n, true
	}
	return 0, false
}
