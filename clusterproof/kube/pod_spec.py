"""The one pod the harness creates, as a plain dict.

Every suite, benchmark and locust user builds its pods here, so a change to
what a "whole-node GPU pod" is (its image, resources, grace period) happens
once. Pure (no Kubernetes client): ``load/burst.py`` runs inside locust.

Every pod is a guest that cannot reach its node's host (docs/rbac.md,
"Escalation paths"): it passes Pod Security ``restricted`` (non-root, no
privilege escalation, every capability dropped, the runtime's seccomp
profile), mounts no ServiceAccount token, and is placed by the scheduler,
never by ``spec.nodeName`` -- a pod pinned to one node is pinned the way a
DaemonSet pins its pods, by node affinity on ``metadata.name``
(``on_node``) -- tolerating taints one by one, exactly (``tolerating``).
The pool namespaces enforce ``restricted``, and the ValidatingAdmissionPolicy
``clusterproof-pods`` of clusterproof/kube/rbac.yaml admits from the
harness's identities only pods of the shape built here (every field and why:
clusterproof/kube/shapes.py).
"""
from __future__ import annotations

import copy

from clusterproof.core.run import metadata

PAUSE_IMAGE = "registry.k8s.io/pause:3.10"     # never pulled: kwok fakes the kubelet
# A pod that asks for no GPU: small enough that it never decides placement.
SMALL = {"cpu": "10m", "memory": "16Mi"}
# nobody:nogroup. Pod Security "restricted" wants a non-root user the kubelet can verify before it starts a
# container (an image's USER by name cannot be); the images built for real nodes need no user of their own.
NON_ROOT = 65534
POD_SECURITY = {"runAsNonRoot": True, "runAsUser": NON_ROOT, "runAsGroup": NON_ROOT,
                "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# Pod Security Admission on every namespace the harness's pods live in: the pool of clusterproof/kube/rbac.yaml
# (tests/test_red_team.py holds the two to the same labels) and the namespaces a run creates. The version is
# pinned so that a newer cluster's stricter "restricted" cannot change a verdict between two runs.
POD_SECURITY_VERSION = "v1.35"
POD_SECURITY_LABELS = {"pod-security.kubernetes.io/enforce": "restricted",
                       "pod-security.kubernetes.io/enforce-version": POD_SECURITY_VERSION}
# The harness's one scheduling gate: a pod that carries it is never scheduled (nothing of the harness lifts it), so
# it may ask admission about a toleration wider than one taint -- the only pod the policies let carry one.
NEVER_SCHEDULED = "clusterproof.io/never-scheduled"


def pod_body(name: str, run_id: str, *, gpus: int = 0, labels: dict | None = None,
             scheduler: str | None = None, node_selector: dict | None = None,
             tolerations: list | tuple | None = None, priority_class: str | None = None,
             hostnames: list[str] | None = None, restart_policy: str | None = None,
             node: str | None = None, never_scheduled: bool = False) -> dict:
    """A pod: whole-node GPU (``gpus`` = the node's GPUs, a training rank) or a tiny CPU pod.

    ``tolerations=None`` leaves ``spec.tolerations`` out entirely (admission
    must handle pods with and without the list); ``hostnames`` keeps the pod
    to those nodes by required node affinity on their hostname label;
    ``node`` pins it to that one node as a DaemonSet pins its pods (``on_node``); ``never_scheduled`` gates it
    with ``NEVER_SCHEDULED`` (it stays Pending for good).
    """
    res = {"nvidia.com/gpu": str(gpus)} if gpus else dict(SMALL)
    spec: dict = {
        # Simulated pods: deleting them must not wait for a grace period.
        "terminationGracePeriodSeconds": 0,
        # No credentials in the pod: none of the harness's containers talks to the API server.
        "automountServiceAccountToken": False,
        "securityContext": copy.deepcopy(POD_SECURITY),
        "containers": [{"name": "work", "image": PAUSE_IMAGE, "securityContext": copy.deepcopy(CONTAINER_SECURITY),
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
    if node:
        spec["affinity"] = on_node(node)
    if tolerations is not None:
        spec["tolerations"] = [dict(t) for t in tolerations]
    if priority_class:
        spec["priorityClassName"] = priority_class
    if restart_policy:
        spec["restartPolicy"] = restart_policy
    if never_scheduled:
        spec["schedulingGates"] = [{"name": NEVER_SCHEDULED}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata(name, run_id, labels), "spec": spec}


def on_node(node: str) -> dict:
    """Required node affinity on the node's name (``matchFields metadata.name``): how the DaemonSet controller
    pins a pod to one node, through the scheduler and every filter it runs (taints, resources), unlike
    ``spec.nodeName``, which skips them all."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}


def tolerating(taints: list[dict] | None, effects: tuple[str, ...] = ("NoSchedule", "PreferNoSchedule", "NoExecute")
               ) -> list[dict]:
    """Tolerations of exactly these taints (each by key, value and effect; never an ``Exists`` wildcard, which
    a cluster's team admission may rightly refuse), for the ``effects`` named."""
    seen = {(t["key"], t.get("value", ""), t["effect"]) for t in taints or [] if t.get("effect") in effects}
    return [{"key": k, "operator": "Equal", "value": v, "effect": e} for k, v, e in sorted(seen)]
