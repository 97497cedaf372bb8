"""Nodes one check uses alone (scratch nodes): fresh kwok nodes, or idle nodes borrowed and given back.

Their taints change through ``clusterproof.kube.node_taints`` (one
conditional write each; on a node the run did not create, only the taints
the run recorded as its own are removed). Besides:

- a borrowed node is first claimed with the taint
  ``clusterproof.io/scratch=<run id>`` (conditional write again), and a node
  another run has claimed is never borrowed: two runs borrowing at once get
  different nodes.

On a simulated cluster a scratch node is a fresh kwok node, deleted at the end.

Why in ``clusterproof.cluster``: gang, preflight and taints each borrow nodes; kept with the cluster they
all run on, none of them reaches into another's room for it.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from kubernetes import client

from clusterproof.cluster.node_plan import kubelet_labels, node_capacity
from clusterproof.core.run import RUN_LABEL, SCRATCH_LABEL, metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import KWOK_ANNOTATION, delete_if_present, list_raw, raw_request
from clusterproof.kube.node_taints import add_taint, change_taints, record_note, release_run_taints, remove_taint
from clusterproof.kube.nodes import is_ready
from clusterproof.kube.pods import list_pods


@dataclass
class ScratchNode:
    """A node only one check's pods use, and how to give it back.

    ``created``: a fresh kwok node of this run (deleted by ``release``).
    Otherwise a borrowed real node: its taints are this run's only as far as
    its record says, and ``release`` removes exactly those.
    """
    api: client.ApiClient
    name: str
    run_id: str
    tag: str                 # value of the scratch label/taint that reserves it
    created: bool

    @property
    def scratch_taint(self) -> dict:
        return {"key": SCRATCH_LABEL, "value": self.tag, "effect": "NoSchedule"}

    @property
    def toleration(self) -> dict:
        """What a check's pods carry to use this node (the scratch taint keeps everyone else off)."""
        return {"key": SCRATCH_LABEL, "operator": "Equal", "value": self.tag, "effect": "NoSchedule"}

    @property
    def selector(self) -> dict:
        """Selects this node only."""
        return {"kubernetes.io/hostname": self.name}

    @property
    def selector_label(self) -> dict:
        """Selects every scratch node of the same tag (a set created together)."""
        return {SCRATCH_LABEL: self.tag}

    def taint(self, taint: dict) -> None:
        """Add ``taint``. A NoExecute taint on a borrowed node only while no pod but this run's is on it:
        NoExecute evicts, and the node is someone else's."""
        if not self.created and taint.get("effect") == "NoExecute":
            others = others_on(self.api, self.name, self.run_id)
            if others:
                raise NotIdle(f"borrowed node {self.name} now runs {len(others)} pod(s) of others "
                              f"({', '.join(others[:5])}): a NoExecute taint would evict them, so it is not applied")
        add_taint(self.api, self.name, taint, None if self.created else self.run_id)

    def untaint(self, taint: dict) -> None:
        remove_taint(self.api, self.name, taint, None if self.created else self.run_id)

    def release(self) -> None:
        if self.created:
            delete_if_present(self.api, f"/api/v1/nodes/{self.name}")
        else:
            release_run_taints(self.api, self.name, self.run_id)


def create_scratch_nodes(api: client.ApiClient, profile, run_id: str, tag: str, count: int = 1,
                         taints: list[dict] = (), gpus: int | None = None, labels: dict | None = None,
                         workers: int = 1, timeout: float = 120,
                         labels_of: Callable[[int], dict] | None = None) -> list[ScratchNode]:
    """``count`` fresh kwok nodes labelled and tainted ``clusterproof.io/scratch=<tag>`` (plus
    ``taints`` and ``labels``, and ``labels_of(i)`` on the i-th: a rack, a block), with the profile's
    capacity; returned once Ready and schedulable (within ``timeout``). ``workers`` creates them in
    parallel (hundreds of nodes joining at once)."""
    cap = node_capacity(profile)
    if gpus is not None:
        cap["nvidia.com/gpu"] = str(gpus)
    nodes = [ScratchNode(api, f"{profile.node_name_prefix}-scratch-{tag}" + (f"-{i}" if count > 1 else ""),
                         run_id, tag, created=True) for i in range(count)]
    own = {n.name: (labels_of(i) if labels_of else {}) for i, n in enumerate(nodes)}

    def create(node: ScratchNode) -> None:
        meta = metadata(node.name, run_id, {**kubelet_labels(node.name), "type": "kwok", SCRATCH_LABEL: tag,
                                            **(labels or {}), **own[node.name]})
        meta["annotations"][KWOK_ANNOTATION] = "fake"
        raw_request(api, "POST", "/api/v1/nodes", body={
            "apiVersion": "v1", "kind": "Node", "metadata": meta,
            "spec": {"taints": [node.scratch_taint, *taints]},
            "status": {"capacity": cap, "allocatable": cap}}).data

    try:
        with ThreadPoolExecutor(max_workers=max(1, min(workers, count))) as pool:
            list(pool.map(create, nodes))

        def ready():
            items = list_raw(api, "/api/v1/nodes", {"labelSelector": f"{SCRATCH_LABEL}={tag}"})["items"]
            return sorted(n["metadata"]["name"] for n in items if is_ready(n))
        wait_for(ready, until=lambda r: len(r) == count, timeout=timeout, interval=0.5,
                 what=f"{count} scratch node(s) {SCRATCH_LABEL}={tag} Ready and schedulable",
                 describe=lambda r: f"{len(r)} of {count} Ready and schedulable")
    except BaseException:
        for node in nodes:
            node.release()
        raise
    return nodes


class NotIdle(Exception):
    """No node is idle enough for a check that changes it (the check is skipped, saying why)."""


def others_on(api: client.ApiClient, node: str, run_id: str) -> list[str]:
    """Every pod on ``node`` that is not this run's (DaemonSet pods and finished pods included), ns/name."""
    pods = list_raw(api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})["items"]
    return sorted(f"{p['metadata']['namespace']}/{p['metadata']['name']}" for p in pods
                  if (p["metadata"].get("labels") or {}).get(RUN_LABEL) != run_id)


def borrow_idle_node(api: client.ApiClient, profile, run_id: str, taints: list[dict] = (),
                     record=None) -> ScratchNode:
    """Real hardware: claim an idle, Ready node of the shared pool with ``clusterproof.io/scratch=<run id>``
    (a conditional write; a node another run claimed is never taken), then add ``taints``.

    Idle means no pod of anyone else on it, DaemonSet pods included -- judged *after* the claim is
    written, so a pod bound between the first LIST and the claim is seen (the claim's NoSchedule taint
    keeps new ones off). A node that is not idle gets its claim back and the next one is tried.
    ``record`` (the run's owner record) learns of the node before it is claimed: a run killed right
    after the claim still leaves a proof the sweeper can act on. Raises NotIdle naming what was found.
    """
    nodes = list_raw(api, "/api/v1/nodes", {"labelSelector": f"{profile.pool_label}=shared"}, timeout=300)["items"]
    busy = {p["spec"]["nodeName"] for p in list_pods(api, None).values() if p["spec"].get("nodeName")}
    candidates = [n for n in nodes if is_ready(n) and not n["spec"].get("unschedulable") and not _claimed(n)]
    found: dict[str, str] = {n["metadata"]["name"]: "runs pods" for n in candidates
                             if n["metadata"]["name"] in busy}
    for n in sorted((n for n in candidates if n["metadata"]["name"] not in busy), key=lambda n: n["metadata"]["name"]):
        name = n["metadata"]["name"]
        node = ScratchNode(api, name, run_id, run_id, created=False)
        if record is not None:
            record.add(f"/api/v1/nodes/{name}", n["metadata"]["uid"], how="borrowed")
        if not claim_node(api, node):
            found[name] = "claimed by another run first"
            continue
        try:
            others = others_on(api, name, run_id)
            if others:
                found[name] = f"{len(others)} pod(s) bound meanwhile ({', '.join(others[:3])})"
                node.release()
                continue
            for t in taints:
                node.taint(t)
        except BaseException:
            node.release()
            raise
        return node
    seen = "; ".join(f"{k}: {v}" for k, v in sorted(found.items())[:5]) or "no Ready, schedulable, unclaimed node"
    raise NotIdle(f"no idle node in the shared pool ({profile.pool_label}=shared, {len(nodes)} nodes) to borrow: "
                  f"a borrowed node must run no pod of anyone else, DaemonSets included ({seen})")


def _claimed(node: dict) -> bool:
    return any(t["key"] == SCRATCH_LABEL for t in node["spec"].get("taints") or [])


def claim_node(api: client.ApiClient, node: ScratchNode) -> bool:
    """Add this run's claim taint unless another run claimed the node first (decided on one read)."""
    won = []

    def change(n):
        taints = n["spec"].get("taints") or []
        won.clear()
        if _claimed(n):
            return None
        won.append(True)
        return taints + [node.scratch_taint], record_note(node.run_id, [node.scratch_taint], n)
    change_taints(api, node.name, change)
    return bool(won)
