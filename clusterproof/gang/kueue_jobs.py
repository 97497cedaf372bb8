"""Training jobs admitted through Kueue: the queues a check makes, the JobSets it submits, what it reads back.

Why a module: suites/test_kueue_admission.py asks what a team running Kueue asks -- is a JobSet admitted
whole or not at all, is a stuck gang requeued, is a whole workload preempted, does a topology request
hold -- and must not know Kueue's object shapes. Kueue v1beta2 and JobSet v1alpha2, the versions the
embedded cluster runs (``clusterproof.cluster.kueue``).

Every object carries the run's label and is recorded by the run's owner record as it is created (the
cluster's ``CallRecorder``), so a killed run's sweeper finds them; the check's own teardown deletes them,
JobSets first (their Workloads and pods go with them).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.cluster.kueue import ADMISSION, VERSION_LABEL
from clusterproof.core.run import metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.gang.gangs import Placement
from clusterproof.gang.jobs import indexed_ranks
from clusterproof.kube.client import create_object, delete_if_present, get_if_present, list_raw
from clusterproof.kube.pod_spec import pod_body

KUEUE_API = "/apis/kueue.x-k8s.io/v1beta2"
# What Kueue's webhooks must stand in front of: a Job or JobSet created for a queue starts suspended (the
# mutating webhook) until Kueue admits it.
GUARDED = {"jobsets", "jobs"}
JOBSET_API = "/apis/jobset.x-k8s.io/v1alpha2"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
GPU = "nvidia.com/gpu"


@dataclass
class Pool:
    """A check's own nodes (``clusterproof.cluster.scratch_nodes.ScratchNode``) and the placement that selects
    them (its ClusterQueue's flavor steers admitted pods there)."""
    place: Placement
    nodes: list


@dataclass
class Queues:
    """A ResourceFlavor over a check's nodes, a ClusterQueue with its GPU quota, a LocalQueue in its namespace."""
    namespace: str
    flavor: str
    cluster_queue: str
    local_queue: str
    created: list[str] = field(default_factory=list)     # paths, deleted last-made first

    def delete(self, api: client.ApiClient) -> None:
        for path in reversed(self.created):
            delete_if_present(api, path)


def make_queues(api: client.ApiClient, run_id: str, ns: str, name: str, place: Placement, gpu_quota: int,
                preemption: dict | None = None, topology: str | None = None, queueing: str | None = None) -> Queues:
    """The three objects, each recorded as it is made (``Queues.delete`` undoes them). The flavor steers the
    admitted pods to ``place`` (its node labels and tolerations); the quota is in GPUs, the only resource a
    rank asks for."""
    q = Queues(ns, f"{name}-flavor", f"{name}-cq", f"{name}-lq")
    flavor_spec: dict = {"nodeLabels": dict(place.node_selector), "tolerations": list(place.tolerations)}
    if topology:
        flavor_spec["topologyName"] = topology
    cq_spec: dict = {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
        "resourceGroups": [{"coveredResources": [GPU], "flavors": [
            {"name": q.flavor, "resources": [{"name": GPU, "nominalQuota": str(gpu_quota)}]}]}]}
    if preemption:
        cq_spec["preemption"] = preemption
    if queueing:
        cq_spec["queueingStrategy"] = queueing
    for path, body in (
            (f"{KUEUE_API}/resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                                              "metadata": metadata(q.flavor, run_id), "spec": flavor_spec}),
            (f"{KUEUE_API}/clusterqueues", {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
                                            "metadata": metadata(q.cluster_queue, run_id), "spec": cq_spec}),
            (f"{KUEUE_API}/namespaces/{ns}/localqueues",
             {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": metadata(q.local_queue, run_id),
              "spec": {"clusterQueue": q.cluster_queue}})):
        create_object(api, path, body)
        q.created.append(f"{path}/{body['metadata']['name']}")
    wait_for(lambda: _active(api, f"{KUEUE_API}/clusterqueues/{q.cluster_queue}"), timeout=60, interval=0.5,
             what=f"ClusterQueue {q.cluster_queue} active")
    return q


def _active(api: client.ApiClient, path: str) -> bool:
    obj = get_if_present(api, path) or {}
    return condition(obj, "Active").get("status") == "True"


def jobset(name: str, run_id: str, queue: str | None, pods: int, gpus: int, priority_class: str | None = None,
           pod_annotations: dict | None = None, backoff_limit: int = 0) -> dict:
    """A JobSet of one replicated Job of ``pods`` whole-node GPU ranks (Indexed, all at once), submitted to
    ``queue`` (None: not to Kueue at all -- the negative control's partial start). The ranks run until deleted,
    as training does (``jobs.indexed_ranks``).
    ``backoff_limit``: pods the Job replaces before it fails (0: the first lost rank fails the JobSet)."""
    labels = {**({QUEUE_LABEL: queue} if queue else {}), **({PRIORITY_LABEL: priority_class} if priority_class else {})}
    ranks = indexed_ranks(pod_body("rank", run_id, gpus=gpus), pods, backoff_limit, pod_annotations)
    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": metadata(name, run_id, labels),
            "spec": {"network": {"enableDNSHostnames": False},
                     "replicatedJobs": [{"name": "ranks", "replicas": 1, "template": {"spec": ranks}}]}}


def submit(api: client.ApiClient, ns: str, body: dict) -> dict:
    return create_object(api, f"{JOBSET_API}/namespaces/{ns}/jobsets", body)


def pods_of(api: client.ApiClient, ns: str, name: str) -> dict[str, str | None]:
    """The JobSet's pods, each with the node it is bound to (None: not bound)."""
    items = list_raw(api, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"{JOBSET_NAME_LABEL}={name}"})["items"]
    return {p["metadata"]["name"]: p["spec"].get("nodeName") for p in items
            if not p["metadata"].get("deletionTimestamp")}


def pods_within(api: client.ApiClient, ns: str, name: str, seconds: float) -> dict[str, str | None]:
    """The JobSet's pods as soon as any exists, or {} if none did for ``seconds`` (a window in which nothing
    may start is watched to its end, not slept through)."""
    try:
        return wait_for(lambda: pods_of(api, ns, name), timeout=seconds, interval=0.5, heartbeat_s=0,
                        what=f"a pod of JobSet {name}")
    except WaitTimeout:
        return {}


def ready_pods(api: client.ApiClient, ns: str, name: str) -> tuple[int, int]:
    """(Ready, all) of the JobSet's pods that are not being deleted."""
    items = list_raw(api, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": f"{JOBSET_NAME_LABEL}={name}"})["items"]
    live = [p for p in items if not p["metadata"].get("deletionTimestamp")]
    return sum(1 for p in live if condition(p, "Ready").get("status") == "True"), len(live)


def workload_of(api: client.ApiClient, ns: str, name: str) -> dict | None:
    """The Workload Kueue made for the JobSet ``name`` (its owner reference), if any yet."""
    for w in list_raw(api, f"{KUEUE_API}/namespaces/{ns}/workloads")["items"]:
        if any(o.get("kind") == "JobSet" and o.get("name") == name for o in w["metadata"].get("ownerReferences") or []):
            return w
    return None


def condition(obj: dict | None, kind: str) -> dict:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or [] if c["type"] == kind), {})


def describe_workload(w: dict | None) -> str:
    """One clause: the Workload's admission state, as Kueue says it (and its requeues, if any)."""
    if w is None:
        return "no Workload yet"
    status = w.get("status") or {}
    parts = [f"{c['type']}={c['status']} ({c.get('reason', '')}: {c.get('message', '')[:160]})"
             for c in status.get("conditions") or []]
    requeued = (status.get("requeueState") or {}).get("count")
    return (f"Workload {w['metadata']['name']}: " + ("; ".join(parts) or "no conditions")
            + (f"; requeued {requeued} time(s)" if requeued else ""))


def delete_jobsets(api: client.ApiClient, ns: str, names: list[str], timeout: float = 120) -> None:
    """Delete the JobSets (foreground: their Jobs, pods and Workloads with them) and wait until their pods are gone."""
    for name in names:
        delete_if_present(api, f"{JOBSET_API}/namespaces/{ns}/jobsets/{name}", {"propagationPolicy": "Foreground"})
    wait_for(lambda: [n for n in names if pods_of(api, ns, n)], until=lambda left: not left, timeout=timeout,
             interval=0.5, what=f"pods of JobSets {', '.join(names)} gone")


def make_priority_classes(api: client.ApiClient, run_id: str, values: dict[str, int]) -> list[str]:
    """WorkloadPriorityClasses ``{name: value}`` (cluster-scoped, the run's); their paths, for deletion."""
    paths = []
    for name, value in values.items():
        body = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
                "metadata": metadata(name, run_id), "value": value,
                "description": "clusterproof: a check's priority (suites/test_kueue_admission.py)"}
        create_object(api, f"{KUEUE_API}/workloadpriorityclasses", body)
        paths.append(f"{KUEUE_API}/workloadpriorityclasses/{name}")
    return paths


def make_topology(api: client.ApiClient, run_id: str, name: str, levels: list[str]) -> str:
    """A Topology (``levels`` from the widest domain to the node's hostname); its path, for deletion."""
    create_object(api, f"{KUEUE_API}/topologies", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": metadata(name, run_id),
        "spec": {"levels": [{"nodeLabel": label} for label in levels]}})
    return f"{KUEUE_API}/topologies/{name}"


@dataclass
class Webhook:
    """One webhook of Kueue's configurations that intercepts the creation of Jobs or JobSets."""
    configuration: str
    name: str
    which: str                   # mutating | validating
    resources: set[str]
    failure_policy: str          # as the API server applies it (unset: Fail)
    version: str | None          # the configuration's app.kubernetes.io/version label, if any

    def describe(self) -> str:
        return (f"{self.which} webhook {self.name} of {self.configuration} ({', '.join(sorted(self.resources))}): "
                f"failurePolicy {self.failure_policy}")


def kueue_webhooks(api: client.ApiClient) -> list[Webhook]:
    """The webhooks of the cluster's Kueue (configurations whose name contains "kueue", as Kueue's manifests and
    chart name them, and the embedded cluster's) that intercept creating a Job or a JobSet."""
    out = []
    for which in ("mutating", "validating"):
        for cfg in list_raw(api, f"{ADMISSION}/{which}webhookconfigurations")["items"]:
            meta = cfg["metadata"]
            if "kueue" not in meta["name"]:
                continue
            for hook in cfg.get("webhooks") or []:
                resources = {r for rule in hook.get("rules") or []
                             if {"CREATE", "*"} & set(rule.get("operations") or [])
                             for r in rule.get("resources") or []} & GUARDED
                if resources:
                    policy = hook.get("failurePolicy") or "Fail"
                    out.append(Webhook(meta["name"], hook["name"], which, resources, policy,
                                       (meta.get("labels") or {}).get(VERSION_LABEL)))
    return out
