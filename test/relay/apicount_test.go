package relay

import (
	"net/http"
	"strings"
	"sync"
	"testing"

	"k8s.io/client-go/rest"

	"github.com/hcp-io/hcp-operator/internal/benchutil"
)

// apiWriteCounter counts the API writes a bed's sidecars send, by verb and
// resource as benchutil.APIWrites keys them ("PATCH hcp.io/hcpsessions/status").
// The API server's own count (benchutil.ReadAPIWrites) holds every
// client's: another bed's late writes landing during a series would count
// as this one's.
type apiWriteCounter struct {
	mu sync.Mutex
	n  benchutil.APIWrites
}

// wrap has cfg's requests counted.
func (c *apiWriteCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripFunc(func(req *http.Request) (*http.Response, error) {
			if key, ok := apiWriteKey(req.Method, req.URL.Path); ok {
				c.mu.Lock()
				if c.n == nil {
					c.n = benchutil.APIWrites{}
				}
				c.n[key]++
				c.mu.Unlock()
			}
			return rt.RoundTrip(req)
		})
	})
	return cfg
}

// snapshot is a copy of the counts so far.
func (c *apiWriteCounter) snapshot() benchutil.APIWrites {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(benchutil.APIWrites, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(req *http.Request) (*http.Response, error) { return f(req) }

// apiWriteKey is the APIWrites key of a write request to a namespaced
// object of an API group (/apis/GROUP/VERSION/namespaces/NS/RESOURCE/NAME
// [/SUBRESOURCE]); ok is false for reads and other paths.
func apiWriteKey(method, path string) (string, bool) {
	switch method {
	case http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	default:
		return "", false
	}
	p := strings.Split(strings.Trim(path, "/"), "/")
	if len(p) < 6 || p[0] != "apis" || p[3] != "namespaces" {
		return "", false
	}
	what := p[1] + "/" + p[5]
	if len(p) > 7 {
		what += "/" + p[7]
	}
	return method + " " + what, true
}

func TestAPIWriteKey(t *testing.T) {
	for _, c := range []struct {
		method, path, want string
	}{
		{http.MethodPatch, "/apis/hcp.io/v1alpha1/namespaces/ns/hcpsessions/s1/status", "PATCH hcp.io/hcpsessions/status"},
		{http.MethodPatch, "/apis/hcp.io/v1alpha1/namespaces/ns/hcpsessions/s1", "PATCH hcp.io/hcpsessions"},
		{http.MethodPost, "/apis/hcp.io/v1alpha1/namespaces/ns/hcpsessions", "POST hcp.io/hcpsessions"},
		{http.MethodGet, "/apis/hcp.io/v1alpha1/namespaces/ns/hcpsessions/s1", ""},
		{http.MethodPost, "/api/v1/namespaces/ns/events", ""},
	} {
		got, ok := apiWriteKey(c.method, c.path)
		if got != c.want || ok != (c.want != "") {
			t.Errorf("apiWriteKey(%s %s) = %q, %v; want %q", c.method, c.path, got, ok, c.want)
		}
	}
}
