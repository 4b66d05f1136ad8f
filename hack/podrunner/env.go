package main

import (
	"context"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
)

// objectSource reads what a pod's environment and volumes refer to. The
// runner's implementation reads the API server with the node's credentials,
// so the Node authorizer decides what a pod may see, as for a kubelet.
type objectSource interface {
	Secret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
	// Services returns the services whose variables a container in the
	// namespace gets: the namespace's (when service links are enabled) and
	// default/kubernetes.
	Services(namespace string, serviceLinks bool) ([]*corev1.Service, error)
}

// configError is a problem with the pod's configuration that keeps a
// container from being created (kubelet's CreateContainerConfigError).
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func configErrorf(format string, args ...any) error {
	return &configError{fmt.Sprintf(format, args...)}
}

// podEnvContext is what the downward API can refer to.
type podEnvContext struct {
	pod      *corev1.Pod
	podIP    string
	hostIP   string
	nodeName string
	// allocatable backs resourceFieldRef when the container has no limit.
	allocatable corev1.ResourceList
}

// containerEnv computes a container's environment as the kubelet does
// (pkg/kubelet/kubelet_pods.go makeEnvironmentVariables): service
// variables, then envFrom, then env with $(VAR) expansion, and returns it in
// order, as KEY=VALUE, plus the map used to expand command and args.
func containerEnv(ctx context.Context, src objectSource, pc podEnvContext, c *corev1.Container) ([]string, map[string]string, error) {
	pod := pc.pod
	serviceLinks := pod.Spec.EnableServiceLinks == nil || *pod.Spec.EnableServiceLinks
	services, err := src.Services(pod.Namespace, serviceLinks)
	if err != nil {
		return nil, nil, fmt.Errorf("list services: %w", err)
	}
	serviceEnv := serviceEnvVars(services)

	tmp := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := tmp[k]; !ok {
			order = append(order, k)
		}
		tmp[k] = v
	}

	for _, from := range c.EnvFrom {
		switch {
		case from.ConfigMapRef != nil:
			cm, err := src.ConfigMap(ctx, pod.Namespace, from.ConfigMapRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && ptrTrue(from.ConfigMapRef.Optional) {
					continue
				}
				return nil, nil, configErrorf("configmap %q not found", from.ConfigMapRef.Name)
			}
			for _, k := range sortedKeys(cm.Data) {
				if validEnvName(from.Prefix + k) {
					set(from.Prefix+k, cm.Data[k])
				}
			}
		case from.SecretRef != nil:
			s, err := src.Secret(ctx, pod.Namespace, from.SecretRef.Name)
			if err != nil {
				if apierrors.IsNotFound(err) && ptrTrue(from.SecretRef.Optional) {
					continue
				}
				return nil, nil, configErrorf("secret %q not found", from.SecretRef.Name)
			}
			for _, k := range sortedKeys(s.Data) {
				if validEnvName(from.Prefix + k) {
					set(from.Prefix+k, string(s.Data[k]))
				}
			}
		}
	}

	mapping := mappingFuncFor(tmp, serviceEnv)
	for _, e := range c.Env {
		v := e.Value
		if v != "" {
			v = expand(v, mapping)
		}
		if e.ValueFrom != nil {
			var found bool
			var err error
			if v, found, err = envValueFrom(ctx, src, pc, c, e); err != nil {
				return nil, nil, err
			}
			if !found {
				// An optional reference to a missing object or key leaves
				// the variable unset.
				continue
			}
		}
		set(e.Name, v)
	}
	// Service variables fill in what the pod did not set.
	for _, k := range sortedKeys(serviceEnv) {
		if _, ok := tmp[k]; !ok {
			set(k, serviceEnv[k])
		}
	}
	out := make([]string, 0, len(order))
	for _, k := range order {
		out = append(out, k+"="+tmp[k])
	}
	return out, tmp, nil
}

func envValueFrom(ctx context.Context, src objectSource, pc podEnvContext, c *corev1.Container, e corev1.EnvVar) (value string, found bool, err error) {
	pod := pc.pod
	vf := e.ValueFrom
	switch {
	case vf.FieldRef != nil:
		v, err := podField(pc, vf.FieldRef.FieldPath)
		return v, err == nil, err
	case vf.ResourceFieldRef != nil:
		v, err := resourceField(pc, c, vf.ResourceFieldRef)
		return v, err == nil, err
	case vf.SecretKeyRef != nil:
		ref := vf.SecretKeyRef
		s, err := src.Secret(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && ptrTrue(ref.Optional) {
				return "", false, nil
			}
			if apierrors.IsNotFound(err) {
				return "", false, configErrorf("secret %q not found", ref.Name)
			}
			return "", false, err
		}
		v, ok := s.Data[ref.Key]
		if !ok {
			if ptrTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, configErrorf("couldn't find key %s in Secret %s/%s", ref.Key, pod.Namespace, ref.Name)
		}
		return string(v), true, nil
	case vf.ConfigMapKeyRef != nil:
		ref := vf.ConfigMapKeyRef
		cm, err := src.ConfigMap(ctx, pod.Namespace, ref.Name)
		if err != nil {
			if apierrors.IsNotFound(err) && ptrTrue(ref.Optional) {
				return "", false, nil
			}
			if apierrors.IsNotFound(err) {
				return "", false, configErrorf("configmap %q not found", ref.Name)
			}
			return "", false, err
		}
		v, ok := cm.Data[ref.Key]
		if !ok {
			if b, ok := cm.BinaryData[ref.Key]; ok {
				return string(b), true, nil
			}
			if ptrTrue(ref.Optional) {
				return "", false, nil
			}
			return "", false, configErrorf("couldn't find key %s in ConfigMap %s/%s", ref.Key, pod.Namespace, ref.Name)
		}
		return v, true, nil
	case vf.FileKeyRef != nil:
		return "", false, configErrorf("env %s: fileKeyRef is not supported by the local pod runner", e.Name)
	}
	return "", false, configErrorf("env %s: unsupported valueFrom", e.Name)
}

// podField resolves a downward-API field path for env and volumes.
func podField(pc podEnvContext, fieldPath string) (string, error) {
	pod := pc.pod
	switch fieldPath {
	case "metadata.name":
		return pod.Name, nil
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.uid":
		return string(pod.UID), nil
	case "metadata.labels":
		return formatMap(pod.Labels), nil
	case "metadata.annotations":
		return formatMap(pod.Annotations), nil
	case "spec.nodeName":
		return pc.nodeName, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "status.hostIP", "status.hostIPs":
		return pc.hostIP, nil
	case "status.podIP", "status.podIPs":
		return pc.podIP, nil
	}
	for prefix, m := range map[string]map[string]string{"metadata.labels": pod.Labels, "metadata.annotations": pod.Annotations} {
		if rest, ok := strings.CutPrefix(fieldPath, prefix+"["); ok && strings.HasSuffix(rest, "]") {
			key := strings.Trim(strings.TrimSuffix(rest, "]"), `'"`)
			return m[key], nil
		}
	}
	return "", configErrorf("unsupported fieldPath %q", fieldPath)
}

// formatMap is the downward API's key="value" lines, sorted by key.
func formatMap(m map[string]string) string {
	var b strings.Builder
	for i, k := range sortedKeys(m) {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s=%q", k, m[k])
	}
	return b.String()
}

func resourceField(pc podEnvContext, c *corev1.Container, ref *corev1.ResourceFieldSelector) (string, error) {
	if ref.ContainerName != "" {
		c = findContainer(pc.pod, ref.ContainerName)
		if c == nil {
			return "", configErrorf("resourceFieldRef: no container %q", ref.ContainerName)
		}
	}
	kind, name, ok := strings.Cut(ref.Resource, ".")
	if !ok {
		return "", configErrorf("resourceFieldRef: unsupported resource %q", ref.Resource)
	}
	res := corev1.ResourceName(name)
	var q resource.Quantity
	var set bool
	switch kind {
	case "limits":
		q, set = c.Resources.Limits[res]
		if !set {
			q, set = pc.allocatable[res]
		}
	case "requests":
		q, set = c.Resources.Requests[res]
		if !set && res != corev1.ResourceCPU {
			q, set = pc.allocatable[res]
		}
	default:
		return "", configErrorf("resourceFieldRef: unsupported resource %q", ref.Resource)
	}
	if !set {
		return "0", nil
	}
	divisor := ref.Divisor
	if divisor.IsZero() {
		divisor = resource.MustParse("1")
	}
	if res == corev1.ResourceCPU {
		return strconv.FormatInt(int64(math.Ceil(float64(q.MilliValue())/float64(divisor.MilliValue()))), 10), nil
	}
	return strconv.FormatInt(int64(math.Ceil(float64(q.Value())/float64(divisor.Value()))), 10), nil
}

func findContainer(pod *corev1.Pod, name string) *corev1.Container {
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == name {
			return &pod.Spec.Containers[i]
		}
	}
	for i := range pod.Spec.InitContainers {
		if pod.Spec.InitContainers[i].Name == name {
			return &pod.Spec.InitContainers[i]
		}
	}
	return nil
}

// serviceEnvVars are the docker-links style variables of the kubelet's
// pkg/kubelet/envvars.
func serviceEnvVars(services []*corev1.Service) map[string]string {
	out := map[string]string{}
	for _, s := range services {
		ip := s.Spec.ClusterIP
		if ip == "" || ip == corev1.ClusterIPNone || len(s.Spec.Ports) == 0 {
			continue
		}
		name := strings.ToUpper(strings.ReplaceAll(s.Name, "-", "_"))
		out[name+"_SERVICE_HOST"] = ip
		out[name+"_SERVICE_PORT"] = strconv.Itoa(int(s.Spec.Ports[0].Port))
		for _, p := range s.Spec.Ports {
			if p.Name != "" {
				out[name+"_SERVICE_PORT_"+strings.ToUpper(strings.ReplaceAll(p.Name, "-", "_"))] = strconv.Itoa(int(p.Port))
			}
		}
		first := s.Spec.Ports[0]
		out[name+"_PORT"] = fmt.Sprintf("%s://%s", strings.ToLower(string(protocol(first))), net.JoinHostPort(ip, strconv.Itoa(int(first.Port))))
		for _, p := range s.Spec.Ports {
			proto := strings.ToUpper(string(protocol(p)))
			prefix := fmt.Sprintf("%s_PORT_%d_%s", name, p.Port, proto)
			out[prefix] = fmt.Sprintf("%s://%s", strings.ToLower(proto), net.JoinHostPort(ip, strconv.Itoa(int(p.Port))))
			out[prefix+"_PROTO"] = strings.ToLower(proto)
			out[prefix+"_PORT"] = strconv.Itoa(int(p.Port))
			out[prefix+"_ADDR"] = ip
		}
	}
	return out
}

func protocol(p corev1.ServicePort) corev1.Protocol {
	if p.Protocol == "" {
		return corev1.ProtocolTCP
	}
	return p.Protocol
}

// expand is Kubernetes' $(VAR) expansion (third_party/forked/golang/expansion):
// $(NAME) is replaced when the mapping knows NAME and kept otherwise, $$
// escapes a dollar.
func expand(input string, mapping func(string) string) string {
	var b strings.Builder
	checkpoint := 0
	for cursor := 0; cursor < len(input); cursor++ {
		if input[cursor] != '$' || cursor+1 >= len(input) {
			continue
		}
		b.WriteString(input[checkpoint:cursor])
		read, isVar, advance := readVariableName(input[cursor+1:])
		if isVar {
			b.WriteString(mapping(read))
		} else {
			b.WriteString(read)
		}
		cursor += advance
		checkpoint = cursor + 1
	}
	return b.String() + input[checkpoint:]
}

func readVariableName(input string) (string, bool, int) {
	switch input[0] {
	case '$':
		return "$", false, 1
	case '(':
		for i := 1; i < len(input); i++ {
			if input[i] == ')' {
				return input[1:i], true, i + 1
			}
		}
		return "$(", false, 1
	default:
		return "$" + input[:1], false, 1
	}
}

func mappingFuncFor(maps ...map[string]string) func(string) string {
	return func(name string) string {
		for _, m := range maps {
			if v, ok := m[name]; ok {
				return v
			}
		}
		return "$(" + name + ")"
	}
}

// validEnvName follows the relaxed validation of current Kubernetes: any
// printable ASCII but '='.
func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r < ' ' || r > '~' || r == '=' {
			return false
		}
	}
	return true
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func ptrTrue(b *bool) bool { return b != nil && *b }
