"""The two phases of GPU preflight on a simulated cluster, run and judged: nodes join; nodes go bad in service.

Why here and not in the suite: the suite asserts on them and the benchmark
(``clusterproof/bench/preflight.py``) measures them at a larger size -- the same actions,
the same judgement, once. Each returns an outcome: the contract violations
found (``problems``, each naming the node or pod) and the figures.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.core import measurement
from clusterproof.core.run import metadata
from clusterproof.core.stats import percentile
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import delete_if_present, list_raw, raw_request
from clusterproof.kube.informer import Informer
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import delete_run_pods, list_pods
from clusterproof.preflight.contract import evictable
from clusterproof.preflight.mock_nvml import BENIGN, FAULTS
from clusterproof.preflight.run import PreflightRun, node_events

# Kinds that hit in-service nodes, in order (each node gets the next).
IN_SERVICE_KINDS = ("xid-79", "ecc-uncorrectable", "nvlink-down", "gpu-lost", "row-remap-pending", "xid-94",
                    "hw-slowdown", "pcie-degraded")
RS_LABEL = "clusterproof.io/preflight-inservice"
# A decision is several writes (labels and cordon, then the condition, then the Event): once a node
# shows the first, the rest must follow within this.
SAYS_WHY_S = 30


def what(run: PreflightRun, name: str) -> str:
    """What the run did to a node's GPUs, for messages."""
    kind = run.plan.get(name)
    if kind in FAULTS:
        return f"injected: {FAULTS[kind].what}"
    return f"healthy, {BENIGN[kind].what}" if kind in BENIGN else "healthy"


def _node(run: PreflightRun, name: str) -> dict | None:
    return run.watch.nodes.get(name)


# --- nodes join -----------------------------------------------------------------------------------------

@dataclass
class JoinOutcome(measurement.Base):
    """Joining nodes decided (``settle_join``, which watches around the join: ``Base``'s start and dispose)."""
    problems: list[str] = field(default_factory=list)
    decided_s: dict[str, float] = field(default_factory=dict)    # node -> join seen -> decision seen
    quarantine_s: list[float] = field(default_factory=list)
    release_s: list[float] = field(default_factory=list)

    def quarantine_p(self, q: float) -> float:
        return percentile(self.quarantine_s, q)

    @property
    def release_p99_s(self) -> float:
        return percentile(self.release_s, 99)

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f("quarantine_p50_s", self.quarantine_p(50), "s"), f("quarantine_p99_s", self.quarantine_p(99), "s"),
                f("release_p99_s", self.release_p99_s, "s"), f("problems", len(self.problems), "")]


def settle_join(api: client.ApiClient, run: PreflightRun, bound: float) -> JoinOutcome:
    """Wait (``bound``) until every joining node is quarantined or released, then judge each one."""
    marks, out = run.marks, JoinOutcome()

    def undecided():
        run.alive()
        return sorted(n for n in run.names
                      if marks.state(_node(run, n) or {"metadata": {}}) not in ("failed", "released"))
    try:
        wait_for(undecided, until=lambda left: not left, timeout=bound, interval=0.5,
                 what=f"all {len(run.names)} joining nodes quarantined or released")
    except WaitTimeout as e:
        out.problems.append(str(e))

    def unexplained():
        """Quarantined nodes whose condition or Event is not there yet (a decision is several writes)."""
        events = node_events(api, marks.event_reason)
        return events, sorted(n for n in run.names if marks.state(_node(run, n) or {"metadata": {}}) == "failed"
                              and (not events.get(n) or (marks.condition_type and not marks.condition(_node(run, n)))))
    try:
        events, _ = wait_for(unexplained, until=lambda r: not r[1], timeout=SAYS_WHY_S, interval=0.5,
                             what="every quarantined node's condition and Event written")
    except WaitTimeout:
        events, _ = unexplained()   # judged below, node by node
    for name in run.names:
        node, code = _node(run, name), run.faults.expected_code(name)
        if node is None:
            out.problems.append(f"node {name} is gone")
            continue
        state = marks.state(node)
        joined = run.watch.seen(name, "pending")
        t = run.watch.seen(name, state) if state in ("failed", "released") else None
        if joined is not None and t is not None:
            out.decided_s[name] = t - joined
            (out.quarantine_s if code else out.release_s).append(t - joined)
            if t - joined > bound:
                out.problems.append(f"node {name} was {state} only {t - joined:.1f} s after it joined "
                                    f"(bound {bound} s)")
        if code and state == "released":
            out.problems.append(f"node {name} ({what(run, name)}) was released; it must stay quarantined with "
                                f"reason {code}")
        elif code and state == "failed":
            out.problems += marks.quarantine_problems(node, code, events.get(name, []))
        elif not code and state == "failed":
            cond = marks.condition(node) or {}
            out.problems.append(f"node {name} ({what(run, name)}) was quarantined with reason {marks.reason(node)}: "
                                f"{cond.get('message', '')}")
        elif not code:
            out.problems += marks.release_problems(node)
    return out


# --- nodes go bad in service ------------------------------------------------------------------------------

class ReadyCount:
    """Ready pods of one ReplicaSet over time (what its PodDisruptionBudget protects), from a watch."""

    def __init__(self, api: client.ApiClient, ns: str):
        self.ready: dict[str, bool] = {}
        self.low: tuple[int, float] | None = None     # (fewest Ready, when), once armed
        self.armed = False
        self.informer = Informer(api, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": RS_LABEL}, self._apply,
                                 chunk_s=5)

    def _apply(self, kind: str, pod: dict) -> None:
        ok = kind != "DELETED" and not pod["metadata"].get("deletionTimestamp") and any(
            c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions") or [])
        self.ready[pod["metadata"]["name"]] = ok
        n = self.count()
        if self.armed and (self.low is None or n < self.low[0]):
            self.low = (n, time.time())

    def count(self) -> int:
        return sum(self.ready.values())


def replicaset(ns: str, run_id: str, run: PreflightRun, replicas: int, gpus: int) -> tuple[dict, dict]:
    """A ReplicaSet of whole-node pods on the run's nodes, and its PDB (one pod may be down at a time)."""
    tmpl = pod_body("inservice", run_id, gpus=gpus, labels={RS_LABEL: "rs"}, node_selector=run.selector,
                    tolerations=[run.toleration])
    rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": metadata("inservice", run_id, {RS_LABEL: "rs"}),
          "spec": {"replicas": replicas, "selector": {"matchLabels": {RS_LABEL: "rs"}},
                   "template": {"metadata": {"labels": tmpl["metadata"]["labels"]}, "spec": tmpl["spec"]}}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": metadata("inservice", run_id),
           "spec": {"minAvailable": replicas - 1, "selector": {"matchLabels": {RS_LABEL: "rs"}}}}
    return rs, pdb


def drained(api: client.ApiClient, node: str) -> bool:
    pods = list_raw(api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={node}"})["items"]
    return not [p for p in pods if evictable(p)]


@dataclass
class InServiceOutcome(measurement.Base):
    """Nodes going bad in service, remediated (``go_bad_in_service``: ``Base``'s start and dispose)."""
    victims: dict[str, str] = field(default_factory=dict)      # node -> fault kind
    problems: list[str] = field(default_factory=list)
    cordon_s: list[float] = field(default_factory=list)        # fault (or freed slot) -> cordoned (watch)
    drained_s: list[float] = field(default_factory=list)       # fault (or freed slot) -> drained (0.5 s polls)
    waves: list[list[str]] = field(default_factory=list)
    most_out: int = 0
    fewest_ready: int | None = None
    replicas: int = 0

    @property
    def cordon_p99_s(self) -> float:
        return percentile(self.cordon_s, 99)

    @property
    def drained_p99_s(self) -> float:
        return percentile(self.drained_s, 99)

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f("most_out", self.most_out, "nodes"), f("cordon_p99_s", self.cordon_p99_s, "s"),
                f("drained_p99_s", self.drained_p99_s, "s"), f("fewest_ready", self.fewest_ready, "pods"),
                f("problems", len(self.problems), "")]


def go_bad_in_service(api: client.ApiClient, run: PreflightRun, profile, ns: str, run_id: str) -> InServiceOutcome:
    """``preflight_inservice_faults`` nodes running a PDB-protected ReplicaSet go bad at once.

    The first wave (at most the cap) must be cordoned and drained within
    ``preflight_remediation_timeout_s``; the nodes out are then sent for
    repair (deleted), which frees their slots, and the next wave must follow
    within the same bound. Judged: the cap over the whole phase (the contract
    watch's timeline), the PDB (fewest Ready pods), each node's marks.
    """
    marks, cap, k = run.marks, profile.preflight_max_unavailable, profile.preflight_inservice_faults
    bound = profile.preflight_remediation_timeout_s
    out = InServiceOutcome(replicas=k + 3)
    rs, pdb = replicaset(ns, run_id, run, out.replicas, profile.node_gpus)
    raw_request(api, "POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", body=rs).data
    raw_request(api, "POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", body=pdb).data
    ready = ReadyCount(api, ns)
    ready.informer.start()
    try:
        wait_for(ready.count, until=lambda n: n == out.replicas, timeout=bound, interval=0.5,
                 what=f"{out.replicas} ReplicaSet pods Ready on released nodes")
        ready.armed = True
        hosts = sorted({p["spec"]["nodeName"] for p in list_pods(api, ns, RS_LABEL).values()})
        out.victims = {n: IN_SERVICE_KINDS[i % len(IN_SERVICE_KINDS)] for i, n in enumerate(hosts[:k])}
        run.plan.update(out.victims)
        since = time.monotonic()
        run.faults.set(out.victims)
        done: set[str] = set()

        def out_and_drained():
            run.alive()
            return sorted(n for n in out.victims if _node(run, n) and marks.out_of_service(_node(run, n))
                          and drained(api, n))
        while len(done) < len(out.victims):
            want = min(cap, len(out.victims) - len(done))
            try:
                now_out = set(wait_for(out_and_drained,
                                       until=lambda o, done=done, want=want: len(set(o) - done) >= want,
                                       timeout=bound, interval=0.5,
                                       what=f"{want} more node(s) gone bad cordoned and drained"))
            except WaitTimeout as e:
                out.problems.append(str(e))
                break
            wave, seen_drained = sorted(now_out - done), time.monotonic()
            out.waves.append(wave)
            out.cordon_s += [(run.watch.seen(n, "out-of-service") or seen_drained) - since for n in wave]
            out.drained_s += [seen_drained - since] * len(wave)
            done |= now_out
            if len(done) < len(out.victims):   # the nodes out go for repair: their slots free up for the rest
                _judge_remediated(api, run, {n: out.victims[n] for n in now_out}, out)
                for n in sorted(now_out):
                    delete_if_present(api, f"/api/v1/nodes/{n}")
                since = time.monotonic()
        _judge_remediated(api, run, {n: k_ for n, k_ in out.victims.items() if n in done and _node(run, n)}, out)
    finally:
        ready.informer.stop()
        delete_if_present(api, f"/apis/apps/v1/namespaces/{ns}/replicasets/inservice")
        delete_run_pods(api, ns, run_id)
    out.most_out, _, which = run.watch.max_out()
    if out.most_out > cap:
        out.problems.append(f"{out.most_out} nodes were out of service at once (cap preflight_max_unavailable={cap}): "
                            f"{', '.join(sorted(which))}")
    out.fewest_ready = ready.low[0] if ready.low else None
    if ready.low is not None and ready.low[0] < out.replicas - 1:
        out.problems.append(f"PodDisruptionBudget inservice (minAvailable {out.replicas - 1}) was overrun: only "
                            f"{ready.low[0]} of {out.replicas} pods were Ready at "
                            f"{time.strftime('%H:%M:%S', time.localtime(ready.low[1]))}")
    slow = [t for t in out.drained_s if t > bound]
    if slow:
        out.problems.append(f"{len(slow)} node(s) cordoned and drained later than {bound} s: "
                            f"{', '.join(f'{t:.1f} s' for t in slow)}")
    return out


def _judge_remediated(api: client.ApiClient, run: PreflightRun, nodes: dict[str, str], out: InServiceOutcome) -> None:
    """Each node taken out carries its reason label, condition and Event (judged before it goes for repair)."""
    if not nodes:
        return
    events = node_events(api, run.marks.event_reason)
    for n, kind in sorted(nodes.items()):
        node = _node(run, n)
        if node is not None:
            out.problems += run.marks.remediation_problems(node, FAULTS[kind].code, events.get(n, []))
