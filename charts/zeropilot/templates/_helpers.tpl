{{/* Names: every object is <fullname>-<part>, so names stay stable across upgrades. */}}
{{- define "zeropilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart>, or just <release> when it already holds the chart name; 47 characters
leave room for the longest suffix (-worker-launches) within the 63 of a DNS label. */}}
{{- define "zeropilot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 47 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 47 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "zeropilot.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object; selectors use only the stable subset below plus the component. */}}
{{- define "zeropilot.labels" -}}
helm.sh/chart: {{ include "zeropilot.chart" . }}
{{ include "zeropilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: zeropilot
{{- end }}

{{- define "zeropilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zeropilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of one component; call with (dict "root" $ "component" "api"). */}}
{{- define "zeropilot.componentLabels" -}}
{{ include "zeropilot.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "zeropilot.componentSelectorLabels" -}}
{{ include "zeropilot.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "zeropilot.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion | toString) }}
{{- end }}

{{- define "zeropilot.workerServiceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-worker" (include "zeropilot.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The Secret holding db-url, broker-url and secret-key: the user's, or the chart's. The
chart's demands every value, so a release never starts without its own secret key. */}}
{{- define "zeropilot.secretName" -}}
{{- if .Values.secret.existingSecret }}
{{- .Values.secret.existingSecret }}
{{- else }}
{{- $hint := "(or set secret.existingSecret to a Secret with keys db-url, broker-url, secret-key)" }}
{{- $_ := required (printf "secret.secretKey is required: --set-string secret.secretKey=$(openssl rand -hex 32) %s" $hint) .Values.secret.secretKey }}
{{- $_ := required (printf "secret.databaseUrl is required: the PostgreSQL URL, postgresql+psycopg://USER:PASS@HOST:5432/zeropilot %s" $hint) .Values.secret.databaseUrl }}
{{- $_ := required (printf "secret.brokerUrl is required: the Redis URL, redis://HOST:6379/0 %s" $hint) .Values.secret.brokerUrl }}
{{- include "zeropilot.fullname" . }}
{{- end }}
{{- end }}

{{- define "zeropilot.claimName" -}}
{{- default (printf "%s-data" (include "zeropilot.fullname" .)) .Values.persistence.existingClaim }}
{{- end }}

{{- define "zeropilot.publicUrl" -}}
{{- default (printf "http://%s-api.%s.svc:%v" (include "zeropilot.fullname" .) .Release.Namespace .Values.api.service.port) .Values.publicUrl }}
{{- end }}

{{/* The cluster profiles file: a YAML string as given, or a map rendered as YAML. */}}
{{- define "zeropilot.clusterProfiles" -}}
{{- if kindIs "string" .Values.clusterProfiles }}
{{- .Values.clusterProfiles }}
{{- else }}
{{- toYaml .Values.clusterProfiles }}
{{- end }}
{{- end }}

{{/* Environment every container shares; secrets only by reference. */}}
{{- define "zeropilot.env" -}}
- name: ZEROPILOT_DB__URL
  valueFrom:
    secretKeyRef: {name: {{ include "zeropilot.secretName" . | quote }}, key: db-url}
- name: ZEROPILOT_BROKER__URL
  valueFrom:
    secretKeyRef: {name: {{ include "zeropilot.secretName" . | quote }}, key: broker-url}
- name: ZEROPILOT_AUTH__SECRET_KEY
  valueFrom:
    secretKeyRef: {name: {{ include "zeropilot.secretName" . | quote }}, key: secret-key}
- name: ZEROPILOT_DATA_DIR
  value: {{ .Values.dataDir | quote }}
- name: ZEROPILOT_API__PUBLIC_URL
  value: {{ include "zeropilot.publicUrl" . | quote }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Long-running pods read the cluster profiles mounted from the ConfigMap. */}}
{{- define "zeropilot.profilesEnv" -}}
- name: ZEROPILOT_CLUSTERS__PROFILES_FILE
  value: /etc/zeropilot/clusters.yaml
{{- end }}

{{/* Pods roll when the Secret or the cluster profiles change. */}}
{{- define "zeropilot.podAnnotations" -}}
checksum/clusters: {{ include "zeropilot.clusterProfiles" . | sha256sum }}
{{- if not .Values.secret.existingSecret }}
checksum/secret: {{ include (print $.Template.BasePath "/secret.yaml") . | sha256sum }}
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Scheduling and security shared by every pod spec. */}}
{{- define "zeropilot.podCommon" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "zeropilot.volumeMounts" -}}
- name: data
  mountPath: {{ .Values.dataDir | quote }}
- name: clusters
  mountPath: /etc/zeropilot
  readOnly: true
{{- end }}

{{- define "zeropilot.volumes" -}}
- name: data
  persistentVolumeClaim:
    claimName: {{ include "zeropilot.claimName" . | quote }}
- name: clusters
  configMap:
    name: {{ include "zeropilot.fullname" . }}-clusters
{{- end }}
