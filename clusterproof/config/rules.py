"""Rules between profile keys, one function per suite (pydantic checks each key alone).

Each raises ValueError with one line that names the keys and how to fix them;
``clusterproof.config.profile`` turns it into the run's one-line error. The API overload
suite's rules live next to what they describe (``clusterproof.apf.apf.validate_profile``).
"""
from __future__ import annotations

import re
from typing import TYPE_CHECKING

from clusterproof.cluster.node_plan import node_pod_cidrs

if TYPE_CHECKING:
    from clusterproof.config.profile import Profile

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")   # a namespace name


def parse_team_namespaces(entries: list[str]) -> dict[str, str]:
    """``["research=ml-research", ...]`` -> {team: namespace} (validated by the profile)."""
    return dict(e.split("=", 1) for e in entries)


def validate_taints(p: Profile, plan: list) -> None:
    """The taint suite's keys: distinct taint keys, team namespaces of known teams, enough nodes."""
    if p.team_taint_key == p.preflight_taint_key:
        raise ValueError(f"team_taint_key and preflight_taint_key are both {p.team_taint_key!r}; they must differ")
    seen = set()
    for entry in p.team_namespaces:
        team, sep, ns = str(entry).partition("=")
        if not sep or team not in p.teams or not DNS_LABEL.match(ns):
            raise ValueError(f"team_namespaces entry {entry!r} must be <team>=<namespace> with a team of teams "
                             f"({', '.join(map(str, p.teams)) or 'none'}) and a namespace name")
        if team in seen:
            raise ValueError(f"team_namespaces names team {team} twice")
        seen.add(team)
    small = [pool for pool in plan if pool.name.startswith("team-") and pool.count < p.taint_borrow_nodes]
    if small:
        raise ValueError(f"taint_borrow_nodes={p.taint_borrow_nodes} is more than the {small[0].count} nodes of "
                         f"{small[0].name}; lower it or raise nodes")


def validate_preflight(p: Profile) -> None:
    """The GPU preflight suite's keys: marks that do not collide, a cohort big enough for its pods."""
    if p.preflight_label_key == p.preflight_reason_label_key:
        raise ValueError(f"preflight_label_key and preflight_reason_label_key are both {p.preflight_label_key!r}; "
                         "they must differ")
    if p.preflight_inservice_faults <= p.preflight_max_unavailable:
        raise ValueError(f"preflight_inservice_faults ({p.preflight_inservice_faults}) must be larger than "
                         f"preflight_max_unavailable ({p.preflight_max_unavailable}), or the cap is never tested")
    healthy = p.preflight_join_nodes - (max(1, round(p.preflight_join_nodes * p.preflight_fault_fraction))
                                        if p.preflight_fault_fraction > 0 else 0)
    # The in-service check runs a ReplicaSet of faults+3 whole-node pods and needs as many spare nodes.
    need = max(p.preflight_waiting_pods, 2 * (p.preflight_inservice_faults + 3))
    if healthy < need:
        raise ValueError(f"preflight_join_nodes={p.preflight_join_nodes} leaves {healthy} healthy node(s) after "
                         f"faults, fewer than the {need} the checks place pods on; raise preflight_join_nodes or "
                         "lower preflight_waiting_pods/preflight_inservice_faults")
    if p.preflight_image and any(c.isspace() for c in p.preflight_image):
        raise ValueError(f"preflight_image {p.preflight_image!r} is not an image reference (it contains spaces)")


def validate_burst(p: Profile, plan: list) -> None:
    """The burst suite's keys: every locust worker has a user; the burst fits the shared pool."""
    if p.burst_users < p.burst_locust_processes:
        raise ValueError(f"burst_users ({p.burst_users}) must be >= burst_locust_processes "
                         f"({p.burst_locust_processes}): every locust worker needs a user")
    shared = sum(pool.count for pool in plan if pool.name == "shared")
    if p.burst_steady_pods > shared:
        raise ValueError(f"the steady phase ({p.burst_steady_pods} whole-node pods) is larger than the {shared} "
                         "nodes of the shared pool; lower burst_steady_pods or raise nodes")
    if p.burst_jobs * p.burst_job_size > shared:
        raise ValueError(f"the burst ({p.burst_jobs} jobs x {p.burst_job_size} whole-node pods "
                         f"= {p.burst_jobs * p.burst_job_size}) is larger than the {shared} nodes of the "
                         "shared pool; lower burst_jobs/burst_job_size or raise nodes")


def validate_watch(p: Profile, plan: list) -> None:
    """The watch-bandwidth suite's keys: a known pool, sizes that fit it, a pod range that fits the nodes."""
    if p.node_pod_cidr:
        node_pod_cidrs(p.node_pod_cidr, p.nodes)   # raises ValueError with the reason
    if p.watch_service and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?/[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                                            p.watch_service):
        raise ValueError(f"watch_service {p.watch_service!r} must be <namespace>/<service> (an existing Service "
                         "to watch read-only) or empty")
    pools = {pool.name: pool.count for pool in plan}
    if p.watch_pool and p.watch_pool not in pools:
        raise ValueError(f"watch_pool {p.watch_pool!r} is not a pool of the plan; use one of "
                         f"{', '.join(sorted(pools))} or empty (every node)")
    sizes = list(p.watch_sizes)
    if not sizes or sizes != sorted(set(sizes)):
        raise ValueError(f"watch_sizes {sizes} must be one or more endpoint counts, strictly rising (e.g. 100,400,1100)")
    if not p.watch_churn_kinds:
        raise ValueError("watch_churn_kinds is empty: name at least one of replace, ready, drain")


def validate_prometheus(p: Profile) -> None:
    """The Prometheus suite's keys: a history of at least two points."""
    if p.prometheus_backfill_minutes * 60 < 2 * p.prometheus_backfill_interval_s:
        raise ValueError(f"prometheus_backfill_minutes={p.prometheus_backfill_minutes} holds fewer than two points "
                         f"at prometheus_backfill_interval_s={p.prometheus_backfill_interval_s}; raise the "
                         "minutes or lower the interval")
