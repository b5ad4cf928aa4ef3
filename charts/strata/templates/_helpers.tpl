{{/* The chart name. */}}
{{- define "strata.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The name of every object: "<release>-controller" (release "strata" gives strata-controller). */}}
{{- define "strata.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-controller" .Release.Name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Selector labels of the operator pods (immutable once installed). */}}
{{- define "strata.selectorLabels" -}}
app.kubernetes.io/name: strata-controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "strata.labels" -}}
{{ include "strata.selectorLabels" . }}
app.kubernetes.io/part-of: strata
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "strata.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "strata.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* repository[:tag][@digest] from an image block, with fallbacks. Call with (list image defaultRepo defaultTag). */}}
{{- define "strata.imageRef" -}}
{{- $image := index . 0 -}}
{{- $repository := default (index . 1) $image.repository -}}
{{- $tag := default (index . 2) $image.tag -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repository $tag -}}
{{- end -}}
{{- end }}

{{/* The operator image. */}}
{{- define "strata.image" -}}
{{- include "strata.imageRef" (list .Values.image .Values.image.repository .Chart.AppVersion) }}
{{- end }}

{{/* The gateway sidecar image: gateway.image, falling back to the operator image. */}}
{{- define "strata.gatewayImage" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if or .Values.gateway.image.repository .Values.gateway.image.tag -}}
{{- include "strata.imageRef" (list (dict "repository" .Values.gateway.image.repository "tag" .Values.gateway.image.tag) .Values.image.repository $tag) }}
{{- else -}}
{{- include "strata.image" . }}
{{- end -}}
{{- end }}

{{/* The compaction Job image: compactor.image, falling back to the gateway image (empty = the controller's default). */}}
{{- define "strata.compactorImage" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if or .Values.compactor.image.repository .Values.compactor.image.tag -}}
{{- include "strata.imageRef" (list (dict "repository" .Values.compactor.image.repository "tag" .Values.compactor.image.tag) .Values.image.repository $tag) }}
{{- end -}}
{{- end }}
