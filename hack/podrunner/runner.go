package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"
)

type options struct {
	kubeconfig, nodeName, stateDir, logDir, imagesFile string
	bridge, podCIDR                                    string
	net                                                *network
	forwards                                           []forward
	kubeletPort                                        int
	tlsCert, tlsKey, clientCA                          string
	kubernetesVersion                                  string
	cpu, memory                                        resource.Quantity
	maxPods                                            int
}

type runner struct {
	o        options
	cs       kubernetes.Interface
	log      *slog.Logger
	src      objectSource
	tokens   *tokenCache
	net      *network
	hostIP   string
	started  metav1.Time
	recorder record.EventRecorder
	mounts   *mountpoints

	mu       sync.Mutex
	workers  map[types.UID]*podWorker
	stopping bool
}

func newRunner(o options, cs kubernetes.Interface, log *slog.Logger) *runner {
	return &runner{
		o: o, cs: cs, log: log,
		src:     apiSource{cs: cs},
		tokens:  newTokenCache(cs),
		net:     o.net,
		hostIP:  o.net.gateway.String(),
		started: metav1.Now(),
		mounts:  &mountpoints{file: filepath.Join(o.stateDir, "created-mountpoints")},
		workers: map[types.UID]*podWorker{},
	}
}

func (r *runner) run(ctx context.Context) error {
	for _, d := range []string{r.o.stateDir, r.o.logDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(r.o.stateDir, 0o700); err != nil {
		return err
	}
	// A previous run may have left processes and namespaces behind (killed
	// with SIGKILL): like a rebooted node, start from nothing.
	r.cleanupStale(ctx)
	if err := r.net.ensureBridge(ctx); err != nil {
		return fmt.Errorf("pod network: %w", err)
	}
	fwdCtx, stopForwards := context.WithCancel(context.Background())
	defer stopForwards()
	for _, f := range r.o.forwards {
		if err := f.run(fwdCtx, r.log); err != nil {
			return err
		}
	}

	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: r.cs.CoreV1().Events("")})
	// Shut down last: stopping the pods records events.
	defer broadcaster.Shutdown()
	r.recorder = broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "kubelet", Host: r.o.nodeName})

	if err := retry(ctx, r.log, "register the node", func() error { return r.registerNode(ctx) }); err != nil {
		return err
	}
	go r.heartbeat(ctx)
	if r.o.tlsCert != "" {
		if err := r.serveKubeletAPI(ctx); err != nil {
			return err
		}
	}

	factory := informers.NewSharedInformerFactoryWithOptions(r.cs, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", r.o.nodeName).String()
	}))
	podInformer := factory.Core().V1().Pods().Informer()
	if _, err := podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { r.onPod(obj.(*corev1.Pod)) },
		UpdateFunc: func(_, obj any) { r.onPod(obj.(*corev1.Pod)) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if p, ok := obj.(*corev1.Pod); ok {
				r.onPodGone(p)
			}
		},
	}); err != nil {
		return err
	}
	factory.Start(ctx.Done())
	r.log.Info("Pod runner ready", "node", r.o.nodeName, "nodeIP", r.hostIP, "podCIDR", r.net.prefix.String())
	<-ctx.Done()
	factory.Shutdown()

	// Node shutdown: stop every pod's processes, keep the Pod objects.
	r.log.Info("Stopping all pods")
	r.mu.Lock()
	r.stopping = true
	ws := make([]*podWorker, 0, len(r.workers))
	for _, w := range r.workers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.shutdown()
		}()
	}
	wg.Wait()
	return nil
}

func (r *runner) onPod(pod *corev1.Pod) {
	if pod.Spec.NodeName != r.o.nodeName {
		return
	}
	r.mu.Lock()
	if r.stopping {
		r.mu.Unlock()
		return
	}
	w := r.workers[pod.UID]
	if w == nil {
		r.mu.Unlock()
		switch {
		case pod.DeletionTimestamp != nil:
			// Nothing of it runs here (it finished, or ran before this
			// runner started): the final delete is all that is left.
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				defer cancel()
				if err := r.deletePod(ctx, pod); err != nil {
					r.log.Error("Deleting the pod failed", "pod", pod.Namespace+"/"+pod.Name, "err", err)
				}
			}()
		case pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed:
			// Finished before this runner started: nothing to run.
		default:
			r.mu.Lock()
			if r.workers[pod.UID] == nil && !r.stopping {
				w = newPodWorker(r, pod)
				r.workers[pod.UID] = w
				go w.run()
			}
			r.mu.Unlock()
		}
		return
	}
	r.mu.Unlock()
	w.update(pod)
}

// onPodGone handles a pod deleted from the API without our final delete
// (a forced deletion): its processes go at once.
func (r *runner) onPodGone(pod *corev1.Pod) {
	r.mu.Lock()
	w := r.workers[pod.UID]
	r.mu.Unlock()
	if w != nil {
		w.gone()
	}
}

func (r *runner) removeWorker(uid types.UID) {
	r.mu.Lock()
	delete(r.workers, uid)
	r.mu.Unlock()
}

func (r *runner) podDir(uid types.UID) string {
	return filepath.Join(r.o.stateDir, "pods", string(uid))
}

// cleanupStale kills the processes and removes the namespaces and state a
// previous run left.
func (r *runner) cleanupStale(ctx context.Context) {
	dirs, _ := filepath.Glob(filepath.Join(r.o.stateDir, "pods", "*"))
	for _, d := range dirs {
		pids, _ := filepath.Glob(filepath.Join(d, "containers", "*.pid"))
		for _, p := range pids {
			killStale(p, r.log)
		}
		r.net.deleteSandbox(ctx, filepath.Base(d))
		_ = os.RemoveAll(d)
	}
	for _, uid := range sandboxes() {
		r.net.deleteSandbox(ctx, uid)
	}
}

// deletePod is the kubelet's final delete: after the processes are gone,
// the Pod object goes with grace period 0.
func (r *runner) deletePod(ctx context.Context, pod *corev1.Pod) error {
	uid := pod.UID
	err := r.cs.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64(0)),
		Preconditions:      &metav1.Preconditions{UID: &uid},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil
	}
	return err
}

// retry runs f until it succeeds or ctx ends, with a capped back-off.
func retry(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	delay := 500 * time.Millisecond
	for {
		err := f()
		if err == nil {
			return nil
		}
		log.Error("Retrying", "what", what, "err", err, "in", delay)
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, err)
		case <-time.After(delay):
		}
		delay = min(delay*2, 10*time.Second)
	}
}

// mountpoints records the mount points the runner had to create on the
// host (a container sees the host's filesystem plus its mounts), so that
// `local-stack.sh down` can remove them again.
type mountpoints struct {
	mu   sync.Mutex
	file string
}

// ensure creates path (a directory, or an empty file when file is set)
// with its missing parents, recording each one it creates.
func (m *mountpoints) ensure(path string, file bool) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	var created []string
	dir := path
	if file {
		dir = filepath.Dir(path)
	}
	for d := dir; d != "/" && d != "."; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		}
		created = append(created, d)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if file {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		_ = f.Close()
		created = append([]string{path}, created...)
	}
	if len(created) == 0 {
		return nil
	}
	f, err := os.OpenFile(m.file, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	// Deepest first, so removing in file order removes children first.
	for _, c := range created {
		if _, err := fmt.Fprintln(f, c); err != nil {
			return err
		}
	}
	return nil
}
