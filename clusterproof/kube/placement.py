"""Where pods landed, and what the scheduler said about the ones that did not.

Why a module: the taint suite checks behaviour on placement and on the
scheduler's own verdicts -- never on the text of a policy. Here live the
readings: nodes with their pool and taints, which nodes are busy, a pod's
refusals by the scheduler (FailedScheduling events by uid, and the pod's
PodScheduled condition, which outlives a dropped event), waiting until every pod is bound or
refused, watching a window in which nothing may happen, and the per-team
placement table the report shows.
"""
from __future__ import annotations

import csv
import io
import re
from collections import Counter
from dataclasses import dataclass

from kubernetes import client

from clusterproof.core.run import SCRATCH_LABEL
from clusterproof.core.texttable import markdown_table
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_raw
from clusterproof.kube.informer import Informer
from clusterproof.kube.nodes import is_ready
from clusterproof.kube.pods import list_pods, pod_events

# The scheduler's FailedScheduling message since 1.34 no longer names the
# taint ("0/100 nodes are available: 42 node(s) had untolerated taint(s), ...").
UNTOLERATED = re.compile(r"(\d+) node\(s\) had untolerated taint")
NO_TEAM, LOW = "no team", "low priority"


@dataclass
class NodeInfo:
    name: str
    pool: str
    taints: list[dict]
    ready: bool
    unschedulable: bool

    def has_taint(self, key: str, value: str | None = None, effect: str | None = None) -> bool:
        return any(t["key"] == key and (value is None or t.get("value", "") == value)
                   and (effect is None or t["effect"] == effect) for t in self.taints)

    def taint_text(self) -> str:
        return ", ".join(f"{t['key']}={t.get('value', '')}:{t['effect']}" for t in self.taints) or "none"


def read_nodes(api: client.ApiClient, pool_label: str) -> dict[str, NodeInfo]:
    """Every node: its pool (label value, 'scratch' or '(no pool)'), taints, readiness."""
    out = {}
    for n in list_raw(api, "/api/v1/nodes", timeout=300)["items"]:
        labels = n["metadata"].get("labels") or {}
        pool = labels.get(pool_label) or ("scratch" if SCRATCH_LABEL in labels else "(no pool)")
        out[n["metadata"]["name"]] = NodeInfo(n["metadata"]["name"], pool, n["spec"].get("taints") or [],
                                              is_ready(n), bool(n["spec"].get("unschedulable")))
    return out


def busy_nodes(api: client.ApiClient) -> Counter:
    """Pods per node, for every pod that is not finished (any namespace)."""
    items = list_raw(api, "/api/v1/pods", {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"},
                     timeout=300)["items"]
    return Counter(p["spec"]["nodeName"] for p in items if p["spec"].get("nodeName"))


def untolerated_count(messages: list[str]) -> int | None:
    """The largest 'N node(s) had untolerated taint(s)' in a pod's FailedScheduling messages."""
    counts = [int(m.group(1)) for msg in messages for m in UNTOLERATED.finditer(msg)]
    return max(counts) if counts else None


def refusal(pod: dict) -> str | None:
    """The scheduler's refusal as written on the pod itself: the message of its PodScheduled=False condition
    with reason Unschedulable (the FailedScheduling event's text), or None.

    Why not the event alone: events are best effort. kube-scheduler's event broadcaster drops an event when
    1,000 are queued (client-go tools/events: ``maxQueuedEvents``, ``DropIfChannelFull``), as when thousands
    of pods are bound at once and each gets its "Scheduled" event; the condition is a status write. With
    its event dropped, a refused pod looked undecided until the scheduler tried it again, up to 5 minutes
    later (``podMaxInUnschedulablePodsDuration``): most likely why the nightly's 3,000-pod taint check once
    took 355 s instead of about 50 s.
    """
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False" and c.get("reason") == "Unschedulable":
            return c.get("message") or ""
    return None


def verdicts(pods_now: dict[str, dict], created: dict[str, dict], events: dict[str, list[str]]) -> dict[str, list[str]]:
    """Each unbound pod's refusals: its FailedScheduling events' messages, then its condition's message if no
    event says the same (only for the pods ``created``, matched by uid: not a predecessor of the same name)."""
    out = {name: list(msgs) for name, msgs in events.items()}
    for name, pod in pods_now.items():
        mine = created.get(name)
        if mine is None or pod["metadata"].get("uid") != mine["metadata"].get("uid") or pod["spec"].get("nodeName"):
            continue
        msg = refusal(pod)
        if msg is not None and msg not in out.get(name, []):
            out.setdefault(name, []).append(msg)
    return out


def wait_settled(api: client.ApiClient, ns: str, pods: dict[str, dict], timeout: float, what: str,
                 bound: set | None = None, pods_of=None) -> tuple[dict[str, str | None], dict[str, list[str]]]:
    """Wait until each pod is bound or refused by the scheduler; return ({pod: node}, refusals).

    ``pods``: name -> pod as created (its uid identifies its events).
    ``bound``: names that must get a node (the others may stay Pending).
    ``pods_of``: the namespace's pods by name, if the caller already follows
    them with a watch (default: one LIST per poll). A pod is refused when a
    FailedScheduling event or its PodScheduled condition says so
    (``verdicts``): a verdict the scheduler has given; waiting longer would
    only measure its retry period.
    """
    need_bound, names = bound or set(), sorted(pods)
    if pods_of is None:
        def pods_of():
            return list_pods(api, ns)

    def probe():
        now = pods_of()
        where = {n: p["spec"].get("nodeName") for n, p in now.items()}
        ev = verdicts(now, pods, pod_events(api, ns, "FailedScheduling", pods))
        open_ = [n for n in names if not (where.get(n) or (n not in need_bound and n in ev))]
        return where, ev, open_
    try:
        # Each poll lists the namespace's FailedScheduling events: at thousands of pods, poll less often
        # so the harness does not compete with the scheduler it is waiting for.
        interval = 0.5 if len(names) < 200 else 3.0
        where, ev, _ = wait_for(probe, until=lambda s: not s[2], timeout=timeout, interval=interval, what=what,
                                describe=lambda s: settled_so_far(s, names))
    except AssertionError:
        where, ev, open_ = probe()
        raise AssertionError(f"{what}: not reached within {timeout:g} s; unsettled: "
                             + "; ".join(f"pod {ns}/{n}: " + (("not bound; last refusal: " + ev[n][-1])
                                                             if n in ev else "neither bound nor refused (no "
                                                             "FailedScheduling event, no Unschedulable condition)")
                                         for n in open_[:10])) from None
    return {n: where.get(n) for n in names}, ev


def settled_so_far(state: tuple, names: list[str]) -> str:
    """``wait_settled``'s state in a few words, for its heartbeat: pods bound, refused, still open."""
    where, _, open_ = state
    bound = sum(1 for n in names if where.get(n))
    refused = len(names) - bound - len(open_)
    return (f"{bound} of {len(names)} pods bound, {refused} refused (Pending with the scheduler's verdict), "
            f"{len(open_)} open")


def watch_for_changes(api: client.ApiClient, label_selector: str, seconds: float, bad) -> dict[str, str]:
    """Measurement: watch the pods matching ``label_selector`` (all namespaces) for ``seconds``;
    return {namespace/pod: what happened} for every event that ``bad(kind, pod)`` names (it
    returns a string or None). Ends early on the first one."""
    found: dict[str, str] = {}

    def apply(kind: str, pod: dict) -> None:
        why = bad(kind, pod)
        if why:
            found[f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"] = why
    Informer(api, "/api/v1/pods", {"labelSelector": label_selector}, apply).watch_for(seconds, lambda: bool(found))
    return found


# --- the placement table ---------------------------------------------------------------

def placement_counts(pod_list: list[dict], pool_of: dict[str, str], team_of_ns: dict[str, str],
                     low_class: str) -> dict[str, Counter]:
    """{row: Counter(column)}: rows are teams, 'no team' and 'low priority'; columns are
    node pools, or 'Pending' for pods without a node."""
    out: dict[str, Counter] = {}
    for p in pod_list:
        if p["spec"].get("priorityClassName") == low_class:
            row = LOW
        else:
            row = team_of_ns.get(p["metadata"]["namespace"], NO_TEAM)
        node = p["spec"].get("nodeName")
        col = pool_of.get(node, "(unknown node)") if node else "Pending"
        out.setdefault(row, Counter())[col] += 1
    return out


def _columns(counts: dict[str, Counter], pools: list[str]) -> list[str]:
    seen = {c for row in counts.values() for c in row}
    extra = sorted(seen - set(pools) - {"Pending"})
    return [p for p in pools if p in seen] + extra + (["Pending"] if "Pending" in seen else [])


def _rows(counts: dict[str, Counter], teams: list[str]) -> list[str]:
    order = [*teams, NO_TEAM, LOW]
    return [r for r in order if r in counts] + sorted(set(counts) - set(order))


def render_placement(counts: dict[str, Counter], pools: list[str], teams: list[str]) -> str:
    """A markdown table: pods per team (rows) per node pool (columns)."""
    if not counts:
        return "(no pods)"
    cols = _columns(counts, pools)
    return markdown_table(["pods of \\ on pool", *cols],
                          [[r, *(counts[r].get(c, 0) for c in cols)] for r in _rows(counts, teams)])


def placement_csv(counts: dict[str, Counter], pools: list[str], teams: list[str]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = _columns(counts, pools)
    w.writerow(["team", *cols])
    for r in _rows(counts, teams):
        w.writerow([r, *(counts[r].get(c, 0) for c in cols)])
    return buf.getvalue()
