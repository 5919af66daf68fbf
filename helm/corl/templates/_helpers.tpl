{{/* Names, labels, images and the cohort config shared by every template. */}}

{{- define "corl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Resource-name prefix: <release>-corl, or the release name when it already contains "corl".
     Kept to 40 characters so "<prefix>-model-<member>-<ordinal>" stays a valid DNS label. */}}
{{- define "corl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "corl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "corl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "corl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "corl.labels" -}}
helm.sh/chart: {{ include "corl.chart" . }}
{{ include "corl.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: corl
{{- end -}}

{{/* Per-member object names. Call with (dict "root" $ "member" $m). */}}
{{- define "corl.modelName" -}}
{{- printf "%s-model-%s" (include "corl.fullname" .root) .member.name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- define "corl.trainerName" -}}
{{- printf "%s-trainer-%s" (include "corl.fullname" .root) .member.name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- define "corl.aggregatorName" -}}
{{- printf "%s-aggregator" (include "corl.fullname" .) -}}
{{- end -}}
{{- define "corl.evaluatorName" -}}
{{- printf "%s-evaluator" (include "corl.fullname" .) -}}
{{- end -}}
{{- define "corl.gatewayName" -}}
{{- printf "%s-gateway" (include "corl.fullname" .) -}}
{{- end -}}
{{- define "corl.sandboxName" -}}
{{- printf "%s-sandbox" (include "corl.fullname" .) -}}
{{- end -}}

{{- define "corl.redisName" -}}
{{- printf "%s-redis" (include "corl.fullname" .) -}}
{{- end -}}
{{- define "corl.configMapName" -}}
{{- printf "%s-cohort" (include "corl.fullname" .) -}}
{{- end -}}
{{- define "corl.dataClaimName" -}}
{{- default (printf "%s-data" (include "corl.fullname" .)) .Values.storage.existingClaim -}}
{{- end -}}
{{- define "corl.secretName" -}}
{{- default (printf "%s-auth" (include "corl.fullname" .)) .Values.auth.existingSecret -}}
{{- end -}}

{{/* GPUs of each of a member's server replicas: its `gpus` (0 when unset). (dict "root" $ "member" $m) */}}
{{- define "corl.serverGpus" -}}
{{- int (default 0 .member.gpus) -}}
{{- end -}}

{{/* GPUs of a member's trainer, one process each: its `trainer.gpus`, else the member's `gpus`. */}}
{{- define "corl.trainerGpus" -}}
{{- $t := default (dict) .member.trainer -}}
{{- if hasKey $t "gpus" -}}{{- int $t.gpus -}}{{- else -}}{{- int (default 0 .member.gpus) -}}{{- end -}}
{{- end -}}

{{/* A vLLM member's engine options (corl.config.MemberVllm), as JSON: its `vllm` values and, with `gpus`,
     tensor_parallel_size = gpus. The cohort config records them and its servers get them as
     CORL_VLLM__<OPTION> (the model-server settings). {} for other backends. (dict "root" $ "member" $m) */}}
{{- define "corl.memberVllm" -}}
{{- $vllm := dict -}}
{{- if eq (default "transformers" .member.backend) "vllm" -}}
{{- $vllm = deepCopy (default (dict) .member.vllm) -}}
{{- $gpus := int (include "corl.serverGpus" .) -}}
{{- if gt $gpus 0 -}}{{- $_ := set $vllm "tensor_parallel_size" $gpus -}}{{- end -}}
{{- end -}}
{{- toJson $vllm -}}
{{- end -}}

{{/* A container's resources with `gpus` GPUs requested and limited (nvidia.com/gpu); 0 leaves them as
     given. (dict "resources" $res "gpus" N) */}}
{{- define "corl.gpuResources" -}}
{{- $res := deepCopy (default (dict) .resources) -}}
{{- if gt (int .gpus) 0 -}}
{{- range $k := list "requests" "limits" -}}
{{- $_ := set $res $k (merge (dict "nvidia.com/gpu" (int $.gpus)) (omit (default (dict) (index $res $k)) "nvidia.com/gpu")) -}}
{{- end -}}
{{- end -}}
{{- toYaml $res -}}
{{- end -}}

{{- define "corl.gpuImage" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "%s-gpu" .Chart.AppVersion) .Values.image.gpuTag) -}}
{{- end -}}

{{/* Image of a member's server: the GPU tag for the vllm backend or a member given `gpus`.
     (dict "root" $ "member" $m) */}}
{{- define "corl.image" -}}
{{- $root := .root -}}
{{- if and .member (or (eq (default "transformers" .member.backend) "vllm") (gt (int (default 0 .member.gpus)) 0)) -}}
{{- include "corl.gpuImage" $root -}}
{{- else -}}
{{- printf "%s:%s" $root.Values.image.repository (default (printf "%s-cpu" $root.Chart.AppVersion) $root.Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* Image of a member's trainer: the GPU (CUDA torch) tag when it has GPUs (`gpus`, `trainer.gpus`, or
     nvidia.com/gpu in its resources). */}}
{{- define "corl.trainerImage" -}}
{{- $root := .root -}}
{{- $t := default (dict) .member.trainer -}}
{{- $limits := default (dict) (default (dict) $t.resources).limits -}}
{{- $requests := default (dict) (default (dict) $t.resources).requests -}}
{{- if or (hasKey $limits "nvidia.com/gpu") (hasKey $requests "nvidia.com/gpu") (gt (int (include "corl.trainerGpus" .)) 0) -}}
{{- include "corl.gpuImage" $root -}}
{{- else -}}
{{- include "corl.image" (dict "root" $root) -}}
{{- end -}}
{{- end -}}

{{- define "corl.redisUrl" -}}
{{- if .Values.redis.enabled -}}
{{- printf "redis://%s:%d/0" (include "corl.redisName" .) (int .Values.redis.port) -}}
{{- else -}}
{{- required "redis.externalUrl is required when redis.enabled=false" .Values.redis.externalUrl -}}
{{- end -}}
{{- end -}}

{{/* Base URLs of a member's server replicas: one stable DNS name per StatefulSet pod, so the
     trainer can hot-swap weights into every replica (a Service would reach only one). */}}
{{- define "corl.memberServers" -}}
{{- $name := include "corl.modelName" . -}}
{{- $servers := list -}}
{{- range $i := until (int (default 1 .member.replicas)) -}}
{{- $servers = append $servers (printf "http://%s-%d.%s:%d" $name $i $name (int $.root.Values.server.port)) -}}
{{- end -}}
{{- toJson $servers -}}
{{- end -}}

{{/* The cohort config (corl.config.CohortConfig), as YAML. */}}
{{- define "corl.cohortConfig" -}}
{{- $root := . -}}
{{- $mount := .Values.storage.mountPath -}}
{{- $members := list -}}
{{- range .Values.members -}}
{{- if .endpoint -}}
{{- /* An outside OpenAI-compatible server: no pods; its key reaches the aggregator from apiKeySecret. */ -}}
{{- $members = append $members (dict "name" .name "endpoint" (omit .endpoint "apiKeySecret") "role" "frozen") -}}
{{- else -}}
{{- $ctx := dict "root" $root "member" . -}}
{{- $servers := include "corl.memberServers" $ctx | fromJsonArray -}}
{{- $member := dict "name" .name "model" .model "servers" $servers "role" (default "trained" .role) "backend" (default "transformers" .backend) -}}
{{- with include "corl.memberVllm" $ctx | fromJson -}}{{- $_ := set $member "vllm" . -}}{{- end -}}
{{- $processes := int (include "corl.trainerGpus" $ctx) -}}
{{- if and (eq $member.role "trained") (gt $processes 1) -}}
{{- $_ := set $member "trainer_processes" $processes -}}
{{- end -}}
{{- $members = append $members $member -}}
{{- end -}}
{{- end -}}
{{- $cfg := dict "run_id" .Values.runId "redis_url" (include "corl.redisUrl" .) "task" .Values.task "weights_dir" (printf "%s/weights" $mount) "checkpoints_dir" (printf "%s/checkpoints" $mount) "members" $members -}}
{{- range $section := list "rounds" "reward" "training" -}}
{{- with index $root.Values.cohort $section -}}
{{- $_ := set $cfg $section . -}}
{{- end -}}
{{- end -}}
{{- with .Values.cohort.tracking -}}
{{- $_ := set $cfg "tracking" (merge (dict) . (dict "dir" (printf "%s/tracking" $mount))) -}}
{{- end -}}
{{- $gateway := default (dict) .Values.cohort.gateway -}}
{{- if .Values.gateway.enabled -}}
{{- $gateway = merge (dict "url" (printf "http://%s:%d" (include "corl.gatewayName" .) (int .Values.gateway.port))) $gateway -}}
{{- end -}}
{{- with $gateway -}}
{{- $_ := set $cfg "gateway" . -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end -}}

{{/* Environment every corl container shares: the admin token from the Secret. (dict "root" $) */}}
{{- define "corl.commonEnv" -}}
- name: CORL_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "corl.secretName" .root }}
      key: {{ .root.Values.auth.adminTokenKey }}
- name: OMP_NUM_THREADS
  value: "1"
{{- end -}}

{{/* The cohort token (generate, grade, the OpenAI routes, the evaluator's readings). (dict "root" $) */}}
{{- define "corl.cohortTokenEnv" -}}
- name: CORL_COHORT_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "corl.secretName" .root }}
      key: {{ .root.Values.auth.cohortTokenKey }}
{{- end -}}

{{/* The built-in Redis's password, for the aggregator, trainers, the evaluator and the gateway only. (dict "root" $) */}}
{{- define "corl.redisPasswordEnv" -}}
{{- if .root.Values.redis.enabled }}
- name: CORL_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "corl.secretName" .root }}
      key: {{ .root.Values.auth.redisPasswordKey }}
{{- end }}
{{- end -}}

{{/* Where programs run: the sandbox service and its token, for the servers, the aggregator and the evaluator. (dict "root" $) */}}
{{- define "corl.sandboxClientEnv" -}}
{{- if .root.Values.sandbox.enabled }}
- name: CORL_SANDBOX_URL
  value: {{ printf "http://%s:%d" (include "corl.sandboxName" .root) (int .root.Values.sandbox.port) | quote }}
- name: CORL_SANDBOX_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "corl.secretName" .root }}
      key: {{ .root.Values.auth.sandboxTokenKey }}
{{- end }}
{{- end -}}

{{/* The run's task name (task: NAME or task: {name: NAME, ...}). */}}
{{- define "corl.taskName" -}}
{{- if kindIs "map" .Values.task -}}{{ .Values.task.name }}{{- else -}}{{ .Values.task }}{{- end -}}
{{- end -}}

{{/* The experiment trackers' keys (tracking.secretEnv), for trainers and the aggregator. (dict "root" $) */}}
{{- define "corl.trackingEnv" -}}
{{- range $name, $ref := .root.Values.tracking.secretEnv }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $ref.name }}
      key: {{ $ref.key }}
{{- end }}
{{- end -}}

{{/* The environment for outside endpoint members' keys, of the aggregator and the gateway (both call
     them): each api_key_env variable from its apiKeySecret (the key never enters the ConfigMap). (dict "root" $) */}}
{{- define "corl.endpointKeyEnv" -}}
{{- range .root.Values.members }}
{{- if and .endpoint .endpoint.apiKeySecret }}
- name: {{ required (printf "members %s: endpoint.api_key_env names the variable apiKeySecret fills" .name) .endpoint.api_key_env }}
  valueFrom:
    secretKeyRef:
      name: {{ .endpoint.apiKeySecret.name }}
      key: {{ .endpoint.apiKeySecret.key }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Extra env from a map, sorted for stable output. */}}
{{- define "corl.extraEnv" -}}
{{- range $k, $v := . }}
- name: {{ $k }}
  value: {{ $v | toString | quote }}
{{- end }}
{{- end -}}

{{/* Init container: wait until the cohort-init Job has written the cohort. */}}
{{- define "corl.waitForCohort" -}}
{{- if .Values.cohortInit.enabled }}
initContainers:
  - name: wait-for-cohort
    image: {{ include "corl.image" (dict "root" .) }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: ["/bin/sh", "-c"]
    args:
      - until [ -f {{ .Values.storage.mountPath }}/cohort/cohort.json ]; do echo "waiting for the cohort-init Job"; sleep 5; done
    securityContext: {{- toYaml .Values.securityContext | nindent 6 }}
    volumeMounts:
      - name: data
        mountPath: {{ .Values.storage.mountPath }}
        readOnly: true
{{- end }}
{{- end -}}

{{- define "corl.dataVolume" -}}
- name: data
  persistentVolumeClaim:
    claimName: {{ include "corl.dataClaimName" . }}
- name: cohort-config
  configMap:
    name: {{ include "corl.configMapName" . }}
{{- end -}}

{{/* The trackers' folder (cohort.tracking.dir, by default <mountPath>/tracking), writable: that folder of
     the data volume only. */}}
{{- define "corl.trackingMount" -}}
{{- $mount := .Values.storage.mountPath -}}
{{- $dir := default (printf "%s/tracking" $mount) .Values.cohort.tracking.dir -}}
{{- if not (hasPrefix (printf "%s/" $mount) $dir) -}}
{{- fail (printf "cohort.tracking.dir %s must be under storage.mountPath %s (the data volume)" $dir $mount) -}}
{{- end -}}
- name: data
  mountPath: {{ $dir }}
  subPath: {{ trimPrefix (printf "%s/" $mount) $dir }}
{{- end -}}
