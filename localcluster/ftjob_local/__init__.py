"""ftjob's embedded local cluster: a Kubernetes-API-compatible control plane, scheduler and process kubelet."""
