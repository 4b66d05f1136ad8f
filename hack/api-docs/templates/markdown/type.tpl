{{- define "validationItem" -}}
{{- $v := . | replace "items:" "each item: " -}}
{{- $v = $v | replace "MaxLength: " "max length " | replace "MinLength: " "min length " -}}
{{- $v = $v | replace "MaxItems: " "max items " | replace "MinItems: " "min items " -}}
{{- $v = $v | replace "Maximum: " "max " | replace "Minimum: " "min " -}}
{{- $v | replace "Pattern: " "pattern " -}}
{{- end -}}

{{- define "doc" -}}
{{- /* Join wrapped comment lines; keep paragraph breaks; escape table pipes. */ -}}
{{- $d := . | replace "|" "\\|" -}}
{{- $d = regexReplaceAll "\n[ \t]*\n" $d "<br /><br />" -}}
{{- regexReplaceAll "\n" $d " " -}}
{{- end -}}

{{- define "validation" -}}
{{- $first := true -}}
{{- $duration := false -}}
{{- if .Type }}{{ if eq .Type.Name "ISO8601Duration" }}{{ $duration = true }}{{ end }}{{ end -}}
{{- if $duration -}}
an [ISO 8601 duration](#iso8601duration){{ $first = false }}
{{- end -}}
{{- range .Validation -}}
{{- if and $duration (or (hasPrefix "Pattern:" .) (hasPrefix "MaxLength:" .)) }}{{ continue }}{{ end -}}
{{- if not (or (hasPrefix "Required:" .) (hasPrefix "Optional:" .) (hasPrefix "Schemaless:" .)) -}}
{{- if not $first }}<br />{{ end }}{{ $first = false -}}
{{- if hasPrefix "Enum:" . -}}
one of {{ range $i, $v := (. | trimPrefix "Enum: [" | trimSuffix "]" | splitList " ") }}{{ if $i }}, {{ end }}`{{ $v }}`{{ end }}
{{- else -}}
{{ template "validationItem" (. | replace "|" "\\|") }}
{{- end -}}
{{- end -}}
{{- end -}}
{{- with index .Markers "kubebuilder:validation:Schemaless" -}}
{{- if not $first }}<br />{{ end }}{{ $first = false -}}
any JSON value (not validated)
{{- end -}}
{{- with index .Markers "kubebuilder:validation:XValidation" -}}
{{- range . -}}
{{- if not $first }}<br />{{ end }}{{ $first = false -}}
CEL: {{ .Message | replace "|" "\\|" }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "typeValidation" -}}
{{- range $i, $v := .Validation -}}
{{- if $i }}, {{ end -}}
{{- if hasPrefix "Enum:" $v -}}
one of {{ range $j, $e := ($v | trimPrefix "Enum: [" | trimSuffix "]" | splitList " ") }}{{ if $j }}, {{ end }}`{{ $e }}`{{ end }}
{{- else -}}
{{ template "validationItem" $v }}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "required" -}}
{{- if or (index .Markers "required") (index .Markers "kubebuilder:validation:Required") (index .Markers "k8s:required") -}}
**required**
{{- else -}}
optional
{{- end -}}
{{- end -}}

{{- define "type" -}}
{{- $type := . -}}
{{- if markdownShouldRenderType $type -}}

### {{ $type.Name }}

{{ if $type.IsAlias }}_Underlying type:_ {{ markdownRenderTypeLink $type.UnderlyingType }}

{{ end -}}
{{ $type.Doc }}
{{- with $type.GVK }}

`apiVersion: {{ .Group }}/{{ .Version }}`, `kind: {{ .Kind }}`, namespaced.
{{- end }}
{{- with index $type.Markers "kubebuilder:resource" }}{{ with index . 0 }}

Short names: {{ range $i, $n := .ShortName }}{{ if $i }}, {{ end }}`{{ $n }}`{{ end }}; categories: {{ range $i, $n := .Categories }}{{ if $i }}, {{ end }}`{{ $n }}`{{ end }}.
{{- end }}{{ end }}
{{- with index $type.Markers "kubebuilder:printcolumn" }}

`kubectl get` columns (`-o wide` adds those of priority 1):

| column | type | from | priority |
| --- | --- | --- | --- |
{{ range . -}}
| {{ .Name }} | {{ .Type }} | `{{ .JSONPath | replace "|" "\\|" }}` | {{ .Priority }} |
{{ end -}}
{{- end }}

{{- if $type.Validation }}

_Validation:_ {{ template "typeValidation" $type }}
{{- else if index $type.Markers "kubebuilder:validation:XValidation" }}

_Validation rules (CEL):_
{{ range index $type.Markers "kubebuilder:validation:XValidation" }}
- {{ .Message }}: `{{ .Rule }}`
{{- end }}
{{- end }}

{{- if $type.References }}

_Appears in:_ {{ range $i, $r := $type.SortedReferences }}{{ if $i }}, {{ end }}{{ markdownRenderTypeLink $r }}{{ end }}
{{- end }}

{{- if $type.Members }}

| Field | Description | Required | Default | Validation |
| --- | --- | --- | --- | --- |
{{ if $type.GVK -}}
| `apiVersion` _string_ | `{{ $type.GVK.Group }}/{{ $type.GVK.Version }}` | **required** | | |
| `kind` _string_ | `{{ $type.GVK.Kind }}` | **required** | | |
{{ end -}}
{{ range $type.Members -}}
| `{{ .Name }}` _{{ markdownRenderType .Type }}_ | {{ template "type_members" . }} | {{ if eq .Name "metadata" "status" }}{{ else }}{{ template "required" . }}{{ end }} | {{ with .Default }}`{{ . | replace "{  }" "{}" }}`{{ end }} | {{ template "validation" . }} |
{{ end -}}
{{- end }}

{{- $documented := false -}}
{{- range $type.EnumValues }}{{ if .Doc }}{{ $documented = true }}{{ end }}{{ end -}}
{{- if and $type.EnumValues $documented }}

| Value | Description |
| --- | --- |
{{ range $type.EnumValues -}}
| `{{ .Name }}` | {{ template "doc" .Doc }} |
{{ end -}}
{{- end }}
{{- end -}}
{{- end -}}
