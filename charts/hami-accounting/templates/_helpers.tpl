{{/*
Names, labels and the pieces the three daemons share. The objects are those of deploy/base, named
<fullname>-<daemon>: with the release name hami-accounting (or fullnameOverride) they are the
kustomize base's names exactly, which tests/deploy/test_deploy_chart.py checks.
*/}}

{{- define "hami-accounting.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami-accounting.fullname" -}}
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

{{- define "hami-accounting.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{/* <fullname>-<daemon>: a daemon's workload, Service, ServiceAccount and PDB. Call with
(list $ "usage"). */}}
{{- define "hami-accounting.daemon" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "hami-accounting.fullname" $root) (index . 1) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hami-accounting.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of a daemon's pods. Call with (list $ "usage"). */}}
{{- define "hami-accounting.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "hami-accounting.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/* Labels of every object of a daemon. Call with (list $ "usage"). */}}
{{- define "hami-accounting.labels" -}}
{{- $root := index . 0 -}}
{{ include "hami-accounting.selectorLabels" . }}
app.kubernetes.io/part-of: hami
app.kubernetes.io/version: {{ $root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ include "hami-accounting.chart" $root }}
{{- with $root.Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels of the pods of a daemon (no chart version: a new chart does not restart them). */}}
{{- define "hami-accounting.podLabels" -}}
{{- $root := index . 0 -}}
{{ include "hami-accounting.selectorLabels" . }}
app.kubernetes.io/part-of: hami
{{- with (index $root.Values (index . 1)).podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "hami-accounting.annotations" -}}
{{- with .Values.global.annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The one image of the three daemons: [registry/]repository(:tag|@digest). */}}
{{- define "hami-accounting.image" -}}
{{- $registry := .Values.global.imageRegistry | default .Values.image.registry -}}
{{- $reference := printf ":%s" (.Values.image.tag | default .Chart.AppVersion) -}}
{{- if .Values.image.digest -}}
{{- $reference = printf "@%s" .Values.image.digest -}}
{{- end -}}
{{- if $registry -}}
{{- printf "%s/%s%s" $registry .Values.image.repository $reference -}}
{{- else -}}
{{- printf "%s%s" .Values.image.repository $reference -}}
{{- end -}}
{{- end -}}

{{- define "hami-accounting.imagePullSecrets" -}}
{{- $names := concat .Values.global.imagePullSecrets .Values.image.pullSecrets | uniq -}}
{{- if $names -}}
imagePullSecrets:
  {{- range $names }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- end -}}

{{/* The contract every artefact follows: daemon -> gRPC port and metrics port. */}}
{{- define "hami-accounting.grpcPort" -}}
{{- get (dict "admission" 50051 "scheduler" 50052 "usage" 50053) . -}}
{{- end -}}
{{- define "hami-accounting.metricsPort" -}}
{{- get (dict "admission" 9101 "scheduler" 9102 "usage" 9103) . -}}
{{- end -}}

{{- define "hami-accounting.usageAddress" -}}
{{- printf "%s:50053" (include "hami-accounting.daemon" (list . "usage")) -}}
{{- end -}}

{{- define "hami-accounting.leaseName" -}}
{{- include "hami-accounting.daemon" (list . "usage") -}}
{{- end -}}

{{- define "hami-accounting.grpcTLSSecret" -}}
{{- .Values.tls.secretName | default (printf "%s-grpc-tls" (include "hami-accounting.fullname" .)) -}}
{{- end -}}

{{- define "hami-accounting.webhookTLSSecret" -}}
{{- .Values.admission.admissionWebhook.secretName | default (printf "%s-webhook-tls" (include "hami-accounting.daemon" (list . "admission"))) -}}
{{- end -}}

{{/* The kube-scheduler extender (scheduler.extender, kubeScheduler): its Secrets and names. */}}
{{- define "hami-accounting.extenderTLSSecret" -}}
{{- .Values.scheduler.extender.tls.secretName | default (printf "%s-extender-tls" (include "hami-accounting.daemon" (list . "scheduler"))) -}}
{{- end -}}

{{- define "hami-accounting.kubeScheduler" -}}
{{- include "hami-accounting.daemon" (list . "kube-scheduler") -}}
{{- end -}}

{{- define "hami-accounting.kubeSchedulerTLSSecret" -}}
{{- .Values.kubeScheduler.tls.secretName | default (printf "%s-tls" (include "hami-accounting.kubeScheduler" .)) -}}
{{- end -}}

{{/* "https" or "http": how the extender is served. */}}
{{- define "hami-accounting.extenderScheme" -}}
{{- ternary "https" "http" .Values.scheduler.extender.tls.enabled -}}
{{- end -}}

{{/* Selector labels of kube-scheduler's pods (not hami-accounting's: no daemon option, such as
tls or tracing, applies to them). */}}
{{- define "hami-accounting.kubeSchedulerSelectorLabels" -}}
app.kubernetes.io/name: kube-scheduler
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kube-scheduler
{{- end -}}

{{- define "hami-accounting.kubeSchedulerLabels" -}}
{{ include "hami-accounting.kubeSchedulerSelectorLabels" . }}
app.kubernetes.io/part-of: hami
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ include "hami-accounting.chart" . }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* kube-scheduler's image: registry/repository:tag, the tag defaulting to the cluster's
version without its vendor suffix (v1.32.4-eks-1a2b3c -> v1.32.4). */}}
{{- define "hami-accounting.kubeSchedulerImage" -}}
{{- $image := .Values.kubeScheduler.image -}}
{{- $tag := $image.tag | default (regexFind "^v[0-9]+\\.[0-9]+\\.[0-9]+" .Capabilities.KubeVersion.Version) -}}
{{- if $image.registry -}}
{{- printf "%s/%s:%s" $image.registry $image.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* Our extender's managedResources: the managedResources of the families
devices.<family>.enabled turns on (files/vendors.yaml), in the table's order, once each. */}}
{{- define "hami-accounting.managedResources" -}}
{{- $table := include "hami-accounting.vendorTable" . | fromYaml -}}
{{- $enabled := include "hami-accounting.vendorFamilies" . | fromJsonArray -}}
{{- $names := list -}}
{{- range $family := $table.families -}}
{{- if has $family.name $enabled -}}
{{- $names = concat $names $family.managedResources -}}
{{- end -}}
{{- end -}}
{{- range ($names | uniq) }}
- name: {{ . }}
  ignoredByScheduler: true
{{- end }}
{{- end -}}

{{/* The cert-manager Certificate of the webhook (its CA is injected into the webhook). */}}
{{/* "true" when the admission daemon serves AdmissionReview: either webhook is on. */}}
{{- define "hami-accounting.webhookServed" -}}
{{- if or .Values.admission.admissionWebhook.enabled .Values.admission.annotationWebhook.enabled -}}
true
{{- end -}}
{{- end -}}

{{- define "hami-accounting.webhookCertificate" -}}
{{- printf "%s-webhook" (include "hami-accounting.daemon" (list . "admission")) -}}
{{- end -}}

{{/*
The accounting policy's vendors, from the vendor table the chart carries (files/vendors.yaml,
written from accounting/vendors.py by scripts/gen_webhook_match.py): the families
devices.<family>.enabled turns on. "hami-accounting.vendorFamilies" is a JSON list of their names.
*/}}
{{- define "hami-accounting.vendorTable" -}}
{{- .Files.Get "files/vendors.yaml" -}}
{{- end -}}

{{- define "hami-accounting.vendorFamilies" -}}
{{- $table := include "hami-accounting.vendorTable" . | fromYaml -}}
{{- $enabled := list -}}
{{- range $family := $table.families -}}
{{- $name := $family.name -}}
{{- $setting := get $.Values.devices $name -}}
{{- $on := $family.enabledByDefault -}}
{{- if and $setting (hasKey $setting "enabled") -}}
{{- $on = $setting.enabled -}}
{{- end -}}
{{- if $on -}}
{{- $enabled = append $enabled $name -}}
{{- end -}}
{{- end -}}
{{- if not $enabled -}}
{{- fail "devices: every vendor family is disabled; the recorder must account at least one (devices.nvidia.enabled=true)" -}}
{{- end -}}
{{- toJson $enabled -}}
{{- end -}}

{{/* HAMI_ACCOUNTING_VENDORS: "default" when the families are HAMi's defaults, else keywords. */}}
{{- define "hami-accounting.vendorsSetting" -}}
{{- $table := include "hami-accounting.vendorTable" . | fromYaml -}}
{{- $enabled := include "hami-accounting.vendorFamilies" . | fromJsonArray -}}
{{- $defaults := list -}}
{{- $keywords := list -}}
{{- range $family := $table.families -}}
{{- $name := $family.name -}}
{{- if $family.enabledByDefault -}}
{{- $defaults = append $defaults $name -}}
{{- end -}}
{{- if has $name $enabled -}}
{{- $keywords = concat $keywords $family.keywords -}}
{{- end -}}
{{- end -}}
{{- if eq (toJson $enabled) (toJson $defaults) -}}
default
{{- else -}}
{{- join "," $keywords -}}
{{- end -}}
{{- end -}}

{{/* The webhook's CEL matchCondition for the enabled families' resource prefixes. */}}
{{- define "hami-accounting.matchExpression" -}}
{{- $table := include "hami-accounting.vendorTable" . | fromYaml -}}
{{- $enabled := include "hami-accounting.vendorFamilies" . | fromJsonArray -}}
{{- $prefixes := list -}}
{{- range $family := $table.families -}}
{{- $name := $family.name -}}
{{- if has $name $enabled -}}
{{- $prefixes = concat $prefixes $family.prefixes -}}
{{- end -}}
{{- end -}}
{{- $quoted := list -}}
{{- range ($prefixes | uniq | sortAlpha) -}}
{{- $quoted = append $quoted (printf "'%s'" .) -}}
{{- end -}}
{{- replace $table.placeholder (printf "[%s]" (join ", " $quoted)) $table.expression -}}
{{- end -}}

{{- define "hami-accounting.conditionName" -}}
{{- (include "hami-accounting.vendorTable" . | fromYaml).conditionName -}}
{{- end -}}

{{/* Checks across values that the schema cannot express; each fails the install with why. */}}
{{- define "hami-accounting.validate" -}}
{{- if and (gt (int .Values.usage.replicas) 1) (not .Values.usage.leaderElect) -}}
{{- fail "usage.replicas > 1 needs usage.leaderElect=true: two recorders without a Lease would both write" -}}
{{- end -}}
{{- if and .Values.usage.leaderElect (eq .Values.usage.kubernetes "off") -}}
{{- fail "usage.leaderElect=true needs usage.kubernetes=in-cluster: the Lease is a Kubernetes object" -}}
{{- end -}}
{{- if and .Values.prometheus.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "prometheus.serviceMonitor.enabled=true needs metrics.enabled=true: there would be nothing to scrape" -}}
{{- end -}}
{{- if and .Values.kubeScheduler.enabled (not .Values.scheduler.extender.enabled) -}}
{{- fail "kubeScheduler.enabled=true needs scheduler.extender.enabled=true: its filter extender is the scheduler daemon's" -}}
{{- end -}}
{{- if and .Values.scheduler.extender.enabled (ge (int .Values.scheduler.extender.deadlineMs) (mul (int .Values.kubeScheduler.extenderHTTPTimeoutSeconds) 1000)) -}}
{{- fail "scheduler.extender.deadlineMs must be below kubeScheduler.extenderHTTPTimeoutSeconds: kube-scheduler would give up before the daemon answers" -}}
{{- end -}}
{{- if and .Values.scheduler.extender.tls.mutual (not .Values.scheduler.extender.tls.enabled) .Values.scheduler.extender.enabled -}}
{{- fail "scheduler.extender.tls.mutual=true needs scheduler.extender.tls.enabled=true: client certificates need HTTPS" -}}
{{- end -}}
{{- if and .Values.kubeScheduler.enabled .Values.hamiScheduler.caBundle -}}
{{- if not (regexMatch "^[A-Za-z0-9+/]+=*$" .Values.hamiScheduler.caBundle) -}}
{{- fail "hamiScheduler.caBundle must be the base64 of the PEM CA (base64 -w0 ca.crt), on one line" -}}
{{- end -}}
{{- end -}}
{{- if and (include "hami-accounting.webhookServed" .) (not .Values.certManager.enabled) .Values.admission.admissionWebhook.caBundle -}}
{{- if not (regexMatch "^[A-Za-z0-9+/]+=*$" .Values.admission.admissionWebhook.caBundle) -}}
{{- fail "admission.admissionWebhook.caBundle must be the base64 of the PEM CA (base64 -w0 ca.crt), on one line" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod-level settings every daemon's pod has (restricted Pod Security). */}}
{{- define "hami-accounting.podSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  {{- if eq . "usage" }}
  fsGroupChangePolicy: OnRootMismatch
  {{- end }}
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{- define "hami-accounting.containerSecurityContext" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  readOnlyRootFilesystem: true
  allowPrivilegeEscalation: false
  capabilities:
    drop: ["ALL"]
  seccompProfile:
    type: RuntimeDefault
{{- end -}}

{{/*
Probes of a daemon. Plaintext: the kubelet's native gRPC probes (readiness the overall status,
on the recorder its "readiness" health service: the synced leader and a standby in contact with
the Lease, so a PodDisruptionBudget lets a drain evict the leader; liveness the "liveness"
health service).
With mutual TLS the kubelet cannot present a certificate: readiness runs the CLI, which reads
the same TLS files, and liveness checks that the port accepts connections. Call with
(list $ "usage").
*/}}
{{- define "hami-accounting.probes" -}}
{{- $root := index . 0 -}}
{{- $usage := eq (index . 1) "usage" -}}
{{- $port := include "hami-accounting.grpcPort" (index . 1) | int -}}
{{- if $root.Values.tls.enabled -}}
readinessProbe:
  exec:
    command: ["hami-accounting", "health", "127.0.0.1:{{ $port }}"{{ if $usage }}, "--service", "readiness"{{ end }}]
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 2
livenessProbe:
  tcpSocket:
    port: grpc
  initialDelaySeconds: 10
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
{{- else -}}
readinessProbe:
  grpc:
    port: {{ $port }}
    {{- if $usage }}
    service: readiness
    {{- end }}
  periodSeconds: 5
  timeoutSeconds: 2
  failureThreshold: 2
livenessProbe:
  grpc:
    port: {{ $port }}
    service: liveness
  initialDelaySeconds: 10
  periodSeconds: 10
  timeoutSeconds: 2
  failureThreshold: 3
{{- end }}
{{- end -}}

{{/* Container ports of a daemon: gRPC, [webhook,] metrics. Call with (list $ "usage"). */}}
{{- define "hami-accounting.containerPorts" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
ports:
  - name: grpc
    containerPort: {{ include "hami-accounting.grpcPort" $daemon }}
    protocol: TCP
  {{- if and (eq $daemon "admission") (include "hami-accounting.webhookServed" $root) }}
  - name: webhook
    containerPort: 8443
    protocol: TCP
  {{- end }}
  {{- if $root.Values.metrics.enabled }}
  - name: metrics
    containerPort: {{ include "hami-accounting.metricsPort" $daemon }}
    protocol: TCP
  {{- end }}
  {{- if and (eq $daemon "scheduler") $root.Values.scheduler.extender.enabled }}
  - name: extender
    containerPort: {{ $root.Values.scheduler.extender.port }}
    protocol: TCP
  {{- end }}
{{- end -}}

{{/* The variables every daemon gets first. Call with (list $ "usage"). */}}
{{- define "hami-accounting.commonEnv" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
- name: HAMI_ACCOUNTING_LISTEN_ADDR
  value: 0.0.0.0:{{ include "hami-accounting.grpcPort" $daemon }}
- name: HAMI_ACCOUNTING_METRICS_ADDR
  value: {{ (ternary (printf "0.0.0.0:%s" (include "hami-accounting.metricsPort" $daemon)) "off" $root.Values.metrics.enabled) | quote }}
- name: HAMI_ACCOUNTING_LOG_LEVEL
  value: {{ $root.Values.logLevel | quote }}
{{- end -}}

{{/* The variables every daemon gets last: tracing, mutual TLS, extraEnv. */}}
{{- define "hami-accounting.trailingEnv" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
- name: OTEL_SERVICE_NAME
  value: {{ (include "hami-accounting.daemon" (list $root $daemon)) | quote }}
{{- with $root.Values.tracing.otlpEndpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ . | quote }}
{{- end }}
{{- with $root.Values.tracing.sampler }}
- name: OTEL_TRACES_SAMPLER
  value: {{ . | quote }}
{{- end }}
{{- with $root.Values.tracing.samplerArg }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- if $root.Values.tls.enabled }}
- name: HAMI_ACCOUNTING_TLS_CERT_FILE
  value: /etc/hami-accounting/grpc-tls/tls.crt
- name: HAMI_ACCOUNTING_TLS_KEY_FILE
  value: /etc/hami-accounting/grpc-tls/tls.key
- name: HAMI_ACCOUNTING_TLS_CA_FILE
  value: /etc/hami-accounting/grpc-tls/ca.crt
{{- end }}
{{- with (index $root.Values $daemon).extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* The mutual-TLS Secret's mount and volume, when tls.enabled. */}}
{{- define "hami-accounting.tlsMount" -}}
{{- if .Values.tls.enabled -}}
- name: grpc-tls
  mountPath: /etc/hami-accounting/grpc-tls
  readOnly: true
{{- end }}
{{- end -}}
{{- define "hami-accounting.tlsVolume" -}}
{{- if .Values.tls.enabled -}}
- name: grpc-tls
  secret:
    secretName: {{ include "hami-accounting.grpcTLSSecret" . }}
    defaultMode: 288  # 0440: owner and fsGroup may read
{{- end }}
{{- end -}}

{{/* Scheduling of a daemon's pods: spread over nodes, and what the values add. */}}
{{- define "hami-accounting.placement" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
{{- $values := index $root.Values $daemon -}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "hami-accounting.selectorLabels" . | nindent 8 }}
  {{- with $values.topologySpreadConstraints }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{/* A daemon pod's annotations: the scrape hints, then the values'. */}}
{{- define "hami-accounting.podAnnotations" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
{{- $annotations := dict -}}
{{- if $root.Values.metrics.enabled -}}
{{- $_ := set $annotations "prometheus.io/scrape" "true" -}}
{{- $_ := set $annotations "prometheus.io/port" (include "hami-accounting.metricsPort" $daemon) -}}
{{- end -}}
{{- $annotations = merge (deepCopy ((index $root.Values $daemon).podAnnotations | default dict)) $annotations -}}
{{- with $annotations -}}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A daemon's Service. Call with (list $ "usage"). */}}
{{- define "hami-accounting.service" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "hami-accounting.daemon" . }}
  namespace: {{ include "hami-accounting.namespace" $root }}
  labels:
    {{- include "hami-accounting.labels" . | nindent 4 }}
  {{- with include "hami-accounting.annotations" $root }}{{ . | nindent 2 }}{{- end }}
spec:
  type: ClusterIP
  selector:
    {{- include "hami-accounting.selectorLabels" . | nindent 4 }}
    {{- if and (eq $daemon "usage") $root.Values.usage.leaderElect }}
    # Set by the leading, synced replica on its own pod, cleared when it stops leading.
    accounting.hami.io/leader: "true"
    {{- end }}
  ports:
    - name: grpc
      port: {{ include "hami-accounting.grpcPort" $daemon }}
      targetPort: grpc
      protocol: TCP
    {{- if and (eq $daemon "admission") (include "hami-accounting.webhookServed" $root) }}
    - name: webhook
      port: 8443
      targetPort: webhook
      protocol: TCP
    {{- end }}
    {{- /* The leader's Service would show Prometheus the leader alone: with election the
    recorders' metrics are served by the metrics Service, which selects every replica. */}}
    {{- if and $root.Values.metrics.enabled (not (and (eq $daemon "usage") $root.Values.usage.leaderElect)) }}
    - name: metrics
      port: {{ include "hami-accounting.metricsPort" $daemon }}
      targetPort: metrics
      protocol: TCP
    {{- end }}
    {{- if and (eq $daemon "scheduler") $root.Values.scheduler.extender.enabled }}
    - name: extender
      port: {{ $root.Values.scheduler.extender.port }}
      targetPort: extender
      protocol: TCP
    {{- end }}
{{- end -}}

{{/* With leader election, the recorders' metrics Service: headless, every replica whether
ready or not (a standby's hami_accounting_leader 0, or a second leader's 1, is what the alert
rules need to see), port "metrics" only. */}}
{{- define "hami-accounting.usageMetricsService" -}}
{{- $root := . -}}
{{- if and $root.Values.metrics.enabled $root.Values.usage.leaderElect }}
apiVersion: v1
kind: Service
metadata:
  name: {{ include "hami-accounting.daemon" (list $root "usage") }}-metrics
  namespace: {{ include "hami-accounting.namespace" $root }}
  labels:
    {{- include "hami-accounting.labels" (list $root "usage") | nindent 4 }}
  {{- with include "hami-accounting.annotations" $root }}{{ . | nindent 2 }}{{- end }}
spec:
  clusterIP: None
  publishNotReadyAddresses: true
  selector:
    {{- include "hami-accounting.selectorLabels" (list $root "usage") | nindent 4 }}
  ports:
    - name: metrics
      port: {{ include "hami-accounting.metricsPort" "usage" }}
      targetPort: metrics
      protocol: TCP
{{- end }}
{{- end -}}

{{/* A daemon's ServiceAccount. Only the recorder talks to the API server, and the scheduler
when it serves the extender (it patches the pods it places). */}}
{{- define "hami-accounting.serviceAccount" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ include "hami-accounting.daemon" . }}
  namespace: {{ include "hami-accounting.namespace" $root }}
  labels:
    {{- include "hami-accounting.labels" . | nindent 4 }}
  {{- with include "hami-accounting.annotations" $root }}{{ . | nindent 2 }}{{- end }}
{{- $api := or (and (eq $daemon "usage") (eq $root.Values.usage.kubernetes "in-cluster")) (and (eq $daemon "scheduler") $root.Values.scheduler.extender.enabled) -}}
{{- if not $api }}
# No API access: no RBAC and no token.
automountServiceAccountToken: false
{{- end }}
{{- end -}}

{{/* A daemon's PodDisruptionBudget. */}}
{{- define "hami-accounting.podDisruptionBudget" -}}
{{- $root := index . 0 -}}
{{- $daemon := index . 1 -}}
{{- $budget := (index $root.Values $daemon).podDisruptionBudget -}}
{{- if $budget.enabled -}}
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ include "hami-accounting.daemon" . }}
  namespace: {{ include "hami-accounting.namespace" $root }}
  labels:
    {{- include "hami-accounting.labels" . | nindent 4 }}
  {{- with include "hami-accounting.annotations" $root }}{{ . | nindent 2 }}{{- end }}
spec:
  maxUnavailable: {{ $budget.maxUnavailable }}
  selector:
    matchLabels:
      {{- include "hami-accounting.selectorLabels" . | nindent 6 }}
{{- end }}
{{- end -}}
