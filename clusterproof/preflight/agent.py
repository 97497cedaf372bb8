"""The harness's reference GPU preflight agent: the cluster's preflight DaemonSet and remediation, simulated.

Why it exists: kwok nodes run no containers, so no DaemonSet pod can test a
simulated node's GPUs. This process plays that part on a simulated cluster,
with the real checker (``clusterproof.preflight.checker.checker``, real pynvml) against each
node's simulated GPUs (the mock NVML library, the machine chosen per check:
one process checks thousands of nodes, ~2 ms each). It does what the seed
cluster's machinery does (``clusterproof.preflight.contract`` names the marks):

- a node that joins under preflight (label ``pending``, taint) is checked as
  soon as it reports Ready=True (its kubelet would start the DaemonSet pod
  then; the lifecycle controller's not-ready taint may still be on it); its
  verdict counts once the XID watch window has passed (a
  DaemonSet pod watches that long; nodes are checked in parallel, as pods
  are, so the window delays each node but not the others). Pass: taint and
  label removed in one conditional write. Fail: taint kept, cordoned, reason
  label, condition, Event;
- every ``active_period_s`` it checks the in-service nodes again; a node gone
  bad is cordoned, labelled, given the condition and an Event, and drained
  with the Eviction API (a PodDisruptionBudget's 429 is waited out, never
  bypassed) -- unless ``max_unavailable`` nodes are already out, then it
  stays in service with a "deferred" Event until one returns.

It acts only on nodes matching ``--scope`` (the run's own scratch nodes).
Modes other than ``healthy`` are the suite's negative controls:
``ignore-xid79`` (releases a node despite XID 79), ``untaint-early`` (removes
the taint before the checks finish), ``ignore-cap`` (remediates every bad
node at once), ``ignore-pdb`` (drains by deleting pods instead of evicting them).

It writes what it did (decisions, drains, its own API requests by verb and
resource, check times) to ``--status`` as JSON, every second and at exit.
Run: ``python -m clusterproof.preflight.agent --kubeconfig K --scope k=v ...``
with ``LD_LIBRARY_PATH`` on the mock library (``clusterproof.preflight.mock_nvml``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from collections import Counter
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from urllib.parse import urlparse

from kubernetes import client

from clusterproof.core.errors import ArgumentParser
from clusterproof.core.run import RUN_LABEL, owner_annotations
from clusterproof.kube.apicalls import CallRecorder
from clusterproof.kube.client import list_raw, load_client, raw_request
from clusterproof.kube.informer import Informer
from clusterproof.kube.node_taints import patch_node
from clusterproof.kube.nodes import has_ready_condition, is_ready
from clusterproof.kube.ownership import OwnerRecord
from clusterproof.preflight.checker import xids
from clusterproof.preflight.checker.checker import CannotCheck, Options, check
from clusterproof.preflight.contract import FAILED, Marks, condition_reason, evictable

MODES = ("healthy", "ignore-xid79", "untaint-early", "ignore-cap", "ignore-pdb")
COMPONENT = "clusterproof-preflight-agent"
VERDICT_ANNOTATION = "clusterproof.io/preflight-verdict"
DEFERRED_REASON = "GPUPreflightRemediationDeferred"
DRAINED_REASON = "GPUPreflightDrained"
DRAIN_BLOCKED_REASON = "GPUPreflightDrainBlocked"
STRATEGIC = {"Content-Type": "application/strategic-merge-patch+json", "Accept": "application/json"}


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def request_key(method: str, url: str) -> str:
    """'PATCH https://h/api/v1/nodes/x/status' -> 'PATCH nodes/status' (verb and resource, as the
    apiserver's metrics count them). Pure."""
    parts = [p for p in urlparse(url).path.split("/") if p]
    if parts[:1] == ["api"]:
        parts = parts[2:]
    elif parts[:1] == ["apis"]:
        parts = parts[3:]
    if parts[:1] == ["namespaces"] and len(parts) > 2:
        parts = parts[2:]
    resource = parts[0] if parts else "?"
    sub = parts[2] if len(parts) > 2 else ""
    return f"{method} {resource}" + (f"/{sub}" if sub else "")


@dataclass
class Drain:
    started: float
    evicted: set = field(default_factory=set)
    refused_429: int = 0
    conflicts_504: int = 0    # the apiserver's "couldn't update PodDisruptionBudget due to conflicts"
    done_at: float | None = None
    blocked_said: bool = False
    last_step: float = 0.0


class Agent:
    def __init__(self, api: client.ApiClient, args: argparse.Namespace):
        self.api, self.a = api, args
        self.marks = Marks(args.label_key, args.taint_key, args.reason_key, args.condition_type, args.event_reason)
        ignored = xids.APPLICATION_XIDS | ({79} if args.mode == "ignore-xid79" else set())
        # The XID window is held per node (below), not slept through inside the check.
        self.options = Options(args.expect_gpus, 0, frozenset(ignored))
        self.requests: Counter = Counter()
        self._count_requests()
        self.informer = Informer(api, "/api/v1/nodes", {"labelSelector": args.scope}, chunk_s=5)
        self.pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="agent-write")
        self.checking: dict[str, tuple[float, dict]] = {}      # node -> (verdict due, verdict)
        self.writing: dict[str, Future] = {}
        self.drains: dict[str, Drain] = {}
        self.drain_steps: dict[str, Future] = {}
        self.deferred: set[str] = set()
        self.decisions: dict[str, dict] = {}
        self.sweeps: list[dict] = []
        self.errors: list[str] = []
        self.checks, self.check_seconds = 0, 0.0
        self.next_sweep = 0.0
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def _count_requests(self) -> None:
        original = self.api.call_api

        def counted(method, url, *args, **kwargs):
            with_watch = "watch=true" in url
            self.requests[("WATCH " if with_watch else "") + request_key(method, url)] += 1
            return original(method, url, *args, **kwargs)
        self.api.call_api = counted

    # --- checks -------------------------------------------------------------------------------

    def verdict(self, name: str) -> dict:
        t0 = time.monotonic()
        try:
            v = check(self.options, machine=name)
            out = {"ok": v.ok, "code": v.code, "message": v.summary()}
        except CannotCheck as e:   # a node whose NVML cannot start cannot take GPU work
            out = {"ok": False, "code": "nvml-unavailable", "message": str(e)}
        self.checks += 1
        self.check_seconds += time.monotonic() - t0
        return out

    def decide(self, name: str, phase: str, verdict: dict, acted: str) -> None:
        with self.lock:
            self.decisions[name] = {**verdict, "phase": phase, "action": acted, "at": time.time()}

    # --- writes (in the pool) -------------------------------------------------------------------

    def _write(self, name: str, fn, *args) -> None:
        if name in self.writing and not self.writing[name].done():
            return
        self.writing[name] = self.pool.submit(self._guard, fn, name, *args)

    def _guard(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception as e:  # a controller keeps going; the error is reported in its status
            with self.lock:
                self.errors.append(f"{fn.__name__}{args[:1]}: {type(e).__name__}: {str(e)[:300]}")

    def untaint(self, name: str) -> None:
        def body(n):
            taints = n["spec"].get("taints") or []
            kept = [t for t in taints if t.get("key") != self.marks.taint_key]
            return None if kept == taints else {"spec": {"taints": kept or None}}
        patch_node(self.api, name, body)

    def release(self, name: str, verdict: dict) -> None:
        def body(n):
            if not self.marks.pending(n):
                return None
            kept = [t for t in n["spec"].get("taints") or [] if t.get("key") != self.marks.taint_key]
            return {"metadata": {"labels": {self.marks.label_key: None, self.marks.reason_key: None},
                                 "annotations": {VERDICT_ANNOTATION: "passed"}},
                    "spec": {"taints": kept or None}}
        patch_node(self.api, name, body)
        self.decide(name, "join", verdict, "released")

    def quarantine(self, name: str, verdict: dict) -> None:
        def body(n):
            taints = n["spec"].get("taints") or []
            if not self.marks.tainted(n):   # the untaint-early agent took it off first
                taints = taints + [self.marks.taint]
            return {"metadata": {"labels": {self.marks.label_key: FAILED, self.marks.reason_key: verdict["code"]},
                                 "annotations": {VERDICT_ANNOTATION: verdict["message"][:2000]}},
                    "spec": {"unschedulable": True, "taints": taints}}
        node = patch_node(self.api, name, body)
        self._condition_and_event(name, node, verdict, "failed GPU preflight")
        self.decide(name, "join", verdict, "quarantined")

    def remediate(self, name: str, verdict: dict) -> None:
        node = patch_node(self.api, name, lambda n: {
            "metadata": {"labels": {self.marks.reason_key: verdict["code"]},
                         "annotations": {VERDICT_ANNOTATION: verdict["message"][:2000]}},
            "spec": {"unschedulable": True}})
        self._condition_and_event(name, node, verdict, "went bad in service; cordoned and draining")
        self.decide(name, "in-service", verdict, "cordoned")

    def _condition_and_event(self, name: str, node: dict | None, verdict: dict, what: str) -> None:
        if node is None:
            return
        if self.marks.condition_type:
            raw_request(self.api, "PATCH", f"/api/v1/nodes/{name}/status", headers=STRATEGIC, body={
                "status": {"conditions": [{"type": self.marks.condition_type, "status": "True",
                                           "reason": condition_reason(verdict["code"]), "message": verdict["message"],
                                           "lastTransitionTime": now_iso(), "lastHeartbeatTime": now_iso()}]}}).data
        self.event(node, self.marks.event_reason, f"GPU preflight: {what}: {verdict['message']}")

    def event(self, node: dict, reason: str, message: str) -> None:
        meta = node["metadata"]
        raw_request(self.api, "POST", f"/api/v1/namespaces/{self.a.events_namespace}/events", body={
            "metadata": {"generateName": f"{meta['name']}.", "labels": {RUN_LABEL: self.a.run_id},
                         "annotations": owner_annotations()},
            "involvedObject": {"kind": "Node", "apiVersion": "v1", "name": meta["name"], "uid": meta.get("uid", "")},
            "reason": reason, "message": message[:1000], "type": "Warning",
            "source": {"component": COMPONENT}, "reportingComponent": COMPONENT,
            "reportingInstance": socket.gethostname()[:128],
            "firstTimestamp": now_iso(), "lastTimestamp": now_iso(), "count": 1}).data

    def drain_step(self, name: str) -> None:
        d = self.drains[name]
        pods = list_raw(self.api, "/api/v1/pods", {"fieldSelector": f"spec.nodeName={name}"})["items"]
        left = [p for p in pods if evictable(p)]
        if not left:
            d.done_at = time.time()
            node = self.informer.get(name)
            if node is not None:
                self.event(node, DRAINED_REASON, f"GPU preflight: {name} drained: no workload pods left")
            return
        for p in left:
            meta = p["metadata"]
            if meta.get("deletionTimestamp") or meta["uid"] in d.evicted:
                continue
            try:
                if self.a.mode == "ignore-pdb":   # the negative control: straight past the budget
                    raw_request(self.api, "DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}").data
                else:
                    raw_request(self.api, "POST",
                                f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/eviction",
                                body={"apiVersion": "policy/v1", "kind": "Eviction",
                                      "metadata": {"name": meta["name"], "namespace": meta["namespace"]}}).data
                d.evicted.add(meta["uid"])
            except client.ApiException as e:
                if e.status == 429:        # a PodDisruptionBudget says not now: try again later
                    d.refused_429 += 1
                elif e.status == 504:      # evictions under one PDB conflicted 20 times: try again later
                    d.conflicts_504 += 1
                elif e.status != 404:
                    raise
        if not d.blocked_said and time.time() - d.started > self.a.drain_timeout_s:
            d.blocked_said = True
            node = self.informer.get(name)
            if node is not None:
                self.event(node, DRAIN_BLOCKED_REASON, f"GPU preflight: {name} not drained after "
                           f"{self.a.drain_timeout_s:g} s ({len(left)} pod(s) left; PodDisruptionBudgets refused "
                           f"{d.refused_429} eviction(s)); still trying")

    # --- the loop -----------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        nodes = {n["metadata"]["name"]: n for n in self.informer.snapshot()}
        # The untaint-early control waits until nothing else (the lifecycle controller's not-ready taint)
        # keeps pods off, so the gap it opens is real and its failure deterministic.
        up = is_ready if self.a.mode == "untaint-early" else has_ready_condition
        for name, node in nodes.items():
            if self.marks.pending(node) and up(node) and name not in self.checking \
                    and (name not in self.writing or self.writing[name].done()) \
                    and self.decisions.get(name, {}).get("phase") != "join":
                if self.a.mode == "untaint-early":
                    self._write(name, self.untaint)
                self.checking[name] = (now + self.a.xid_window_ms / 1000, self.verdict(name))
        for name, (due, verdict) in list(self.checking.items()):
            if now >= due and (name not in self.writing or self.writing[name].done()):
                del self.checking[name]
                self._write(name, self.release if verdict["ok"] else self.quarantine, verdict)
        if now >= self.next_sweep:
            self.sweep(nodes)
            self.next_sweep = now + self.a.active_period_s
        # The ignore-pdb control deletes the pods of a whole wave together (as a script deleting pods
        # would), so the budget it breaks is broken at one moment, not masked by quick replacements.
        wave_written = all(self.writing[n].done() for n in self.drains if n in self.writing)
        for name, d in self.drains.items():
            step = self.drain_steps.get(name)
            cordoned = name not in self.writing or self.writing[name].done()   # never evict before the cordon
            if self.a.mode == "ignore-pdb":
                cordoned = wave_written
            if d.done_at is None and cordoned and (step is None or step.done()) and now - d.last_step >= 1.0:
                d.last_step = now
                self.drain_steps[name] = self.pool.submit(self._guard, self.drain_step, name)

    def sweep(self, nodes: dict[str, dict]) -> None:
        """The periodic active check of every in-service node in scope."""
        t0 = time.monotonic()
        out = {n for n, node in nodes.items() if self.marks.out_of_service(node)} | {
            n for n, d in self.drains.items() if n in nodes}
        checked = 0
        for name, node in sorted(nodes.items()):
            if self.marks.unpassed(node) or name in self.drains or node["spec"].get("unschedulable") \
                    or not has_ready_condition(node):
                continue
            checked += 1
            verdict = self.verdict(name)
            if verdict["ok"]:
                continue
            if self.a.mode != "ignore-cap" and len(out) >= self.a.max_unavailable:
                if name not in self.deferred:
                    self.deferred.add(name)
                    self.decide(name, "in-service", verdict, "deferred")
                    self.pool.submit(self._guard, self.event, node, DEFERRED_REASON,
                                     f"GPU preflight: {name} went bad in service ({verdict['message']}), but "
                                     f"{len(out)} node(s) are already out for GPU faults (max "
                                     f"{self.a.max_unavailable}): it stays in service until one returns")
                continue
            out.add(name)
            self.deferred.discard(name)
            self.drains[name] = Drain(started=time.time())
            self._write(name, self.remediate, verdict)
        self.sweeps.append({"at": time.time(), "nodes": checked, "seconds": round(time.monotonic() - t0, 4)})

    def status(self) -> dict:
        with self.lock:
            return {"mode": self.a.mode, "scope": self.a.scope, "pid": os.getpid(), "requests": dict(self.requests),
                    "checks": self.checks, "check_seconds": round(self.check_seconds, 4),
                    "decisions": dict(self.decisions), "sweeps": self.sweeps[-50:], "sweep_count": len(self.sweeps),
                    "drains": {n: {"started": d.started, "done_at": d.done_at, "evicted": len(d.evicted),
                                   "refused_429": d.refused_429,
                                   "conflicts_504": d.conflicts_504} for n, d in self.drains.items()},
                    "deferred": sorted(self.deferred), "errors": self.errors[-20:]}

    def write_status(self) -> None:
        tmp = f"{self.a.status}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.status(), f)
        os.replace(tmp, self.a.status)

    def run(self) -> None:
        self.informer.start()
        self.next_sweep = time.monotonic() + self.a.active_period_s
        last_status = 0.0
        try:
            while not self.stop.is_set():
                self.informer.check()
                now = time.monotonic()
                self.tick(now)
                if now - last_status >= 1.0:
                    self.write_status()
                    last_status = now
                self.stop.wait(0.1)     # the controller's own resync period, not a wait for a condition
        finally:
            self.informer.stop()
            self.pool.shutdown(wait=True)
            self.write_status()


def parse(argv: list[str]) -> argparse.Namespace:
    p = ArgumentParser(prog="python -m clusterproof.preflight.agent")   # bad arguments: one line, exit 4
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--scope", required=True, help="label selector of the nodes the agent acts on")
    p.add_argument("--run-id", required=True, help="label put on the Events it creates")
    p.add_argument("--status", required=True, help="JSON file it writes its decisions and counters to")
    p.add_argument("--mode", choices=MODES, default="healthy")
    p.add_argument("--label-key", required=True)
    p.add_argument("--taint-key", required=True)
    p.add_argument("--reason-key", required=True)
    p.add_argument("--condition-type", default="")
    p.add_argument("--event-reason", required=True)
    p.add_argument("--events-namespace", default="default")
    p.add_argument("--expect-gpus", type=int, required=True)
    p.add_argument("--xid-window-ms", type=int, default=2000)
    p.add_argument("--active-period-s", type=float, default=5.0)
    p.add_argument("--max-unavailable", type=int, default=3)
    p.add_argument("--drain-timeout-s", type=float, default=60.0)
    p.add_argument("--owner-record", default="", metavar="NAMESPACE",
                   help="write what it creates into the run's owner record there (clusterproof.kube.ownership)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    api = load_client(args.kubeconfig, pool_size=16)
    if args.owner_record:
        # The run's record exists (the harness made it); the agent adds its Events, uid for uid, so a
        # sweeper can remove them after a killed run.
        OwnerRecord(api, args.owner_record, args.run_id).attach(CallRecorder().install(api))
    agent = Agent(api, args)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stop.set())
    agent.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
