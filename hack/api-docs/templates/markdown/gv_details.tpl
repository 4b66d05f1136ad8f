{{- define "gvDetails" -}}
{{- $gv := . -}}

## Resource types
{{ range $gv.SortedKinds }}
{{ template "type" ($gv.TypeForKind .) }}
{{ end }}

## Other types
{{ range $gv.SortedTypes }}
{{- if not .GVK }}
{{ template "type" . }}
{{ end -}}
{{ end }}
{{- end -}}
