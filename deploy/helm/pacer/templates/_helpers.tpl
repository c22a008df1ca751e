{{- /* Objects are named RELEASE-monitor, RELEASE-server, RELEASE-worker
     (a release named "pacer" gives the names of deploy/k8s). */ -}}
{{- define "pacer.fullname" -}}
{{ .Release.Name }}
{{- end }}

{{- define "pacer.labels" -}}
app.kubernetes.io/name: pacer
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: pacer
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "pacer.selector" -}}
app.kubernetes.io/name: pacer
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pacer.monitorAddress" -}}
tcp://{{ include "pacer.fullname" . }}-monitor-0.{{ include "pacer.fullname" . }}-monitor:7000
{{- end }}

{{- define "pacer.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag }}
{{- end }}
