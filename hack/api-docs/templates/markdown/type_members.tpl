{{- define "type_members" -}}
{{- $field := . -}}
{{- if eq $field.Name "metadata" -}}
Standard object metadata; see the Kubernetes API reference.
{{- else if and (eq $field.Name "status") (not $field.Doc) (eq $field.Type.Name "HCPSessionStatus") -}}
Observed state: the read model of the session's event stream, written by the callee sidecar (the caller sidecar writes `callerAckedSequence`).
{{- else if and (eq $field.Name "status") (not $field.Doc) -}}
Observed state, written by the operator.
{{- else if and (eq $field.Name "spec") (not $field.Doc) (eq $field.Type.Name "HCPSessionSpec") -}}
What was asked: written by the callee sidecar when the task_submit arrives; immutable except `abortRequested`.
{{- else if and (eq $field.Name "spec") (not $field.Doc) -}}
Desired state.
{{- else -}}
{{ template "doc" $field.Doc }}
{{- end -}}
{{- end -}}
