"""The node agent: registers local nodes and runs the scheduler, the process kubelet and the service proxy.

`python -m ftjob_local.node --kubeconfig K --state-dir DIR --nodes N --spot-nodes M`
"""
