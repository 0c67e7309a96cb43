{{/* The release's name for Assent's objects: RELEASE-assent, or RELEASE if it says assent already. */}}
{{- define "assent.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; "component" is the program. */}}
{{- define "assent.labels" -}}
{{ include "assent.selectorLabels" . }}
app.kubernetes.io/part-of: assent
app.kubernetes.io/version: {{ .root.Values.image.tag | default .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version }}
{{- end -}}

{{- define "assent.selectorLabels" -}}
app.kubernetes.io/name: assent
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The image of a program: REGISTRY/PREFIX/PROGRAM:TAG. */}}
{{- define "assent.image" -}}
{{- $v := .root.Values.image -}}
{{- $repo := printf "%s/%s" $v.prefix .component -}}
{{- if $v.registry }}{{ $repo = printf "%s/%s" $v.registry $repo }}{{ end -}}
{{- printf "%s:%s" $repo ($v.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* The Secret of a secret value {existingSecret, key, value}: the chart's when value is set. */}}
{{- define "assent.secretName" -}}
{{- if .ref.value -}}{{ include "assent.fullname" .root }}-secrets{{- else -}}{{ .ref.existingSecret }}{{- end -}}
{{- end -}}

{{/* "true" when a secret value is given at all. */}}
{{- define "assent.secretSet" -}}
{{- if or .ref.value .ref.existingSecret -}}true{{- end -}}
{{- end -}}

{{/* A volume of one key of a secret value, as the file of the same name. */}}
{{- define "assent.secretVolume" -}}
- name: {{ .name }}
  secret:
    secretName: {{ include "assent.secretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .ref.key }}
        path: {{ .ref.key }}
{{- end -}}

{{/* What every pod has: pull secrets, security context, no service account token. */}}
{{- define "assent.podCommon" -}}
automountServiceAccountToken: false
enableServiceLinks: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- end -}}

{{/* Scheduling of a component's pods; default: prefer one a node. */}}
{{- define "assent.scheduling" -}}
{{- $c := .values -}}
{{- with $c.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $c.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml . | nindent 2 }}
{{- end }}
affinity:
{{- if $c.affinity }}
  {{- toYaml $c.affinity | nindent 2 }}
{{- else }}
  podAntiAffinity:
    preferredDuringSchedulingIgnoredDuringExecution:
      - weight: 100
        podAffinityTerm:
          topologyKey: kubernetes.io/hostname
          labelSelector:
            matchLabels:
              {{- include "assent.selectorLabels" . | nindent 14 }}
{{- end }}
{{- end -}}
