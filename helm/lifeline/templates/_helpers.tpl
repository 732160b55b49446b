{{/* Chart name, truncated to the 63 characters a DNS label allows. */}}
{{- define "lifeline.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Fully qualified app name: the release name, prefixed with the chart name unless it already contains it. */}}
{{- define "lifeline.fullname" -}}
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

{{/* Labels on every object of the chart. */}}
{{- define "lifeline.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/name: {{ include "lifeline.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | default .Chart.Version | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one component; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "lifeline.selectorLabels" -}}
app.kubernetes.io/name: {{ include "lifeline.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image every role runs (one image, `python -m lifeline <role>`). */}}
{{- define "lifeline.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion | default "dev" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The operator's ServiceAccount name. */}}
{{- define "lifeline.operator.serviceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "lifeline.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount of training pods (trainer + sidecar), created in every watched namespace. */}}
{{- define "lifeline.workload.serviceAccountName" -}}
{{- default (printf "%s-workload" (include "lifeline.fullname" .)) .Values.workload.serviceAccount.name -}}
{{- end -}}

{{/* Namespaces the operator watches (and gets namespaced rights in): operator.namespaces or the release namespace. */}}
{{- define "lifeline.watchNamespaces" -}}
{{- if .Values.operator.namespaces -}}
{{- join "," .Values.operator.namespaces -}}
{{- else -}}
{{- .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Redis URL of the catalog: the external URL, or the in-cluster Service. */}}
{{- define "lifeline.redisURL" -}}
{{- if .Values.redis.external.url -}}
{{- .Values.redis.external.url -}}
{{- else -}}
{{- printf "redis://%s-redis.%s.svc:%d/0" (include "lifeline.fullname" .) .Release.Namespace (int .Values.redis.internal.port) -}}
{{- end -}}
{{- end -}}

{{/* S3 endpoint (host:port): the external endpoint, or the in-cluster MinIO Service. */}}
{{- define "lifeline.s3Endpoint" -}}
{{- if .Values.objectStorage.external.endpoint -}}
{{- .Values.objectStorage.external.endpoint -}}
{{- else -}}
{{- printf "%s-minio.%s.svc:%d" (include "lifeline.fullname" .) .Release.Namespace (int .Values.objectStorage.internal.port) -}}
{{- end -}}
{{- end -}}

{{/* Name of the Secret holding the S3 credentials (chart-made unless objectStorage.existingSecret). */}}
{{- define "lifeline.s3SecretName" -}}
{{- default (printf "%s-object-storage" (include "lifeline.fullname" .)) .Values.objectStorage.existingSecret -}}
{{- end -}}

{{/* Name of the Secret holding the Redis password (key "password"): redis.auth.existingSecret or the chart's. */}}
{{- define "lifeline.redisSecretName" -}}
{{- default (printf "%s-redis" (include "lifeline.fullname" .)) .Values.redis.auth.existingSecret -}}
{{- end -}}

{{/* "true" when the catalog needs a password: auth on, and a Secret to read it from (the chart makes
     one for the in-cluster Redis; an external Redis needs redis.auth.existingSecret). */}}
{{- define "lifeline.redisAuth" -}}
{{- if and .Values.redis.auth.enabled (or .Values.redis.auth.existingSecret (not .Values.redis.external.url)) -}}
true
{{- end -}}
{{- end -}}

{{/* A Secret's value under key, kept from the live object on upgrade (lookup), else random: credentials
     are never literal in values.yaml. Call with (dict "ctx" $ "name" NAME "key" KEY "given" VALUE). */}}
{{- define "lifeline.secretValue" -}}
{{- if .given -}}
{{- .given | b64enc -}}
{{- else -}}
{{- $old := lookup "v1" "Secret" .ctx.Release.Namespace .name -}}
{{- if and $old (hasKey ($old.data | default dict) .key) -}}
{{- index $old.data .key -}}
{{- else -}}
{{- randAlphaNum 40 | b64enc -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Pod-level securityContext of every chart pod (Pod Security Standard "restricted"); call with the uid. */}}
{{- define "lifeline.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: {{ . }}
runAsGroup: {{ . }}
fsGroup: {{ . }}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* Container securityContext of every chart container: read-only root, no capabilities, no escalation. */}}
{{- define "lifeline.containerSecurityContext" -}}
runAsNonRoot: true
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* NetworkPolicy peers: the training pods (every rank pod carries app.kubernetes.io/managed-by=lifeline-operator)
     of the watched namespaces, or of every namespace with operator.clusterWide. */}}
{{- define "lifeline.trainingPeers" -}}
- podSelector:
    matchLabels: {app.kubernetes.io/managed-by: lifeline-operator}
  {{- if .Values.operator.clusterWide }}
  namespaceSelector: {}
  {{- else }}
  namespaceSelector:
    matchExpressions:
      - {key: kubernetes.io/metadata.name, operator: In, values: {{ splitList "," (include "lifeline.watchNamespaces" .) | toJson }}}
  {{- end }}
{{- end -}}
