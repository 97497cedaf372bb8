"""The one pod the harness creates, as a plain dict.

Every suite, benchmark and locust user builds its pods here, so a change to
what a "whole-node GPU pod" is (its image, resources, grace period) happens
once. Pure (no Kubernetes client): ``load/burst.py`` runs inside locust.
"""
from __future__ import annotations

from clusterproof.core.run import metadata

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"     # never pulled: kwok fakes the kubelet
# A pod that asks for no GPU: small enough that it never decides placement.
SMALL = {"cpu": "10m", "memory": "16Mi"}


def pod_body(name: str, run_id: str, *, gpus: int = 0, labels: dict | None = None,
             scheduler: str | None = None, node_selector: dict | None = None,
             tolerations: list | tuple | None = None, priority_class: str | None = None,
             hostnames: list[str] | None = None, restart_policy: str | None = None) -> dict:
    """A pod: whole-node GPU (``gpus`` = the node's GPUs, a training rank) or a tiny CPU pod.

    ``tolerations=None`` leaves ``spec.tolerations`` out entirely (admission
    must handle pods with and without the list); ``hostnames`` pins the pod
    to those nodes by required node affinity.
    """
    res = {"nvidia.com/gpu": str(gpus)} if gpus else dict(SMALL)
    spec: dict = {
        # Simulated pods: deleting them must not wait for a grace period.
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "work", "image": PAUSE_IMAGE,
                        "resources": {"requests": res, "limits": dict(res)}}],
    }
    if scheduler:
        spec["schedulerName"] = scheduler
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if hostnames:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": sorted(hostnames)}]}]}}}
    if tolerations is not None:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if priority_class:
        spec["priorityClassName"] = priority_class
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(name, run_id, labels), "spec": spec}
