"""Watching the preflight contract for a whole run: binds, node states, nodes out of service.

Why a watch and not a look at the end: "no workload pod is ever bound to a
node that has not passed" is about the moment of the bind. A pod that landed
on a node whose taint was removed before its checks finished may look fine a
second later (the node passed after all) -- only the order of events shows
it. Two informers (``clusterproof.kube.informer``: every node, every pod) run from
the start of the module to its end:

- per node, the history of "has it passed?" (``Marks.unpassed``) with the
  resourceVersion of each change;
- per workload pod (``is_workload``), the resourceVersion of the event that
  first shows it bound.

A bind is a violation if the node had not passed at the bind's
resourceVersion. Nodes and pods live in the same etcd, whose revisions are
one total order (kube-apiserver's resourceVersion is the etcd revision);
the harness compares them only on the simulated cluster's single etcd or a
real cluster's node/pod store. Binds seen in the first list (before the
watch) are not judged: they happened before the run.

The informers ride out a cut connection by resuming from their last
resourceVersion: every event still arrives, in order. After a relist (410
Gone: the apiserver no longer had those events) the order is lost: a pod
first seen bound in the relist, or bound while the node watch was in such a
gap, was bound at a moment the watch did not see. Such binds are not judged
(neither way) and ``check`` says so in one line: the verdict would be a
guess.

The same node informer records, per node of the run's scope, when it was
first seen in each state (pending, failed, released, out-of-service) and the
timeline of nodes out of service (the remediation cap).
"""
from __future__ import annotations

import bisect
import threading
import time
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.kube.informer import Informer, InformerError
from clusterproof.preflight.contract import Marks, is_workload, max_out_at_once


def _int(rv: str) -> int:
    try:
        return int(rv)
    except ValueError:
        return 0


def _rv(obj: dict) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:
        return 0


@dataclass
class Bind:
    pod: str          # namespace/name
    node: str
    rv: int
    at: float         # monotonic, when the harness saw it
    unseen: bool = False   # first seen in a relist: bound at a moment the watch did not see


@dataclass
class NodeHistory:
    rvs: list[int] = field(default_factory=list)
    unpassed: list[bool] = field(default_factory=list)
    why: list[str] = field(default_factory=list)

    def at(self, rv: int) -> tuple[bool, str] | None:
        """Whether the node had not passed at ``rv`` (None: nothing known before ``rv``)."""
        i = bisect.bisect_right(self.rvs, rv) - 1
        return None if i < 0 else (self.unpassed[i], self.why[i])


class ContractWatch:
    """Every node and every pod, from ``start()`` to ``stop()``; see the module docstring."""

    def __init__(self, api: client.ApiClient, marks: Marks, scope: tuple[str, str] | None = None):
        self.marks, self.scope = marks, scope
        self.lock = threading.Lock()
        self.history: dict[str, NodeHistory] = {}
        self.binds: dict[str, Bind] = {}
        self.first_in_state: dict[str, dict[str, float]] = {}     # node -> state -> monotonic
        self.out: set[str] = set()
        self.out_timeline: list[tuple[float, frozenset[str]]] = []
        self.gone: dict[str, float] = {}
        self.pod_list_rv = 0
        # Short watch chunks: a stop waits for the current one to end (a resumed watch costs no list).
        self.nodes = Informer(api, "/api/v1/nodes", on_event=self._node, chunk_s=5)
        self.pods = Informer(api, "/api/v1/pods", on_event=self._pod, chunk_s=5)

    def start(self) -> "ContractWatch":
        self.nodes.start()
        self.pods.start()
        self.pod_list_rv = int(self.pods.rv or 0)
        return self

    def stop(self) -> None:
        self.nodes.stop()
        self.pods.stop()

    def check(self) -> None:
        """Raise (one line) if an informer gave up, or if binds happened where the watch has a gap."""
        self.nodes.check()
        self.pods.check()
        missed = self.unjudged()
        if missed:
            gaps = [f"{what} {a}->{b}" for what, inf in (("pods", self.pods), ("nodes", self.nodes))
                    for a, b in inf.gaps]
            raise InformerError(f"the contract watch missed the moment of {len(missed)} bind(s): it had to relist "
                                f"(410 Gone; resourceVersions {', '.join(gaps)}), so whether their nodes had passed "
                                f"then is unknown: {'; '.join(missed[:5])}")

    def _in_gap(self, b: Bind) -> bool:
        return b.unseen or any(_int(lo) < b.rv <= _int(hi) for lo, hi in self.nodes.gaps)

    def unjudged(self) -> list[str]:
        """Binds after the watch began that it cannot judge (see the module docstring)."""
        with self.lock:
            return [f"pod {b.pod} on node {b.node}" for b in sorted(self.binds.values(), key=lambda b: b.rv)
                    if b.rv > self.pod_list_rv and self._in_gap(b)]

    def in_scope(self, node: dict) -> bool:
        if self.scope is None:
            return True
        return (node["metadata"].get("labels") or {}).get(self.scope[0]) == self.scope[1]

    def _node(self, kind: str, node: dict) -> None:
        name, now = node["metadata"]["name"], time.monotonic()
        with self.lock:
            if kind == "DELETED":
                self.gone.setdefault(name, now)
                if name in self.out:
                    self.out.discard(name)
                    self.out_timeline.append((now, frozenset(self.out)))
                return
            h = self.history.setdefault(name, NodeHistory())
            unpassed, why = self.marks.unpassed(node), self._why(node)
            if not h.unpassed or (h.unpassed[-1], h.why[-1]) != (unpassed, why):
                h.rvs.append(_rv(node))
                h.unpassed.append(unpassed)
                h.why.append(why)
            if not self.in_scope(node):
                return
            self.first_in_state.setdefault(name, {}).setdefault(self.marks.state(node), now)
            was_out = name in self.out
            if self.marks.out_of_service(node) != was_out:
                (self.out.add if not was_out else self.out.discard)(name)
                self.out_timeline.append((now, frozenset(self.out)))

    def _why(self, node: dict) -> str:
        m, parts = self.marks, []
        if m.label(node) is not None:
            parts.append(f"label {m.label_key}={m.label(node)}")
        if m.tainted(node):
            parts.append(f"taint {m.taint_key}")
        if m.reason(node) is not None:
            parts.append(f"reason {m.reason_key}={m.reason(node)}")
        return ", ".join(parts)

    def _pod(self, kind: str, pod: dict) -> None:
        node = pod.get("spec", {}).get("nodeName")
        if kind == "DELETED" or not node:
            return
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        with self.lock:
            if key not in self.binds and is_workload(pod, self.marks.taint_key):
                self.binds[key] = Bind(key, node, _rv(pod), time.monotonic(), unseen=self.pods.relisting)

    # --- verdicts -----------------------------------------------------------------------------------

    def violations(self) -> list[str]:
        """Every workload pod bound (after the watch began) to a node that had not passed at that moment."""
        out = []
        with self.lock:
            for b in sorted(self.binds.values(), key=lambda b: b.rv):
                if b.rv <= self.pod_list_rv or self._in_gap(b):   # before the watch; or unknowable (check)
                    continue
                h = self.history.get(b.node)
                state = h.at(b.rv) if h else None
                if state is not None and state[0]:
                    out.append(f"pod {b.pod} was bound to node {b.node} while it had not passed preflight "
                               f"({state[1]})")
        return out

    def bound_to(self, nodes: set[str]) -> list[Bind]:
        with self.lock:
            return [b for b in self.binds.values() if b.node in nodes]

    def max_out(self) -> tuple[int, float | None, frozenset[str]]:
        with self.lock:
            return max_out_at_once(list(self.out_timeline))

    def seen(self, name: str, state: str) -> float | None:
        with self.lock:
            return self.first_in_state.get(name, {}).get(state)
