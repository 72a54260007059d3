"""The local kubelet: runs the containers of pods bound to its nodes as local processes.

What it emulates and how (also posted as a pod event, reason LocalEmulation):
- image: ignored; command+args run as a process in its own process group (session), with `PATH` starting with
  the directory of the Python running ftjob, so `python` and `torchrun` are ftjob's. Without a command, args run
  alone, as an entrypoint that execs its arguments (tini, `exec "$@"`) would run them.
- runtime: each container runs under a shim (ftjob_local/shim.py) that writes its exit status to a file, so the
  containers outlive this kubelet: a restarted one adopts those still running (worker.PodWorker._adopt), and at
  start kills what is left of pods whose objects are gone (sync.Kubelet._housekeeping).
- network: each pod gets its own loopback address in 127.10.0.0/16 (status.podIP); no network namespace. A pod that
  declares containerPorts binds 127.11.x.y instead (what its downward API status.podIP says, objects.own_ip) and
  the service proxy serves podIP:port for those ports, so NetworkPolicy ingress holds for them as for Services.
- volumes: emptyDir -> DIR/pods/<uid>/volumes/<name>, persistentVolumeClaim -> DIR/pvcs/<ns>/<claim> (shared like a
  RWX volume), hostPath as is, secret/configMap/downwardAPI -> files. There is no mount namespace, so every
  absolute mountPath prefix found in command, args, env values and workingDir is rewritten to its folder, and
  FTJOB_LOCAL_MOUNTS holds the mapping as JSON. Paths a program builds on its own are not rewritten.
- termination message: terminationMessagePath (also rewritten where it appears) is a real file, also named by
  $FTJOB_TERMINATION_LOG; its content becomes state.terminated.message.
- resources: requests count for scheduling only; limits are not enforced (no OOMKilled).
Logs (stdout and stderr together) go to DIR/logs/<namespace>/<pod>/<container>.log, the file the API server serves
for `kubectl logs`; on a restart the previous run's log moves to <container>.previous.log (`kubectl logs -p`).
"""

from .container import HOST_IP, ConfigError, expand, rewrite_paths
from .sync import Kubelet
from .worker import PodWorker

__all__ = ["HOST_IP", "ConfigError", "Kubelet", "PodWorker", "expand", "rewrite_paths"]
