package main

import (
	"context"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

type fakeSource struct {
	secrets    map[string]*corev1.Secret
	configMaps map[string]*corev1.ConfigMap
	services   []*corev1.Service
}

func (f fakeSource) Secret(_ context.Context, _, name string) (*corev1.Secret, error) {
	if s, ok := f.secrets[name]; ok {
		return s, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
}

func (f fakeSource) ConfigMap(_ context.Context, _, name string) (*corev1.ConfigMap, error) {
	if c, ok := f.configMaps[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(schema.GroupResource{Resource: "configmaps"}, name)
}

func (f fakeSource) Services(string, bool) ([]*corev1.Service, error) { return f.services, nil }

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "a", "EMPTY": ""}
	for in, want := range map[string]string{
		"$(A)":           "a",
		"x$(A)y":         "xay",
		"$(MISSING)":     "$(MISSING)",
		"$$(A)":          "$(A)",
		"$(EMPTY)-":      "-",
		"$(A":            "$(A",
		"cost $5":        "cost $5",
		"trailing $":     "trailing $",
		"$(A)$(A)$$$(A)": "aa$a",
	} {
		if got := expand(in, mappingFuncFor(env)); got != want {
			t.Errorf("expand(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestContainerEnv(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1", Labels: map[string]string{"app": "x"}},
		Spec:       corev1.PodSpec{ServiceAccountName: "sa", NodeName: "n"},
	}
	src := fakeSource{
		secrets:    map[string]*corev1.Secret{"creds": {Data: map[string][]byte{"url": []byte("amqp://u:p@h/v"), "bad=key": []byte("x")}}},
		configMaps: map[string]*corev1.ConfigMap{"cfg": {Data: map[string]string{"LEVEL": "debug"}}},
		services: []*corev1.Service{{
			ObjectMeta: metav1.ObjectMeta{Name: "kubernetes"},
			Spec:       corev1.ServiceSpec{ClusterIP: "10.251.0.1", Ports: []corev1.ServicePort{{Name: "https", Port: 443}}},
		}},
	}
	c := &corev1.Container{
		Name:    "c",
		EnvFrom: []corev1.EnvFromSource{{Prefix: "CFG_", ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "cfg"}}}},
		Env: []corev1.EnvVar{
			{Name: "URL", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "url"}}},
			{Name: "NS", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.namespace"}}},
			{Name: "IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
			{Name: "APP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.labels['app']"}}},
			{Name: "OPT", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "nope"}, Key: "k", Optional: new(true)}}},
			{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory", Divisor: resource.MustParse("1Mi")}}},
			{Name: "MSG", Value: "$(NS)/$(CFG_LEVEL) on $(KUBERNETES_SERVICE_HOST)"},
		},
	}
	pc := podEnvContext{pod: pod, podIP: "10.250.0.7", hostIP: "10.250.0.1", nodeName: "n",
		allocatable: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("2Gi")}}
	env, m, err := containerEnv(context.Background(), src, pc, c)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"CFG_LEVEL": "debug", "URL": "amqp://u:p@h/v", "NS": "ns", "IP": "10.250.0.7", "APP": "x",
		"MEM": "2048", "MSG": "ns/debug on 10.251.0.1",
		"KUBERNETES_SERVICE_HOST": "10.251.0.1", "KUBERNETES_SERVICE_PORT": "443", "KUBERNETES_SERVICE_PORT_HTTPS": "443",
		"KUBERNETES_PORT": "tcp://10.251.0.1:443", "KUBERNETES_PORT_443_TCP_ADDR": "10.251.0.1",
	}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("%s = %q, want %q", k, m[k], v)
		}
	}
	if _, ok := m["OPT"]; ok {
		t.Error("an optional reference to a missing Secret must leave the variable unset")
	}
	// envFrom comes first, env in order, service variables last.
	if env[0] != "CFG_LEVEL=debug" || env[1] != "URL=amqp://u:p@h/v" {
		t.Errorf("order: %v", env[:2])
	}

	c.Env = []corev1.EnvVar{{Name: "X", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "creds"}, Key: "missing"}}}}
	if _, _, err := containerEnv(context.Background(), src, pc, c); err == nil || !strings.Contains(err.Error(), "couldn't find key missing") {
		t.Errorf("missing key: got %v", err)
	}
}

func TestCommandLine(t *testing.T) {
	img := &imageConfig{Entrypoint: []string{"/manager"}, Cmd: []string{"--default"}}
	env := map[string]string{"MODE": "callee"}
	for _, tc := range []struct {
		name string
		c    corev1.Container
		want []string
	}{
		{"image defaults", corev1.Container{}, []string{"/manager", "--default"}},
		{"args replace cmd", corev1.Container{Args: []string{"--mode=$(MODE)"}}, []string{"/manager", "--mode=callee"}},
		{"command replaces entrypoint and cmd", corev1.Container{Command: []string{"/hcp-sidecar"}}, []string{"/hcp-sidecar"}},
		{"command and args", corev1.Container{Command: []string{"/hcp-sidecar"}, Args: []string{"--mode=$(MODE)", "$$(MODE)"}}, []string{"/hcp-sidecar", "--mode=callee", "$(MODE)"}},
	} {
		got, err := commandLine(tc.c, img, env)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%s: got %v, %v; want %v", tc.name, got, err, tc.want)
		}
	}
	if _, err := commandLine(corev1.Container{}, &imageConfig{}, nil); err == nil {
		t.Error("no command and no entrypoint must fail")
	}
}

func TestImages(t *testing.T) {
	for in, want := range map[string]string{
		"ghcr.io/hcp-io/hcp-operator:latest":       "ghcr.io/hcp-io/hcp-operator",
		"ghcr.io/hcp-io/hcp-operator@sha256:abc":   "ghcr.io/hcp-io/hcp-operator",
		"localhost:5000/x:v1":                      "localhost:5000/x",
		"localhost:5000/x":                         "localhost:5000/x",
		"ghcr.io/hcp-io/hcp-operator:v1@sha256:ab": "ghcr.io/hcp-io/hcp-operator",
	} {
		if got := repository(in); got != want {
			t.Errorf("repository(%q) = %q, want %q", in, got, want)
		}
	}
	img := &imageConfig{User: "65532:65532", Files: map[string]string{"/manager": "/b/manager", "/usr/bin/tool": "/b/tool"}}
	if f, err := img.resolve("/manager", nil); err != nil || f != "/b/manager" {
		t.Errorf("absolute: %q %v", f, err)
	}
	if f, err := img.resolve("tool", nil); err != nil || f != "/b/tool" {
		t.Errorf("PATH lookup: %q %v", f, err)
	}
	if _, err := img.resolve("/hcp-sidecar", nil); err == nil {
		t.Error("a file the image does not hold must not resolve")
	}
	if uid, gid, err := img.user(); err != nil || uid != 65532 || gid != 65532 {
		t.Errorf("user: %d:%d %v", uid, gid, err)
	}
}

func TestWriteAtomic(t *testing.T) {
	dir := t.TempDir()
	v1 := map[string]fileContent{"token": {[]byte("t1"), 0o600}, "sub/ca.crt": {[]byte("ca"), 0o644}}
	changed, err := writeAtomic(dir, v1, -1)
	if err != nil || !changed {
		t.Fatalf("first write: %v %v", changed, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "token")); string(b) != "t1" {
		t.Errorf("token = %q", b)
	}
	if changed, _ := writeAtomic(dir, v1, -1); changed {
		t.Error("an unchanged volume must not be rewritten")
	}
	v2 := map[string]fileContent{"token": {[]byte("t2"), 0o600}}
	if changed, err := writeAtomic(dir, v2, -1); err != nil || !changed {
		t.Fatalf("second write: %v %v", changed, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "token")); string(b) != "t2" {
		t.Errorf("token = %q after the update", b)
	}
	if _, err := os.Stat(filepath.Join(dir, "sub")); !os.IsNotExist(err) {
		t.Errorf("a key that went away must disappear: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	var ts int
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "..ts-") {
			ts++
		}
	}
	if ts != 1 {
		t.Errorf("%d timestamped directories left, want 1", ts)
	}
	if _, err := writeAtomic(dir, map[string]fileContent{"../escape": {}}, -1); err == nil {
		t.Error("a path leaving the volume must be refused")
	}
}

func TestAllocateRoundRobin(t *testing.T) {
	n, err := newNetwork("br", "10.9.0.0/29", []netip.Addr{netip.MustParseAddr("10.9.0.3")})
	if err != nil {
		t.Fatal(err)
	}
	// .1 is the gateway, .3 is reserved, .7 is the broadcast address.
	got := make([]string, 0, 4)
	for _, uid := range []string{"a", "b", "c", "d"} {
		a, err := n.allocate(uid, netip.Addr{})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, a.String())
	}
	if want := []string{"10.9.0.2", "10.9.0.4", "10.9.0.5", "10.9.0.6"}; !slices.Equal(got, want) {
		t.Errorf("allocated %v, want %v", got, want)
	}
	if _, err := n.allocate("e", netip.Addr{}); err == nil {
		t.Error("a full range must fail")
	}
	n.release("b")
	n.release("a")
	// The next address goes round the range: not the one freed last (a's .2)
	// before .4 comes up again.
	if a, _ := n.allocate("f", netip.Addr{}); a.String() != "10.9.0.2" {
		t.Errorf("after wrapping: %s", a)
	}
	if a, _ := n.allocate("g", netip.Addr{}); a.String() != "10.9.0.4" {
		t.Errorf("next: %s", a)
	}
	n.release("g")
	if a, _ := n.allocate("h", netip.MustParseAddr("10.9.0.4")); a.String() != "10.9.0.4" {
		t.Errorf("a free preferred address must be kept: %s", a)
	}
}

func TestPodStatus(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "i"}, {Name: "side", Image: "i"}}},
		Status: corev1.PodStatus{Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue},
		}},
	}
	r := &runner{hostIP: "10.250.0.1"}
	w := newPodWorker(r, pod)
	now := metav1.Now()

	s := w.status(now)
	if s.Phase != corev1.PodPending || s.ContainerStatuses[0].State.Waiting.Reason != "ContainerCreating" {
		t.Errorf("before start: phase %s, %+v", s.Phase, s.ContainerStatuses[0].State)
	}
	w.sandboxReady, w.ip, w.initialized = true, "10.250.0.9", true
	w.ctrs[0].state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	w.ctrs[0].ready, w.ctrs[0].started, w.ctrs[0].hadRun = true, true, true
	w.ctrs[1].state = corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff"}}
	w.ctrs[1].hadRun, w.ctrs[1].restartCount = true, 3
	s = w.status(now)
	if s.Phase != corev1.PodRunning || s.PodIP != "10.250.0.9" {
		t.Errorf("running: phase %s ip %s", s.Phase, s.PodIP)
	}
	cond := map[corev1.PodConditionType]corev1.PodCondition{}
	for _, c := range s.Conditions {
		cond[c.Type] = c
	}
	if cond[corev1.PodReady].Status != corev1.ConditionFalse || !strings.Contains(cond[corev1.PodReady].Message, "[side]") {
		t.Errorf("Ready: %+v", cond[corev1.PodReady])
	}
	if cond[corev1.PodScheduled].Status != corev1.ConditionTrue {
		t.Error("the scheduler's condition must be kept")
	}
	if s.ContainerStatuses[1].RestartCount != 3 {
		t.Errorf("restart count %d", s.ContainerStatuses[1].RestartCount)
	}
	readySince := cond[corev1.ContainersReady].LastTransitionTime
	initSince := cond[corev1.PodInitialized].LastTransitionTime

	w.ctrs[1].state = corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}
	w.ctrs[1].ready = true
	s = w.status(metav1.NewTime(now.Add(5e9)))
	for _, c := range s.Conditions {
		if c.Type == corev1.PodReady && c.Status != corev1.ConditionTrue {
			t.Errorf("all ready: %+v", c)
		}
		if c.Type == corev1.PodInitialized && !c.LastTransitionTime.Equal(&initSince) {
			t.Error("an unchanged condition must keep its transition time")
		}
		if c.Type == corev1.ContainersReady && c.LastTransitionTime.Equal(&readySince) {
			t.Error("a changed condition must get a new transition time")
		}
	}
	w.phase = corev1.PodSucceeded
	if s = w.status(now); s.Phase != corev1.PodSucceeded {
		t.Errorf("finished: %s", s.Phase)
	}
}

func TestHostsAndForwardAndTail(t *testing.T) {
	h := string(hostsFile("10.250.0.5", "web-1", "", "ns", []hostAlias{{ip: "1.2.3.4", hostnames: []string{"a", "b"}}}))
	for _, want := range []string{"127.0.0.1\tlocalhost", "10.250.0.5\tweb-1\n", "1.2.3.4\ta\tb"} {
		if !strings.Contains(h, want) {
			t.Errorf("hosts file lacks %q:\n%s", want, h)
		}
	}
	if _, err := parseForward("10.250.0.1:5672=127.0.0.1:5672"); err != nil {
		t.Error(err)
	}
	if _, err := parseForward("10.250.0.1:5672"); err == nil {
		t.Error("a forward without a target must fail")
	}

	f, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	_, _ = f.WriteString("one\ntwo\nthree\n")
	for n, want := range map[int]string{0: "", 1: "three\n", 2: "two\nthree\n", 10: "one\ntwo\nthree\n"} {
		if err := seekTail(f, n); err != nil {
			t.Fatal(err)
		}
		b, _ := readAll(f)
		if n > 0 && string(b) != want {
			t.Errorf("tail %d = %q, want %q", n, b, want)
		}
	}
}

func readAll(f *os.File) ([]byte, error) {
	var out []byte
	buf := make([]byte, 64)
	for {
		n, err := f.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			return out, nil
		}
	}
}
