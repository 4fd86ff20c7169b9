{{/* Names, labels and small decisions shared by the templates. */}}

{{- define "llm-gpu-exporter.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llm-gpu-exporter.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llm-gpu-exporter.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llm-gpu-exporter.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llm-gpu-exporter.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "llm-gpu-exporter.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/component: exporter
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "llm-gpu-exporter.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "llm-gpu-exporter.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* "true" when the exporter talks to the API server: engine discovery through pods. */}}
{{- define "llm-gpu-exporter.needsApi" -}}
{{- if or .Values.discovery.kubernetes (and .Values.attribution.enabled .Values.attribution.processes) -}}true{{- end -}}
{{- end -}}

{{- define "llm-gpu-exporter.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{- define "llm-gpu-exporter.priorityClassName" -}}
{{- if .Values.priorityClass.create -}}
{{- include "llm-gpu-exporter.fullname" . -}}
{{- else -}}
{{- .Values.priorityClassName -}}
{{- end -}}
{{- end -}}

{{/* A Kubernetes object name from a file name: lower case, [a-z0-9-], at most 63. */}}
{{- define "llm-gpu-exporter.objectName" -}}
{{- regexReplaceAll "[^a-z0-9-]+" (lower .) "-" | trunc 63 | trimAll "-" -}}
{{- end -}}

{{/* The exporter's config file: settings the chart manages, then .Values.config. */}}
{{- define "llm-gpu-exporter.config" -}}
{{- $managed := dict
  "listen" (printf "%s:%d" (.Values.listenAddress | toString) (int .Values.port))
  "interval" .Values.interval
  "log_level" .Values.logLevel
  "engines" .Values.engines
  "discover_kubernetes" .Values.discovery.kubernetes
  "engine_annotation" .Values.discovery.annotation
  "probe_dir" .Values.probeDir.hostPath
-}}
{{- if .Values.attribution.enabled -}}
{{- $_ := set $managed "kubelet_socket" (printf "%s/kubelet.sock" (trimSuffix "/" .Values.attribution.podResourcesDir)) -}}
{{- if .Values.attribution.processes -}}
{{- $_ := set $managed "process_owners" true -}}
{{- if .Values.attribution.podLabels -}}
{{- $_ := set $managed "pod_labels" .Values.attribution.podLabels -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if .Values.webConfig.existingSecret -}}
{{- $_ := set $managed "web_config_file" (printf "/etc/llm-gpu-exporter/web/%s" .Values.webConfig.key) -}}
{{- end -}}
{{- toYaml (merge $managed .Values.config) -}}
{{- end -}}

{{- define "llm-gpu-exporter.validate" -}}
{{- if and .Values.attribution.processes (not .Values.attribution.enabled) -}}
{{- fail "attribution.processes needs attribution.enabled (hostPID and the kubelet socket)" -}}
{{- end -}}
{{- if and .Values.attribution.podLabels (not .Values.attribution.processes) -}}
{{- fail "attribution.podLabels needs attribution.processes: pod labels come from the API server's pod list" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) -}}
{{- fail "serviceMonitor.enabled needs service.enabled: the ServiceMonitor selects the Service (or use podMonitor)" -}}
{{- end -}}
{{- if and .Values.serviceMonitor.enabled .Values.podMonitor.enabled -}}
{{- fail "serviceMonitor.enabled and podMonitor.enabled would scrape every exporter twice: enable one" -}}
{{- end -}}
{{- end -}}

{{/* The scrape endpoint shared by the ServiceMonitor and the PodMonitor. */}}
{{- define "llm-gpu-exporter.endpoint" -}}
{{- $m := .monitor -}}
- port: metrics
  path: /metrics
  scheme: {{ lower .root.Values.webConfig.scheme }}
  interval: {{ $m.interval }}
  scrapeTimeout: {{ $m.scrapeTimeout }}
  honorLabels: {{ $m.honorLabels }}
  {{- with $m.tlsConfig }}
  tlsConfig:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  relabelings:
    - sourceLabels: [__meta_kubernetes_pod_node_name]
      targetLabel: node
      action: replace
    {{- with $m.relabelings }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  {{- with $m.metricRelabelings }}
  metricRelabelings:
    {{- toYaml . | nindent 4 }}
  {{- end }}
{{- end -}}

{{/*
Labels of the Prometheus Operator objects: the chart's, `release: <prometheus.release>`
(kube-prometheus-stack's selectors match it), then the object's own, which win.
Takes dict "root" "labels".
*/}}
{{- define "llm-gpu-exporter.monitoringLabels" -}}
{{- $extra := dict -}}
{{- with .root.Values.prometheus.release -}}
{{- $_ := set $extra "release" . -}}
{{- end -}}
{{- $extra = merge (deepCopy (.labels | default dict)) $extra -}}
{{- include "llm-gpu-exporter.labels" .root }}
{{- with $extra }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
Spec fields shared by the ServiceMonitor and the PodMonitor. targetLabels copies labels
of the Service (ServiceMonitor targetLabels) or of the pod (PodMonitor podTargetLabels).
Takes dict "monitor" "targetLabels" (the field name).
*/}}
{{- define "llm-gpu-exporter.monitorSpec" -}}
{{- with .monitor.jobLabel }}
jobLabel: {{ . | quote }}
{{- end }}
{{- with .monitor.targetLabels }}
{{ $.targetLabels }}:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .monitor.sampleLimit }}
sampleLimit: {{ int64 . }}
{{- end }}
{{- end -}}
