package resource

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"

	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Keys of a topology-operator connection Secret, plus our optional amqpURL.
const (
	ConnectionSecretURIKey      = "uri"
	ConnectionSecretUsernameKey = "username"
	ConnectionSecretPasswordKey = "password"
	// ConnectionSecretAMQPURLKey optionally gives the AMQP endpoint
	// (amqp://host:port or amqps://host:port) when it cannot be derived from
	// the management uri.
	ConnectionSecretAMQPURLKey = "amqpURL"
)

// AllowedNamespacesAnnotation is the topology operator's annotation that lets
// objects in other namespaces use a connection Secret or RabbitmqCluster.
const AllowedNamespacesAnnotation = "rabbitmq.com/topology-allowed-namespaces"

// URL schemes.
const (
	schemeAMQP  = "amqp"
	schemeAMQPS = "amqps"
	schemeHTTPS = "https"
)

// Default vhost settings.
const (
	DeletionPolicyRetain = "retain"
	DeletionPolicyDelete = "delete"
)

// Broker is a resolved broker reference: what every topology object points
// at, and what the credentials Secret needs.
type Broker struct {
	// Reference is passed to the topology operator unchanged.
	Reference topologyv1beta1.RabbitmqClusterReference
	// Vhost holds the HCP topology.
	Vhost string
	// Identity names the broker itself (see the package documentation).
	Identity string
	// AMQPURL is amqp(s)://host:port, without credentials or vhost: the
	// first node when the broker is given as a list of them.
	AMQPURL string
	// AMQPAddresses are a cluster's nodes (HOST:PORT, AMQPURL's first)
	// when the connection Secret lists several; the sidecar tries them in
	// turn. Nil for one endpoint.
	AMQPAddresses []string
	// CreateVhost and VhostDeletionPolicy come from the subject's spec.
	CreateVhost         bool
	VhostDeletionPolicy string
}

// Key is the vhost key: it names the (broker, vhost) pair in object names
// and in the hcp.io/vhost-key label.
func (b Broker) Key() string { return VhostKey(b.Identity, b.Vhost) }

// VhostKey is the first 10 hex digits of SHA-256(identity NUL vhost).
func VhostKey(identity, vhost string) string {
	return shortHash(identity+"\x00"+vhost, 10)
}

// DefaultBroker is the manager's configured default broker
// (--default-connection-secret).
type DefaultBroker struct {
	// Namespace of the connection Secret; empty means the namespace of the
	// Callee or Caller that uses it.
	Namespace string
	Name      string
}

// ParseDefaultBroker parses --default-connection-secret: "namespace/name" or
// "name" (the Secret is then looked up in each Callee's or Caller's own
// namespace). Empty means no default.
func ParseDefaultBroker(s string) (*DefaultBroker, error) {
	if s == "" {
		return nil, nil
	}
	ns, name, found := strings.Cut(s, "/")
	if !found {
		ns, name = "", s
	}
	if name == "" || strings.Contains(name, "/") || (found && ns == "") {
		return nil, fmt.Errorf("default connection secret %q: want NAMESPACE/NAME or NAME", s)
	}
	return &DefaultBroker{Namespace: ns, Name: name}, nil
}

// ErrNoBroker means neither the spec nor the manager names a broker.
var ErrNoBroker = errors.New("no broker: spec.broker.rabbitmqClusterReference is not set and the manager has no --default-connection-secret")

// Reference converts the spec's reference, or the default, into the
// topology operator's. namespace is the subject's.
func Reference(spec hcpv1alpha1.BrokerSpec, def *DefaultBroker) (topologyv1beta1.RabbitmqClusterReference, error) {
	if r := spec.RabbitmqClusterReference; r != nil {
		out := topologyv1beta1.RabbitmqClusterReference{Name: r.Name, Namespace: r.Namespace}
		if r.ConnectionSecret != nil {
			out.ConnectionSecret = &corev1.LocalObjectReference{Name: r.ConnectionSecret.Name}
		}
		return out, nil
	}
	if def == nil {
		return topologyv1beta1.RabbitmqClusterReference{}, ErrNoBroker
	}
	return topologyv1beta1.RabbitmqClusterReference{
		Namespace:        def.Namespace,
		ConnectionSecret: &corev1.LocalObjectReference{Name: def.Name},
	}, nil
}

// VhostOf is the vhost in effect (the CRD defaults it; older objects may
// lack the default).
func VhostOf(spec hcpv1alpha1.BrokerSpec) string {
	if spec.Vhost == "" {
		return topology.DefaultVhost
	}
	return spec.Vhost
}

func vhostSettings(b *Broker, spec hcpv1alpha1.BrokerSpec) {
	b.Vhost = VhostOf(spec)
	b.CreateVhost = spec.CreateVhost
	b.VhostDeletionPolicy = spec.VhostDeletionPolicy
	if b.VhostDeletionPolicy == "" {
		b.VhostDeletionPolicy = DeletionPolicyRetain
	}
}

// BrokerFromConnectionSecret resolves a connection-Secret reference. It
// checks what the topology operator will need (keys uri, username,
// password; the uri parses) and derives the identity and the AMQP address:
// the Secret's amqpURL, else the management host on 5672, or amqps on 5671
// when the management uri is https or spec.tls is set. spec.tls with a
// plaintext amqpURL is an error. The label and namespace checks are the
// caller's (they need the API).
func BrokerFromConnectionSecret(ref topologyv1beta1.RabbitmqClusterReference, spec hcpv1alpha1.BrokerSpec, secret *corev1.Secret) (Broker, error) {
	var missing []string
	for _, k := range []string{ConnectionSecretURIKey, ConnectionSecretUsernameKey, ConnectionSecretPasswordKey} {
		if len(secret.Data[k]) == 0 {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return Broker{}, fmt.Errorf("connection Secret %s/%s lacks key(s) %s (it needs uri, username and password)", secret.Namespace, secret.Name, strings.Join(missing, ", "))
	}
	mgmt, err := parseManagementURI(string(secret.Data[ConnectionSecretURIKey]))
	if err != nil {
		return Broker{}, fmt.Errorf("connection Secret %s/%s: key uri: %w", secret.Namespace, secret.Name, err)
	}
	b := Broker{Reference: ref, Identity: hostPort(mgmt)}
	vhostSettings(&b, spec)
	if raw := strings.TrimSpace(string(secret.Data[ConnectionSecretAMQPURLKey])); raw != "" {
		// One endpoint, or a cluster's nodes: comma-separated, one scheme.
		scheme := ""
		for one := range strings.SplitSeq(raw, ",") {
			u, err := url.Parse(strings.TrimSpace(one))
			if err != nil || (u.Scheme != schemeAMQP && u.Scheme != schemeAMQPS) || u.Hostname() == "" || (scheme != "" && u.Scheme != scheme) {
				return Broker{}, fmt.Errorf("connection Secret %s/%s: key %s must be amqp://HOST[:PORT] or amqps://HOST[:PORT], or a comma-separated list of them with one scheme", secret.Namespace, secret.Name, ConnectionSecretAMQPURLKey)
			}
			if spec.TLS != nil && u.Scheme != schemeAMQPS {
				// Guessing the TLS port of an explicitly plaintext endpoint
				// would be wrong as often as right.
				return Broker{}, fmt.Errorf("spec.broker.tls is set, but the connection Secret %s/%s gives a plaintext endpoint (%s: %s://%s); set %s to amqps://HOST[:PORT], or remove spec.broker.tls",
					secret.Namespace, secret.Name, ConnectionSecretAMQPURLKey, u.Scheme, u.Host, ConnectionSecretAMQPURLKey)
			}
			node := hostPortDefault(u, amqpPort(u.Scheme))
			if scheme == "" {
				scheme, b.AMQPURL = u.Scheme, u.Scheme+"://"+node
			}
			b.AMQPAddresses = append(b.AMQPAddresses, node)
		}
		if len(b.AMQPAddresses) == 1 {
			b.AMQPAddresses = nil
		}
		return b, nil
	}
	scheme, port := schemeAMQP, "5672"
	if mgmt.Scheme == schemeHTTPS || spec.TLS != nil {
		scheme, port = schemeAMQPS, "5671"
	}
	b.AMQPURL = scheme + "://" + net.JoinHostPort(mgmt.Hostname(), port)
	return b, nil
}

// BrokerFromCluster resolves a RabbitmqCluster reference; namespace is the
// subject's (the default when the reference has none). The AMQP address is
// the cluster's Service: amqp on 5672, or amqps on 5671 with spec.tls.
func BrokerFromCluster(ref topologyv1beta1.RabbitmqClusterReference, spec hcpv1alpha1.BrokerSpec, namespace string) Broker {
	ns := ref.Namespace
	if ns == "" {
		ns = namespace
	}
	scheme := schemeAMQP
	if spec.TLS != nil {
		// The cluster-operator's Service serves amqps on 5671 when the
		// cluster has TLS enabled.
		scheme = schemeAMQPS
	}
	b := Broker{
		Reference: ref,
		Identity:  "rabbitmqcluster:" + ns + "/" + ref.Name,
		AMQPURL:   scheme + "://" + net.JoinHostPort(ref.Name+"."+ns+".svc", amqpPort(scheme)),
	}
	vhostSettings(&b, spec)
	return b
}

func parseManagementURI(s string) (*url.URL, error) {
	s = strings.TrimSpace(s)
	if !strings.Contains(s, "://") {
		// The topology operator accepts a bare host:port and uses http.
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("not a URL: %w", err)
	}
	if u.Scheme != "http" && u.Scheme != schemeHTTPS {
		return nil, fmt.Errorf("scheme %q: want http or https (the management API)", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("no host")
	}
	return u, nil
}

func hostPort(u *url.URL) string {
	def := "80"
	if u.Scheme == schemeHTTPS {
		def = "443"
	}
	return hostPortDefault(u, def)
}

func hostPortDefault(u *url.URL, def string) string {
	port := u.Port()
	if port == "" {
		port = def
	}
	return net.JoinHostPort(strings.ToLower(u.Hostname()), port)
}

func amqpPort(scheme string) string {
	if scheme == schemeAMQPS {
		return "5671"
	}
	return "5672"
}

// AMQPURI is the full URL a harness connects with: AMQPURL with the
// credentials and the URL-escaped vhost ("/hcp" becomes "%2Fhcp").
func AMQPURI(amqpURL, username, password, vhost string) (string, error) {
	u, err := url.Parse(amqpURL)
	if err != nil {
		return "", err
	}
	u.User = url.UserPassword(username, password)
	u.Path = "/" + vhost
	u.RawPath = "/" + url.PathEscape(vhost)
	return u.String(), nil
}
