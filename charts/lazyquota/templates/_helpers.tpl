{{/*
The chart name, or nameOverride.
*/}}
{{- define "lazyquota.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the chart's objects: fullnameOverride, else <release>-<name>, or just
<release> when the release name already contains the name.
*/}}
{{- define "lazyquota.fullname" -}}
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

{{/*
chart-version, for the helm.sh/chart label.
*/}}
{{- define "lazyquota.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Labels on every object.
*/}}
{{- define "lazyquota.labels" -}}
helm.sh/chart: {{ include "lazyquota.chart" . }}
{{ include "lazyquota.selectorLabels" . }}
app.kubernetes.io/version: {{ include "lazyquota.tag" . | quote }}
app.kubernetes.io/part-of: lazyquota
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the controller pods (immutable once deployed: keep them minimal).
*/}}
{{- define "lazyquota.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lazyquota.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount name.
*/}}
{{- define "lazyquota.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "lazyquota.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image tag: image.tag, else the chart's appVersion.
*/}}
{{- define "lazyquota.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/*
The image reference.
*/}}
{{- define "lazyquota.image" -}}
{{- printf "%s:%s" .Values.image.repository (include "lazyquota.tag" .) }}
{{- end }}

{{/*
The leader-election Lease name.
*/}}
{{- define "lazyquota.leaseName" -}}
{{- default (include "lazyquota.fullname" .) .Values.leaderElection.leaseName }}
{{- end }}

{{/*
The container arguments: the flags of `lazyquota run`.
*/}}
{{- define "lazyquota.args" -}}
- run
- --metrics-addr
{{- if .Values.hostNetwork }}
{{- /* $(POD_IP) is expanded by the kubelet from the container's env (see deployment.yaml). */}}
- {{ printf "$(POD_IP):%d" (int .Values.metrics.port) | quote }}
{{- else }}
- {{ printf "0.0.0.0:%d" (int .Values.metrics.port) | quote }}
{{- end }}
- --metrics-auth
- {{ .Values.metrics.auth | default "none" | quote }}
- --mode
- {{ .Values.controller.mode | quote }}
- --resync-period
- {{ .Values.controller.resyncPeriod | quote }}
- --concurrency
- {{ int .Values.controller.concurrency | toString | quote }}
- --namespace-watch-threshold
- {{ int .Values.controller.namespaceWatchThreshold | toString | quote }}
- --discovery-poll
- {{ .Values.controller.discoveryPoll | quote }}
- --streaming-lists
- {{ .Values.controller.streamingLists | quote }}
- --log-format
- {{ .Values.logging.format | quote }}
{{- if .Values.shadow }}
- --shadow
{{- end }}
{{- if .Values.metrics.quotaUsage.enabled }}
- --quota-usage-metrics
- --quota-usage-metrics-max-series
- {{ int .Values.metrics.quotaUsage.maxSeries | toString | quote }}
{{- end }}
{{- if .Values.kcp.shardURL }}
- --kcp-home-cluster
- {{ .Values.kcp.homeCluster | quote }}
{{- end }}
{{- if .Values.leaderElection.enabled }}
- --leader-elect
- --leader-election-namespace
- {{ .Release.Namespace | quote }}
- --leader-election-lease-name
- {{ include "lazyquota.leaseName" . | quote }}
- --leader-election-lease-duration
- {{ .Values.leaderElection.leaseDuration | quote }}
- --leader-election-renew-deadline
- {{ .Values.leaderElection.renewDeadline | quote }}
- --leader-election-retry-period
- {{ .Values.leaderElection.retryPeriod | quote }}
{{- end }}
{{- end }}

{{/*
Checks of combinations the schema cannot express.
*/}}
{{- define "lazyquota.validate" -}}
{{- if and .Values.kcp.shardURL (not .Values.kcp.kubeconfigSecret) }}
{{- fail "kcp.shardURL needs kcp.kubeconfigSecret: the pod's ServiceAccount is not a kcp identity" }}
{{- end }}
{{- if and (not .Values.leaderElection.enabled) (gt (int .Values.replicaCount) 1) (not .Values.shadow) }}
{{- fail "replicaCount > 1 needs leaderElection.enabled (or shadow: true): two writers of ResourceQuota status would fight" }}
{{- end }}
{{- if and .Values.serviceMonitor.enabled (not .Values.service.enabled) }}
{{- fail "serviceMonitor.enabled needs service.enabled" }}
{{- end }}
{{- end }}

{{/*
The scheme of the metrics port: HTTPS with delegated authentication (bearer tokens must not
travel in clear text).
*/}}
{{- define "lazyquota.metricsScheme" -}}
{{- if eq (.Values.metrics.auth | default "none") "delegated" }}https{{ else }}http{{ end }}
{{- end }}
