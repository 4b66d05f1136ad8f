package testbed_test

import (
	"context"
	"errors"
	"fmt"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	amqp "github.com/rabbitmq/amqp091-go"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/testbed"
)

// TestTestbed proves the bed end to end: envtest with the topology CRDs, the
// real broker, the real topology operator; a Vhost and a quorum Queue with a
// TTL argument become Ready and exist in the broker as declared, and deleting
// the Queue deletes the queue.
func TestTestbed(t *testing.T) {
	if testing.Short() {
		t.Skip("slow: starts envtest, RabbitMQ and the topology operator")
	}
	start := time.Now()
	broker := testbed.EnsureRabbitMQ(t)
	env := testbed.StartEnv(t, testbed.Options{})
	ns := env.CreateNamespace(t, "testbed-")
	mto := testbed.StartTopologyOperator(t, env.Kubeconfig, ns)
	c := env.Client
	ctx := t.Context()

	vhostName := testbed.RandomName("/hcp-testbed-")
	broker.CleanupVhost(t, vhostName)
	testbed.DumpOnFailure(t, testbed.Dump{
		Client:    c,
		Namespace: ns,
		Lists:     []client.ObjectList{&topologyv1beta1.VhostList{}, &topologyv1beta1.QueueList{}},
		Operators: []*testbed.TopologyOperator{mto},
		Broker:    broker,
		Vhosts:    []string{vhostName},
	})

	secret, err := testbed.CreateConnectionSecret(ctx, c, ns, "rabbitmq")
	if err != nil {
		t.Fatal(err)
	}
	ref := topologyv1beta1.RabbitmqClusterReference{ConnectionSecret: &corev1.LocalObjectReference{Name: secret.Name}}
	vhost := &topologyv1beta1.Vhost{
		ObjectMeta: metav1.ObjectMeta{Name: "hcp", Namespace: ns},
		Spec:       topologyv1beta1.VhostSpec{Name: vhostName, RabbitmqClusterReference: ref},
	}
	const queueName, ttl = "hcp.evt.testbed", 60000
	queue := &topologyv1beta1.Queue{
		ObjectMeta: metav1.ObjectMeta{Name: "evt-testbed", Namespace: ns},
		Spec: topologyv1beta1.QueueSpec{
			Name:                     queueName,
			Vhost:                    vhostName,
			Type:                     "quorum",
			Durable:                  ptr.To(true),
			Arguments:                &runtime.RawExtension{Raw: []byte(`{"x-message-ttl":` + strconv.Itoa(ttl) + `}`)},
			RabbitmqClusterReference: ref,
		},
	}
	for _, o := range []client.Object{vhost, queue} {
		if err := c.Create(ctx, o); err != nil {
			t.Fatalf("create %T: %v", o, err)
		}
	}
	testbed.WaitForTopologyReady(t, c, vhost, time.Minute)
	testbed.WaitForTopologyReady(t, c, queue, time.Minute)
	t.Logf("Vhost and Queue Ready %s after start", time.Since(start).Round(time.Millisecond))

	q, err := broker.Queue(vhostName, queueName)
	if err != nil {
		t.Fatalf("queue %s in vhost %s: %v", queueName, vhostName, err)
	}
	if q.Type != "quorum" || !q.Durable {
		t.Errorf("queue %s: type=%q durable=%t, want quorum, durable", queueName, q.Type, q.Durable)
	}
	// JSON numbers decode as float64.
	if got, ok := q.Arguments["x-message-ttl"].(float64); !ok || got != ttl {
		t.Errorf("queue %s: x-message-ttl=%v (%T), want %d; arguments %v", queueName, q.Arguments["x-message-ttl"], q.Arguments["x-message-ttl"], ttl, q.Arguments)
	}

	// The operator's finalizer deletes the queue in the broker, then lets go.
	if err := c.Delete(ctx, queue); err != nil {
		t.Fatal(err)
	}
	testbed.Eventually(t, time.Minute, "Queue deleted in the broker and the API", func(ctx context.Context) error {
		if _, err := broker.Queue(vhostName, queueName); !testbed.IsNotFound(err) {
			return fmt.Errorf("queue still in the broker (err %v)", err)
		}
		if err := c.Get(ctx, client.ObjectKeyFromObject(queue), queue); !apierrors.IsNotFound(err) {
			return fmt.Errorf("Queue object still there: finalizers %v (err %v)", queue.Finalizers, err)
		}
		return nil
	})
	if mto.Exited() {
		t.Error("the topology operator exited during the test")
	}
	t.Logf("test bed verified in %s", time.Since(start).Round(time.Millisecond))
}

// TestBrokerCloseConnections proves the fault-injection helper: a connection
// opened just before is closed at once (the management API would not list it
// yet), and the client sees CONNECTION_FORCED.
func TestBrokerCloseConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("needs RabbitMQ")
	}
	b := testbed.EnsureRabbitMQ(t)
	vhost := testbed.RandomName("hcp-testbed-conn-")
	if err := b.CreateVhost(vhost); err != nil {
		t.Fatal(err)
	}
	b.CleanupVhost(t, vhost)
	if _, err := b.API.UpdatePermissionsIn(vhost, b.Username, rabbithole.Permissions{Configure: ".*", Write: ".*", Read: ".*"}); err != nil {
		t.Fatal(err)
	}
	conn, err := amqp.Dial(b.AMQPURI(b.Username, b.Password, vhost))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	closed := conn.NotifyClose(make(chan *amqp.Error, 1))
	if err := b.CloseConnectionsIn(vhost); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-closed:
		if e == nil || e.Code != amqp.ConnectionForced {
			t.Errorf("connection closed with %v, want CONNECTION_FORCED", e)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the connection was not closed within 10s")
	}
}

// TestNotImportedByProductionCode keeps the test bed out of binaries: only
// _test.go files and the test bed itself may import it.
func TestNotImportedByProductionCode(t *testing.T) {
	root, err := testbed.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	const pkg = testbed.ModulePath + "/internal/testbed"
	self := filepath.Join(root, "internal", "testbed")
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path == self || (path != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, imp := range f.Imports {
			if p, _ := strconv.Unquote(imp.Path.Value); p == pkg {
				rel, _ := filepath.Rel(root, path)
				t.Errorf("%s imports %s, which is for tests only", rel, pkg)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.SkipAll) {
		t.Fatal(err)
	}
}

func TestFreeAddrsAreDistinct(t *testing.T) {
	for range 50 {
		addrs, err := testbed.FreeAddrs(4)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string]bool{}
		for _, a := range addrs {
			if seen[a] {
				t.Fatalf("FreeAddrs(4) = %v: %s twice", addrs, a)
			}
			seen[a] = true
		}
	}
}
