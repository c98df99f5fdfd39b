{{- define "faultline.name" -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}

{{- define "faultline.labels" -}}
app.kubernetes.io/name: faultline
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "faultline.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "faultline.mongoSecret" -}}
{{- if .Values.mongodb.existingSecret -}}{{ .Values.mongodb.existingSecret }}{{- else -}}{{ include "faultline.name" . }}-mongodb{{- end -}}
{{- end -}}

{{/* environment every component shares: the MongoDB URI from its Secret */}}
{{- define "faultline.env" -}}
- name: MONGODB_URI
  valueFrom:
    secretKeyRef:
      name: {{ include "faultline.mongoSecret" . }}
      key: uri
{{- end -}}

{{/* a component's settings: the values the chart maps (dict), the common ones, then the component's
`config` map from the values over them (any field of the component's settings model, by its name) */}}
{{- define "faultline.settings" -}}
{{- $cfg := merge (dict "database" .root.Values.mongodb.database "metrics_port" .root.Values.metrics.port) .settings -}}
{{- toYaml (mergeOverwrite $cfg (deepCopy (.values.config | default dict))) -}}
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
"settings" dict "files" dict "mounts" list "volumes" list) */}}
{{- define "faultline.worker" -}}
{{- $root := .root -}}
{{- $name := printf "%s-%s" (include "faultline.name" $root) .worker -}}
{{ include "faultline.configmap" . }}
---
apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ $name }}
  namespace: {{ $root.Release.Namespace }}
  labels:
    {{- include "faultline.labels" $root | nindent 4 }}
    app.kubernetes.io/component: {{ .worker }}
spec:
  replicas: {{ .values.replicas }}
  selector:
    matchLabels:
      app.kubernetes.io/instance: {{ $root.Release.Name }}
      app.kubernetes.io/component: {{ .worker }}
  template:
    metadata:
      annotations:
        checksum/config: {{ include "faultline.configmap" . | sha256sum }}
      labels:
        {{- include "faultline.labels" $root | nindent 8 }}
        app.kubernetes.io/component: {{ .worker }}
        {{- with .podLabels }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
    spec:
      serviceAccountName: {{ $name }}
      {{- with $root.Values.imagePullSecrets }}
      imagePullSecrets: {{- toYaml . | nindent 8 }}
      {{- end }}
      securityContext:
        runAsNonRoot: true
        runAsUser: 65532
        seccompProfile: {type: RuntimeDefault}
      affinity:
        podAntiAffinity:
          preferredDuringSchedulingIgnoredDuringExecution:
            - weight: 100
              podAffinityTerm:
                topologyKey: kubernetes.io/hostname
                labelSelector:
                  matchLabels:
                    app.kubernetes.io/instance: {{ $root.Release.Name }}
                    app.kubernetes.io/component: {{ .worker }}
      containers:
        - name: {{ .worker }}
          image: {{ include "faultline.image" $root }}
          imagePullPolicy: {{ $root.Values.image.pullPolicy }}
          args:
            - worker
            - {{ .worker }}
            - --config={{ include "faultline.configDir" . }}/config.yaml
          env:
            {{- include "faultline.env" $root | nindent 12 }}
          {{- if $root.Values.metrics.port }}
          ports:
            - {name: metrics, containerPort: {{ $root.Values.metrics.port }}}
          livenessProbe:
            httpGet: {path: /healthz, port: metrics}
            periodSeconds: 20
          {{- end }}
          securityContext:
            allowPrivilegeEscalation: false
            readOnlyRootFilesystem: true
            capabilities: {drop: [ALL]}
          resources: {{- toYaml .values.resources | nindent 12 }}
          volumeMounts:
            - {name: config, mountPath: {{ include "faultline.configDir" . }}, readOnly: true}
            {{- with .mounts }}
            {{- toYaml . | nindent 12 }}
            {{- end }}
      volumes:
        - {name: config, configMap: {name: {{ $name }}-config}}
        {{- with .volumes }}
        {{- toYaml . | nindent 8 }}
        {{- end }}
{{- end -}}

{{/* ServiceAccount + ClusterRole + ClusterRoleBinding: (dict "root" $ "worker" "x" "rules" list "annotations" dict) */}}
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
{{- end -}}
