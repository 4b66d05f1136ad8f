package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"slices"
	"strings"
	"testing"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// EnvSkipBroker, set to "1", skips every test that needs the broker instead
// of failing it. It is an explicit opt-out: without it a missing broker fails.
const EnvSkipBroker = "HCP_SKIP_BROKER"

// Defaults match hack/testbed-rabbitmq.sh and Debian's rabbitmq-server; the
// same environment variables override both.
const (
	DefaultManagementURL = "http://127.0.0.1:15672"
	DefaultAMQPURL       = "amqp://127.0.0.1:5672"
	DefaultUsername      = "guest"
	DefaultPassword      = "guest"
)

var brokerReady once[string]

// EnsureRabbitMQ makes sure the local broker runs with the management plugin
// and quorum queues (hack/testbed-rabbitmq.sh, once per test process: it may
// start or even install RabbitMQ) and returns a Broker for it. It fails the
// test with the script's message when that is impossible, or skips it when
// HCP_SKIP_BROKER=1 (then the script does not run at all).
func EnsureRabbitMQ(t testing.TB) *Broker {
	t.Helper()
	if BrokerSkipped() {
		t.Skipf("testbed: %s=1: skipping a test that needs RabbitMQ", EnvSkipBroker)
	}
	b, err := EnsureBroker(t.Context())
	if err != nil {
		t.Fatalf("testbed: RabbitMQ with the management plugin is not available (set %s=1 to skip broker tests explicitly): %v", EnvSkipBroker, err)
	}
	return b
}

// BrokerSkipped reports whether HCP_SKIP_BROKER=1 asks to skip broker tests.
func BrokerSkipped() bool { return os.Getenv(EnvSkipBroker) == "1" }

// EnsureBroker is EnsureRabbitMQ for TestMain: it returns the script's error
// instead of failing a test, and does not look at HCP_SKIP_BROKER.
func EnsureBroker(ctx context.Context) (*Broker, error) {
	mgmtURL, err := brokerReady.do(func() (string, error) {
		// Not ctx: the result is shared by the whole process.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute) // apt-get install included
		defer cancel()
		u, _, err := runScript(ctx, "testbed-rabbitmq.sh")
		return u, err
	})
	if err != nil {
		return nil, err
	}
	return NewBroker(mgmtURL, envOr("RABBITMQ_USERNAME", DefaultUsername), envOr("RABBITMQ_PASSWORD", DefaultPassword))
}

// Broker inspects and cleans up the broker through the management API.
type Broker struct {
	// ManagementURL is the management API's base URL, as a topology operator
	// connection Secret's uri wants it.
	ManagementURL      string
	Username, Password string
	// AMQPURL is the AMQP endpoint without credentials or vhost; see AMQPURI.
	AMQPURL string
	// API is the underlying client, for what the helpers do not cover.
	API *rabbithole.Client
	// VhostOpTimeout overrides the package's VhostOpTimeout when set.
	VhostOpTimeout time.Duration
}

// NewBroker returns a Broker for a management API; the AMQP endpoint comes
// from $RABBITMQ_AMQP_URL or DefaultAMQPURL.
func NewBroker(managementURL, username, password string) (*Broker, error) {
	api, err := rabbithole.NewClient(managementURL, username, password)
	if err != nil {
		return nil, err
	}
	api.SetTimeout(15 * time.Second)
	return &Broker{
		ManagementURL: managementURL,
		Username:      username,
		Password:      password,
		AMQPURL:       envOr("RABBITMQ_AMQP_URL", DefaultAMQPURL),
		API:           api,
	}, nil
}

// AMQPURI returns an amqp:// URI for user/password on vhost.
func (b *Broker) AMQPURI(username, password, vhost string) string {
	u, err := url.Parse(b.AMQPURL)
	if err != nil {
		panic(fmt.Sprintf("testbed: bad AMQP URL %q: %v", b.AMQPURL, err))
	}
	u.User = url.UserPassword(username, password)
	// The vhost is one path segment: "/" and "/hcp" must be escaped (%2F).
	u.Path = "/" + vhost
	u.RawPath = "/" + url.PathEscape(vhost)
	return u.String()
}

// Queues lists the queues in vhost with their type and arguments.
func (b *Broker) Queues(vhost string) ([]rabbithole.QueueInfo, error) {
	return b.API.ListQueuesIn(vhost)
}

// Queue returns one queue; IsNotFound(err) tells a missing one.
func (b *Broker) Queue(vhost, name string) (*rabbithole.DetailedQueueInfo, error) {
	return b.API.GetQueue(vhost, name)
}

// Exchanges lists the exchanges in vhost, the built-in ones included.
func (b *Broker) Exchanges(vhost string) ([]rabbithole.ExchangeInfo, error) {
	return b.API.ListExchangesIn(vhost)
}

// Bindings lists the bindings in vhost, the default exchange's included.
func (b *Broker) Bindings(vhost string) ([]rabbithole.BindingInfo, error) {
	return b.API.ListBindingsIn(vhost)
}

// BindingNames lists vhost's bindings, the default exchange's left out, as
// "source -> destination [routing key]", sorted.
func (b *Broker) BindingNames(vhost string) ([]string, error) {
	bs, err := b.Bindings(vhost)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, bd := range bs {
		if bd.Source != "" {
			names = append(names, fmt.Sprintf("%s -> %s [%s]", bd.Source, bd.Destination, bd.RoutingKey))
		}
	}
	slices.Sort(names)
	return names, nil
}

// Users lists every user of the broker (users are global, not per vhost).
func (b *Broker) Users() ([]rabbithole.UserInfo, error) {
	return b.API.ListUsers()
}

// Permissions lists the permissions granted on vhost.
func (b *Broker) Permissions(vhost string) ([]rabbithole.PermissionInfo, error) {
	all, err := b.API.ListPermissions()
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p rabbithole.PermissionInfo) bool { return p.Vhost != vhost }), nil
}

// Answered turns an answer of the management API (rabbit-hole's calls
// return one) into an error unless it is a 2xx; the body is closed.
func Answered(r *http.Response, err error) error {
	if err != nil {
		return err
	}
	defer func() { _ = r.Body.Close() }()
	if r.StatusCode/100 != 2 {
		return errors.New("management API: " + r.Status)
	}
	return nil
}

// DeleteUsers deletes users; missing ones are fine (rabbit-hole takes a
// 404 on DELETE as done).
func (b *Broker) DeleteUsers(names ...string) error {
	var errs []error
	for _, n := range names {
		if _, err := b.API.DeleteUser(n); err != nil {
			errs = append(errs, fmt.Errorf("delete user %s: %w", n, err))
		}
	}
	return errors.Join(errs...)
}

// CloseConnectionsIn force-closes the client connections to vhost
// (connection.close with CONNECTION_FORCED), as an operator or a broker
// failure would.
//
// It uses rabbitmqctl when it can (root or the rabbitmq user on the broker's
// host): that sees every connection at once. The management API lists a new
// connection only after its first statistics emission (about 3-5 s), so the
// fallback misses connections opened just before the call.
func (b *Broker) CloseConnectionsIn(vhost string) error {
	if ctl, ok := rabbitmqctl(); ok {
		return runCtl(ctl, "close_all_connections", "--vhost", vhost, "--limit", "1000000", closeReason)
	}
	return b.closeConnections(func(c rabbithole.ConnectionInfo) bool { return c.Vhost == vhost })
}

// CloseConnectionsOf force-closes the client connections of a user; see
// CloseConnectionsIn.
func (b *Broker) CloseConnectionsOf(username string) error {
	if ctl, ok := rabbitmqctl(); ok {
		return runCtl(ctl, "close_all_user_connections", username, closeReason)
	}
	return b.closeConnections(func(c rabbithole.ConnectionInfo) bool { return c.User == username })
}

const closeReason = "closed by the hcp-operator test bed"

// MaxMessageSize reads the broker's max_message_size, when this process may
// use rabbitmqctl (see CloseConnectionsIn).
func (b *Broker) MaxMessageSize() (int64, bool) {
	ctl, ok := rabbitmqctl()
	if !ok {
		return 0, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ctl, "-q", "eval", "application:get_env(rabbit, max_message_size).")
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.Output()
	if err != nil {
		return 0, false
	}
	var n int64
	if _, err := fmt.Sscanf(strings.TrimSpace(string(out)), "{ok,%d}", &n); err != nil {
		return 0, false
	}
	return n, true
}

func (b *Broker) closeConnections(match func(rabbithole.ConnectionInfo) bool) error {
	conns, err := b.API.ListConnections()
	if err != nil {
		return err
	}
	var errs []error
	for _, c := range conns {
		if !match(c) {
			continue
		}
		if _, err := b.API.CloseConnection(c.Name); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("close connection %s: %w", c.Name, err))
		}
	}
	return errors.Join(errs...)
}

// rabbitmqctl returns the CLI when this process may use it against a local
// broker: root or the rabbitmq user, and a management URL on this host.
func rabbitmqctl() (string, bool) {
	if u := os.Getenv("RABBITMQ_MANAGEMENT_URL"); u != "" && !isLocalURL(u) {
		return "", false
	}
	if uid := os.Getuid(); uid != 0 {
		if cur, err := user.Current(); err != nil || cur.Username != "rabbitmq" {
			return "", false
		}
	}
	for _, p := range []string{"rabbitmqctl", "/usr/sbin/rabbitmqctl", "/usr/lib/rabbitmq/bin/rabbitmqctl"} {
		if path, err := exec.LookPath(p); err == nil {
			return path, true
		}
	}
	return "", false
}

func runCtl(ctl string, args ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, ctl, append([]string{"-q"}, args...)...)
	cmd.WaitDelay = 5 * time.Second // epmd, if the CLI had to start it, keeps our pipes
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("rabbitmqctl %v: %w: %s", args, err, out)
	}
	return nil
}

func isLocalURL(raw string) bool {
	u, err := url.Parse(raw)
	if err != nil {
		return false
	}
	switch u.Hostname() {
	case "127.0.0.1", "localhost", "::1":
		return true
	}
	return false
}

// IsNotFound reports whether err is the management API's 404.
func IsNotFound(err error) bool {
	var er rabbithole.ErrorResponse
	return errors.As(err, &er) && er.StatusCode == http.StatusNotFound
}

// CreateConnectionSecret creates the Secret through which the topology
// operator reaches the local broker (rabbitmqClusterReference.connectionSecret):
// keys uri, username, password, and the label without which the operator's
// Secret cache never sees it.
func CreateConnectionSecret(ctx context.Context, c client.Client, namespace, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: namespace,
			Labels:    map[string]string{topologyv1beta1.TopologyOperatorLabel: topologyv1beta1.TopologyOperatorLabelValue},
		},
		StringData: map[string]string{
			"uri":      envOr("RABBITMQ_MANAGEMENT_URL", DefaultManagementURL),
			"username": envOr("RABBITMQ_USERNAME", DefaultUsername),
			"password": envOr("RABBITMQ_PASSWORD", DefaultPassword),
		},
	}
	if err := c.Create(ctx, s); err != nil {
		return nil, fmt.Errorf("testbed: create connection secret %s/%s: %w", namespace, name, err)
	}
	return s, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
