{{/* The release's full name: the release name, with the chart's unless it already has it. */}}
{{- define "gregor-operator.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gregor-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "gregor-operator.labels" -}}
{{ include "gregor-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "gregor-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "gregor-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* What the operator may do to the resources it owns and the objects it makes of them. */}}
{{- define "gregor-operator.rules" -}}
- apiGroups: [gregor.dev]
  resources: [kafkaclusters, topics, users]
  verbs: [get, list, watch, patch, update]
- apiGroups: [gregor.dev]
  resources: [kafkaclusters/status, topics/status, users/status]
  verbs: [get, patch, update]
- apiGroups: [gregor.dev]
  resources: [kafkaclusters/finalizers, topics/finalizers, users/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [services, configmaps, secrets, serviceaccounts]
  verbs: [get, list, watch, create, patch, update, delete]
# Retention audits: a CronJob per cluster, and requested runs (Jobs) ...
- apiGroups: [batch]
  resources: [cronjobs, jobs]
  verbs: [get, list, watch, create, patch, update, delete]
# ... or, where the Kubeflow Spark Operator is installed, a ScheduledSparkApplication and
# requested SparkApplications (a cluster without its CRDs answers 404, which means "Jobs") ...
- apiGroups: [sparkoperator.k8s.io]
  resources: [scheduledsparkapplications, sparkapplications]
  verbs: [get, list, watch, create, patch, update, delete]
# ... under a service account whose Role the operator makes: RBAC lets it grant only what it
# holds itself, which is what Spark on Kubernetes needs (gregor_operator.audits.SPARK_RULES).
# Of these, the operator itself deletes pods (a rolling restart, one at a time), reads the
# nodes' claims (never deletes them) and makes the audit reports' claim.
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: [""]
  resources: [pods, services, configmaps, persistentvolumeclaims]
  verbs: [create, get, list, watch, patch, update, delete, deletecollection]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create, get, list, watch, patch, update, delete, deletecollection]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch, update, delete]
- apiGroups: ["", events.k8s.io]
  resources: [events]
  verbs: [create, patch]
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end -}}
