"""Taints on nodes, and nodes one check uses alone (scratch nodes).

Why a module: tainting is the one way a run changes nodes it did not
create, so three rules live here once:

- every change of a node's taints is one conditional write (the
  ``resourceVersion`` read with it): the node lifecycle controller, the
  cluster's own machinery and other runs write taints too, and a lost update
  would silently drop theirs;
- on a node the run did not create (real hardware, ``--allow-destructive``)
  the run records, under its own annotation key
  ``clusterproof.io/added-taints.<run id>``, only the taints it actually
  added -- a taint the node already had is not the run's to remove -- and
  removes only those at the end. Two runs never share a record;
- a borrowed node is first claimed with the taint
  ``clusterproof.io/scratch=<run id>`` (conditional write again), and a node
  another run has claimed is never borrowed: two runs borrowing at once get
  different nodes.

On a simulated cluster a scratch node is a fresh kwok node, deleted at the end.
"""
from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.kube.client import (KWOK_ANNOTATION, delete_if_present, get_if_present, list_raw, merge_patch,
                           raw_request)
from clusterproof.cluster.nodes import is_ready
from clusterproof.kube.pods import list_pods
from clusterproof.cluster.node_plan import node_capacity
from clusterproof.core.run import CREATED, RUN_LABEL, SCRATCH_LABEL, metadata, owner_annotations
from clusterproof.core.waiting import wait_for

ADDED_TAINTS_PREFIX = "clusterproof.io/added-taints."


def added_taints_key(run_id: str) -> str:
    return ADDED_TAINTS_PREFIX + run_id


def _id(t: dict) -> tuple:
    return (t["key"], t.get("value", ""), t["effect"])


def records(node: dict) -> dict[str, list[dict]]:
    """{run id: taints that run added} from a node's annotations."""
    return {run: rec["taints"] for run, rec in _records(node).items()}


def _records(node: dict) -> dict[str, dict]:
    """{run id: {"taints": [...], "created": time}} -- the record as written."""
    out = {}
    for k, v in (node["metadata"].get("annotations") or {}).items():
        if k.startswith(ADDED_TAINTS_PREFIX):
            try:
                rec = json.loads(v)
                out[k[len(ADDED_TAINTS_PREFIX):]] = {"taints": list(rec["taints"]), "created": rec.get("created")}
            except (TypeError, ValueError, KeyError):
                out[k[len(ADDED_TAINTS_PREFIX):]] = {"taints": [], "created": None}
    return out


def record_created(node: dict, run_id: str) -> str | None:
    """When ``run_id`` first recorded a taint on ``node`` (for the sweeper's age bound)."""
    return (_records(node).get(run_id) or {}).get("created")


def _note(run_id: str, taints: list[dict], node: dict) -> dict:
    """The annotation change that makes ``taints`` the run's record (None removes it)."""
    if not taints:
        return {added_taints_key(run_id): None}
    created = record_created(node, run_id) or owner_annotations()[CREATED]
    return {added_taints_key(run_id): json.dumps({"taints": taints, "created": created})}


def patch_node(api: client.ApiClient, node: str, decide: Callable[[dict], dict | None],
               attempts: int = 10) -> dict | None:
    """Read the node, let ``decide(node) -> merge-patch body`` choose the change, write it conditionally.

    The body is sent with the ``resourceVersion`` read with it; on a conflict
    the node is read again and ``decide`` asked again, so the decision is
    always made on what is there. ``decide`` returns None when there is
    nothing to write; a node that is gone has nothing to change.
    """
    for _ in range(attempts):
        n = get_if_present(api, f"/api/v1/nodes/{node}")
        body = decide(n) if n is not None else None
        if body is None:
            return None
        body.setdefault("metadata", {})["resourceVersion"] = n["metadata"]["resourceVersion"]
        try:
            return merge_patch(api, f"/api/v1/nodes/{node}", body)
        except client.ApiException as e:
            if e.status != 409:
                raise
    raise HarnessError(f"node {node} could not be written: {attempts} write conflicts in a row (something else "
                       "rewrites it several times a second, e.g. a controller fighting over its taints); the "
                       "harness only ever writes a node conditionally, so it gave up rather than overwrite it")


def change_taints(api: client.ApiClient, node: str, change: Callable[[dict], tuple[list, dict] | None],
                  attempts: int = 10) -> dict | None:
    """Read the node, let ``change(node) -> (taints, annotations)`` decide, write both conditionally.

    ``annotations`` is merged (a value of None removes a key); ``change``
    returns None when there is nothing to write (``patch_node`` does the rest).
    """
    def decide(n: dict) -> dict | None:
        decided = change(n)
        if decided is None:
            return None
        taints, annotations = decided
        body: dict = {"spec": {"taints": taints or None}}
        if annotations:
            body["metadata"] = {"annotations": annotations}
        return body
    return patch_node(api, node, decide, attempts)


def add_taint(api: client.ApiClient, node: str, taint: dict, run_id: str | None = None) -> None:
    """Add ``taint`` unless present; with ``run_id``, record it as that run's (only if it was added)."""
    def change(n):
        taints = n["spec"].get("taints") or []
        if any(_id(t) == _id(taint) for t in taints):
            return None
        note = _note(run_id, records(n).get(run_id, []) + [taint], n) if run_id else {}
        return taints + [taint], note
    change_taints(api, node, change)


def _drop(n: dict, run_id: str | None, only: set | None, removed: list) -> tuple[list, dict] | None:
    """The change that removes taints: ``run_id`` None -> the ``only`` ones, unconditionally (the
    run's own node); else those ``run_id`` recorded (all, or the ``only`` ones), except a taint
    another run's record also lists, and the record entries themselves."""
    taints = n["spec"].get("taints") or []
    if run_id is None:
        drop = {_id(t) for t in taints} & only
        note = {}
    else:
        recs = records(n)
        if run_id not in recs:
            return None
        mine = {_id(t) for t in recs[run_id]}
        gone = mine if only is None else mine & only
        others = {_id(t) for run, ts in recs.items() if run != run_id for t in ts}
        drop = gone - others
        note = _note(run_id, [t for t in recs[run_id] if _id(t) not in gone], n)
    if not drop and not note:
        return None
    removed[:] = [t for t in taints if _id(t) in drop]
    return [t for t in taints if _id(t) not in drop], note


def remove_taint(api: client.ApiClient, node: str, taint: dict, run_id: str | None = None) -> None:
    """Remove ``taint``; with ``run_id``, only if that run recorded it (and drop it from the record)."""
    change_taints(api, node, lambda n: _drop(n, run_id, {_id(taint)}, []))


def release_run_taints(api: client.ApiClient, node: str, run_id: str) -> list[dict]:
    """Remove every taint ``run_id`` recorded on ``node`` -- except one another run's record
    also lists -- and the record itself. Returns the taints removed (for the sweeper's report)."""
    removed: list[dict] = []
    change_taints(api, node, lambda n: _drop(n, run_id, None, removed))
    return removed


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
                         workers: int = 1, timeout: float = 120) -> list[ScratchNode]:
    """``count`` fresh kwok nodes labelled and tainted ``clusterproof.io/scratch=<tag>`` (plus
    ``taints`` and ``labels``), with the profile's capacity; returned once Ready and schedulable
    (within ``timeout``). ``workers`` creates them in parallel (hundreds of nodes joining at once)."""
    cap = node_capacity(profile)
    if gpus is not None:
        cap["nvidia.com/gpu"] = str(gpus)
    nodes = [ScratchNode(api, f"{profile.node_name_prefix}-scratch-{tag}" + (f"-{i}" if count > 1 else ""),
                         run_id, tag, created=True) for i in range(count)]
    def create(node: ScratchNode) -> None:
        meta = metadata(node.name, run_id, {"kubernetes.io/hostname": node.name, "kubernetes.io/os": "linux",
                                            "type": "kwok", SCRATCH_LABEL: tag, **(labels or {})})
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
                 what=f"{count} scratch node(s) {SCRATCH_LABEL}={tag} Ready and schedulable")
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
        return taints + [node.scratch_taint], _note(node.run_id, [node.scratch_taint], n)
    change_taints(api, node.name, change)
    return bool(won)
