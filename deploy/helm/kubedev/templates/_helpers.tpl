{{/*
The chart's name, cut to the 63 characters of a label value.
*/}}
{{- define "kubedev.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name, used for every object of the release.
*/}}
{{- define "kubedev.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Labels of every object.
*/}}
{{- define "kubedev.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kubedev.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/*
Labels that select the daemon's pods.
*/}}
{{- define "kubedev.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kubedev.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The ServiceAccount the daemon runs as.
*/}}
{{- define "kubedev.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kubedev.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The image reference: `<repository>@<digest>` when a digest pins it, else `<repository>:<tag>`
(the tag defaulting to the chart's appVersion).
*/}}
{{- define "kubedev.image" -}}
{{- $repository := .Values.image.repository }}
{{- with .Values.image.digest }}
{{- if not (regexMatch "^sha256:[0-9a-f]{64}$" .) }}
{{- fail (printf "image.digest %q is not sha256:<64 lowercase hex digits>" .) }}
{{- end }}
{{- printf "%s@%s" $repository . }}
{{- else }}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) }}
{{- end }}
{{- end }}

{{/*
"true" when an enabled backend reads host paths anywhere on the host, which only the host's root
(mounted read-only at /host, the daemon's hostRoot) reaches: nvidia (the NVML library at
libraryPath, /proc/driver/nvidia-caps) and host (socket and character devices at any path).
vfio and usb read only the host's /sys and /dev, mounted at /sys and /dev (hostRoot `/`).
*/}}
{{- define "kubedev.hostRootMounted" -}}
{{- $b := .Values.backends }}
{{- if or $b.nvidia.enabled $b.host.enabled }}true{{ else }}false{{ end }}
{{- end }}

{{/*
"true" when the vfio backend writes to sysfs: rebinding functions to vfio-pci (bindOnPrepare:
driver_override, unbind, bind, drivers_probe) or creating and removing mediated devices
(desiredMdevTypes).
*/}}
{{- define "kubedev.vfioWritesSysfs" -}}
{{- $v := .Values.backends.vfio }}
{{- if and $v.enabled (or $v.bindOnPrepare (not (empty $v.desiredMdevTypes))) }}true{{ else }}false{{ end }}
{{- end }}

{{/*
"true" when the host's /sys is mounted writable: vfio writes to it, NVML (nvidia) may, or the
values ask for privilege.
*/}}
{{- define "kubedev.sysWritable" -}}
{{- if or (eq (include "kubedev.vfioWritesSysfs" .) "true") .Values.backends.nvidia.enabled .Values.privileged }}true{{ else }}false{{ end }}
{{- end }}

{{/*
The user name the API server gives the daemon's service account.
*/}}
{{- define "kubedev.serviceAccountUser" -}}
{{- printf "system:serviceaccount:%s:%s" .Release.Namespace (include "kubedev.serviceAccountName" .) }}
{{- end }}

{{/*
"true" when the daemon runs privileged: NVIDIA (NVML opens every GPU node, MIG changes) and VFIO
(driver binds and mdev creation write to sysfs) need it, or the values ask for it.
*/}}
{{- define "kubedev.privileged" -}}
{{- $b := .Values.backends }}
{{- if or .Values.privileged $b.nvidia.enabled $b.vfio.enabled }}true{{ else }}false{{ end }}
{{- end }}

{{/*
The kubelet's root directory, without a trailing slash.
*/}}
{{- define "kubedev.kubeletDir" -}}
{{- trimSuffix "/" .Values.kubeletDir }}
{{- end }}

{{/*
The daemon's configuration file (crates/kubedev/src/config.rs), generated from the values.
*/}}
{{- define "kubedev.config" -}}
{{- $v := .Values }}
{{- $kubelet := include "kubedev.kubeletDir" . }}
{{- $cfg := dict }}
{{- $_ := set $cfg "hostRoot" (ternary "/host" "/" (eq (include "kubedev.hostRootMounted" .) "true")) }}
{{- $_ := set $cfg "stateDir" $v.stateDir }}
{{- /* Every address of the pod's own network namespace (the probes reach it at the pod IP),
unless bindAddress names one. */}}
{{- $metrics := dict "address" (printf "%s:%v" ($v.metrics.bindAddress | default "0.0.0.0") $v.metrics.port) }}
{{- if $v.metrics.holderLabels }}
{{- $_ := set $metrics "podResourcesSocket" (printf "%s/pod-resources/kubelet.sock" $kubelet) }}
{{- $_ := set $metrics "podResourcesIntervalSeconds" $v.metrics.podResourcesIntervalSeconds }}
{{- end }}
{{- $_ := set $cfg "metrics" $metrics }}
{{- $dp := dict "enabled" $v.devicePlugin.enabled }}
{{- if $v.devicePlugin.enabled }}
{{- $_ := set $dp "directory" (printf "%s/device-plugins" $kubelet) }}
{{- $_ := set $dp "cdi" $v.devicePlugin.cdi }}
{{- $_ := set $dp "cdiDir" $v.cdiDir }}
{{- $_ := set $dp "resources" $v.devicePlugin.resources }}
{{- with $v.devicePlugin.policyDir }}
{{- $_ := set $dp "policyDir" . }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "devicePlugin" $dp }}
{{- $dra := dict "enabled" $v.dra.enabled }}
{{- if $v.dra.enabled }}
{{- $_ := set $dra "driverName" $v.dra.driverName }}
{{- $_ := set $dra "registryDir" (printf "%s/plugins_registry" $kubelet) }}
{{- $_ := set $dra "pluginDir" (printf "%s/plugins/%s" $kubelet $v.dra.driverName) }}
{{- $_ := set $dra "cdiDir" $v.cdiDir }}
{{- $_ := set $dra "health" $v.dra.health }}
{{- $_ := set $dra "unhealthyDevices" $v.dra.unhealthyDevices }}
{{- $_ := set $dra "deviceMetadata" $v.dra.deviceMetadata }}
{{- $_ := set $dra "claimStatus" $v.rbac.claimStatus }}
{{- $_ := set $dra "sliceRequests" $v.dra.sliceRequests }}
{{- with $v.dra.deviceClasses }}
{{- $_ := set $dra "deviceClasses" . }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "dra" $dra }}
{{- $backends := dict }}
{{- range $name, $section := $v.backends }}
{{- if $section.enabled }}
{{- $_ := set $backends $name (omit $section "enabled") }}
{{- end }}
{{- end }}
{{- $_ := set $cfg "backends" $backends }}
{{- toYaml $cfg }}
{{- end }}

{{/*
One DeviceClass; takes a dict with the root context (`root`), the class name (`name`) and the
CEL expression (`expression`).
*/}}
{{- define "kubedev.deviceClass" -}}
---
apiVersion: resource.k8s.io/v1
kind: DeviceClass
metadata:
  name: {{ .name }}.{{ .root.Values.dra.driverName }}
  labels:
    {{- include "kubedev.labels" .root | nindent 4 }}
spec:
  selectors:
    - cel:
        expression: '{{ .expression | replace "'" "''" }}'
{{ end }}
