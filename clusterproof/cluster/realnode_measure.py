"""What the real-node checks measure, typed: the checker pod's rounds and the real kubelets' heartbeats.

Why a module: suites/test_real_nodes.py reads each check's timings and
problems as attributes of one result and states its own figures and its
assert from them; how a kubelet's log and the apiserver's audit events
become flows, Lease renewals and problem lines lives here, once. Both are
read after the fact (rounds timed as they run, logs read when they are
done): ``Base``'s start and dispose. Audit events stay the apiserver's
dicts (outside input).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from clusterproof.cluster import realnodes
from clusterproof.cluster.realnode_config import LEASE_DURATION_S
from clusterproof.core import measurement
from clusterproof.core.timeparse import epoch

NODE_FLOWS = {"system-node-high", "system-nodes"}   # the stock FlowSchemas of group system:nodes
MIN_RENEWALS = 3


# --- GPU preflight through a checker pod ----------------------------------------------------------------

@dataclass
class CheckerRounds(measurement.Base):
    """Preflight rounds on the real nodes (``clusterproof.preflight.real.Round``: the checker pod's verdict and
    the decision), each timed from its pod created to the decision, and their problems."""
    rounds: list = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def timed(self, run: Callable[[], Any]) -> Any:
        """One round (``run()`` returns it), timed and kept with its problems."""
        t0 = time.monotonic()
        r = run()
        self.seconds.append(time.monotonic() - t0)
        self.rounds.append(r)
        self.problems += r.problems
        return r

    @property
    def round_max_s(self) -> float | None:
        """The slowest round (None: no round ran)."""
        return max(self.seconds) if self.seconds else None

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f("round_max_s", self.round_max_s, "s"), f("problems", len(self.problems), "")]


# --- heartbeats and flows of the real kubelets ----------------------------------------------------------

def audited_heartbeats(audit_log: Path, names: list[str]) -> list[dict]:
    """The real nodes' Lease and node-status writes the apiserver audited
    (``clusterproof.cluster.realnode_config.audit_rules``)."""
    out = []
    try:
        lines = audit_log.read_text(errors="replace").splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            e = json.loads(line)
        except ValueError:
            continue
        ref = e.get("objectRef") or {}
        if (ref.get("name") in names and ref.get("resource") in ("leases", "nodes")
                and e.get("stage") == "ResponseComplete"):
            out.append(e)
    return out


def renewals_audited(events: list[dict], names: list[str]) -> bool:
    """Has every node's Lease been renewed ``MIN_RENEWALS`` times in ``events``?"""
    return all(sum(1 for e in events if e["objectRef"]["name"] == n and e["objectRef"]["resource"] == "leases")
               >= MIN_RENEWALS for n in names)


def flows_text(counts: dict[str, int]) -> str:
    """Flow schemas by responses, most first: 'system-node-high 120, system-nodes 4'."""
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])) or "none"


@dataclass
class LeaseRenewals:
    """One real node's audited Lease renewals (seconds since the epoch, oldest first)."""
    node: str
    times: list[float]

    @property
    def count(self) -> int:
        return len(self.times)

    @property
    def span_s(self) -> float:
        return self.times[-1] - self.times[0]

    @property
    def gaps(self) -> list[float]:
        """The time since the previous renewal, at each renewal after the first."""
        return [b - a for a, b in zip(self.times, self.times[1:])]

    @property
    def longest_gap_s(self) -> float:
        return max(self.gaps)


@dataclass
class KubeletHeartbeats(measurement.Base):
    """The real kubelets' requests by flow schema (``flows``: node -> schema -> responses), their Lease renewals
    (``leases``: the nodes with at least ``MIN_RENEWALS`` audited) and every problem: a kubelet never classified
    ``system-node-high`` or classified outside the node flows, heartbeats from another identity, too few
    renewals, or a gap longer than the Lease's duration."""
    flows: dict[str, dict[str, int]] = field(default_factory=dict)
    leases: dict[str, LeaseRenewals] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def longest_gap_s(self) -> float | None:
        """The longest gap between two renewals of any node's Lease (None: no node had enough renewals)."""
        return max(r.longest_gap_s for r in self.leases.values()) if self.leases else None

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f("lease_longest_gap_s", self.longest_gap_s, "s"), f("problems", len(self.problems), "")]


def judge_heartbeats(names: list[str], events: list[dict], schemas: dict[str, str],
                     kwok_dir: Path) -> KubeletHeartbeats:
    """Each real node's kubelet: its responses' flow schemas (its log; ``schemas``: uid -> name), the identity
    of its heartbeats and the gaps between its Lease renewals (``events``: ``audited_heartbeats``)."""
    out = KubeletHeartbeats()
    for name in names:
        log = kwok_dir / "logs" / f"{realnodes.kubelet_component(name)}.log"
        got = {schemas.get(uid, uid if uid == realnodes.UNCLASSIFIED else f"unknown uid {uid}"): n
               for uid, n in realnodes.flow_schema_uids(log).items()}
        out.flows[name] = got
        if "system-node-high" not in got:
            out.problems.append(f"node {name}: none of its kubelet's {sum(got.values())} responses was classified "
                                f"system-node-high (its flows: {flows_text(got)})")
        elsewhere = {k: v for k, v in got.items() if k not in NODE_FLOWS and k != realnodes.UNCLASSIFIED}
        if elsewhere:
            out.problems.append(f"node {name}: {sum(elsewhere.values())} of its kubelet's requests were classified "
                                f"outside the node flows: {flows_text(elsewhere)}")
        evs = [e for e in events if e["objectRef"]["name"] == name]
        foreign = [e for e in evs if e["user"].get("username") != f"system:node:{name}"
                   and e.get("userAgent", "").startswith("kubelet")]
        if foreign:
            out.problems.append(f"node {name}: {len(foreign)} heartbeats came from "
                                f"{foreign[0]['user'].get('username')}, not system:node:{name}")
        leases = [e for e in evs if e["objectRef"]["resource"] == "leases"]
        if len(leases) < MIN_RENEWALS:
            out.problems.append(f"node {name}: {len(leases)} Lease renewal(s) audited")
            continue
        renewals = LeaseRenewals(name, sorted(epoch(e["stageTimestamp"]) for e in leases))
        out.leases[name] = renewals
        if renewals.longest_gap_s > LEASE_DURATION_S:
            out.problems.append(f"node {name}: its Lease went {renewals.longest_gap_s:.0f} s without renewal "
                                f"(duration {LEASE_DURATION_S} s)")
    return out
