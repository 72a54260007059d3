{{/* The API group of TrainingJob; must match crds/ (tests/chart checks it). */}}
{{- define "ftjob.apiGroup" -}}ftjob.dev{{- end }}

{{/* Chart name, overridable. */}}
{{- define "ftjob.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart, or just the release when it already contains the chart name. 63 chars (DNS label). */}}
{{- define "ftjob.fullname" -}}
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

{{/* chart label value: name-version */}}
{{- define "ftjob.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object the chart creates. */}}
{{- define "ftjob.labels" -}}
helm.sh/chart: {{ include "ftjob.chart" . }}
{{ include "ftjob.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: ftjob
{{- end }}

{{/* Selector labels of the operator pods: immutable on the Deployment, so only name, instance and component. */}}
{{- define "ftjob.selectorLabels" -}}
app.kubernetes.io/name: {{ include "ftjob.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "ftjob.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "ftjob.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name: name an existing ServiceAccount when serviceAccount.create=false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "ftjob.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "ftjob.trainerImage" -}}
{{- printf "%s:%s" .Values.trainer.image.repository (default .Chart.AppVersion .Values.trainer.image.tag) }}
{{- end }}

{{- define "ftjob.peeringName" -}}
{{- default (include "ftjob.fullname" .) .Values.peering.name }}
{{- end }}

{{/* The Secret holding the operator's token key (tokens.py). */}}
{{- define "ftjob.tokenKeySecret" -}}
{{- default (printf "%s-token-key" (include "ftjob.fullname" .)) .Values.tokenKey.existingSecret }}
{{- end }}

{{/*
Cross-value checks the schema cannot express clearly; each message says what to set.
*/}}
{{- define "ftjob.validate" -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.peering.enabled) }}
{{- fail "replicaCount > 1 needs peering.enabled=true: without kopf peering every replica would reconcile the same TrainingJobs" }}
{{- end }}
{{- if and (not .Values.clusterWide) (empty .Values.watchNamespaces) }}
{{- fail "watchNamespaces is empty: list the namespaces the operator manages, or set clusterWide=true to manage every namespace (wider permissions)" }}
{{- end }}
{{- end }}
