"""The seed cluster's alert signal on every run: 5xx answers and 429s per flow schema, per test module.

Why: an SRE's first signal that a control plane is in trouble is the API
servers' rate of 5xx and 429. ``control_plane_guard`` (clusterproof.cluster.health)
reads ``apiserver_request_total`` by code and
``apiserver_flowcontrol_rejected_requests_total`` before and after every
test module: any 5xx fails the module, naming verb, resource and count; the
429s are reported per flow schema (an attachment of the module), because
shedding load with 429 is APF doing its job, not a defect.

Not errors by definition (measured: healthy smoke runs of every suite; docs/verdicts.md
"The seed's alert signal"): one, each with its reason in ``NOT_ERRORS``.
Anything else stays an error until it is shown to be normal operation.

Deliberate breakage: a module that breaks the control plane on purpose (a
negative control stalling etcd) declares the window with
``api_guard.excuse(reason)`` -- as ``Supervisor.pause`` does for a component
it stops. 5xx counted inside a declared window are reported as excused, not
failed; 5xx outside it still fail the module. The counters are per
apiserver replica: both scrapes of a window come from the same replica
(``apimetrics.scrape_same_replica``), and the report says so when there are
several.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from clusterproof.cluster import apiwork
from clusterproof.core.stats import histogram_quantile
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube import apimetrics
from clusterproof.kube import flowcontrol as apf

Key = tuple  # (verb, group, resource, subresource, code)
BY = ("verb", "group", "resource", "subresource", "code")
# (verb, resource, subresource, code) that are not errors although 5xx; each with the reason. Every
# 5xx healthy smoke runs of all suites produced was looked at; this is the one that is normal operation.
NOT_ERRORS: dict[tuple[str, str, str, str], str] = {
    ("POST", "pods", "eviction", "504"):
        "the apiserver answers an eviction 504 (reason Timeout, 'couldn't update PodDisruptionBudget ... due "
        "to conflicts', retry after 10 s) when concurrent evictions under one PDB conflict 20 times in a row "
        "(k8s.io/kubernetes pkg/registry/core/pod/storage/eviction.go, EvictionsRetry); draining several "
        "nodes at once does that, and a drainer retries it like a 429. A slow etcd still shows on every "
        "other write.",
}


# kube-apiserver's own view of etcd (per operation and object type): read beside the 5xx, so that a 504 says
# whether storage was slow (a write waits for etcd's disk) or the API server itself (CPU, queues).
ETCD = "etcd_request_duration_seconds"
SLOW_ETCD_S = 1.0
SCRAPED = (*apf.METRICS, ETCD, *apiwork.SCRAPED)   # apiwork: each module's requests and watch events

# An excused window stays open until the 5xx count reads the same twice this far apart (at most SETTLE_S).
SETTLE_EVERY_S = 2.0
SETTLE_S = 20.0


def server_errors(before: str, after: str) -> dict[Key, float]:
    """5xx answers between two scrapes, by verb/group/resource/subresource/code (pure)."""
    after, before = (apimetrics.only(t, (apf.REQUESTS,)) for t in (after, before))
    d = apf.delta(apf.counters(after, apf.REQUESTS, BY), apf.counters(before, apf.REQUESTS, BY))
    return {k: v for k, v in d.items() if k[-1].startswith("5") and (k[0], k[2], k[3], k[-1]) not in NOT_ERRORS}


def rejections(before: str, after: str) -> dict[tuple[str, str], float]:
    """429s (APF rejections) between two scrapes, by flow schema and priority level (pure)."""
    out: dict[tuple[str, str], float] = {}
    after, before = (apimetrics.only(t, (apf.REJECTED,)) for t in (after, before))
    for (fs, pl, _reason), v in apf.delta(apf.rejected(after), apf.rejected(before)).items():
        out[(fs, pl)] = out.get((fs, pl), 0.0) + v
    return out


def storage_latency(before: str, after: str) -> str:
    """etcd as kube-apiserver saw it between two scrapes, in one clause (pure): the operations with requests
    slower than ``SLOW_ETCD_S``, the most first, each with its count and p99 (at most three); or that every
    one was faster. '' if the scrapes hold no etcd latency."""
    d = apimetrics.delta(*(_etcd(apimetrics.only(t, (ETCD,))) for t in (after, before)))
    if not d:
        return ""
    slow = []
    for (op, kind), b in d.items():
        over = b[math.inf] - max((c for le, c in b.items() if le <= SLOW_ETCD_S), default=0.0)
        if over > 0:
            slow.append((over, f"{op} {kind}: {int(over)} of {int(b[math.inf])} over {SLOW_ETCD_S:g} s, "
                               f"p99 {histogram_quantile(0.99, b):.2g} s"))
    total = int(sum(b[math.inf] for b in d.values()))
    if not slow:
        return f"etcd, as kube-apiserver saw it: all {total:,} requests within {SLOW_ETCD_S:g} s"
    return "etcd, as kube-apiserver saw it: " + "; ".join(t for _, t in sorted(slow, reverse=True)[:3])


def _etcd(text: str) -> dict[tuple[str, str], dict[float, float]]:
    out: dict[tuple[str, str], dict[float, float]] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name != ETCD:
            continue
        for smp in fam.samples:
            if smp.name.endswith("_bucket"):
                b = out.setdefault((smp.labels.get("operation", ""), smp.labels.get("type", "")), {})
                le = float(smp.labels["le"])
                b[le] = b.get(le, 0.0) + smp.value
    return out


def describe(key: Key) -> str:
    verb, group, resource, sub, code = key
    what = "/".join(x for x in (f"{resource}.{group}" if group else resource, sub) if x) or "(non-resource)"
    return f"{verb} {what} -> {code}"


def subtract(a: dict, b: dict) -> dict:
    return {k: v - b.get(k, 0.0) for k, v in a.items() if v - b.get(k, 0.0) > 0}


@dataclass
class Health:
    """What the API servers answered during one module."""
    errors: dict[Key, float]
    excused: dict[Key, float]
    reasons: list[str]
    rejected: dict[tuple[str, str], float]
    note: str = ""
    storage: str = ""     # etcd's latency as kube-apiserver saw it, when there were errors (storage_latency)
    metrics: str = ""     # the scrape that ended the window (SCRAPED), for what else it tells (apiwork)

    def error_line(self) -> str:
        line = "; ".join(f"{describe(k)} x{int(v)}" for k, v in sorted(self.errors.items(), key=lambda kv: -kv[1]))
        return line + (f" ({self.storage})" if line and self.storage else "")

    def report(self) -> str:
        lines = ["429s per flow schema: " + ("; ".join(f"{fs} -> {pl}: {int(n)}" for (fs, pl), n in
                                                       sorted(self.rejected.items())) or "none")]
        lines.append("5xx: " + (self.error_line() or "none"))
        if self.excused:
            lines.append(f"5xx excused ({'; '.join(self.reasons)}): "
                         + "; ".join(f"{describe(k)} x{int(v)}" for k, v in sorted(self.excused.items())))
        if self.note:
            lines.append(self.note)
        return "\n".join(lines)


@dataclass
class Mark:
    text: str | None
    excused: dict[Key, float]
    reasons: int


@dataclass
class ApiGuard:
    """The session's view of the API servers' answers; modules ``excuse`` windows of deliberate breakage."""
    api: client.ApiClient
    replicas: int = 1
    excused: dict[Key, float] = field(default_factory=dict)
    reasons: list[str] = field(default_factory=list)

    def __post_init__(self):
        self._lock = threading.Lock()

    def scrape(self, like: str | None = None) -> str | None:
        try:
            if like is None:
                return apimetrics.scrape(self.api, SCRAPED)
            return apimetrics.scrape_same_replica(self.api, like, prefixes=SCRAPED)
        except Exception:        # the control-plane guard reports an unreachable apiserver itself
            return None

    @contextmanager
    def excuse(self, reason: str):
        """5xx the API servers answer while this block runs are excused (reported, not failed) -- and until
        their count stops moving (``settled``, at most ``SETTLE_S``): an apiserver on a loaded machine counts
        the requests a killed client abandoned a moment after the client is gone (seen in CI: a taint run
        SIGKILLed on purpose, its 6 POSTs of pods counted as 504 after the window had closed)."""
        before = self.scrape()
        try:
            yield
        finally:
            after = self.settled(before) if before else None
            with self._lock:
                self.reasons.append(reason)
                if before and after:
                    for k, v in server_errors(before, after).items():
                        self.excused[k] = self.excused.get(k, 0.0) + v

    def settled(self, before: str) -> str | None:
        """A scrape after which two reads ``SETTLE_EVERY_S`` apart count the same 5xx since ``before`` (the last
        one read if the count still moves after ``SETTLE_S``; None if the counters cannot be read)."""
        reads: list[tuple[str | None, dict]] = []

        def read() -> list[tuple[str | None, dict]]:
            after = self.scrape(before)
            reads.append((after, server_errors(before, after) if after else {}))
            return reads
        try:
            wait_for(read, until=lambda r: r[-1][0] is None or (len(r) > 1 and r[-1][1] == r[-2][1]),
                     timeout=SETTLE_S, interval=SETTLE_EVERY_S, heartbeat_s=0,
                     what="the API servers' 5xx count settled after an excused window")
        except WaitTimeout:
            pass
        return reads[-1][0]

    def mark(self) -> Mark:
        with self._lock:
            return Mark(self.scrape(), dict(self.excused), len(self.reasons))

    def since(self, mark: Mark) -> Health | None:
        """What happened since ``mark`` (None if the counters could not be read twice from one replica)."""
        if mark.text is None:
            return None
        after = self.scrape(mark.text)
        if after is None:
            return None
        with self._lock:
            excused = subtract(self.excused, mark.excused)
            reasons = self.reasons[mark.reasons:]
        errors = server_errors(mark.text, after)
        note = (f"figures of one of {self.replicas} apiserver replicas" if self.replicas > 1 else "")
        return Health(subtract(errors, excused), {k: v for k, v in excused.items() if errors.get(k)}, reasons,
                      rejections(mark.text, after), note, storage_latency(mark.text, after) if errors else "", after)
