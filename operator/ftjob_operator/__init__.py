"""ftjob's Kubernetes operator: the TrainingJob API, CRD generation, the pure planner and the kopf handlers."""
