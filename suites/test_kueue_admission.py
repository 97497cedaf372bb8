"""Training jobs admitted through Kueue: whole or not at all, against quota.

A team running a large GPU cluster today admits its training jobs through
Kueue (quota per ClusterQueue, all-or-nothing admission of a workload) and
submits them as JobSets; the default kube-scheduler places the pods. The
embedded cluster runs Kueue v0.17.0 and JobSet v0.11.1 for these checks
(``clusterproof.cluster.kueue``); each check's ClusterQueue covers a few
scratch kwok nodes of its own, so its quota and free capacity are exact.
"""
from __future__ import annotations

import time

import pytest

from clusterproof.core.waiting import wait_for
from clusterproof.gang import kueue_jobs as kq
from clusterproof.kube.client import delete_if_present

pytestmark = pytest.mark.kueue


def test_a_jobset_is_admitted_whole_or_not_at_all_under_its_quota(cluster, profile, run_id, kueue_namespace,
                                                                   kueue_nodes, figures):
    """A JobSet that fits its ClusterQueue's quota gets every pod bound; while it runs, a second one of the same
    size and one larger than the whole quota start no pod at all; once the first is deleted the second is
    admitted whole, the larger one still not. Red: a partial start (named, with its pods and Kueue's word on
    its Workload), or a JobSet never admitted."""
    api, n, gpus, ns = cluster.api, profile.gang_nodes, profile.node_gpus, kueue_namespace
    q = kq.make_queues(api, run_id, ns, f"whole-{run_id[-6:]}", kueue_nodes, gpu_quota=n * gpus)
    queue = q.local_queue if profile.kueue_admission else None
    quota = f"a quota of {n * gpus} GPUs"
    try:
        kq.submit(api, ns, kq.jobset("fits", run_id, queue, n, gpus))
        _wait_all_bound(api, ns, "fits", n, profile, f"JobSet fits ({n} pods, {quota})")
        kq.submit(api, ns, kq.jobset("waits", run_id, queue, n, gpus))
        kq.submit(api, ns, kq.jobset("too-big", run_id, queue, n + 1, gpus))
        for name, size, why in (("waits", n, "while JobSet fits holds the whole quota"),
                                ("too-big", n + 1, "larger than the whole quota")):
            pods = kq.pods_within(api, ns, name, profile.gang_observe_s)
            w = kq.workload_of(api, ns, name)
            assert not pods, (f"JobSet {name} ({size} pods against {quota}, {why}) started partly: {len(pods)} "
                              f"pods {sorted(pods)[:5]}; {kq.describe_workload(w)}")
            assert w is not None, f"Kueue made no Workload for JobSet {name}: it is suspended, but not queued"
            assert kq.condition(w, "QuotaReserved").get("status") != "True", kq.describe_workload(w)
        kq.delete_jobsets(api, ns, ["fits"])
        freed = time.monotonic()
        _wait_all_bound(api, ns, "waits", n, profile, f"JobSet waits ({n} pods) once the quota was free")
        figures.add("quota freed -> the waiting JobSet admitted and every pod bound", time.monotonic() - freed, "s",
                    profile.gang_bind_timeout_s)
        pods = kq.pods_of(api, ns, "too-big")
        assert not pods, f"JobSet too-big ({n + 1} pods against {quota}) started partly: {sorted(pods)[:5]}"
    finally:
        kq.delete_jobsets(api, ns, ["fits", "waits", "too-big"])
        q.delete(api)


def test_a_higher_priority_jobset_preempts_a_whole_workload_never_part_of_one(cluster, profile, run_id,
                                                                             kueue_namespace, kueue_nodes, figures):
    """With the quota held by a low-priority JobSet, a high-priority one of the same size preempts it: every
    pod of the low one goes, the high one is admitted whole. Red: part of the low JobSet still running beside
    the high one (a partial preemption, named), or the high one never admitted."""
    api, n, gpus, ns = cluster.api, profile.gang_nodes, profile.node_gpus, kueue_namespace
    tag = run_id[-6:]
    classes = kq.make_priority_classes(api, run_id, {f"low-{tag}": 100, f"high-{tag}": 1000})
    q = kq.make_queues(api, run_id, ns, f"preempt-{tag}", kueue_nodes, gpu_quota=n * gpus,
                       preemption={"withinClusterQueue": "LowerPriority"})
    queue = q.local_queue if profile.kueue_admission else None
    try:
        kq.submit(api, ns, kq.jobset("low", run_id, queue, n, gpus, priority_class=f"low-{tag}"))
        _wait_all_bound(api, ns, "low", n, profile, f"JobSet low ({n} pods, priority 100)")
        kq.submit(api, ns, kq.jobset("high", run_id, queue, n, gpus, priority_class=f"high-{tag}"))
        t = time.monotonic()
        _wait_all_bound(api, ns, "high", n, profile, f"JobSet high ({n} pods, priority 1000)")
        figures.add("high-priority JobSet created -> the low one preempted and every pod of the high one bound",
                    time.monotonic() - t, "s", profile.gang_bind_timeout_s)
        left = {p: node for p, node in kq.pods_of(api, ns, "low").items() if node}
        w = kq.workload_of(api, ns, "low")
        assert not left, (f"JobSet low was preempted only in part: {len(left)} of its {n} pods still bound "
                          f"({sorted(left)[:5]}) beside the whole high-priority JobSet; {kq.describe_workload(w)}")
        assert kq.condition(w, "Evicted").get("reason") == "Preempted", kq.describe_workload(w)
    finally:
        kq.delete_jobsets(api, ns, ["low", "high"])
        q.delete(api)
        for path in classes:
            delete_if_present(api, path)


def test_a_jobset_that_requires_one_rack_lands_in_one_rack_or_is_not_admitted(cluster, profile, run_id,
                                                                             kueue_namespace, kueue_racks):
    """Topology-aware scheduling: with two racks of free nodes, a JobSet that requires one rack and fits in one
    has every pod bound in a single rack; one a node larger than a rack starts no pod, although the quota
    covers it. Red: a JobSet spread over racks (named, with its pods' racks), or a fitting one never
    admitted (nodes without the topology's labels)."""
    api, gpus, ns = cluster.api, profile.node_gpus, kueue_namespace
    place, per_rack = kueue_racks
    tag = run_id[-6:]
    rack = profile.topology_rack_label
    topology = kq.make_topology(api, run_id, f"racks-{tag}",
                                [profile.topology_block_label, rack, "kubernetes.io/hostname"])
    q = kq.make_queues(api, run_id, ns, f"topo-{tag}", place, gpu_quota=2 * per_rack * gpus,
                       topology=f"racks-{tag}")
    queue = q.local_queue if profile.kueue_admission else None
    one_rack = {kq.REQUIRED_TOPOLOGY: rack}
    try:
        kq.submit(api, ns, kq.jobset("one-rack", run_id, queue, per_rack, gpus, pod_annotations=one_rack))
        _wait_all_bound(api, ns, "one-rack", per_rack, profile, f"JobSet one-rack ({per_rack} pods, one rack)")
        pods = kq.pods_of(api, ns, "one-rack")
        racks = kq.node_labels(api, list(pods.values()), rack)
        assert len(set(racks.values())) == 1 and None not in racks.values(), (
            f"JobSet one-rack ({per_rack} pods required in one rack) spans racks: "
            + ", ".join(f"{p} on {n} ({racks.get(n)})" for p, n in sorted(pods.items())))
        kq.delete_jobsets(api, ns, ["one-rack"])
        kq.submit(api, ns, kq.jobset("wider", run_id, queue, per_rack + 1, gpus, pod_annotations=one_rack))
        pods = kq.pods_within(api, ns, "wider", profile.gang_observe_s)
        assert not pods, (f"JobSet wider ({per_rack + 1} pods required in one rack of {per_rack} nodes) started: "
                          f"{sorted(pods)[:5]}; {kq.describe_workload(kq.workload_of(api, ns, 'wider'))}")
    finally:
        kq.delete_jobsets(api, ns, ["one-rack", "wider"])
        q.delete(api)
        delete_if_present(api, topology)


def _wait_all_bound(api, ns: str, name: str, n: int, profile, what: str) -> None:
    wait_for(lambda: kq.pods_of(api, ns, name), until=lambda p: len(p) == n and all(p.values()),
             timeout=profile.gang_bind_timeout_s, interval=0.5, what=f"{what}: admitted and every pod bound",
             describe=lambda p: f"{sum(1 for v in p.values() if v)} of {n} pods bound; "
                                f"{kq.describe_workload(kq.workload_of(api, ns, name))}")
