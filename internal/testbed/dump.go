package testbed

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"
)

// Dump says what DumpOnFailure prints.
type Dump struct {
	// Client and Lists: the objects of each list type (e.g.
	// &topologyv1beta1.QueueList{}) in Namespace ("" for all), as YAML.
	Client    client.Client
	Namespace string
	Lists     []client.ObjectList
	// Operators whose logs to print.
	Operators []*TopologyOperator
	// Broker and Vhosts: the queues, exchanges, bindings and permissions of
	// each vhost, and the broker's users.
	Broker *Broker
	Vhosts []string
}

// DumpOnFailure prints d when the test has failed by the time it ends.
// Register it after starting what it dumps: cleanups run last-registered
// first, so it runs while the API server, operators and vhosts still exist.
func DumpOnFailure(t testing.TB, d Dump) {
	t.Helper()
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // t.Context is done in cleanups
		defer cancel()
		if d.Client != nil {
			for _, l := range d.Lists {
				t.Logf("testbed dump: %s", dumpList(ctx, d.Client, d.Namespace, l))
			}
		}
		for _, o := range d.Operators {
			o.dump(t)
		}
		if d.Broker != nil {
			t.Logf("testbed dump: broker %s\n%s", d.Broker.ManagementURL, dumpBroker(d.Broker, d.Vhosts))
		}
	})
}

func dumpList(ctx context.Context, c client.Client, ns string, list client.ObjectList) string {
	gvk, err := apiutil.GVKForObject(list, c.Scheme())
	if err != nil {
		return fmt.Sprintf("%T: %v", list, err)
	}
	kind := strings.TrimSuffix(gvk.Kind, "List")
	if err := c.List(ctx, list, client.InNamespace(ns)); err != nil {
		return fmt.Sprintf("%s: list: %v", kind, err)
	}
	items, err := meta.ExtractList(list)
	if err != nil {
		return fmt.Sprintf("%s: %v", kind, err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s in namespace %q\n", len(items), kind, ns)
	for _, it := range items {
		b.WriteString("---\n")
		b.WriteString(objectYAML(it, gvk.GroupVersion().WithKind(kind)))
	}
	return b.String()
}

func objectYAML(o runtime.Object, gvk schema.GroupVersionKind) string {
	o = o.DeepCopyObject()
	if m, err := meta.Accessor(o); err == nil {
		m.SetManagedFields(nil)
	}
	o.GetObjectKind().SetGroupVersionKind(gvk)
	y, err := yaml.Marshal(o)
	if err != nil {
		return fmt.Sprintf("(%v)\n", err)
	}
	return string(y)
}

func dumpBroker(b *Broker, vhosts []string) string {
	var w strings.Builder
	if len(vhosts) == 0 {
		all, err := b.API.ListVhosts()
		if err != nil {
			return fmt.Sprintf("list vhosts: %v", err)
		}
		for _, v := range all {
			vhosts = append(vhosts, v.Name)
		}
	}
	for _, v := range vhosts {
		fmt.Fprintf(&w, "vhost %q:\n", v)
		if qs, err := b.Queues(v); err != nil {
			fmt.Fprintf(&w, "  queues: %v\n", err)
		} else {
			for _, q := range qs {
				fmt.Fprintf(&w, "  queue %s type=%s durable=%t messages=%d consumers=%d state=%s arguments=%v\n",
					q.Name, q.Type, q.Durable, q.Messages, q.Consumers, q.Status, q.Arguments)
			}
		}
		if xs, err := b.Exchanges(v); err != nil {
			fmt.Fprintf(&w, "  exchanges: %v\n", err)
		} else {
			for _, x := range xs {
				if x.Name == "" || strings.HasPrefix(x.Name, "amq.") {
					continue // built-in
				}
				fmt.Fprintf(&w, "  exchange %s type=%s durable=%t arguments=%v\n", x.Name, x.Type, x.Durable, x.Arguments)
			}
		}
		if bs, err := b.Bindings(v); err != nil {
			fmt.Fprintf(&w, "  bindings: %v\n", err)
		} else {
			for _, bd := range bs {
				if bd.Source == "" {
					continue // the default exchange's implicit bindings
				}
				fmt.Fprintf(&w, "  binding %s -> %s %s key=%q arguments=%v\n", bd.Source, bd.DestinationType, bd.Destination, bd.RoutingKey, bd.Arguments)
			}
		}
		if ps, err := b.Permissions(v); err != nil {
			fmt.Fprintf(&w, "  permissions: %v\n", err)
		} else {
			for _, p := range ps {
				fmt.Fprintf(&w, "  permission %s configure=%q write=%q read=%q\n", p.User, p.Configure, p.Write, p.Read)
			}
		}
	}
	if us, err := b.Users(); err != nil {
		fmt.Fprintf(&w, "users: %v\n", err)
	} else {
		names := make([]string, 0, len(us))
		for _, u := range us {
			names = append(names, fmt.Sprintf("%s%v", u.Name, []string(u.Tags)))
		}
		slices.Sort(names)
		fmt.Fprintf(&w, "users: %s\n", strings.Join(names, " "))
	}
	return w.String()
}
