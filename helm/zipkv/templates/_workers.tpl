{{/* Serve replicas that fit in one Ray worker pod (a replica's GPUs are always in one pod). */}}
{{- define "zipkv.workers.replicasPerPod" -}}
{{- div (int .Values.workers.gpusPerPod) (int .Values.workers.gpusPerReplica) -}}
{{- end -}}

{{/* Ray worker pods: enough for every Serve replica. */}}
{{- define "zipkv.workers.podCount" -}}
{{- $perPod := include "zipkv.workers.replicasPerPod" . | int -}}
{{- div (add (int .Values.workers.numReplicas) $perPod -1) $perPod -}}
{{- end -}}

{{/* The Serve application's builder args (zipkv.worker.serve:app_builder). The report token is not
here (the CR is readable by anyone who can list RayServices): it reaches the replicas as
ZIPKV_REPORT_TOKEN from the Secret through the pod environment, which Ray's workers inherit. */}}
{{- define "zipkv.workers.appArgs" -}}
{{- $args := dict
  "engine" .Values.workers.engine
  "model" .Values.model.path
  "model_name" .Values.model.name
  "router" (include "zipkv.router.reportAddress" .)
  "report_interval_ms" (int .Values.workers.reportIntervalMs)
  "num_replicas" (int .Values.workers.numReplicas)
  "gpus_per_replica" (int .Values.workers.gpusPerReplica)
  "cpus_per_replica" (int .Values.workers.cpusPerReplica)
  "max_running_requests" (int .Values.workers.maxRunningRequests)
  "compression" .Values.workers.compression
  "metrics_port" (int .Values.workers.metrics.port)
  "metrics_ports" (include "zipkv.workers.replicasPerPod" . | int)
-}}
{{- toYaml (mustMergeOverwrite $args (deepCopy .Values.workers.extraArgs)) -}}
{{- end -}}

{{- define "zipkv.workers.serveConfig" -}}
applications:
  - name: zipkv
    import_path: {{ .Values.workers.importPath }}
    args:
      {{- include "zipkv.workers.appArgs" . | nindent 6 }}
{{- end -}}

{{/* Environment of every Ray container (head and workers). */}}
{{- define "zipkv.workers.env" -}}
- name: ZIPKV_REPORT_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "zipkv.auth.secretName" . }}
      key: report-token
- name: ZIPKV_DISPATCH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "zipkv.auth.secretName" . }}
      key: dispatch-token
{{- if .Values.grpcTls.enabled }}
{{- $dir := include "zipkv.grpcTls.dir" . }}
- name: ZIPKV_TLS_CERT
  value: {{ printf "%s/worker.crt" $dir }}
- name: ZIPKV_TLS_KEY
  value: {{ printf "%s/worker.key" $dir }}
- name: ZIPKV_TLS_CA
  value: {{ printf "%s/ca.crt" $dir }}
- name: ZIPKV_TLS_ROUTER_NAME
  value: zipkv-router
# Report ids are `zipkv-worker/<replica>`: the router binds them to the certificate's common name.
- name: ZIPKV_WORKER_IDENTITY
  value: zipkv-worker
{{- end }}
{{- with .Values.model.hfTokenSecret }}
- name: HF_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .key }}
{{- end }}
{{- include "zipkv.otelEnv" (dict "ctx" . "service" .Values.otel.serviceNames.worker) }}
{{- with .Values.workers.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "zipkv.workers.volumeMounts" -}}
- name: dshm
  mountPath: /dev/shm
{{- if .Values.grpcTls.enabled }}
- name: grpc-tls
  mountPath: {{ include "zipkv.grpcTls.dir" . }}
  readOnly: true
{{- end }}
{{- if .Values.model.volume }}
- name: model
  mountPath: {{ .Values.model.mountPath }}
  readOnly: true
{{- end }}
{{- end -}}

{{- define "zipkv.workers.volumes" -}}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ .Values.workers.gpuWorker.shmSize }}
{{- if .Values.grpcTls.enabled }}
- name: grpc-tls
  secret:
    secretName: {{ include "zipkv.grpcTls.secretName" . }}
    items:
      - {key: ca.crt, path: ca.crt}
      - {key: worker.crt, path: worker.crt}
      - {key: worker.key, path: worker.key}
{{- end }}
{{- if .Values.model.volume }}
- name: model
  {{- toYaml .Values.model.volume | nindent 2 }}
{{- end }}
{{- end -}}
