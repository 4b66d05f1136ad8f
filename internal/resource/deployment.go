package resource

import (
	"fmt"
	"slices"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	hcpv1alpha1 "github.com/hcp-io/hcp-operator/api/v1alpha1"
	"github.com/hcp-io/hcp-operator/internal/sidecar/config"
	"github.com/hcp-io/hcp-operator/pkg/hcp/topology"
)

// Names of what the operator injects into the harness pod. A user container
// or volume with one of these names is replaced.
const (
	SidecarContainerName = "hcp-sidecar"
	StateVolumeName      = "hcp-state"
	APIPortName          = "hcp-api"
	ProbePortName        = "probes"
	// sidecarUID is the non-root user the sidecar runs as (the distroless
	// "nonroot" user of the image).
	sidecarUID int64 = 65532
)

// DefaultSidecarImage is the sidecar image when neither the Callee/Caller
// nor the manager sets one. Set at build time with
// -ldflags "-X github.com/hcp-io/hcp-operator/internal/resource.DefaultSidecarImage=...".
var DefaultSidecarImage = "ghcr.io/hcp-io/hcp-operator:latest"

// DefaultSidecarResources are the sidecar's resources unless
// spec.sidecar.resources says otherwise.
func DefaultSidecarResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("50m"),
			corev1.ResourceMemory: resource.MustParse("64Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
	}
}

// HarnessParams is what the harness Deployment is built from.
type HarnessParams struct {
	Subject Subject
	Harness hcpv1alpha1.HarnessSpec
	Sidecar hcpv1alpha1.SidecarSpec
	Vhost   string
	// Image is the manager's sidecar image; Sidecar.Image overrides it.
	Image string
	// Prefetch is the consumer prefetch in effect.
	Prefetch int32
	// SecretsHash changes when the content of a Secret the pods read
	// changes (HashSecretData of each, combined by the caller).
	SecretsHash string
}

// Image in effect: spec.sidecar.image, else the manager's, else the default.
func (p HarnessParams) image() string {
	switch {
	case p.Sidecar.Image != "":
		return p.Sidecar.Image
	case p.Image != "":
		return p.Image
	}
	return DefaultSidecarImage
}

func (p HarnessParams) port() int32 {
	if p.Harness.Port == 0 {
		return 8080
	}
	return p.Harness.Port
}

// SidecarContainer is the injected hcp-sidecar. Its environment follows
// internal/sidecar/config exactly.
func SidecarContainer(p HarnessParams) corev1.Container {
	s := p.Subject
	secretEnv := func(name, secret, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secret}, Key: key,
		}}}
	}
	fieldEnv := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{
			APIVersion: "v1", FieldPath: path,
		}}}
	}
	logLevel := p.Sidecar.LogLevel
	if logLevel == "" {
		logLevel = config.DefaultLogLevel
	}
	env := []corev1.EnvVar{
		{Name: config.EnvMode, Value: string(s.Role)},
		{Name: config.EnvID, Value: s.ID},
		{Name: config.EnvObjectName, Value: s.Name},
		fieldEnv(config.EnvNamespace, "metadata.namespace"),
		fieldEnv(config.EnvPodName, "metadata.name"),
		{Name: config.EnvVhost, Value: p.Vhost},
		secretEnv(config.EnvAMQPURL, s.CredentialsSecretName(), CredentialsURIKey),
		secretEnv(config.EnvUsername, s.CredentialsSecretName(), CredentialsUsernameKey),
	}
	if s.Role == topology.RoleCallee {
		env = append(env, secretEnv(config.EnvTokenKey, s.TokenSecretName(), TokenPrivateKeyKey))
	}
	env = append(env,
		corev1.EnvVar{Name: config.EnvHarnessURL, Value: fmt.Sprintf("http://127.0.0.1:%d", p.port())},
		corev1.EnvVar{Name: config.EnvAPIAddr, Value: config.DefaultAPIAddr},
		corev1.EnvVar{Name: config.EnvProbeAddr, Value: config.DefaultProbeAddr},
		corev1.EnvVar{Name: config.EnvPrefetch, Value: strconv.Itoa(int(p.Prefetch))},
		corev1.EnvVar{Name: config.EnvLogLevel, Value: logLevel},
		corev1.EnvVar{Name: config.EnvStateDir, Value: config.DefaultStateDir},
	)
	resources := DefaultSidecarResources()
	if p.Sidecar.Resources != nil {
		resources = *p.Sidecar.Resources.DeepCopy()
	}
	probe := func(path string, period int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString(ProbePortName), Scheme: corev1.URISchemeHTTP,
			}},
			PeriodSeconds:    period,
			TimeoutSeconds:   2,
			SuccessThreshold: 1,
			FailureThreshold: 3,
		}
	}
	return corev1.Container{
		Name:  SidecarContainerName,
		Image: p.image(),
		// The image's entrypoint is the manager; the sidecar is its second binary.
		Command: []string{SidecarCommand},
		Args:    []string{"--mode=" + string(s.Role)},
		Env:     env,
		Ports: []corev1.ContainerPort{
			// The harness API listens on 127.0.0.1 only; the port is
			// declared for documentation.
			{Name: APIPortName, ContainerPort: config.DefaultAPIPort, Protocol: corev1.ProtocolTCP},
			{Name: ProbePortName, ContainerPort: config.DefaultProbePort, Protocol: corev1.ProtocolTCP},
		},
		Resources:      resources,
		LivenessProbe:  probe("/healthz", 10),
		ReadinessProbe: probe("/readyz", 5),
		VolumeMounts: []corev1.VolumeMount{
			{Name: StateVolumeName, MountPath: config.DefaultStateDir},
		},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		// Pod Security Standard "restricted".
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             new(true),
			RunAsUser:                new(sidecarUID),
			ReadOnlyRootFilesystem:   new(true),
			AllowPrivilegeEscalation: new(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// Deployment is the harness Deployment: the user's pod template with the
// hcp-sidecar container, its state volume, the ServiceAccount and the
// config-hash annotation injected.
func Deployment(p HarnessParams) *appsv1.Deployment {
	s := p.Subject
	tmpl := *p.Harness.Template.DeepCopy()

	labels := tmpl.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range s.Labels() {
		labels[k] = v // ours win: the selector depends on them
	}
	tmpl.Labels = labels

	spec := &tmpl.Spec
	spec.Containers = slices.DeleteFunc(spec.Containers, func(c corev1.Container) bool { return c.Name == SidecarContainerName })
	spec.Containers = append(spec.Containers, SidecarContainer(p))
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return v.Name == StateVolumeName })
	spec.Volumes = append(spec.Volumes, corev1.Volume{
		Name:         StateVolumeName,
		VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}},
	})
	spec.ServiceAccountName = s.BaseName()
	spec.DeprecatedServiceAccount = ""
	// The sidecar talks to the API server.
	spec.AutomountServiceAccountToken = new(true)

	// The hash covers the whole rendered pod template (harness, sidecar,
	// broker settings through the env) and the Secrets' content.
	annotations := tmpl.Annotations
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, hcpv1alpha1.AnnotationConfigHash)
	tmpl.Annotations = annotations
	annotations[hcpv1alpha1.AnnotationConfigHash] = hashJSON(tmpl, p.SecretsHash)

	replicas := int32(1)
	if p.Harness.Replicas != nil {
		replicas = *p.Harness.Replicas
	}
	return &appsv1.Deployment{
		ObjectMeta: s.meta(s.BaseName()),
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: s.SelectorLabels()},
			Template: tmpl,
		},
	}
}
