package resource

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

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
	// APIAccessVolumeName is the sidecar's Kubernetes API credentials (a
	// projected ServiceAccount token), mounted in the sidecar only.
	APIAccessVolumeName = "hcp-api-access"
	// TLSCAVolumeName and TLSClientVolumeName hold spec.broker.tls's
	// Secrets, mounted in the sidecar only.
	TLSCAVolumeName     = "hcp-tls-ca"
	TLSClientVolumeName = "hcp-tls-client"
	// CredentialsVolumeName and TokenVolumeName hold the broker URL and the
	// callee's token keys, as files rather than environment variables: two
	// volumes of the one credentials Secret, each with its own keys only.
	CredentialsVolumeName = "hcp-credentials"
	TokenVolumeName       = "hcp-token"
	APIPortName           = "hcp-api"
	ProbePortName         = "probes"
	// sidecarUID is the non-root user the sidecar runs as (the distroless
	// "nonroot" user of the image).
	sidecarUID int64 = 65532
)

// Where the sidecar finds what is mounted for it.
const (
	// ServiceAccountMountPath is where client-go's in-cluster config
	// reads the token, CA and namespace.
	ServiceAccountMountPath = "/var/run/secrets/kubernetes.io/serviceaccount"
	TLSCAMountPath          = "/etc/hcp/tls/ca"
	TLSClientMountPath      = "/etc/hcp/tls/client"
	CredentialsMountPath    = "/etc/hcp/credentials"
	TokenMountPath          = "/etc/hcp/token"
	// serviceAccountTokenSeconds is the lifetime of the projected token;
	// the kubelet renews it at 80% and client-go re-reads the file.
	serviceAccountTokenSeconds int64 = 3600
	// rootCAConfigMap is published in every namespace by
	// kube-controller-manager; the kubelet's own kube-api-access volume
	// reads it too.
	rootCAConfigMap = "kube-root-ca.crt"
)

// reservedVolumes are the volumes the operator injects; a user volume with
// one of these names is replaced.
var reservedVolumes = []string{StateVolumeName, APIAccessVolumeName, TLSCAVolumeName, TLSClientVolumeName, CredentialsVolumeName, TokenVolumeName}

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
	// Addresses are the broker's nodes when it is a cluster reached
	// without a load balancer (Broker.AMQPAddresses).
	Addresses []string
	// Image is the manager's sidecar image; Sidecar.Image overrides it.
	Image string
	// Prefetch is the consumer prefetch in effect.
	Prefetch int32
	// AppMaxBatch is the caller's spec.consumer.appMaxBatch (0 or 1: the
	// sidecar's default, one event per request).
	AppMaxBatch int32
	// AppStream is the caller's spec.consumer.appStream.
	AppStream bool
	// AppMaxAttempts is the caller's spec.delivery.maxAttempts (0: the
	// sidecar's default).
	AppMaxAttempts int32
	// SecretsHash changes when the content of a Secret the sidecar loads
	// only at start changes (TLSSecretsHash), so that a renewal rolls the
	// pods. The credentials Secret (a callee's token keys included) is not
	// in it: the sidecar follows its files (internal/sidecar/secretfile).
	SecretsHash string
	// TLS is spec.broker.tls: its Secrets are mounted into the sidecar.
	TLS *hcpv1alpha1.BrokerTLS
	// Tracing is the manager's span export setting for every sidecar.
	Tracing SidecarTracing
	// SidecarClusterRole is the ClusterRole a callee's RoleBinding grants
	// (CalleeRoleBinding; the manager's --callee-sidecar-cluster-role).
	SidecarClusterRole string
}

// SidecarTracing switches on the sidecars' spans and their OTLP export
// (internal/sidecar/tracing). Trace context is propagated whether or not
// it is set.
type SidecarTracing struct {
	// OTLPEndpoint is the collector (OTEL_EXPORTER_OTLP_ENDPOINT, e.g.
	// http://otel-collector.observability:4317); empty: no spans.
	OTLPEndpoint string
	// Protocol is grpc (the default) or http/protobuf
	// (OTEL_EXPORTER_OTLP_PROTOCOL).
	Protocol string
}

// The sidecar's tracing environment (internal/sidecar/tracing's EnvTracing,
// ModeOTLP, DefaultServiceName; a test keeps them equal): spelled out so
// that the manager does not link the OpenTelemetry SDK.
const (
	envTracing         = "HCP_TRACING"
	tracingOTLP        = "otlp"
	tracingServiceName = "hcp-sidecar"
)

// Enabled reports whether the sidecars record and export spans.
func (t SidecarTracing) Enabled() bool { return t.OTLPEndpoint != "" }

// ParseOTLPProtocol checks an OTLP protocol name.
func ParseOTLPProtocol(s string) error {
	switch s {
	case "", "grpc", "http/protobuf":
		return nil
	}
	return fmt.Errorf("%q: want grpc or http/protobuf", s)
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
		// The username is not secret; the password and the token key are
		// files (see injectedVolumes), never in the environment, which
		// /proc/PID/environ and `kubectl describe pod` readers can see, and
		// which cannot change without a restart.
		secretEnv(config.EnvUsername, s.CredentialsSecretName(), CredentialsUsernameKey),
		{Name: config.EnvAMQPURLFile, Value: CredentialsMountPath + "/" + CredentialsURIKey},
	}
	if len(p.Addresses) > 0 {
		env = append(env, corev1.EnvVar{Name: config.EnvAMQPAddresses, Value: strings.Join(p.Addresses, ",")})
	}
	mounts := []corev1.VolumeMount{
		{Name: StateVolumeName, MountPath: config.DefaultStateDir},
		{Name: APIAccessVolumeName, MountPath: ServiceAccountMountPath, ReadOnly: true},
		{Name: CredentialsVolumeName, MountPath: CredentialsMountPath, ReadOnly: true},
	}
	if s.Role == topology.RoleCallee {
		env = append(env,
			corev1.EnvVar{Name: config.EnvTokenKeyFile, Value: TokenMountPath + "/" + TokenPrivateKeyKey},
			corev1.EnvVar{Name: config.EnvTokenVerifyKeysFile, Value: TokenMountPath + "/" + TokenVerifyKeysKey},
		)
		mounts = append(mounts, corev1.VolumeMount{Name: TokenVolumeName, MountPath: TokenMountPath, ReadOnly: true})
	}
	if t := p.TLS; t != nil {
		if t.CASecret != "" {
			env = append(env, corev1.EnvVar{Name: config.EnvTLSCAFile, Value: TLSCAMountPath + "/" + TLSCAKey})
			mounts = append(mounts, corev1.VolumeMount{Name: TLSCAVolumeName, MountPath: TLSCAMountPath, ReadOnly: true})
		}
		if t.ClientCertSecret != "" {
			env = append(env,
				corev1.EnvVar{Name: config.EnvTLSCertFile, Value: TLSClientMountPath + "/" + corev1.TLSCertKey},
				corev1.EnvVar{Name: config.EnvTLSKeyFile, Value: TLSClientMountPath + "/" + corev1.TLSPrivateKeyKey},
			)
			mounts = append(mounts, corev1.VolumeMount{Name: TLSClientVolumeName, MountPath: TLSClientMountPath, ReadOnly: true})
		}
	}
	env = append(env,
		corev1.EnvVar{Name: config.EnvHarnessURL, Value: fmt.Sprintf("http://127.0.0.1:%d", p.port())},
		corev1.EnvVar{Name: config.EnvAPIAddr, Value: config.DefaultAPIAddr},
		corev1.EnvVar{Name: config.EnvProbeAddr, Value: config.DefaultProbeAddr},
		corev1.EnvVar{Name: config.EnvPrefetch, Value: strconv.Itoa(int(p.Prefetch))},
		corev1.EnvVar{Name: config.EnvLogLevel, Value: logLevel},
		corev1.EnvVar{Name: config.EnvStateDir, Value: config.DefaultStateDir},
	)
	if p.AppMaxBatch > 1 {
		env = append(env, corev1.EnvVar{Name: config.EnvAppMaxBatch, Value: strconv.Itoa(int(p.AppMaxBatch))})
	}
	if p.AppStream {
		env = append(env, corev1.EnvVar{Name: config.EnvAppStream, Value: "true"})
	}
	if p.AppMaxAttempts > 0 {
		env = append(env, corev1.EnvVar{Name: config.EnvAppMaxAttempts, Value: strconv.Itoa(int(p.AppMaxAttempts))})
	}
	if t := p.Tracing; t.Enabled() {
		env = append(env,
			corev1.EnvVar{Name: envTracing, Value: tracingOTLP},
			corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_ENDPOINT", Value: t.OTLPEndpoint},
			corev1.EnvVar{Name: "OTEL_SERVICE_NAME", Value: tracingServiceName},
		)
		if t.Protocol != "" {
			env = append(env, corev1.EnvVar{Name: "OTEL_EXPORTER_OTLP_PROTOCOL", Value: t.Protocol})
		}
	}
	env = withUserEnv(env, p.Sidecar.Env)
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
		// A native sidecar (see Deployment).
		RestartPolicy: new(corev1.ContainerRestartPolicyAlways),
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
		Resources:                resources,
		LivenessProbe:            probe("/healthz", 10),
		ReadinessProbe:           probe("/readyz", 5),
		VolumeMounts:             mounts,
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
// hcp-sidecar, its volumes, the ServiceAccount, the drain hooks and the
// hash annotations injected.
//
// The sidecar is a Kubernetes native sidecar: the first init container,
// with restartPolicy Always. The kubelet starts it before every other
// container and, when the pod is deleted, stops it only after the regular
// containers have exited (the later native sidecars first, in reverse
// order). A plain container would get SIGTERM together with the app, and
// could not hand the app's sessions over while the app checkpoints; it would
// also be gone before the app's last events reached it.
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
	isSidecar := func(c corev1.Container) bool { return c.Name == SidecarContainerName }
	spec.Containers = slices.DeleteFunc(spec.Containers, isSidecar)
	spec.InitContainers = slices.DeleteFunc(spec.InitContainers, isSidecar)
	addDrainHooks(spec.Containers)
	spec.Volumes = slices.DeleteFunc(spec.Volumes, func(v corev1.Volume) bool { return slices.Contains(reservedVolumes, v.Name) })
	spec.Volumes = append(spec.Volumes, injectedVolumes(s, p.TLS)...)
	spec.ServiceAccountName = s.BaseName()
	spec.DeprecatedServiceAccount = ""
	// Only the sidecar talks to the API server, so only the sidecar gets
	// credentials: no token in every container (the kubelet's default),
	// but a projected token volume mounted where client-go's in-cluster
	// config looks, in the sidecar container alone. The harness
	// containers hold no Kubernetes credentials.
	spec.AutomountServiceAccountToken = new(false)

	// Two hashes: the config hash covers the rendered pod template but the
	// sidecar container, and SecretsHash; the sidecar hash the
	// sidecar container. A change of either rolls the pods, but only a
	// change of the sidecar hash alone may be held back
	// (spec.sidecar.updatePolicy OnDrain; see the Callee controller).
	annotations := tmpl.Annotations
	if annotations == nil {
		annotations = map[string]string{}
	}
	delete(annotations, hcpv1alpha1.AnnotationConfigHash)
	delete(annotations, AnnotationSidecarHash)
	tmpl.Annotations = annotations
	sidecar := SidecarContainer(p)
	configHash, sidecarHash := hashJSON(tmpl, p.SecretsHash), hashJSON(sidecar)
	annotations[hcpv1alpha1.AnnotationConfigHash] = configHash
	annotations[AnnotationSidecarHash] = sidecarHash
	spec.InitContainers = append([]corev1.Container{sidecar}, spec.InitContainers...)

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

// injectedVolumes are the sidecar's volumes: its state directory, its API
// credentials and, with spec.broker.tls, the TLS Secrets (only the keys
// the sidecar reads).
func injectedVolumes(s Subject, t *hcpv1alpha1.BrokerTLS) []corev1.Volume {
	// Secret files for the sidecar alone (no other container mounts them),
	// which runs as non-root without an fsGroup on the user's pod, hence
	// readable by all in its mount namespace. The kubelet replaces them
	// atomically on a change, and the sidecar follows (internal/sidecar/secretfile).
	secretVolume := func(name, secret string, keys ...string) corev1.Volume {
		items := make([]corev1.KeyToPath, len(keys))
		for i, k := range keys {
			items[i] = corev1.KeyToPath{Key: k, Path: k}
		}
		return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: secret, Items: items, DefaultMode: new(int32(0o444)),
		}}}
	}
	vols := []corev1.Volume{
		{Name: StateVolumeName, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
		{Name: APIAccessVolumeName, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
			// What the kubelet's own kube-api-access volume holds.
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{Path: "token", ExpirationSeconds: new(serviceAccountTokenSeconds)}},
				{ConfigMap: &corev1.ConfigMapProjection{
					LocalObjectReference: corev1.LocalObjectReference{Name: rootCAConfigMap},
					Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}},
				}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
					Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"},
				}}}},
			},
			// The kube-api-access volume's mode: readable by the sidecar's
			// non-root user (the kubelet tightens the token file itself
			// when the pod has an fsGroup or a single runAsUser).
			DefaultMode: new(int32(0o644)),
		}}},
		secretVolume(CredentialsVolumeName, s.CredentialsSecretName(), CredentialsURIKey),
	}
	if s.Role == topology.RoleCallee {
		// The token keys of the credentials Secret (WithTokenKeys).
		vols = append(vols, secretVolume(TokenVolumeName, s.CredentialsSecretName(), TokenPrivateKeyKey, TokenVerifyKeysKey))
	}
	if t == nil {
		return vols
	}
	if t.CASecret != "" {
		vols = append(vols, secretVolume(TLSCAVolumeName, t.CASecret, TLSCAKey))
	}
	if t.ClientCertSecret != "" {
		vols = append(vols, secretVolume(TLSClientVolumeName, t.ClientCertSecret, corev1.TLSCertKey, corev1.TLSPrivateKeyKey))
	}
	return vols
}
