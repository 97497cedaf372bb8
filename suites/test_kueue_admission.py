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


def _wait_all_bound(api, ns: str, name: str, n: int, profile, what: str) -> None:
    wait_for(lambda: kq.pods_of(api, ns, name), until=lambda p: len(p) == n and all(p.values()),
             timeout=profile.gang_bind_timeout_s, interval=0.5, what=f"{what}: admitted and every pod bound",
             describe=lambda p: f"{sum(1 for v in p.values() if v)} of {n} pods bound; "
                                f"{kq.describe_workload(kq.workload_of(api, ns, name))}")
