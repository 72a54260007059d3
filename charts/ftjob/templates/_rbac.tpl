{{/* RBAC rule lists shared by the ClusterRole and the per-namespace Roles (rbac.yaml). */}}
{{- define "ftjob.namespacedRules" -}}
# The operator's own resource: kopf watches TrainingJobs and patches them (finalizer, kopf progress annotations);
# delete is for ttlSecondsAfterFinished.
- apiGroups: [{{ include "ftjob.apiGroup" . | quote }}]
  resources: [trainingjobs]
  verbs: [get, list, watch, patch, delete]
# Status: phase, conditions, preemption/failure counters, last checkpoint. (No trainingjobs/scale: the operator
# never scales through the scale subresource; users and autoscalers do.)
- apiGroups: [{{ include "ftjob.apiGroup" . | quote }}]
  resources: [trainingjobs/status]
  verbs: [patch, update]
# Children: coordinator and worker pods (create replacements, delete on scale-down or finish, patch labels and
# annotations, observe phases, exit codes and DisruptionTarget conditions).
- apiGroups: [""]
  resources: [pods]
  verbs: [create, delete, get, list, watch, patch]
# Children: the coordinator Service (rendezvous store and control API).
- apiGroups: [""]
  resources: [services]
  verbs: [create, delete, get, list, watch]
# Children: the job's control-API token Secret (created and owned by the operator).
- apiGroups: [""]
  resources: [secrets]
  verbs: [create, delete, get, list, watch]
# Events that say why pods were replaced (preemption vs failure); kopf posts its handler events too.
- apiGroups: [""]
  resources: [events]
  verbs: [create, patch]
{{- end }}
{{- define "ftjob.kopfPeeringRule" -}}
# kopf peering between replicas (namespaced operators use KopfPeering in each watched namespace): watch the
# peers' keep-alives, patch our own; `ftjob operator --peering` creates the object when it is missing.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch, create]
{{- end }}
