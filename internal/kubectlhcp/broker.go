package kubectlhcp

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	rabbithole "github.com/michaelklishin/rabbit-hole/v3"
	topologyv1beta1 "github.com/rabbitmq/messaging-topology-operator/api/v1beta1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// brokerAccess is how the plugin reaches a broker's management API: the
// connection Secret a topology object references (keys uri, username,
// password), or a RabbitmqCluster's default-user Secret with
// --management-url.
type brokerAccess struct {
	// Ref names the broker as the topology objects do, for people.
	Ref string
	// URL is the management API's base URL; empty when unknown.
	URL                string
	Username, Password string
	// Problem says why the broker cannot be reached (no Secret, no URL).
	Problem string
}

// refString names a cluster reference for people.
func refString(ref topologyv1beta1.RabbitmqClusterReference, ns string) string {
	if ref.Namespace != "" {
		ns = ref.Namespace
	}
	if ref.ConnectionSecret != nil {
		return "connection Secret " + ns + "/" + ref.ConnectionSecret.Name
	}
	return "RabbitmqCluster " + ns + "/" + ref.Name
}

// resolveBroker finds the management API and its credentials for a
// topology object's reference in namespace ns. override (--management-url)
// replaces the URL; credentials in it replace the Secret's.
func resolveBroker(ctx context.Context, c client.Reader, ref topologyv1beta1.RabbitmqClusterReference, ns, override string) brokerAccess {
	a := brokerAccess{Ref: refString(ref, ns)}
	if ref.Namespace != "" {
		ns = ref.Namespace
	}
	secretName := ""
	switch {
	case ref.ConnectionSecret != nil:
		secretName = ref.ConnectionSecret.Name
	case ref.Name != "":
		// cluster-operator's default user; the Service is in-cluster, so the
		// URL must come from --management-url.
		secretName = ref.Name + "-default-user"
	}
	if secretName != "" {
		s := &corev1.Secret{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: secretName}, s); err != nil {
			a.Problem = fmt.Sprintf("Secret %s/%s: %v", ns, secretName, err)
		} else {
			a.Username, a.Password = string(s.Data["username"]), string(s.Data["password"])
			if ref.ConnectionSecret != nil {
				a.URL = strings.TrimSpace(string(s.Data["uri"]))
			}
		}
	}
	if override != "" {
		u, err := url.Parse(override)
		if err == nil && u.User != nil {
			a.Username = u.User.Username()
			a.Password, _ = u.User.Password()
			u.User = nil
			override = u.String()
		}
		a.URL, a.Problem = override, ""
	}
	if a.URL == "" && a.Problem == "" {
		a.Problem = "no management URL (a RabbitmqCluster's API is in-cluster: pass --management-url, e.g. after kubectl port-forward svc/" + ref.Name + " 15672)"
	}
	return a
}

// managementClient is a rabbit-hole client with a short timeout.
func (a brokerAccess) managementClient() (*rabbithole.Client, error) {
	if a.Problem != "" {
		return nil, fmt.Errorf("%s", a.Problem)
	}
	rh, err := rabbithole.NewClient(strings.TrimSuffix(a.URL, "/"), a.Username, a.Password)
	if err != nil {
		return nil, fmt.Errorf("management API %s: %w", a.URL, err)
	}
	rh.SetTransport(&http.Transport{Proxy: http.ProxyFromEnvironment, ResponseHeaderTimeout: 5 * time.Second, TLSHandshakeTimeout: 5 * time.Second})
	rh.SetTimeout(8 * time.Second)
	return rh, nil
}

// redactedURL is the URL without credentials, for output.
func redactedURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return s
	}
	u.User = nil
	return u.String()
}
