"""A cluster's state as text, for the page of a check that failed: nodes per pool, and the run's events.

Bounded on purpose: a table of pools, not 7,500 node lines, and only the
events of the namespaces this run created -- never another tenant's.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

from kubernetes import client

from clusterproof.core.run import RUN_LABEL
from clusterproof.kube.client import list_all, list_raw


def cluster_summary(api: client.ApiClient, pool_label: str, names: bool, ready: Callable[[dict], bool]) -> str:
    """Nodes per pool and readiness (``ready``: a node's Ready condition): a table, not 7,500 lines. Node
    names (of those not Ready) only on a simulated cluster: on a shared one the harness reports counts,
    not other tenants' nodes."""
    rows: Counter = Counter()
    not_ready = []
    for n in list_all(api, "/api/v1/nodes"):
        pool = (n["metadata"].get("labels") or {}).get(pool_label, "(no pool label)")
        is_ready = ready(n)
        rows[(pool, is_ready)] += 1
        if not is_ready and len(not_ready) < 50:
            not_ready.append(n["metadata"]["name"])
    lines = [f"{'pool':30} {'ready':>7} {'not ready':>10}"]
    for pool in sorted({p for p, _ in rows}):
        lines.append(f"{pool:30} {rows[(pool, True)]:>7} {rows[(pool, False)]:>10}")
    if not_ready and names:
        lines.append("not ready (first 50): " + ", ".join(not_ready))
    return "\n".join(lines)


def run_events(api: client.ApiClient, run_id: str, limit: int = 200) -> str:
    """The newest events in the namespaces this run created -- never another tenant's."""
    events = []
    for ns in list_raw(api, "/api/v1/namespaces", {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]:
        events += list_raw(api, f"/api/v1/namespaces/{ns['metadata']['name']}/events")["items"]
    when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""  # noqa: E731
    events.sort(key=when)
    return "\n".join(
        f"{when(e)} {e.get('type', ''):7} {e.get('reason', ''):24} {e['metadata']['namespace']} "
        f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: {e.get('message') or e.get('note')}"
        for e in events[-limit:]) or "(no events)"
