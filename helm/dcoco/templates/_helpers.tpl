{{/*
Helpers of the dcoco chart. Every name is scoped to the chart ("dcoco.*").
*/}}

{{/* Chart name, overridable. */}}
{{- define "dcoco.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource-name prefix: the release name, plus the chart name unless it already holds it. */}}
{{- define "dcoco.fullname" -}}
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

{{/* A component's resource name: "<fullname>-<suffix>", at most 63 characters. */}}
{{- define "dcoco.componentName" -}}
{{- printf "%s-%s" (include "dcoco.fullname" .root) .suffix | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "dcoco.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of the release; components add app.kubernetes.io/component. */}}
{{- define "dcoco.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dcoco.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every resource. */}}
{{- define "dcoco.labels" -}}
helm.sh/chart: {{ include "dcoco.chart" . }}
{{ include "dcoco.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: dcoco
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "dcoco.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "dcoco.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* An image reference from {registry, repository, tag, digest}; needs "image" and "root". */}}
{{- define "dcoco.image" -}}
{{- $registry := default .root.Values.global.imageRegistry .image.registry -}}
{{- $ref := .image.repository -}}
{{- if $registry -}}
{{- $ref = printf "%s/%s" (trimSuffix "/" $registry) $ref -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $ref .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $ref (default .root.Chart.AppVersion (toString .image.tag)) -}}
{{- end -}}
{{- end -}}

{{/*
Deep merge, in place: every key of "src" replaces the one of "dst", maps merge key by key, and
null leaves the default. Unlike Sprig's mergeOverwrite, false and 0 do override.
*/}}
{{- define "dcoco.merge" -}}
{{- $dst := .dst -}}
{{- range $key, $value := .src -}}
{{- if and (kindIs "map" $value) (kindIs "map" (get $dst $key)) -}}
{{- $_ := include "dcoco.merge" (dict "dst" (get $dst $key) "src" $value) -}}
{{- else if not (kindIs "invalid" $value) -}}
{{- $_ := set $dst $key $value -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A model name as a DNS-1123 label fragment: lower case, runs of other characters as "-". */}}
{{- define "dcoco.modelId" -}}
{{- regexReplaceAll "[^a-z0-9]+" (lower .) "-" | trunc 40 | trimAll "-" -}}
{{- end -}}

{{/*
The effective models: modelDefaults, then engineDefaults.<engine>, then the entry itself. Sets
"models" (a list of maps, each with "id") in the dict passed as "out". Fails on a missing or
duplicate name, an unknown engine, or a grace period that would cut the drain short.
*/}}
{{- define "dcoco.resolveModels" -}}
{{- $root := .root -}}
{{- $models := list -}}
{{- $ids := dict -}}
{{- range $index, $entry := $root.Values.models -}}
{{- if not $entry.name -}}
{{- fail (printf "models[%d]: a name is required" $index) -}}
{{- end -}}
{{- $engine := default $root.Values.modelDefaults.engine $entry.engine -}}
{{- if not (hasKey $root.Values.engineDefaults $engine) -}}
{{- fail (printf "models[%d] (%s): engine must be vllm or torch, not %q" $index $entry.name $engine) -}}
{{- end -}}
{{- $model := deepCopy $root.Values.modelDefaults -}}
{{- $_ := include "dcoco.merge" (dict "dst" $model "src" (deepCopy (get $root.Values.engineDefaults $engine))) -}}
{{- $_ := include "dcoco.merge" (dict "dst" $model "src" (deepCopy $entry)) -}}
{{- $_ := set $model "engine" $engine -}}
{{- $id := include "dcoco.modelId" $entry.name -}}
{{- if not $id -}}
{{- fail (printf "models[%d]: the name %q has no letters or digits" $index $entry.name) -}}
{{- end -}}
{{- if hasKey $ids $id -}}
{{- fail (printf "models %q and %q map to the same resource name %q" (get $ids $id) $entry.name $id) -}}
{{- end -}}
{{- $_ := set $ids $id $entry.name -}}
{{- $_ := set $model "id" $id -}}
{{- $grace := $model.terminationGracePeriodSeconds -}}
{{- if kindIs "invalid" $grace -}}
{{- $grace = add (int $model.drainTimeoutSeconds) 20 -}}
{{- end -}}
{{- if le (int $grace) (int $model.drainTimeoutSeconds) -}}
{{- fail (printf "models %q: terminationGracePeriodSeconds (%v) must exceed drainTimeoutSeconds (%v)" $entry.name $grace $model.drainTimeoutSeconds) -}}
{{- end -}}
{{- $_ := set $model "terminationGracePeriodSeconds" (int $grace) -}}
{{- $models = append $models $model -}}
{{- end -}}
{{- $_ := set .out "models" $models -}}
{{- end -}}

{{/* "true" when some model autoscales with minReplicaCount 0, else "". */}}
{{- define "dcoco.scalesToZero" -}}
{{- $ctx := dict -}}
{{- $_ := include "dcoco.resolveModels" (dict "root" . "out" $ctx) -}}
{{- range $ctx.models -}}
{{- if and .autoscaling.enabled (eq (int .autoscaling.minReplicaCount) 0) -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{- define "dcoco.anyAutoscaling" -}}
{{- $ctx := dict -}}
{{- $_ := include "dcoco.resolveModels" (dict "root" . "out" $ctx) -}}
{{- range $ctx.models -}}
{{- if .autoscaling.enabled -}}true{{- end -}}
{{- end -}}
{{- end -}}

{{/*
DCOCO_QUEUE_TIMEOUT_S: queue.timeoutSeconds, or by default 30 s raised to the longest cold start
of the models that scale to zero. An explicit value shorter than such a cold start fails.
*/}}
{{- define "dcoco.queueTimeout" -}}
{{- $ctx := dict -}}
{{- $_ := include "dcoco.resolveModels" (dict "root" . "out" $ctx) -}}
{{- $coldStart := 0 -}}
{{- $slowest := "" -}}
{{- range $ctx.models -}}
{{- if and .autoscaling.enabled (eq (int .autoscaling.minReplicaCount) 0) (gt (int .autoscaling.coldStartSeconds) $coldStart) -}}
{{- $coldStart = int .autoscaling.coldStartSeconds -}}
{{- $slowest = .name -}}
{{- end -}}
{{- end -}}
{{- $timeout := .Values.queue.timeoutSeconds -}}
{{- if kindIs "invalid" $timeout -}}
{{- max 30 $coldStart -}}
{{- else if lt (int $timeout) $coldStart -}}
{{- fail (printf "queue.timeoutSeconds (%v) is shorter than the cold start of %q (%d s), which scales to zero: requests sent at zero workers would time out. Raise queue.timeoutSeconds or leave it null." $timeout $slowest $coldStart) -}}
{{- else -}}
{{- $timeout -}}
{{- end -}}
{{- end -}}

{{/* Redis: host, port, database, TLS and the password Secret. */}}
{{- define "dcoco.redis.host" -}}
{{- if .Values.redis.enabled -}}
{{- include "dcoco.componentName" (dict "root" . "suffix" "redis") -}}
{{- else if .Values.externalRedis.host -}}
{{- .Values.externalRedis.host -}}
{{- else -}}
{{- fail "redis.enabled is false: set externalRedis.host" -}}
{{- end -}}
{{- end -}}

{{- define "dcoco.redis.port" -}}
{{- if .Values.redis.enabled -}}{{ .Values.redis.port }}{{- else -}}{{ .Values.externalRedis.port }}{{- end -}}
{{- end -}}

{{- define "dcoco.redis.database" -}}
{{- if .Values.redis.enabled -}}0{{- else -}}{{ .Values.externalRedis.database }}{{- end -}}
{{- end -}}

{{- define "dcoco.redis.tls" -}}
{{- if and (not .Values.redis.enabled) .Values.externalRedis.tls -}}true{{- end -}}
{{- end -}}

{{/* The Secret holding the Redis password; empty for an external Redis without one. */}}
{{- define "dcoco.redis.secretName" -}}
{{- if .Values.redis.enabled -}}
{{- default (include "dcoco.componentName" (dict "root" . "suffix" "redis")) .Values.redis.auth.existingSecret -}}
{{- else -}}
{{- .Values.externalRedis.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "dcoco.redis.secretKey" -}}
{{- if .Values.redis.enabled -}}
{{- .Values.redis.auth.existingSecretPasswordKey -}}
{{- else -}}
{{- .Values.externalRedis.existingSecretPasswordKey -}}
{{- end -}}
{{- end -}}

{{/*
REDIS_PASSWORD from the Secret, then DCOCO_REDIS_URL built from it by Kubernetes' $(VAR)
interpolation, so the password never sits in the pod spec.
*/}}
{{- define "dcoco.redis.env" -}}
{{- $scheme := ternary "rediss" "redis" (eq (include "dcoco.redis.tls" .) "true") -}}
{{- $address := printf "%s:%s/%s" (include "dcoco.redis.host" .) (include "dcoco.redis.port" .) (include "dcoco.redis.database" .) -}}
{{- $secret := include "dcoco.redis.secretName" . -}}
{{- if $secret }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ include "dcoco.redis.secretKey" . }}
- name: DCOCO_REDIS_URL
  value: {{ printf "%s://:$(REDIS_PASSWORD)@%s" $scheme $address | quote }}
{{- else }}
- name: DCOCO_REDIS_URL
  value: {{ printf "%s://%s" $scheme $address | quote }}
{{- end }}
{{- end -}}

{{/* Settings every gateway and worker shares. */}}
{{- define "dcoco.queue.env" -}}
- name: DCOCO_QUEUE_TIMEOUT_S
  value: {{ include "dcoco.queueTimeout" . | quote }}
- name: DCOCO_LEASE_S
  value: {{ .Values.queue.leaseSeconds | quote }}
- name: DCOCO_LOG_LEVEL
  value: {{ .Values.logLevel | quote }}
{{- end -}}

{{/* A name: value map as EnvVar entries, in key order. */}}
{{- define "dcoco.envMap" -}}
{{- range $name, $value := . }}
- name: {{ $name }}
  value: {{ toString $value | quote }}
{{- end }}
{{- end -}}

{{/* An httpGet probe: needs "path", "port" and "probe" (period, timeout, failureThreshold). */}}
{{- define "dcoco.httpProbe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{- with .probe }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The model-cache volume of a worker pod (nothing when modelCache.type is none). */}}
{{- define "dcoco.worker.cacheVolume" -}}
{{- $m := .model -}}
{{- $cache := $m.modelCache -}}
{{- if eq $cache.type "pvc" -}}
- name: model-cache
  persistentVolumeClaim:
    claimName: {{ default (include "dcoco.componentName" (dict "root" .root "suffix" (printf "cache-%s" $m.id))) $cache.pvc.existingClaim }}
{{- else if eq $cache.type "emptyDir" -}}
- name: model-cache
  {{- if $cache.emptyDir.sizeLimit }}
  emptyDir:
    sizeLimit: {{ $cache.emptyDir.sizeLimit }}
  {{- else }}
  emptyDir: {}
  {{- end }}
{{- else if eq $cache.type "hostPath" -}}
- name: model-cache
  hostPath:
    path: {{ $cache.hostPath.path }}
    type: {{ $cache.hostPath.type }}
{{- end -}}
{{- end -}}
