{{/* RBAC rule lists shared by the ClusterRole and the per-namespace Roles (rbac.yaml). Every verb is one the operator
(operator/ftjob_operator/kube.py, handlers.py) or kopf sends; tests/chart/test_install_operator_rbac.py runs the
operator under exactly these rules and fails on any 403. */}}
{{- define "ftjob.namespacedRules" -}}
# The operator's own resource: kopf lists and watches TrainingJobs and patches them (finalizer, kopf progress
# annotations); each pass GETs the job fresh; delete is for ttlSecondsAfterFinished.
- apiGroups: [{{ include "ftjob.apiGroup" . | quote }}]
  resources: [trainingjobs]
  verbs: [get, list, watch, patch, delete]
# Status: phase, conditions, preemption/failure counters, last checkpoint, written as a merge patch (never a PUT,
# so no update). No trainingjobs/scale: the operator never scales through the scale subresource; users and
# autoscalers do.
- apiGroups: [{{ include "ftjob.apiGroup" . | quote }}]
  resources: [trainingjobs/status]
  verbs: [patch]
# Children: coordinator and worker pods. Create replacements, delete on preemption, scale-down, restart or finish;
# list and watch (by job label, the operator's watch-fed cache) to observe phases, exit codes and DisruptionTarget
# conditions. Pods are never patched or read one by one.
- apiGroups: [""]
  resources: [pods]
  verbs: [create, delete, list, watch]
# Children: the coordinator Service (rendezvous store and control API; its clusterIP is read from the operator's
# watch-fed cache) and the job's control-API token Secret. Both are owned by the job, so the garbage collector
# deletes them with it.
- apiGroups: [""]
  resources: [services]
  verbs: [create, list, watch]
# The token Secret is created, never read: the operator derives the token from its key (tokens.py), so it cannot
# read any Secret, its own jobs' included.
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
{{- if .Values.networkPolicy.enabled }}
# Children: the job's NetworkPolicy (network_policy.py), created once and owned by the job; never read back.
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
{{- end }}
# Events that say why pods were replaced (preemption vs failure); kopf posts its warnings too. Posted, never patched.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end }}
{{- define "ftjob.kopfPeeringRule" -}}
# kopf peering between replicas (namespaced operators use KopfPeering in each watched namespace): list and watch
# the peers' keep-alives, patch our own; `ftjob operator --peering` creates the object when it is missing (and is
# answered 409 when it exists, which still needs create).
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [list, watch, patch, create]
{{- end }}
