"""What the taint isolation checks measure, typed: each check's result is a ``Measurement``.

Why a module: a check in suites/test_taint_isolation.py reads its timings
and its counts as attributes of one result (``run.settle_s``,
``run.misplaced``), and states its own figures (name, threshold, headline)
and its assert from them; how a pod's placement or a refusal becomes a
problem line lives here, beside the timings, once. A result's problems
are one line each, naming the pod or node first; ``gather()`` hands on its
timings (``measured`` fields) and the count of its problems, for a bench
or an attachment.

The one check that holds something open while it measures -- the
untolerated pods', whose pods an informer follows (a LIST per poll would
cost more than the scheduler at thousands of pods) -- is ``UntoleratedRun``:
started, settled, judged, disposed of. The others wait with
``kube.placement`` (each wait self-contained): ``Base``'s start and dispose.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from kubernetes import client

from clusterproof.core import measurement
from clusterproof.core.measurement import measured
from clusterproof.kube import placement as pl
from clusterproof.kube.informer import Informer

# A pod watch cut off longer than this cannot settle a wait: one line, not a verdict on a stale store
# (the harness's own bound for "the API server is away": kube.RETRY_S).
STALE_S = 60


def stopwatch() -> Callable[[], float]:
    """Seconds since this call, each time the returned function is called (a check's timing of a wait)."""
    t0 = time.monotonic()
    return lambda: time.monotonic() - t0


@dataclass
class Judged(measurement.Typed):
    """A taint check's problems, one line each (data); a subclass adds its timings as ``measured`` fields."""
    problems: list[str] = field(default_factory=list)

    @property
    def problem_count(self) -> int:
        return len(self.problems)

    def gather(self) -> list[measurement.Figure]:
        return [*super().gather(), measurement.figure("problems", self.problem_count, "")]


# --- 1. pods without a team toleration ---------------------------------------------------------------

@dataclass
class Untolerated(Judged):
    """Whole-node pods without a team toleration, bound or refused: how long, how many each way, and the
    misplaced ones (``problems``: a pod on a team or tainted node, or Pending without the refusal it owes)."""
    pods: int = measured("pods", default=0)
    settle_s: float | None = measured("s", default=None)   # created -> each bound or refused (informer stopped)
    refused_without_event: int = measured("pods", default=0)
    bound: int = measured("pods", default=0)
    pending: int = measured("pods", default=0)
    guarded: int = 0          # schedulable team nodes carrying their team taint (each refusal must name them)

    @property
    def misplaced(self) -> int:
        return self.problem_count


class UntoleratedRun(measurement.Base):
    """The untolerated pods of one namespace (``selector``) followed by an informer from ``start()`` to
    ``dispose()``; ``settle()`` waits for each to be bound or refused, ``judge()`` reads the outcome into
    ``result``. ``settle_s`` runs from the wait's start until the informer is stopped."""

    def __init__(self, api: client.ApiClient, namespace: str, selector: str, pods: int) -> None:
        self.api, self.namespace, self.selector = api, namespace, selector
        self.result = Untolerated(pods=pods)
        self.placed: dict[str, str | None] = {}
        self.events: dict[str, list[str]] = {}
        self._watch: Informer | None = None
        self._took: Callable[[], float] | None = None

    def start(self) -> None:
        self._watch = Informer(self.api, f"/api/v1/namespaces/{self.namespace}/pods",
                               {"labelSelector": self.selector}, chunk_s=5).start()

    def settle(self, created: dict[str, dict], timeout: float, what: str) -> None:
        watch, self._took = self._watch, stopwatch()
        self.placed, self.events = pl.wait_settled(
            self.api, self.namespace, created, timeout, what,
            pods_of=lambda: (watch.check(max_stale_s=STALE_S), {p["metadata"]["name"]: p for p in watch.snapshot()})[1])

    def dispose(self) -> None:
        if self._watch is not None:
            self._watch.stop()
        if self._took is not None:
            self.result.settle_s = self._took()

    def count_silent_refusals(self, names: list[str], said: dict[str, list[str]]) -> int:
        """Refused pods whose FailedScheduling event ``said`` lacks (the verdict read from PodScheduled alone)."""
        self.result.refused_without_event = sum(1 for name in names if not self.placed.get(name)
                                                and name in self.events and name not in said)
        return self.result.refused_without_event

    def judge(self, names: list[str], nodes: dict[str, pl.NodeInfo], team_taint_key: str,
              preflight_taint_key: str) -> Untolerated:
        """Each pod on an untainted node, or Pending refused for at least every schedulable tainted team node."""
        r, ns = self.result, self.namespace
        r.guarded = sum(1 for i in nodes.values() if i.pool.startswith("team-") and i.has_taint(team_taint_key)
                        and not i.unschedulable)
        pending = 0
        for name in names:
            node = self.placed.get(name)
            if node:
                info = nodes.get(node)
                if info and info.pool.startswith("team-"):
                    taint = ("carries no " + team_taint_key + " taint"
                             if not info.has_taint(team_taint_key) else f"taints: {info.taint_text()}")
                    r.problems.append(f"pod {ns}/{name} landed on team node {node} (pool {info.pool}; {taint})")
                elif info and (info.has_taint(team_taint_key) or info.has_taint(preflight_taint_key)):
                    r.problems.append(f"pod {ns}/{name} landed on tainted node {node} ({info.taint_text()})")
                continue
            pending += 1
            msgs = self.events.get(name, [])
            count = pl.untolerated_count(msgs)
            if count is None:
                r.problems.append(f"pod {ns}/{name} is Pending without the scheduler refusing it for untolerated "
                                  f"taints (last refusal: {msgs[-1] if msgs else 'none'})")
            elif count < r.guarded:
                r.problems.append(f"pod {ns}/{name}: the scheduler refused only {count} node(s) for untolerated "
                                  f"taints, but {r.guarded} schedulable team nodes carry their taint ({msgs[-1]})")
        r.pending, r.bound = pending, r.pods - pending
        return r

    def gather(self) -> list[measurement.Figure]:
        return self.result.gather()


# --- 2. team pods -----------------------------------------------------------------------------------

@dataclass
class TeamPods(measurement.Typed):
    """Each team's pods, admitted and placed: how long until all were bound or refused, the pods on nodes they
    may not use (``misplaced``) and those admission gave the wrong tolerations (``wrong_tolerations``)."""
    settle_s: float | None = measured("s", default=None)
    misplaced: list[str] = field(default_factory=list)
    wrong_tolerations: list[str] = field(default_factory=list)

    @property
    def misplaced_count(self) -> int:
        return len(self.misplaced)

    @property
    def wrong_toleration_count(self) -> int:
        return len(self.wrong_tolerations)

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [*super().gather(), f("misplaced", self.misplaced_count, "pods"),
                f("wrong_tolerations", self.wrong_toleration_count, "pods")]

    def judge_placement(self, settled: dict[str, tuple[dict, dict]], team_of: dict[str, str],
                        off_limits: dict[tuple[str, str], str], pool_of: dict[str, str]) -> list[str]:
        """A team's pod only on its team's or shared nodes; one sent to another team's pool Pending, refused for
        untolerated taints (``settled``: namespace -> ``wait_settled``'s ({pod: node}, refusals))."""
        for ns, (now, ev) in settled.items():
            team = team_of[ns]
            for name, node in now.items():
                pool = pool_of.get(node)
                if (ns, name) in off_limits:
                    if node:
                        self.misplaced.append(f"pod {ns}/{name} of team {team} landed on node {node} of pool {pool}")
                    elif pl.untolerated_count(ev.get(name, [])) is None:
                        self.misplaced.append(
                            f"pod {ns}/{name} is Pending without an untolerated-taint refusal from the scheduler "
                            f"(last: {(ev.get(name) or ['none'])[-1]})")
                elif node and pool not in (f"team-{team}", "shared"):
                    self.misplaced.append(f"pod {ns}/{name} of team {team} landed on node {node} of pool {pool}")
        return self.misplaced


# --- 3. foreign tolerations ----------------------------------------------------------------------------

@dataclass
class ForeignAttempts(Judged):
    """Pods claiming another team's toleration (and a running pod adding one): what admission did with each
    attempt (``outcome``, one line each) and the foreign tolerations that got through (``problems``)."""
    outcome: list[str] = field(default_factory=list)


# --- 4. borrowing and preemption -----------------------------------------------------------------------

@dataclass
class Borrowing(Judged):
    """Low-priority pods borrowing idle team nodes, then the teams reclaiming them: how long each took, and
    every borrowing or preemption problem."""
    borrow_s: float | None = measured("s", default=None)    # low-priority pods created -> bound on idle nodes
    reclaim_s: float | None = measured("s", default=None)   # team pods created -> bound on reclaimed nodes
    # team pods kube-scheduler parked after their preemption and bound only at its flush (a known upstream
    # defect, clusterproof.kube.preemption): one line each, with the delay
    parked: list[str] = field(default_factory=list)


# --- 5. NoExecute eviction -----------------------------------------------------------------------------

@dataclass
class Eviction(Judged):
    """A team taint on a node, NoSchedule then NoExecute: how long until the pods without its toleration were
    evicted (None: they were not, within the bound), and every pod evicted or left running wrongly."""
    evict_s: float | None = measured("s", default=None)


# --- 6. preflight taint ------------------------------------------------------------------------------

@dataclass
class NewNode(Judged):
    """A new node behind the preflight taint: how long its pods took to bind once the taint went, and every
    pod bound early or elsewhere."""
    bind_s: float | None = measured("s", default=None)
