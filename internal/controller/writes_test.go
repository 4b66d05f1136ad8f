package controller

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// managerWrites counts the suite manager's API writes (POST, PUT, PATCH,
// DELETE) by namespace and "verb resource[/subresource]", as its HTTP
// client sends them: the controllers' client and its Event recorder alike.
var managerWrites = &writeCounter{byNS: map[string]map[string]int{}}

type writeCounter struct {
	mu   sync.Mutex
	byNS map[string]map[string]int
}

// countWrites returns a copy of cfg whose requests managerWrites counts.
func countWrites(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if req.Method != http.MethodGet {
				managerWrites.add(req.Method, req.URL.Path)
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// add records one write to path: /api/v1/namespaces/NS/RES[/name[/sub]] or
// /apis/G/V/namespaces/NS/RES[/name[/sub]].
func (w *writeCounter) add(method, path string) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	ns, what := "", path
	for i, p := range parts {
		if p == "namespaces" && i+2 < len(parts) {
			ns, what = parts[i+1], parts[i+2]
			if i+4 < len(parts) {
				what += "/" + parts[i+4]
			}
			break
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byNS[ns] == nil {
		w.byNS[ns] = map[string]int{}
	}
	w.byNS[ns][method+" "+what]++
}

// in returns a copy of the counts of namespace ns.
func (w *writeCounter) in(ns string) map[string]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := map[string]int{}
	for k, v := range w.byNS[ns] {
		m[k] = v
	}
	return m
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// since returns now minus before, key by key.
func since(now, before map[string]int) map[string]int {
	for k, v := range before {
		if now[k] -= v; now[k] == 0 {
			delete(now, k)
		}
	}
	return now
}

func breakdown(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var sb strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&sb, "\n  %4d %s", m[k], k)
	}
	return sb.String()
}

// writesTable renders the writes of n Callees (callees) and n Callers
// (callers) by verb and resource: count and per object of each kind, and
// the mean per Callee/Caller.
func writesTable(n int, callees, callers map[string]int) string {
	keys := map[string]bool{}
	for k := range callees {
		keys[k] = true
	}
	for k := range callers {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	var sb strings.Builder
	row := func(what string, e, r int) {
		fmt.Fprintf(&sb, "\n  %-28s %8d %7.2f %8d %7.2f %7.2f", what, e, float64(e)/float64(n), r, float64(r)/float64(n), float64(e+r)/float64(2*n))
	}
	fmt.Fprintf(&sb, "\n  %-28s %8s %7s %8s %7s %7s", "write", "Callees", "each", "Callers", "each", "mean")
	for _, k := range sorted {
		row(k, callees[k], callers[k])
	}
	row("total", total(callees), total(callers))
	return sb.String()
}

// writesBudget is issue 35's bound on the manager's API writes per Callee
// or Caller with replicas 0, from creation until converged, Events
// included (test/scale's targetWritesPerObject).
const writesBudget = 12

// TestManagerWritesPerObject: N Callees and N Callers with no replicas, as
// in test/scale's TestScale, in one vhost, each converge (Ready=True
// ScaledToZero, the topology operator played by the test as soon as each
// object appears); once the manager is quiet, the mean of its writes in
// their namespaces (Callees in one, Callers in another), Events included,
// is at most writesBudget per object. The shared per-vhost objects, made
// once per vhost in the shared home, are printed apart.
func TestManagerWritesPerObject(t *testing.T) {
	const n = 20
	nsE, nsR := newNamespace(t, "writes-e-"), newNamespace(t, "writes-r-")
	dumpOnFailure(t, nsE)
	dumpOnFailure(t, nsR)
	vhost := testVhost(nsE)
	beforeE, beforeR, beforeHome := managerWrites.in(nsE), managerWrites.in(nsR), managerWrites.in(suiteBrokerNamespace)
	var objs []client.Object
	for i := range n {
		objs = append(objs,
			newCallee(nsE, fmt.Sprintf("e%d", i), func(c *hcpv1alpha1.Callee) {
				c.Spec.Broker.Vhost = vhost
				c.Spec.Harness.Replicas = new(int32(0))
			}),
			newCaller(nsR, fmt.Sprintf("r%d", i), func(c *hcpv1alpha1.Caller) {
				c.Spec.Broker.Vhost = vhost
				c.Spec.Harness = &hcpv1alpha1.HarnessSpec{Template: harnessTemplate("example.com/caller:1"), Replicas: new(int32(0))}
			}))
	}
	start := time.Now()
	create(t, objs...)
	key := claimedKey(t, objs[0])
	testbed.Eventually(t, 2*time.Minute, "all Ready=True ScaledToZero", func(ctx context.Context) error {
		// The topology operator: every topology object Ready as soon as
		// it exists.
		for _, ns := range []string{nsE, nsR} {
			if err := declareAll(ctx, ns, client.MatchingLabels{}); err != nil {
				return err
			}
		}
		if err := declareAll(ctx, suiteBrokerNamespace, client.MatchingLabels{hcpv1alpha1.LabelVhostKey: key}); err != nil {
			return err
		}
		for _, o := range objs {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(o), o); err != nil {
				return err
			}
			v, _ := viewOf(o)
			c := meta.FindStatusCondition(*v.conditions, hcpv1alpha1.ConditionReady)
			if c == nil || c.Status != metav1.ConditionTrue || c.Reason != hcpv1alpha1.ReasonScaledToZero {
				return fmt.Errorf("%s: Ready %+v", o.GetName(), c)
			}
		}
		return nil
	})
	ready := time.Since(start)
	// Until quiet: no write in the three namespaces for 3 s.
	last := -1
	for {
		cur := total(managerWrites.in(nsE)) + total(managerWrites.in(nsR)) + total(managerWrites.in(suiteBrokerNamespace))
		if cur == last {
			break
		}
		last = cur
		time.Sleep(3 * time.Second)
	}
	e, r := since(managerWrites.in(nsE), beforeE), since(managerWrites.in(nsR), beforeR)
	home := since(managerWrites.in(suiteBrokerNamespace), beforeHome)
	mean := float64(total(e)+total(r)) / float64(2*n)
	t.Logf("%d Callees + %d Callers (replicas 0, one vhost), all Ready after %s: manager writes in their namespaces by verb and resource, %.2f per Callee/Caller (budget %d):%s",
		n, n, ready.Round(100*time.Millisecond), mean, writesBudget, writesTable(n, e, r))
	t.Logf("and in the shared home %s meanwhile (the vhost's shared objects, and whatever other tests' objects still do there), %.2f per Callee/Caller:%s",
		suiteBrokerNamespace, float64(total(home))/float64(2*n), breakdown(home))
	if mean > writesBudget {
		t.Errorf("%.2f manager writes per Callee/Caller, want ≤ %d", mean, writesBudget)
	}
}

// declareAll plays the topology operator: every topology object in ns
// (matching sel) without a Ready condition for its generation gets one.
func declareAll(ctx context.Context, ns string, sel client.MatchingLabels) error {
	lists := []client.ObjectList{&topologyv1beta1.QueueList{}, &topologyv1beta1.BindingList{}, &topologyv1beta1.UserList{},
		&topologyv1beta1.PermissionList{}, &topologyv1beta1.PolicyList{}, &topologyv1beta1.ExchangeList{}, &topologyv1beta1.VhostList{}}
	var errs []error
	for _, l := range lists {
		if err := k8sClient.List(ctx, l, client.InNamespace(ns), sel); err != nil {
			return err
		}
		items, err := meta.ExtractList(l)
		if err != nil {
			return err
		}
		for _, it := range items {
			o := it.(client.Object)
			if testbed.TopologyReady(o) == nil {
				continue
			}
			errs = append(errs, writeTopologyStatus(ctx, o, true, ""))
		}
	}
	return errors.Join(errs...)
}
