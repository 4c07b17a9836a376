{{/* Labels of every object; selectorLabels are the stable subset. */}}
{{- define "bypassd.selectorLabels" -}}
app.kubernetes.io/name: bypassd
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "bypassd.labels" -}}
{{ include "bypassd.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}
