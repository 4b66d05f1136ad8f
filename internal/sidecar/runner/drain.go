package runner

import (
	"context"
	"net/http"
	"sync"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/server"
)

// drainer is a mode that prepares the pod's deletion.
type drainer interface {
	Drain(ctx context.Context) error
}

// drainTarget is the mode's runner, set once it exists.
type drainTarget struct {
	mu sync.Mutex
	r  drainer
}

func (d *drainTarget) set(r mode) {
	d.mu.Lock()
	d.r, _ = r.(drainer)
	d.mu.Unlock()
}

func (d *drainTarget) get() drainer {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.r
}

// drainHandler serves /drain on the probe port: the preStop hook of the
// harness containers calls it, so the sidecar hands its sessions over (or,
// in caller mode, records its positions) before the harness gets SIGTERM.
// It answers 409 unless the sidecar's own pod is being deleted, so nobody
// who can reach the port can drain a healthy replica.
func drainHandler(cfg *config.Config, r client.Reader, d *drainTarget, log logr.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodGet && req.Method != http.MethodPost {
			server.Errorf(w, http.StatusMethodNotAllowed, server.CodeBadRequest, "GET or POST")
			return
		}
		var pod metav1.PartialObjectMetadata
		pod.SetGroupVersionKind(schema.GroupVersionKind{Version: "v1", Kind: "Pod"})
		if err := r.Get(req.Context(), client.ObjectKey{Namespace: cfg.Namespace, Name: cfg.PodName}, &pod); err != nil {
			server.Errorf(w, http.StatusServiceUnavailable, server.CodeUnavailable, "cannot read the sidecar's pod: %v", err)
			return
		}
		if pod.DeletionTimestamp == nil {
			server.Errorf(w, http.StatusConflict, server.CodeInvalidTransition, "pod %s is not being deleted: nothing to drain", cfg.PodName)
			return
		}
		rn := d.get()
		if rn == nil {
			server.WriteJSON(w, http.StatusOK, map[string]string{"status": "not started: nothing to drain"})
			return
		}
		log.Info("Draining before the pod's deletion")
		if err := rn.Drain(req.Context()); err != nil {
			server.Errorf(w, http.StatusServiceUnavailable, server.CodeUnavailable, "drain: %v", err)
			return
		}
		server.WriteJSON(w, http.StatusOK, map[string]string{"status": "drained"})
	})
}
