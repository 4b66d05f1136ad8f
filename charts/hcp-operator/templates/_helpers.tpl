{{/*
Chart name, truncated to the 63 characters a label value allows.
*/}}
{{- define "hcp-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Full name: the release name, plus the chart name unless the release name
already contains it.
*/}}
{{- define "hcp-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "hcp-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels of every object. Deterministic (no dates, no random values), so that
re-rendering and re-applying changes nothing.
*/}}
{{- define "hcp-operator.labels" -}}
helm.sh/chart: {{ include "hcp-operator.chart" . }}
{{ include "hcp-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hcp-operator
{{- end }}

{{/*
Selector labels of the manager pods. Immutable in a Deployment: never add to
them.
*/}}
{{- define "hcp-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "hcp-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: manager
{{- end }}

{{- define "hcp-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-controller-manager" (include "hcp-operator.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
An image reference from repository, tag and digest: the digest wins.
Arguments: (list repository tag digest).
*/}}
{{- define "hcp-operator.imageRef" -}}
{{- $repo := index . 0 }}{{- $tag := index . 1 }}{{- $digest := index . 2 }}
{{- if $digest }}
{{- printf "%s@%s" $repo $digest }}
{{- else }}
{{- printf "%s:%s" $repo $tag }}
{{- end }}
{{- end }}

{{- define "hcp-operator.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- include "hcp-operator.imageRef" (list .Values.image.repository $tag .Values.image.digest) }}
{{- end }}

{{/*
The sidecar image: the manager's image unless overridden (one image, two
binaries).
*/}}
{{- define "hcp-operator.sidecarImage" -}}
{{- $s := .Values.sidecarImage }}
{{- $tag := default (default .Chart.AppVersion .Values.image.tag) $s.tag }}
{{- if $s.repository }}
{{- include "hcp-operator.imageRef" (list $s.repository $tag $s.digest) }}
{{- else }}
{{- include "hcp-operator.imageRef" (list .Values.image.repository $tag (default .Values.image.digest $s.digest)) }}
{{- end }}
{{- end }}

{{- define "hcp-operator.defaultBrokerSecretName" -}}
{{- default (printf "%s-default-broker" (include "hcp-operator.fullname" .)) .Values.defaultBroker.secret.name }}
{{- end }}

{{/*
The --default-connection-secret value: NAMESPACE/NAME, NAME, or empty.
Fails on contradictory values.
*/}}
{{- define "hcp-operator.defaultConnectionSecret" -}}
{{- $b := .Values.defaultBroker }}
{{- if and $b.existingSecret $b.secret.create }}
{{- fail "set at most one of defaultBroker.existingSecret and defaultBroker.secret.create" }}
{{- end }}
{{- if $b.secret.create }}
{{- printf "%s/%s" .Release.Namespace (include "hcp-operator.defaultBrokerSecretName" .) }}
{{- else if $b.existingSecret }}
{{- $parts := splitList "/" $b.existingSecret }}
{{- if or (gt (len $parts) 2) (has "" $parts) }}
{{- fail (printf "defaultBroker.existingSecret %q: want NAMESPACE/NAME or NAME" $b.existingSecret) }}
{{- end }}
{{- $b.existingSecret }}
{{- end }}
{{- end }}

{{/*
Namespace of the default connection Secret when the manager reads it from a
fixed namespace; empty otherwise.
*/}}
{{- define "hcp-operator.defaultBrokerNamespace" -}}
{{- $ref := include "hcp-operator.defaultConnectionSecret" . }}
{{- if contains "/" $ref }}
{{- first (splitList "/" $ref) }}
{{- end }}
{{- end }}

{{/*
The ClusterRole every callee sidecar is granted in its namespace
(templates/sidecar-rbac.yaml, the manager's --callee-sidecar-cluster-role).
*/}}
{{- define "hcp-operator.calleeSidecarClusterRole" -}}
{{- include "hcp-operator.fullname" . }}-callee-sidecar
{{- end }}
