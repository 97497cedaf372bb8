"""Simulated GPU nodes: create the profile's node plan fast, and follow it to Ready.

Why Python threads and not ``kwokctl scale``: every pool has its own labels
and taints, and the same plan is what the suites check against. Bodies are
plain dicts and responses are not decoded into models, so the client does
~1k creates/s on two cores; the admin identity is APF-exempt, which is
right for building the cluster (not for load -- see load/).
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Iterator

from kubernetes import client

from clusterproof.cluster.node_plan import NodePool, kubelet_labels, node_plan, node_pod_cidrs, topology_labels
from clusterproof.config.profile import Profile
from clusterproof.core.run import RUN_LABEL, owner_annotations
from clusterproof.core.waiting import WaitTimeout
from clusterproof.kube.client import KWOK_ANNOTATION, raw_request
from clusterproof.kube.informer import Informer
from clusterproof.kube.nodes import has_ready_condition, is_ready


def node_name(p: Profile, pool: NodePool, index: int) -> str:
    return f"{p.node_name_prefix}-{pool.name}-{index:05d}"


def node_bodies(p: Profile, run_id: str) -> Iterator[dict]:
    annotations = {KWOK_ANNOTATION: "fake", **owner_annotations()}
    cidrs = iter(node_pod_cidrs(p.node_pod_cidr, p.nodes) if p.node_pod_cidr else [])
    index = 0
    for pool in node_plan(p):
        for i in range(pool.count):
            name = node_name(p, pool, i)
            topology, index = topology_labels(p, index), index + 1
            spec = {"taints": [t.as_dict() for t in pool.taints]}
            cidr = next(cidrs, None)
            if cidr:  # pod IPs per node, as on a real cluster (kwok allocates from it)
                spec.update(podCIDR=cidr, podCIDRs=[cidr])
            yield {
                "apiVersion": "v1", "kind": "Node",
                "metadata": {
                    "name": name, "annotations": annotations,
                    "labels": {**kubelet_labels(name), "type": "kwok",
                               "nvidia.com/gpu.present": "true", RUN_LABEL: run_id,
                               **topology, **pool.labels},
                },
                "spec": spec,
                "status": {"capacity": pool.capacity, "allocatable": pool.capacity,
                           "nodeInfo": {"kubeletVersion": "fake", "operatingSystem": "linux",
                                        "architecture": "amd64"}},
            }


def create_nodes(api: client.ApiClient, p: Profile, run_id: str,
                 progress: Callable[[str], None]) -> int:
    """Create every node of the plan in parallel; AlreadyExists counts as created."""
    bodies = list(node_bodies(p, run_id))
    total, done, last = len(bodies), 0, time.monotonic()

    def create(body: dict) -> None:
        try:
            raw_request(api, "POST", "/api/v1/nodes", body=body).data  # read: frees the connection
        except client.ApiException as e:
            if e.status != 409:
                raise RuntimeError(f"creating node {body['metadata']['name']} failed: "
                                   f"{e.status} {e.reason}") from None

    with ThreadPoolExecutor(max_workers=p.node_create_concurrency) as pool:
        for _ in pool.map(create, bodies):
            done += 1
            if time.monotonic() - last > 5 or done == total:
                progress(f"nodes created: {done}/{total}")
                last = time.monotonic()
    return total


@dataclass
class ReadyTracker:
    """Which nodes are Ready, and which are also schedulable, fed by a watch.

    Two moments matter and differ at scale: when every node reports
    Ready=True (kwok's work) and when the node lifecycle controller has lifted
    every not-ready taint (kube-controller-manager's work, rate-limited).
    """
    expected: int
    ready: set = field(default_factory=set)
    condition: set = field(default_factory=set)
    seen: set = field(default_factory=set)
    all_condition_at: float | None = None

    def apply(self, kind: str, node: dict) -> None:
        name = node["metadata"]["name"]
        for s in (self.seen, self.ready, self.condition):
            s.discard(name)
        if kind == "DELETED":
            return
        self.seen.add(name)
        if has_ready_condition(node):
            self.condition.add(name)
            if is_ready(node):
                self.ready.add(name)
        if self.all_condition_at is None and len(self.condition) >= self.expected:
            self.all_condition_at = time.monotonic()

    def done(self) -> bool:
        return len(self.ready) >= self.expected

    def __str__(self) -> str:
        return (f"{len(self.ready)}/{self.expected} Ready and schedulable, "
                f"{len(self.condition)} Ready=True, {len(self.seen)} registered")


def wait_ready(api: client.ApiClient, run_id: str, expected: int, timeout: float,
               progress: Callable[[str], None]) -> ReadyTracker:
    tracker = ReadyTracker(expected)
    deadline = time.monotonic() + timeout
    last = [time.monotonic()]

    def apply(kind: str, node: dict) -> None:
        tracker.apply(kind, node)
        if time.monotonic() - last[0] > 5:
            progress(f"nodes: {tracker}")
            last[0] = time.monotonic()

    Informer(api, "/api/v1/nodes", {"labelSelector": f"{RUN_LABEL}={run_id}"}, apply).run(
        tracker.done, deadline, what=f"all {expected} nodes Ready and schedulable", status=tracker.__str__)
    if not tracker.done():
        raise WaitTimeout(f"all {expected} nodes Ready and schedulable: not reached within "
                          f"{timeout:g} s; last seen: {tracker}")
    progress(f"nodes: {tracker}")
    return tracker
