"""A cluster's state as text, for the page of a check that failed: nodes per pool, and the run's events.

Bounded on purpose: a table of pools, not 7,500 node lines, and only the
events of the namespaces this run created -- never another tenant's.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

from kubernetes import client

from clusterproof.core.run import RUN_LABEL
from clusterproof.core.texttable import text_table
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
    pools = sorted({p for p, _ in rows})
    table = text_table(["pool", "ready", "not ready"], [[p, rows[(p, True)], rows[(p, False)]] for p in pools], "<>>")
    if not_ready and names:
        table += "\nnot ready (first 50): " + ", ".join(not_ready)
    return table


def run_events(api: client.ApiClient, run_id: str, limit: int = 200) -> str:
    """The newest events in the namespaces this run created -- never another tenant's."""
    events = []
    for ns in list_raw(api, "/api/v1/namespaces", {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]:
        events += list_raw(api, f"/api/v1/namespaces/{ns['metadata']['name']}/events")["items"]
    when = lambda e: e.get("lastTimestamp") or e.get("eventTime") or ""  # noqa: E731
    events.sort(key=when)
    return text_table((), [[when(e), e.get("type", ""), e.get("reason", ""), e["metadata"]["namespace"],
                            f"{e['involvedObject'].get('kind')}/{e['involvedObject'].get('name')}: "
                            f"{e.get('message') or e.get('note')}"] for e in events[-limit:]], gap=1) or "(no events)"
