//go:build e2e

package scale

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
)

var managedBy = client.MatchingLabels{hcpv1alpha1.LabelManagedBy: hcpv1alpha1.ManagedByValue}

// readOnly: the test's cache lists only read what they list, so they take
// the cache's objects without copying them. Copying some 20,000 objects
// every 500 ms while waiting for a cleanup cost the test process 95 s of
// CPU at 1,000 + 1,000, CPU the API server and the garbage collector it
// waits for did not get.
var readOnly = client.UnsafeDisableDeepCopy

// count counts, in the test's cache, the operator's children (labelled
// managed-by hcp-operator) in namespaces, by kind.
func (b *bed) count(ctx context.Context, namespaces ...string) map[string]int {
	out := map[string]int{}
	for _, k := range childKinds {
		for _, ns := range namespaces {
			l := k.list()
			if err := b.cache.List(ctx, l, client.InNamespace(ns), managedBy, readOnly); err != nil {
				b.t.Fatal(err)
			}
			out[k.name] += meta.LenList(l)
		}
	}
	return out
}

// topologyReady counts the topology objects in namespaces and those Ready
// at their generation.
func (b *bed) topologyReady(ctx context.Context, namespaces ...string) (ready, total int) {
	for _, k := range childKinds {
		if k.ready == nil {
			continue
		}
		for _, ns := range namespaces {
			l := k.list()
			if err := b.cache.List(ctx, l, client.InNamespace(ns), managedBy, readOnly); err != nil {
				b.t.Fatal(err)
			}
			_ = meta.EachListItem(l, func(o runtime.Object) error {
				total++
				if k.ready(o.(client.Object)) {
					ready++
				}
				return nil
			})
		}
	}
	return ready, total
}

// waitFor polls cond every 500 ms until it holds, failing the test after
// the run's bound with cond's last description. It returns how long it
// took from start.
func (b *bed) waitFor(ctx context.Context, what string, start time.Time, cond func() (bool, string)) time.Duration {
	b.t.Helper()
	deadline := time.Now().Add(b.s.wait)
	lastLog := time.Now()
	for {
		ok, desc := cond()
		if ok {
			d := time.Since(start)
			b.t.Logf("%s after %s: %s", what, d.Round(100*time.Millisecond), desc)
			return d
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("%s: not within %s: %s", what, b.s.wait, desc)
		}
		if time.Since(lastLog) > 30*time.Second {
			b.t.Logf("%s: waiting (%s): %s", what, time.Since(start).Round(time.Second), desc)
			lastLog = time.Now()
		}
		select {
		case <-ctx.Done():
			b.t.Fatal(ctx.Err())
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// forBoth runs callee and caller for i in [0, n), each on its own
// goroutine, as the
// manager runs one worker per controller by default.
func forBoth(n int, callee, caller func(i int) error) error {
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for j, f := range []func(int) error{callee, caller} {
		wg.Go(func() {
			for i := range n {
				if err := f(i); err != nil {
					errs[j] = err
					return
				}
			}
		})
	}
	wg.Wait()
	if errs[0] != nil {
		return errs[0]
	}
	return errs[1]
}

// waitGone waits until namespaces hold no Callee, Caller or child and the
// broker holds nothing of vhost; when the cluster is clean but the broker
// is not, it waits 2 more minutes for the broker and returns what is left.
func (b *bed) waitGone(ctx context.Context, what string, start time.Time, vhost string, namespaces ...string) (time.Duration, leftover) {
	var clusterClean time.Time
	var left leftover
	var lastErr error
	d := b.waitFor(ctx, what+": nothing left in the cluster or on the broker", start, func() (bool, string) {
		c := b.count(ctx, namespaces...)
		var parts []string
		for _, k := range append(append([]kind{}, ownKinds...), childKinds...) {
			n := c[k.name]
			if k.list != nil && containsName([]string{"Callee", "Caller"}, k.name) {
				for _, ns := range namespaces {
					l := k.list()
					if err := b.cache.List(ctx, l, client.InNamespace(ns), readOnly); err != nil {
						b.t.Fatal(err)
					}
					n += meta.LenList(l)
				}
			}
			if n > 0 {
				parts = append(parts, fmt.Sprintf("%d %s", n, k.name))
			}
		}
		if len(parts) > 0 {
			return false, "in the cluster: " + strings.Join(parts, ", ")
		}
		if clusterClean.IsZero() {
			clusterClean = time.Now()
		}
		left, lastErr = onBroker(b.broker, vhost)
		if lastErr != nil {
			return false, "broker: " + lastErr.Error()
		}
		if left.total() > 0 && time.Since(clusterClean) > 2*time.Minute {
			return true, "cluster clean, but the broker still holds " + left.String()
		}
		return left.total() == 0, "on the broker: " + left.String()
	})
	if left.total() > 0 {
		b.t.Errorf("%s: orphans on the broker in vhost %s: %s", what, vhost, left)
	}
	return d, left
}

func converged(gen, observed int64, conds []metav1.Condition) (ready, topology bool) {
	if observed != gen {
		return false, false
	}
	topo := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionTopologyReady)
	h := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionHarnessReady)
	topology = topo != nil && topo.Status == metav1.ConditionTrue
	// Replicas 0 is HarnessReady=False, ScaledToZero (nothing consumes
	// the queue; Ready=True ScaledToZero). Everything the operator can
	// make ready is.
	harness := h != nil && (h.Status == metav1.ConditionTrue || h.Reason == hcpv1alpha1.ReasonScaledToZero)
	return topology && harness, topology
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func describeStatus(kind, name string, conds []metav1.Condition) string {
	c := meta.FindStatusCondition(conds, hcpv1alpha1.ConditionReady)
	if c == nil {
		return kind + " " + name + ": no status yet"
	}
	msg := c.Message
	if len(msg) > 200 {
		msg = msg[:200] + "…"
	}
	return fmt.Sprintf("%s %s: Ready=%s %s: %s", kind, name, c.Status, c.Reason, msg)
}

// waitQuiet waits until the harness controllers have nothing queued or in
// progress for three scrapes in a row.
func (b *bed) waitQuiet(ctx context.Context, m *manager) error {
	quiet := 0
	b.waitFor(ctx, "manager: work queues empty", time.Now(), func() (bool, string) {
		s, err := m.scrape()
		if err != nil {
			return false, err.Error()
		}
		if q := s.queued(); q > 0 {
			quiet = 0
			return false, fmt.Sprintf("%v queued or in progress", q)
		}
		quiet++
		return quiet >= 3, "nothing queued or in progress"
	})
	return nil
}

// serializedSize is the JSON size of what the manager holds for the run
// (the Callees and Callers, their children, the shared objects and the
// connection Secret), as the API server serves it and without
// managedFields (the manager's cache drops them).
func (b *bed) serializedSize(ctx context.Context) (full, trimmed int64) {
	add := func(l client.ObjectList) {
		_ = meta.EachListItem(l, func(o runtime.Object) error {
			raw, err := json.Marshal(o)
			if err != nil {
				b.t.Fatal(err)
			}
			full += int64(len(raw))
			o.(client.Object).SetManagedFields(nil)
			raw, _ = json.Marshal(o)
			trimmed += int64(len(raw))
			return nil
		})
	}
	for _, ns := range []string{b.op, b.home} {
		for _, k := range ownKinds {
			l := k.list()
			if err := b.cl.List(ctx, l, client.InNamespace(ns)); err != nil {
				b.t.Fatal(err)
			}
			add(l)
		}
		for _, k := range childKinds {
			l := k.list()
			if err := b.cl.List(ctx, l, client.InNamespace(ns), managedBy); err != nil {
				b.t.Fatal(err)
			}
			add(l)
		}
	}
	conn := &corev1.SecretList{}
	if err := b.cl.List(ctx, conn, client.InNamespace(b.home)); err != nil {
		b.t.Fatal(err)
	}
	for i := range conn.Items {
		if conn.Items[i].Name == connSecretName {
			add(&corev1.SecretList{Items: conn.Items[i : i+1]})
		}
	}
	return full, trimmed
}
