"""A Service with one small pod per node (node-exporter-like), grown to a size and churned at a set rate.

Why this Service: the seed cluster's watch bandwidth came from Services with
one endpoint per node, watched by every node's kube-proxy: each endpoint
change is sent to every watcher. The pods are tiny CPU pods, each tolerating
exactly its node's taints (``tolerations``, per node) and placed one of two
ways (``by_name``):

- on a cluster the harness does not own, the way a node-exporter DaemonSet's
  are: pinned to its node by node affinity on ``metadata.name`` and scheduled
  by kube-scheduler (its identity may not set ``spec.nodeName`` there:
  docs/rbac.md);
- on its own embedded cluster, as its admin, bound by ``nodeName``: thousands
  of binds and scheduler Events would measure the scheduler, not the
  endpoints, and on the 2-core machine beside the self-tests' clusters the
  API server answered them 504.

Either way the pods are in place before the measurement window, which counts
watch bytes only; kwok
gives the pods IPs from their node's podCIDR and makes them Ready, so
kube-controller-manager maintains both the EndpointSlices and the Endpoints
of the Service.

Endpoint ``j`` (a "slot") lives on node ``j % nodes``: above the node count a
node holds several, as the per-node Service of a larger cluster would.

Churn (``churn_plan``, pure): kinds taken in turn -- ``replace`` (a pod
deleted and recreated on its node), ``ready`` (its Ready condition flipped
off; the next ``ready`` step flips it back on), ``drain`` (every pod of the
Service on one node evicted; the next ``drain`` step brings them back). The
plan ends with the Service whole again. Nothing on a node is changed.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.core.run import metadata
from clusterproof.kube.client import create_object, delete_if_present, get_if_present, list_all, raw_request
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import pods_path
from clusterproof.watch.wire import endpoints_of

APP_LABEL = "clusterproof.io/watch-endpoints"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
# kube-proxy's label selector for the slices it watches (pkg/proxy: not headless, no other proxy).
KUBE_PROXY_SELECTOR = "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
# kube-controller-manager's Endpoints controller keeps at most this many addresses (ready ones first).
ENDPOINTS_MAX_CAPACITY = 1000
OVER_CAPACITY = "endpoints.kubernetes.io/over-capacity"
STATUS_PATCH = {"Content-Type": "application/strategic-merge-patch+json", "Accept": "application/json"}


@dataclass(frozen=True)
class Step:
    kind: str          # replace | unready | ready | drain | undrain
    slot: int = -1     # replace, unready, ready
    node: int = -1     # drain, undrain (index into the node list)


def churn_plan(steps: int, kinds: list[str], size: int, nodes: int) -> list[Step]:
    """``steps`` churn steps over a Service of ``size`` endpoints on ``nodes`` nodes, kinds in turn.

    A ``ready`` step flips a pod off, the next one flips the same pod back on;
    ``drain``/``undrain`` likewise for a node. Whatever is still off at the
    end is restored by extra steps, so the Service is whole afterwards.
    Targets never overlap: a replaced pod is never the unready one nor on
    the drained node. Deterministic (a failure can be replayed).
    """
    plan: list[Step] = []
    unready: int | None = None
    drained: int | None = None
    cursor = 0
    stride = max(1, size // max(1, steps)) | 1   # spread targets over the slots (and so over the slices)

    def free_slot() -> int:
        nonlocal cursor
        for _ in range(size):
            cursor = (cursor + stride) % size
            if cursor != unready and (drained is None or cursor % nodes != drained):
                return cursor
        raise ValueError(f"no free endpoint among {size} to churn")

    for i in range(steps):
        kind = kinds[i % len(kinds)]
        if kind == "replace":
            plan.append(Step("replace", slot=free_slot()))
        elif kind == "ready":
            if unready is None:
                unready = free_slot()
                plan.append(Step("unready", slot=unready))
            else:
                plan.append(Step("ready", slot=unready))
                unready = None
        elif kind == "drain":
            if drained is None:
                drained = free_slot() % nodes
                plan.append(Step("drain", node=drained))
            else:
                plan.append(Step("undrain", node=drained))
                drained = None
    if unready is not None:
        plan.append(Step("ready", slot=unready))
    if drained is not None:
        plan.append(Step("undrain", node=drained))
    return plan


@dataclass
class PerNodeService:
    """The Service and its pods in ``namespace``; ``pods`` maps each slot to its current pod."""
    api: client.ApiClient
    namespace: str
    run_id: str
    nodes: list[str]
    name: str = "per-node"
    concurrency: int = 24
    tolerations: dict[str, list[dict]] = field(default_factory=dict)   # per node: its own taints
    by_name: bool = False            # bound by spec.nodeName (the harness's own cluster), else by the scheduler
    pods: dict[int, str] = field(default_factory=dict)
    generation: dict[int, int] = field(default_factory=dict)
    not_ready: set[int] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)     # every pod name a churn step deleted, created or flipped
    _marked: set[str] = field(default_factory=set)     # pods with a NodeNotReady event, as last listed
    _marked_at: float = float("-inf")

    @property
    def size(self) -> int:
        return len(self.pods)

    def create(self) -> None:
        body = {"apiVersion": "v1", "kind": "Service", "metadata": metadata(self.name, self.run_id),
                "spec": {"selector": {APP_LABEL: self.name},
                         "ports": [{"name": "metrics", "port": 9100, "protocol": "TCP"}]}}
        create_object(self.api, f"/api/v1/namespaces/{self.namespace}/services", body)

    def _pod(self, slot: int) -> dict:
        gen = self.generation.get(slot, 0)
        name = f"ep-{slot:05d}" + (f"-r{gen}" if gen else "")
        node = self.nodes[slot % len(self.nodes)]
        body = pod_body(name, self.run_id, labels={APP_LABEL: self.name}, node=None if self.by_name else node,
                        tolerations=list(self.tolerations.get(node, [])))
        if self.by_name:
            body["spec"]["nodeName"] = node
        return body

    def _create(self, slots: list[int]) -> None:
        def one(slot: int) -> None:
            body = self._pod(slot)
            create_object(self.api, pods_path(self.namespace), body)   # sent again after a 504: tells its own 409
            self.pods[slot] = body["metadata"]["name"]
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(slots)))) as pool:
            list(pool.map(one, slots))

    def _delete(self, slots: list[int]) -> None:
        def one(slot: int) -> None:
            delete_if_present(self.api, f"{pods_path(self.namespace)}/{self.pods.pop(slot)}",
                              {"gracePeriodSeconds": "0"})
        with ThreadPoolExecutor(max_workers=min(self.concurrency, max(1, len(slots)))) as pool:
            list(pool.map(one, slots))

    def remove_all(self) -> int:
        """Delete the Service, then every pod (in parallel: ~1.5x faster here than one collection delete,
        which the apiserver works through with one worker); return how many pods.

        The Service first: its slices and Endpoints go with it, so the pods'
        deletions cost no endpoint updates (at 1,000 addresses each Endpoints
        write is ~180 kB).
        """
        delete_if_present(self.api, f"/api/v1/namespaces/{self.namespace}/services/{self.name}")
        n = self.size
        self._delete(list(self.pods))
        return n

    def grow(self, size: int) -> None:
        """Create the pods of slots ``[size now, size)``."""
        self._create(list(range(self.size, size)))

    def slots_on(self, node: int, size: int) -> list[int]:
        return [j for j in range(node, size, len(self.nodes))]

    def apply(self, step: Step, size: int) -> int:
        """Carry out one churn step; return how many endpoint changes it makes (added/removed/flipped)."""
        if step.kind == "replace":
            self.touched.add(self.pods[step.slot])
            self._delete([step.slot])
            self.generation[step.slot] = self.generation.get(step.slot, 0) + 1
            self._create([step.slot])
            self.touched.add(self.pods[step.slot])
            return 2
        if step.kind in ("unready", "ready"):
            ready = step.kind == "ready"
            pod = self.pods[step.slot]
            self.touched.add(pod)
            raw_request(self.api, "PATCH", f"{pods_path(self.namespace)}/{pod}/status", headers=STATUS_PATCH,
                        body={"status": {"conditions": [{"type": "Ready", "status": str(ready)}]}}).data
            (self.not_ready.discard if ready else self.not_ready.add)(step.slot)
            return 1
        slots = self.slots_on(step.node, size)
        if step.kind == "drain":
            self.touched.update(self.pods[j] for j in slots)
            self._delete(slots)
        else:
            for j in slots:
                self.generation[j] = self.generation.get(j, 0) + 1
            self._create(slots)
            self.touched.update(self.pods[j] for j in slots)
        return len(slots)

    # --- what the cluster should show -----------------------------------------------------------

    def expected(self) -> dict[str, bool]:
        """Pod name -> ready, for every endpoint the Service has now."""
        return {pod: slot not in self.not_ready for slot, pod in self.pods.items()}

    def slices(self) -> list[dict]:
        return list(list_all(self.api, f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
                             {"labelSelector": f"{SERVICE_NAME_LABEL}={self.name}"}))

    def endpoints(self) -> dict | None:
        return get_if_present(self.api, f"/api/v1/namespaces/{self.namespace}/endpoints/{self.name}")

    def why_not_ready(self, pods: list[str]) -> str:
        """What the cluster said about endpoints shown not ready that the harness did not make so: the node
        lifecycle controller's ``NodeNotReady`` events on those pods (their node's Lease lapsed; kwok makes a pod
        Ready only while it is Pending, so the pod stays not ready where a kubelet would make it Ready again)."""
        if not pods:
            return ""
        if time.monotonic() - self._marked_at > 30:      # a LIST of events at most every 30 s of a wait
            events = list_all(self.api, f"/api/v1/namespaces/{self.namespace}/events",
                              {"fieldSelector": "reason=NodeNotReady"})
            self._marked, self._marked_at = {e["involvedObject"]["name"] for e in events}, time.monotonic()
        marked = sorted(self._marked & set(pods))
        if not marked:
            return ""
        why = ("their nodes' Leases lapsed, the simulator's kwok fell behind, and kwok never makes a Running pod "
               "Ready again -- a simulation fault, not the watch's (docs/simulation.md)" if self.by_name else
               "their nodes went NotReady during the measurement")
        return (f"; {len(marked)} of the {len(pods)} not-ready pods were marked not ready by the node lifecycle "
                f"controller (NodeNotReady, e.g. {marked[:3]}): {why}")

    def differences(self) -> str:
        """'' when slices and Endpoints show exactly the expected endpoints, else what differs (for wait_for)."""
        want = self.expected()
        have: dict[str, bool | None] = {}
        for s in self.slices():
            for _addr, ready, pod in endpoints_of(s)[0]:
                have[pod] = ready
        wrong = sorted(p for p in set(want) | set(have) if have.get(p, "missing") != want.get(p, "absent"))
        if wrong:
            return (f"slices differ on {len(wrong)} endpoints (e.g. {wrong[:3]}: "
                    f"{[(have.get(p, 'missing'), want.get(p, 'absent')) for p in wrong[:3]]})"
                    + self.why_not_ready([p for p in wrong if have.get(p) is False and want.get(p) is True]))
        ep = self.endpoints()
        listed = len(endpoints_of(ep)[0]) if ep else 0
        if listed != min(len(want), ENDPOINTS_MAX_CAPACITY):
            return f"Endpoints lists {listed} addresses, expected {min(len(want), ENDPOINTS_MAX_CAPACITY)}"
        return ""
