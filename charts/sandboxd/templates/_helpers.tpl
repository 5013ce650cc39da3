{{- define "sandboxd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "sandboxd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sandboxd.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sandboxd.serviceAccount" -}}
{{- default (include "sandboxd.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{- define "sandboxd.sandboxNamespace" -}}
{{- default .Release.Namespace .Values.sandboxNamespace.name -}}
{{- end -}}

{{- define "sandboxd.leaderElection" -}}
{{- if or .Values.leaderElection.enabled (gt (int .Values.replicaCount) 1) }}true{{ else }}false{{ end -}}
{{- end -}}

{{- /* Must match sandboxd.backends.kubernetes.ledger.pools_configmap. */ -}}
{{- define "sandboxd.poolsConfigMap" -}}
{{- regexReplaceAll "[^a-z0-9-]" (printf "sandboxd-pools-%s" .Values.instanceId | lower) "-" | trunc 253 | trimAll "-" -}}
{{- end -}}

{{- define "sandboxd.egressName" -}}
{{- printf "%s-egress" (include "sandboxd.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- /* Not the control plane's selector: its Service must not reach the proxy. */ -}}
{{- define "sandboxd.egressSelector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-egress-proxy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: egress-proxy
{{- end -}}
