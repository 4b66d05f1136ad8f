package runner

import (
	"context"
	"sync"

	"github.com/go-logr/logr"

	"github.com/hcp-io/hcp-operator/internal/sidecar/caller"
	"github.com/hcp-io/hcp-operator/internal/sidecar/status"
)

// otherWriters runs the status writers of HCPSessions in namespaces other
// than the sidecar's: a caller sidecar records its position in the
// sessions of Callees in other namespaces (caller.Options.StatusIn), where
// the operator grants it that write (resource.SessionReaderRole). Each
// runs until stop, which flushes their last writes; stop runs after the
// mode's Run returned, as for the sidecar's own writer.
type otherWriters struct {
	ctx  context.Context
	opts status.Options
	log  logr.Logger

	mu    sync.Mutex
	stops []func()
}

// in starts the writer of namespace ns (the caller sidecar asks once per
// namespace).
func (w *otherWriters) in(ns string) caller.StatusWriter {
	o := w.opts
	o.Namespace = ns
	sw := status.New(o)
	stop := runUntilStopped(w.ctx, func(ctx context.Context) {
		if err := sw.Run(ctx); err != nil {
			w.log.Error(err, "Failed to write the last HCPSession status", "namespace", ns)
		}
	})
	w.mu.Lock()
	w.stops = append(w.stops, stop)
	w.mu.Unlock()
	return sw
}

// stop stops every writer started, after its last write.
func (w *otherWriters) stop() {
	w.mu.Lock()
	stops := w.stops
	w.stops = nil
	w.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}
