{{/* Names: every object is "<release>-zipkv-<component>" unless overridden. */}}
{{- define "zipkv.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
The base of every object name, at most 39 characters: KubeRay refuses RayService names over 47 and the
longest suffix is "-workers". Services and RayServices need DNS-1035 names, so it must start with a letter.
*/}}
{{- define "zipkv.fullname" -}}
{{- $full := "" -}}
{{- if .Values.fullnameOverride -}}
{{- $full = .Values.fullnameOverride -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- $full = ternary .Release.Name (printf "%s-%s" .Release.Name $name) (contains $name .Release.Name) -}}
{{- end -}}
{{- $full = $full | trunc 39 | trimSuffix "-" -}}
{{- if not (regexMatch "^[a-z]([-a-z0-9]*[a-z0-9])?$" $full) -}}
{{- fail (printf "object name prefix %q must start with a lowercase letter (DNS-1035): set fullnameOverride" $full) -}}
{{- end -}}
{{- $full -}}
{{- end -}}

{{- define "zipkv.router.fullname" -}}{{ include "zipkv.fullname" . }}-router{{- end -}}
{{- define "zipkv.redis.fullname" -}}{{ include "zipkv.fullname" . }}-redis{{- end -}}
{{- define "zipkv.workers.fullname" -}}{{ include "zipkv.fullname" . }}-workers{{- end -}}
{{- define "zipkv.auth.secretName" -}}
{{- default (printf "%s-auth" (include "zipkv.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{- define "zipkv.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels shared by every object; pass a dict with "ctx" (the root) and "component". */}}
{{- define "zipkv.labels" -}}
helm.sh/chart: {{ include "zipkv.chart" .ctx }}
{{ include "zipkv.selectorLabels" . }}
app.kubernetes.io/version: {{ .ctx.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: zipkv
{{- with .ctx.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "zipkv.selectorLabels" -}}
app.kubernetes.io/name: {{ include "zipkv.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* "repository:tag", the tag defaulting to the chart's appVersion. Pass a dict with "image" and "ctx". */}}
{{- define "zipkv.image" -}}
{{- printf "%s:%s" .image.repository (default .ctx.Chart.AppVersion .image.tag | toString) -}}
{{- end -}}

{{- define "zipkv.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "zipkv.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Where the router state lives: "redis" (bundled or external) or "memory" (one router only). */}}
{{- define "zipkv.stateBackend" -}}
{{- if or .Values.redis.enabled .Values.redis.external.url -}}redis{{- else -}}memory{{- end -}}
{{- end -}}

{{/* The Redis URL without credentials; the password is added from a Secret through the environment. */}}
{{- define "zipkv.redis.url" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s.%s.svc:%d/0" (include "zipkv.redis.fullname" .) .Release.Namespace (int .Values.redis.port) -}}
{{- else -}}
{{- .Values.redis.external.url -}}
{{- end -}}
{{- end -}}

{{/* The Secret and key that hold the Redis password, or nothing when Redis runs without auth. */}}
{{- define "zipkv.redis.passwordSecretName" -}}
{{- if .Values.redis.auth.existingSecret -}}
{{- .Values.redis.auth.existingSecret -}}
{{- else if .Values.redis.enabled -}}
{{- printf "%s-redis" (include "zipkv.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The router's gRPC report address, as the workers dial it. */}}
{{- define "zipkv.router.reportAddress" -}}
{{- printf "%s-report.%s.svc:%d" (include "zipkv.router.fullname" .) .Release.Namespace (int .Values.router.service.reportPort) -}}
{{- end -}}

{{/*
OpenTelemetry through the standard OTEL_* variables. Pass a dict with "ctx" and "service" (the
service.name). Off: the SDK is disabled outright so no exporter tries to connect.
*/}}
{{- define "zipkv.otelEnv" -}}
{{- $otel := .ctx.Values.otel -}}
{{- if $otel.enabled }}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ required "otel.endpoint is required when otel.enabled is true" $otel.endpoint | quote }}
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $otel.protocol | quote }}
- name: OTEL_TRACES_EXPORTER
  value: "otlp"
- name: OTEL_TRACES_SAMPLER
  value: {{ $otel.sampler | quote }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $otel.samplerArg | toString | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ include "zipkv.otelResourceAttributes" .ctx | quote }}
{{- if $otel.insecure }}
- name: OTEL_EXPORTER_OTLP_INSECURE
  value: "true"
{{- end }}
{{- with $otel.headersSecret }}
- name: OTEL_EXPORTER_OTLP_HEADERS
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- else }}
- name: OTEL_SDK_DISABLED
  value: "true"
- name: OTEL_TRACES_EXPORTER
  value: "none"
{{- end }}
{{- end -}}

{{- define "zipkv.otelResourceAttributes" -}}
{{- $attrs := list (printf "service.namespace=%s" .Release.Namespace) (printf "service.version=%s" .Chart.AppVersion) (printf "deployment.environment.name=%s" .Values.otel.environment) -}}
{{- range $k, $v := .Values.otel.resourceAttributes -}}
{{- $attrs = append $attrs (printf "%s=%s" $k (toString $v)) -}}
{{- end -}}
{{- join "," $attrs -}}
{{- end -}}

{{/* The Secret with the gRPC mutual-TLS files (ca.crt, router.crt/.key, worker.crt/.key). */}}
{{- define "zipkv.grpcTls.secretName" -}}
{{- default (printf "%s-grpc-tls" (include "zipkv.fullname" .)) .Values.grpcTls.existingSecret -}}
{{- end -}}

{{/* Where the TLS files are mounted in router and Ray pods. */}}
{{- define "zipkv.grpcTls.dir" -}}/etc/zipkv-tls{{- end -}}
