{{/* vim: set filetype=mustache: */}}

{{/* Chart name, truncated to the 63 characters DNS labels allow. */}}
{{- define "loopwatch.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name. Truncated to 52 characters rather than 63 because the StatefulSet
controller appends "-<ordinal>" to pod names and a controller-revision hash label
("<name>-<10 chars>") must also fit in 63 characters.
*/}}
{{- define "loopwatch.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 52 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* "name-version" as used by the helm.sh/chart label. */}}
{{- define "loopwatch.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Standard labels (https://kubernetes.io/docs/concepts/overview/working-with-objects/common-labels/). */}}
{{- define "loopwatch.labels" -}}
helm.sh/chart: {{ include "loopwatch.chart" . }}
app.kubernetes.io/name: {{ include "loopwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | trunc 63 | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: loopwatch
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* Standard labels of the worker's objects (StatefulSet, pods, Services, PDB). */}}
{{- define "loopwatch.workerLabels" -}}
{{ include "loopwatch.labels" . }}
app.kubernetes.io/component: worker
{{- end }}

{{/* Selector labels: immutable on a StatefulSet, so never add anything version-dependent here. */}}
{{- define "loopwatch.selectorLabels" -}}
app.kubernetes.io/name: {{ include "loopwatch.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end }}

{{- define "loopwatch.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "loopwatch.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "loopwatch.headlessServiceName" -}}
{{- printf "%s-headless" (include "loopwatch.fullname" .) }}
{{- end }}

{{/* Name of the ConfigMap holding the loop-detection config (chart-managed or existing). */}}
{{- define "loopwatch.configMapName" -}}
{{- if .Values.detectionConfig.existingConfigMap }}
{{- .Values.detectionConfig.existingConfigMap }}
{{- else }}
{{- printf "%s-config" (include "loopwatch.fullname" .) }}
{{- end }}
{{- end }}

{{/* Container image reference; a digest, when set, wins over the tag. */}}
{{- define "loopwatch.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{- define "loopwatch.kafkaUsesTLS" -}}
{{- if has .Values.kafka.securityProtocol (list "SSL" "SASL_SSL") }}true{{ end }}
{{- end }}

{{- define "loopwatch.kafkaUsesSASL" -}}
{{- if has .Values.kafka.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") }}true{{ end }}
{{- end }}

{{/* Fail early on security settings that cannot work, instead of a crash-looping pod. */}}
{{- define "loopwatch.validateValues" -}}
{{- if include "loopwatch.kafkaUsesTLS" . }}
{{- if not .Values.kafka.tls.existingSecret }}
{{- fail (printf "kafka.securityProtocol=%s needs kafka.tls.existingSecret (a Secret with the CA certificate, and the client certificate/key for mTLS)" .Values.kafka.securityProtocol) }}
{{- end }}
{{- if ne (not .Values.kafka.tls.certKey) (not .Values.kafka.tls.keyKey) }}
{{- fail "kafka.tls.certKey and kafka.tls.keyKey go together: set both for mutual TLS, or both to \"\" for server-only TLS" }}
{{- end }}
{{- end }}
{{- if .Values.signing.enabled }}
{{- if not .Values.signing.existingSecret }}
{{- fail "signing.enabled needs signing.existingSecret (a Secret with the agents' signing keys)" }}
{{- end }}
{{- end }}
{{- if include "loopwatch.kafkaUsesSASL" . }}
{{- if not .Values.kafka.sasl.existingSecret }}
{{- fail (printf "kafka.securityProtocol=%s needs kafka.sasl.existingSecret (a Secret holding the SASL password)" .Values.kafka.securityProtocol) }}
{{- end }}
{{- if and (not .Values.kafka.sasl.username) (not .Values.kafka.sasl.usernameKey) }}
{{- fail "SASL needs kafka.sasl.username or kafka.sasl.usernameKey (a key of kafka.sasl.existingSecret)" }}
{{- end }}
{{- end }}
{{- /* Thresholds only matter to agents of profile configurable-final: profile latest ignores them. */}}
{{- $global := (.Values.detectionConfig.tools | default dict).loopDetection | default dict }}
{{- $rootProfile := (.Values.detectionConfig.loopwatch | default dict).profile | default "configurable-final" }}
{{- $agents := (.Values.detectionConfig.agents | default dict).list | default list }}
{{- $globalRead := eq $rootProfile "configurable-final" }}
{{- range $agent := $agents }}
{{- if eq (($agent.loopwatch | default dict).profile | default $rootProfile) "configurable-final" }}{{ $globalRead = true }}{{ end }}
{{- end }}
{{- if $globalRead }}
{{- include "loopwatch.validateThresholds" (dict "ld" $global "where" "detectionConfig.tools.loopDetection") }}
{{- end }}
{{- range $agent := $agents }}
{{- if eq (($agent.loopwatch | default dict).profile | default $rootProfile) "configurable-final" }}
{{- $own := ($agent.tools | default dict).loopDetection | default dict }}
{{- include "loopwatch.validateThresholds" (dict "ld" (merge (deepCopy $own) $global) "where" (printf "agent %s (merged with the global loopDetection)" $agent.id)) }}
{{- end }}
{{- end }}
{{- /* The fleet options (scope, fleetIncidents, agentRings): the checks schemas.config makes across keys. */}}
{{- $options := .Values.detectionConfig.loopwatch | default dict }}
{{- $fleet := $options.fleetIncidents | default dict }}
{{- if gt (int ($fleet.minAgents | default 3)) (int ($fleet.minRuns | default 20)) }}
{{- fail (printf "detectionConfig.loopwatch.fleetIncidents: minAgents (%v) must not exceed minRuns (%v)" ($fleet.minAgents | default 3) ($fleet.minRuns | default 20)) }}
{{- end }}
{{- if gt (int ($fleet.hopSeconds | default 60)) (int ($fleet.windowSeconds | default 300)) }}
{{- fail (printf "detectionConfig.loopwatch.fleetIncidents: hopSeconds (%v) must not exceed windowSeconds (%v)" ($fleet.hopSeconds | default 60) ($fleet.windowSeconds | default 300)) }}
{{- end }}
{{- $rings := $options.agentRings | default dict }}
{{- if ge (int ($rings.warningThreshold | default 3)) (int ($rings.criticalThreshold | default 5)) }}
{{- fail (printf "detectionConfig.loopwatch.agentRings: warningThreshold (%v) must be lower than criticalThreshold (%v)" ($rings.warningThreshold | default 3) ($rings.criticalThreshold | default 5)) }}
{{- end }}
{{- end }}

{{/* warning < critical < globalCircuitBreaker, as upstream's config validation requires. */}}
{{- define "loopwatch.validateThresholds" -}}
{{- $ld := .ld }}
{{- $w := $ld.warningThreshold }}{{ $c := $ld.criticalThreshold }}{{ $g := $ld.globalCircuitBreakerThreshold }}
{{- if and $w $c (ge (int $w) (int $c)) }}
{{- fail (printf "%s: warningThreshold (%v) must be lower than criticalThreshold (%v)" .where $w $c) }}
{{- end }}
{{- if and $c $g (ge (int $c) (int $g)) }}
{{- fail (printf "%s: criticalThreshold (%v) must be lower than globalCircuitBreakerThreshold (%v)" .where $c $g) }}
{{- end }}
{{- end }}
