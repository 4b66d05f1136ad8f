package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlconfig "sigs.k8s.io/controller-runtime/pkg/client/config"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/cachetrim"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/internal/sidecar/events"
)

// cacheSyncTimeout bounds the object cache's first sync.
const cacheSyncTimeout = 2 * time.Minute

// kube is the sidecar's view of the API server: a cache scoped to the
// namespace and to the objects this mode reads, a client reading through
// it, an uncached reader for reads that must not be stale, and the Event
// recorder. The cache drops the objects' managed fields, as the manager's
// does, and what no sidecar reads of an HCPSession (cachetrim): a cached
// HCPSession is held per live session.
type kube struct {
	cache      cache.Cache
	watched    []client.Object
	client     client.Client
	reader     client.Client
	recorder   record.EventRecorder
	stopEvents func()
}

func newKube(cfg *config.Config) (*kube, error) {
	restCfg, err := ctrlconfig.GetConfig()
	if err != nil {
		return nil, fmt.Errorf("kubernetes client configuration: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := hcpv1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	byObject, watched := cacheScope(cfg)
	objCache, err := cache.New(restCfg, cache.Options{
		Scheme:            scheme,
		DefaultNamespaces: map[string]cache.Config{cfg.Namespace: {}},
		ByObject:          byObject,
		DefaultTransform:  cachetrim.Transform,
	})
	if err != nil {
		return nil, fmt.Errorf("creating the object cache: %w", err)
	}
	kc, err := client.New(restCfg, client.Options{Scheme: scheme, Cache: &client.CacheOptions{Reader: objCache}})
	if err != nil {
		return nil, err
	}
	apiReader, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	recorder, stopEvents, err := events.NewRecorder(restCfg, scheme, cfg.Namespace, cfg.PodName)
	if err != nil {
		return nil, err
	}
	return &kube{cache: objCache, watched: watched, client: kc, reader: apiReader, recorder: recorder, stopEvents: stopEvents}, nil
}

// waitForCache starts the informers of the watched kinds (the cache must
// be running) and waits for their first sync.
func (k *kube) waitForCache(ctx context.Context) error {
	for _, o := range k.watched {
		if _, err := k.cache.GetInformer(ctx, o); err != nil {
			return fmt.Errorf("watching %T: %w", o, err)
		}
	}
	syncCtx, cancelSync := context.WithTimeout(ctx, cacheSyncTimeout)
	synced := k.cache.WaitForCacheSync(syncCtx)
	cancelSync()
	if !synced {
		return errors.New("the object cache did not sync within 2 minutes (RBAC of the sidecar's ServiceAccount?)")
	}
	return nil
}

// cacheScope limits the cache to what the mode reads, matching the RBAC
// the operator grants (internal/resource.RoleRules): the own Callee or
// Caller by name, and only the HCPSessions of this callee or caller (a
// caller's cut down to what it reads: cachetrim.CallerSession).
func cacheScope(cfg *config.Config) (map[client.Object]cache.ByObject, []client.Object) {
	own := fields.OneTermEqualSelector("metadata.name", cfg.ObjectName)
	if cfg.Mode == config.ModeCallee {
		return map[client.Object]cache.ByObject{
				&hcpv1alpha1.Callee{}:     {Field: own},
				&hcpv1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{hcpv1alpha1.LabelCalleeID: cfg.ID})},
			}, []client.Object{
				&hcpv1alpha1.Callee{}, &hcpv1alpha1.HCPSession{}, &hcpv1alpha1.CapabilityPolicy{}, &hcpv1alpha1.Caller{},
			}
	}
	return map[client.Object]cache.ByObject{
			&hcpv1alpha1.Caller{}:     {Field: own},
			&hcpv1alpha1.HCPSession{}: {Label: labels.SelectorFromSet(labels.Set{hcpv1alpha1.LabelCallerID: cfg.ID}), Transform: cachetrim.CallerSession},
		}, []client.Object{
			&hcpv1alpha1.Caller{}, &hcpv1alpha1.HCPSession{},
		}
}
