"""Taints on nodes: every change one conditional write, and what a run added recorded on the node itself.

Why a module: tainting is the one way a run changes nodes it did not
create, so two rules live here once (the sweeper of dead runs' leftovers,
``clusterproof.kube.sweep``, reads the same records):

- every change of a node's taints is one conditional write (the
  ``resourceVersion`` read with it): the node lifecycle controller, the
  cluster's own machinery and other runs write taints too, and a lost update
  would silently drop theirs;
- on a node the run did not create (real hardware, ``--cp-allow-destructive``)
  the run records, under its own annotation key
  ``clusterproof.io/added-taints.<run id>``, only the taints it actually
  added -- a taint the node already had is not the run's to remove -- and
  removes only those at the end. Two runs never share a record.
"""
from __future__ import annotations

import json
from typing import Callable

from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.core.run import CREATED, owner_annotations
from clusterproof.kube.client import get_if_present, merge_patch

ADDED_TAINTS_PREFIX = "clusterproof.io/added-taints."
# The only taints the harness's identity may add to or remove from a node it does not own (the policy
# clusterproof-nodes of clusterproof/kube/rbac-destructive.yaml): its claim (core.run.SCRATCH_LABEL) and a check's
# own taints under this prefix -- never a key a site may use for its teams or preflight, not even the profiles'
# default clusterproof.io/team.
CHECK_TAINTS = "check.clusterproof.io/"


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


def record_note(run_id: str, taints: list[dict], node: dict) -> dict:
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
        note = record_note(run_id, records(n).get(run_id, []) + [taint], n) if run_id else {}
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
        note = record_note(run_id, [t for t in recs[run_id] if _id(t) not in gone], n)
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
