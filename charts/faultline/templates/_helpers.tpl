{{- define "faultline.name" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "faultline.labels" -}}
app.kubernetes.io/name: faultline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- with omit (.Values.commonLabels | default dict) "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "helm.sh/chart" "app.kubernetes.io/component" }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* a pod template's annotations and labels beyond the chart's own: the chart-wide podAnnotations /
podLabels, then the component's (values.<component>.podAnnotations / .podLabels), then the template's
own (`extra`): (dict "root" $ "values" .Values.x "extra" dict "kind" "podAnnotations") */}}
{{- define "faultline.podMeta" -}}
{{- $all := merge (deepCopy (.extra | default dict)) (deepCopy (get .values .kind | default dict)) (deepCopy (get .root.Values .kind | default dict)) -}}
{{- /* the chart's own labels (its selectors among them) are not overridden */ -}}
{{- $all = omit $all "app.kubernetes.io/name" "app.kubernetes.io/instance" "app.kubernetes.io/version" "app.kubernetes.io/managed-by" "helm.sh/chart" "app.kubernetes.io/component" -}}
{{- with $all }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* the component's extra environment, volumes and mounts (values.<component>.extraEnv, .extraVolumes,
.extraVolumeMounts): (dict "values" .Values.x "kind" "extraEnv") */}}
{{- define "faultline.extra" -}}
{{- with (get .values .kind) }}{{ toYaml . }}{{ end -}}
{{- end -}}

{{/* an image reference from (dict "repository" r "tag" t "digest" d) and a default tag: by digest
where given (repository@sha256:...), else repository:tag */}}
{{- define "faultline.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .tag) -}}
{{- end -}}
{{- end -}}

{{/* the one image of every component (and of the repair Jobs) */}}
{{- define "faultline.image" -}}
{{- include "faultline.imageRef" (dict "image" .Values.image "tag" .Chart.AppVersion) -}}
{{- end -}}

{{/* true ("true") when the chart brings the store: store.external names nothing */}}
{{- define "faultline.store.embedded" -}}
{{- if not (or .Values.store.external.uri .Values.store.external.existingSecret) -}}true{{- end -}}
{{- end -}}

{{/* true ("true") when the agents relay Azure's Scheduled Events for the maintenance monitor */}}
{{- define "faultline.scheduledEvents" -}}
{{- $m := .Values.maintenance -}}
{{- if and $m.enabled $m.azure.scheduledEvents (has "azure" $m.clouds) -}}true{{- end -}}
{{- end -}}

{{/* "true" where the cluster analyzer scores anomalies (analyzer.anomaly.enabled, or its config's
anomaly): the agents then store the health samples it reads */}}
{{- define "faultline.anomaly" -}}
{{- $a := .Values.analyzer | default dict -}}
{{- $on := ($a.anomaly | default dict).enabled -}}
{{- if hasKey ($a.config | default dict) "anomaly" }}{{ $on = $a.config.anomaly }}{{ end -}}
{{- if and $a.enabled $on -}}true{{- end -}}
{{- end -}}

{{/* the Secret holding the store's MongoDB URI, and its key */}}
{{- define "faultline.store.secret" -}}
{{- if .Values.store.external.existingSecret -}}{{ .Values.store.external.existingSecret }}
{{- else if .Values.store.external.uri -}}{{ include "faultline.name" . }}-store-uri
{{- else -}}{{ include "faultline.name" . }}-store{{- end -}}
{{- end -}}
{{- define "faultline.store.secretKey" -}}
{{- if .Values.store.external.existingSecret -}}{{ .Values.store.external.existingSecretKey }}{{- else -}}uri{{- end -}}
{{- end -}}

{{/* the Secret holding the cluster components' evidence key (faultline.evidence), its mount, its file */}}
{{- define "faultline.evidence.secret" -}}
{{- .Values.evidence.existingSecret | default (printf "%s-evidence" (include "faultline.name" .)) -}}
{{- end -}}
{{- define "faultline.evidence.dir" -}}/etc/faultline/evidence{{- end -}}
{{- define "faultline.evidence.file" -}}{{ include "faultline.evidence.dir" . }}/key{{- end -}}

{{/* environment every component shares: the MongoDB URI from its Secret */}}
{{- define "faultline.env" -}}
{{- $root := .root | default . -}}
{{- $own := dict -}}
{{- if .component }}{{ $own = index ($root.Values.store.external.users | default dict) .component | default dict }}{{ end -}}
- name: MONGODB_URI
  valueFrom:
    secretKeyRef:
      {{- if $own.existingSecret }}
      name: {{ $own.existingSecret }}
      key: {{ $own.existingSecretKey | default "uri" }}
      {{- else }}
      name: {{ include "faultline.store.secret" $root }}
      key: {{ include "faultline.store.secretKey" $root }}
      {{- end }}
{{- end -}}

{{/* the probes of a component on its metrics port (/healthz): readiness and liveness; the agent adds a
startup probe (a first start reads the journal from its beginning) */}}
{{- define "faultline.probes" -}}
readinessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 10
  timeoutSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet: {path: /healthz, port: metrics}
  periodSeconds: 20
  timeoutSeconds: 5
  failureThreshold: 3
{{- end -}}

{{/* a container that needs nothing from the kernel beyond an ordinary process */}}
{{- define "faultline.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* the pod of a non-root component: the image's user 65532 */}}
{{- define "faultline.nonRootPod" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile: {type: RuntimeDefault}
{{- end -}}

{{/* labels selecting one component's pods */}}
{{- define "faultline.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* a component's settings: the values the chart maps (dict), the common ones, then the component's
`config` map from the values over them (any field of the component's settings model, by its name) */}}
{{- define "faultline.settings" -}}
{{- $cfg := merge (dict "database" .root.Values.store.database "metrics_port" .root.Values.metrics.port
  "metrics_address" .root.Values.metrics.address) .settings -}}
{{- $cfg = mergeOverwrite $cfg (deepCopy (.values.config | default dict)) -}}
{{- toYaml $cfg -}}
{{- range (.nulls | default list) }}{{ if not (hasKey $cfg .) }}
{{ . }}: null
{{- end }}{{ end -}}
{{- end -}}

{{/* a component's ConfigMap: its settings file `config.yaml` (passed with --config) and the files the
settings name (rules, templates): (dict "root" $ "worker" "x" "values" .Values.x "settings" dict "files" dict) */}}
{{- define "faultline.configmap" -}}
{{- $root := .root -}}
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ include "faultline.name" $root }}-{{ .worker }}-config
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "faultline.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .worker }}
data:
  config.yaml: |
    {{- include "faultline.settings" . | nindent 4 }}
  {{- range $file, $text := .files }}
  {{ $file }}: {{ $text | quote }}
  {{- end }}
{{- end -}}

{{- define "faultline.configDir" -}}/etc/faultline/config{{- end -}}

{{/* a worker's ConfigMap and Deployment: (dict "root" $ "worker" "quarantine" "values" .Values.quarantine
"settings" dict "files" dict "mounts" list "volumes" list "command" list "podAnnotations" dict), `command`
the arguments before --config (default: worker <worker>) */}}
{{- define "faultline.worker" -}}
{{- $root := .root -}}
{{- $name := printf "%s-%s" (include "faultline.name" $root) .worker -}}
{{ include "faultline.configmap" . }}
---
apiVersion: apps/v1
{{- /* .statefulSet (the analyzer spread over pods): {serviceName, replicas}: a StatefulSet whose pods
start together (Parallel: each needs the others to run its flow) */}}
{{- with .statefulSet }}
kind: StatefulSet
{{- else }}
kind: Deployment
{{- end }}
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "faultline.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .worker }}
spec:
  {{- with .statefulSet }}
  replicas: {{ .replicas }}
  serviceName: {{ .serviceName }}
  podManagementPolicy: Parallel
  {{- else }}
  replicas: {{ .values.replicas }}
  {{- with .strategy }}
  strategy: {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- end }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ $root.Release.Name }}
      app.kubernetes.io/component: {{ .worker }}
  template:
    metadata:
      annotations:
        checksum/config: {{ include "faultline.configmap" . | sha256sum }}
        {{- with include "faultline.podMeta" (dict "root" $root "values" .values "extra" .podAnnotations "kind" "podAnnotations") }}
        {{- . | nindent 8 }}
        {{- end }}
      labels:
        {{- include "faultline.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .worker }}
        {{- with include "faultline.podMeta" (dict "root" $root "values" .values "extra" .podLabels "kind" "podLabels") }}
        {{- . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets: {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext: {{- include "faultline.nonRootPod" . | nindent 8 }}
      terminationGracePeriodSeconds: 30  # the worker hands its claims back within 20 s of SIGTERM
      {{- with .values.nodeSelector }}
      nodeSelector: {{- toYaml . | nindent 8 }}
      {{- end }}
      {{- with .values.tolerations }}
      tolerations: {{- toYaml . | nindent 8 }}
      {{- end }}
      affinity:
        {{- with .values.affinity }}
        {{- toYaml . | nindent 8 }}
        {{- else }}
        podAntiAffinity:  # replicas on different nodes where they can be
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/instance: {{ $root.Release.Name }}
                    app.kubernetes.io/component: {{ .worker }}
        {{- end }}
      containers:
        - name: {{ .worker }}
          image: {{ .image | default (include "faultline.image" $root) }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            {{- range (.command | default (list "worker" .worker)) }}
            - {{ . }}
            {{- end }}
            - --config={{ include "faultline.configDir" . }}/config.yaml
          env:
            {{- include "faultline.env" (dict "root" $root "component" .worker) | nindent 12 }}
            {{- if .podEnv }}
            - {name: POD_NAME, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
            - {name: POD_NAMESPACE, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
            {{- end }}
            {{- with .values.extraEnv }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- if or $root.Values.metrics.port .ports }}
          ports:
            {{- if $root.Values.metrics.port }}
            - {name: metrics, containerPort: {{ $root.Values.metrics.port }}, protocol: TCP}
            {{- end }}
            {{- with .ports }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
          {{- end }}
          {{- if $root.Values.metrics.port }}
          {{- include "faultline.probes" . | nindent 10 }}
          {{- end }}
          securityContext: {{- include "faultline.restrictedContainer" . | nindent 12 }}
          resources: {{- toYaml .values.resources | nindent 12 }}
          volumeMounts:
            - {name: config, mountPath: {{ include "faultline.configDir" . }}, readOnly: true}
            - {name: tmp, mountPath: /tmp}
            {{- if .evidence }}
            - {name: evidence, mountPath: {{ include "faultline.evidence.dir" . }}, readOnly: true}
            {{- end }}
            {{- with .mounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
            {{- with .values.extraVolumeMounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - {name: config, configMap: {name: {{ $name }}-config}}
        - {name: tmp, emptyDir: {sizeLimit: 64Mi}}
        {{- if .evidence }}
        - name: evidence
          secret:
            secretName: {{ include "faultline.evidence.secret" $root }}
            items: [{key: {{ ternary $root.Values.evidence.existingSecretKey "key" (not (empty $root.Values.evidence.existingSecret)) }}, path: key}]
        {{- end }}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
        {{- with .values.extraVolumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- if and $root.Values.podDisruptionBudget.enabled (gt (int .values.replicas) 1) }}
---
# a node drain (an upgrade of the cluster) takes one replica at a time; the others keep the work
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "faultline.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .worker }}
spec:
  maxUnavailable: 1
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ $root.Release.Name }}
      app.kubernetes.io/component: {{ .worker }}
{{- end }}
{{- end -}}

{{/* ServiceAccount + ClusterRole + ClusterRoleBinding, and a Role to post Events in `default` (not with
"events" false): (dict "root" $ "worker" "x" "rules" list "annotations" dict). What each may do is charts/faultline/rbac-matrix.yaml (docs/rbac.md) */}}
{{- define "faultline.identity" -}}
{{- $root := .root -}}
{{- $name := printf "%s-%s" (include "faultline.name" $root) .worker -}}
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels: {{- include "faultline.labels" $root | nindent 4 }}
  {{- with .annotations }}
  annotations: {{- toYaml . | nindent 4 }}
  {{- end }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ $name }}
  labels: {{- include "faultline.labels" $root | nindent 4 }}
rules: {{- toYaml .rules | nindent 2 }}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ $name }}
  labels: {{- include "faultline.labels" $root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {{ $name }}}
subjects:
  - {kind: ServiceAccount, name: {{ $name }}, namespace: {{ $root.Release.Namespace }}}
{{- if or (not (hasKey . "events")) .events }}
---
# Events about Nodes live in `default` (where `kubectl describe node` finds them): Events there only
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: {{ $name }}-events
  namespace: default
  labels: {{- include "faultline.labels" $root | nindent 4 }}
rules:
  - {apiGroups: [events.k8s.io], resources: [events], verbs: [create]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: {{ $name }}-events
  namespace: default
  labels: {{- include "faultline.labels" $root | nindent 4 }}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: {{ $name }}-events}
subjects:
  - {kind: ServiceAccount, name: {{ $name }}, namespace: {{ $root.Release.Namespace }}}
{{- end }}
{{- end -}}

{{- /* the analyzer's processes per pod: analyzer.config.processes where given, else analyzer.processes */ -}}
{{- define "faultline.analyzerProcesses" -}}
{{- $a := .Values.analyzer -}}
{{- $c := $a.config | default dict -}}
{{- if hasKey $c "processes" }}{{ int $c.processes }}{{ else }}{{ int ($a.processes | default 1) }}{{ end -}}
{{- end -}}
