"""Training jobs admitted through Kueue: whole or not at all against quota, requeued rather than deadlocked,
preempted whole, never overtaken by smaller later ones, refused while Kueue is down, placed in one rack when asked.

A team running a large GPU cluster today admits its training jobs through
Kueue (quota per ClusterQueue, all-or-nothing admission of a workload) and
submits them as JobSets; the default kube-scheduler places the pods. The
embedded cluster runs Kueue v0.17.0 and JobSet v0.11.1 for these checks
(``clusterproof.cluster.kueue``); each exact-quota check's ClusterQueue covers
a few scratch kwok nodes of its own, so its quota and free capacity are exact.
On a cluster the harness did not build, the read-only webhook check judges the
cluster's own Kueue and the exact-quota checks are skipped, saying why.
"""
from __future__ import annotations

import time

import pytest
from kubernetes.client import ApiException

from clusterproof.cluster import kueue
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.gang import kueue_jobs as kq
from clusterproof.gang.gangs import node_labels
from clusterproof.kube.client import delete_if_present

pytestmark = pytest.mark.kueue


def test_kueues_webhooks_refuse_a_job_while_kueue_is_down_rather_than_admit_it(cluster, judged_kueue):
    """Read-only, on any cluster that runs Kueue: every webhook of Kueue's configurations that intercepts the
    creation of a JobSet or a batch Job fails closed (failurePolicy Fail), so while Kueue is down a job is
    refused, never started without quota; and a mutating one stands in front of JobSets (it suspends them until
    admission). Red: a webhook that fails open (Ignore), named with its configuration, or none in front of
    JobSets."""
    hooks = kq.kueue_webhooks(cluster.api)
    assert any(h.which == "mutating" and "jobsets" in h.resources for h in hooks), (
        f"{judged_kueue}: no mutating webhook of a configuration named *kueue* intercepts JobSet creation, so a "
        f"JobSet for a queue is not suspended until Kueue admits it (found: {[h.describe() for h in hooks] or 'none'})")
    open_ = [h.describe() for h in hooks if h.failure_policy != "Fail"]
    assert not open_, (f"{judged_kueue}: {len(open_)} of Kueue's webhooks fail open -- while Kueue is down, jobs "
                       f"are created and start without quota: {'; '.join(open_)}")


def test_a_jobset_is_admitted_whole_or_not_at_all_under_its_quota(cluster, profile, run_id, kueue_namespace,
                                                                   kueue_nodes, figures):
    """A JobSet that fits its ClusterQueue's quota gets every pod bound; while it runs, a second one of the same
    size and one larger than the whole quota start no pod at all; once the first is deleted the second is
    admitted whole, the larger one still not. Red: a partial start (named, with its pods and Kueue's word on
    its Workload), or a JobSet never admitted."""
    api, n, gpus, ns = cluster.api, profile.gang_nodes, profile.node_gpus, kueue_namespace
    q = kq.make_queues(api, run_id, ns, f"whole-{run_id[-6:]}", kueue_nodes.place, gpu_quota=n * gpus)
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
    q = kq.make_queues(api, run_id, ns, f"preempt-{tag}", kueue_nodes.place, gpu_quota=n * gpus,
                       preemption={"withinClusterQueue": profile.kueue_preemption})
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


def test_a_waiting_large_jobset_is_not_overtaken_by_smaller_ones_submitted_after_it(cluster, profile, run_id,
                                                                                    kueue_namespace, kueue_nodes,
                                                                                    figures):
    """A JobSet as large as the quota waits behind running JobSets of 2; each time one finishes, a new JobSet of 2
    is submitted. In a StrictFIFO ClusterQueue (``kueue_queueing``) the large one, first in line, keeps the freed
    quota and is admitted whole once the older ones are done. Red: a newcomer admitted past it (named), so under
    a steady stream of small jobs it never starts."""
    api, n, gpus, ns = cluster.api, profile.gang_nodes, profile.node_gpus, kueue_namespace
    q = kq.make_queues(api, run_id, ns, f"fifo-{run_id[-6:]}", kueue_nodes.place, gpu_quota=n * gpus,
                       queueing=profile.kueue_queueing)
    queue = q.local_queue if profile.kueue_admission else None
    elders = [f"running-{i}" for i in range(n // 2)]
    newcomers = [f"newcomer-{i}" for i in range(len(elders))]
    try:
        for name in elders:
            kq.submit(api, ns, kq.jobset(name, run_id, queue, 2, gpus))
        for name in elders:
            _wait_all_bound(api, ns, name, 2, profile, f"JobSet {name} (2 pods)")
        kq.submit(api, ns, kq.jobset("large", run_id, queue, n, gpus))
        wait_for(lambda: kq.workload_of(api, ns, "large"), timeout=profile.gang_bind_timeout_s, interval=0.5,
                 what="Kueue's Workload for JobSet large (queued behind the running ones)")
        overtook = {}
        for elder, new in zip(elders, newcomers):
            kq.delete_jobsets(api, ns, [elder])
            kq.submit(api, ns, kq.jobset(new, run_id, queue, 2, gpus))
            pods = kq.pods_within(api, ns, new, profile.gang_observe_s)
            if pods:
                overtook[new] = pods
        figures.add("smaller JobSets submitted later admitted ahead of the waiting large one", len(overtook),
                    "JobSets", 0)
        assert not overtook, (
            f"JobSet large ({n} pods, the whole quota, waiting before them) was overtaken by {len(overtook)} smaller "
            f"JobSet(s) submitted after it, admitted into the quota it was waiting for: {', '.join(overtook)} "
            f"(ClusterQueue queueingStrategy {profile.kueue_queueing}); "
            f"{kq.describe_workload(kq.workload_of(api, ns, 'large'))} -- under a steady stream of small jobs it "
            "never starts")
        freed = time.monotonic()
        _wait_all_bound(api, ns, "large", n, profile, f"JobSet large ({n} pods) once the older JobSets finished")
        figures.add("the older JobSets finished -> the waiting large one admitted and every pod bound",
                    time.monotonic() - freed, "s", profile.gang_bind_timeout_s)
    finally:
        kq.delete_jobsets(api, ns, [*elders, "large", *newcomers])
        q.delete(api)


LOST = {"key": "check.clusterproof.io/node-lost", "value": "kueue-requeue", "effect": "NoExecute"}


def test_a_gang_that_cannot_become_ready_is_requeued_and_the_one_behind_it_admitted(cluster, profile, run_id,
                                                                                  kueue_namespace, kueue_nodes,
                                                                                  figures):
    """waitForPodsReady: JobSet stuck holds the whole quota, every rank Ready; JobSet behind (a rank smaller)
    waits. Then a node of stuck is lost. Within Kueue's timeout (``kueue_pods_ready_timeout_s``) stuck is
    evicted whole and requeued with backoff, and behind is admitted with every pod bound. Red: a deadlock
    (both named, with Kueue's word on each), stuck left partly running, or not requeued."""
    # The node is lost by a NoExecute taint: its rank is evicted and the replacement has nowhere to go. The
    # bound is the timeout plus the backoff's base plus gang_bind_timeout_s of slack.
    api, n, gpus, ns = cluster.api, profile.gang_nodes, profile.node_gpus, kueue_namespace
    timeout = profile.kueue_pods_ready_timeout_s
    q = kq.make_queues(api, run_id, ns, f"requeue-{run_id[-6:]}", kueue_nodes.place, gpu_quota=n * gpus)
    queue = q.local_queue if profile.kueue_admission else None
    lost = None
    try:
        kq.submit(api, ns, kq.jobset("stuck", run_id, queue, n, gpus, backoff_limit=n))
        _wait_all_bound(api, ns, "stuck", n, profile, f"JobSet stuck ({n} pods, the whole quota)")
        wait_for(lambda: kq.ready_pods(api, ns, "stuck"), until=lambda r: r[0] == n,
                 timeout=profile.gang_bind_timeout_s, interval=0.5, what=f"the {n} ranks of JobSet stuck Ready")
        kq.submit(api, ns, kq.jobset("behind", run_id, queue, n - 1, gpus))
        node = sorted(kq.pods_of(api, ns, "stuck").values())[0]
        lost = next(x for x in kueue_nodes.nodes if x.name == node)
        lost.taint(LOST)
        t = time.monotonic()
        allowed = timeout + profile.kueue_backoff_base_s + profile.gang_bind_timeout_s
        try:
            _wait_all_bound(api, ns, "behind", n - 1, profile, "JobSet behind", timeout=allowed)
        except WaitTimeout:
            ready, live = kq.ready_pods(api, ns, "stuck")
            pytest.fail(f"deadlock: JobSet stuck kept the quota of {n * gpus} GPUs with {ready} of its {n} ranks "
                        f"Ready (live pods: {live}) for {time.monotonic() - t:.0f} s after node {node} was lost "
                        f"(Kueue's waitForPodsReady allows {timeout} s), while JobSet behind ({n - 1} ranks, which "
                        f"fit) was never admitted. Stuck: {kq.describe_workload(kq.workload_of(api, ns, 'stuck'))}. "
                        f"Behind: {kq.describe_workload(kq.workload_of(api, ns, 'behind'))}", pytrace=False)
        figures.add("a rank's node lost -> the stuck JobSet evicted and every pod of the one behind bound",
                    time.monotonic() - t, "s", allowed)
        w = kq.workload_of(api, ns, "stuck")
        left = {p: nd for p, nd in kq.pods_of(api, ns, "stuck").items() if nd}
        assert not left, (f"JobSet stuck was evicted only in part: {len(left)} of its ranks still bound "
                          f"({sorted(left)[:5]}) beside JobSet behind; {kq.describe_workload(w)}")
        assert ((w or {}).get("status") or {}).get("requeueState", {}).get("count", 0) >= 1 or \
            kq.condition(w, "Evicted").get("reason") == "PodsReadyTimeout", (
                f"JobSet stuck gave up its quota but not by Kueue's requeue: {kq.describe_workload(w)}")
    finally:
        kq.delete_jobsets(api, ns, ["stuck", "behind"])
        q.delete(api)
        if lost is not None:
            lost.untaint(LOST)


def test_with_kueues_webhook_down_a_jobset_is_refused_never_admitted_without_quota(cluster, profile, run_id,
                                                                                  kueue_namespace, kueue_nodes,
                                                                                  supervisor, api_guard):
    """Kueue's manager stopped (its webhooks with it): the API server refuses a JobSet for Kueue's queue, as
    Kueue's webhooks are failurePolicy Fail, so nothing starts without quota; Kueue is started again after.
    Red: a JobSet created while Kueue was down, with the pods it started. Only on the embedded cluster."""
    # The API servers' 5xx while Kueue is down are excused, and reported: the refused create itself is one,
    # and Kueue's requests cut off by its stop are others.
    if cluster.kwok is None or supervisor is None:
        pytest.skip("stops Kueue's manager, which only the embedded cluster the harness started lets it do")
    api, n, gpus, ns = cluster.api, profile.gang_nodes, profile.node_gpus, kueue_namespace
    q = kq.make_queues(api, run_id, ns, f"down-{run_id[-6:]}", kueue_nodes.place, gpu_quota=n * gpus)
    try:
        with api_guard.excuse("Kueue's manager stopped on purpose (the webhook-down check)"), \
                kueue.manager_stopped(cluster.kwok, supervisor):
            try:
                kq.submit(api, ns, kq.jobset("unguarded", run_id, q.local_queue, n, gpus))
                refused = None
            except ApiException as e:
                refused = e
            if refused is None:
                pods = kq.pods_within(api, ns, "unguarded", profile.gang_observe_s)
                pytest.fail(f"JobSet unguarded was created while Kueue's manager was down (its webhooks were "
                            f"not called, so its failurePolicy is not Fail) and {len(pods)} pod(s) started without "
                            f"quota: {sorted(pods)[:5]}", pytrace=False)
        assert refused.status in (500, 502, 503, 504) and "webhook" in (refused.body or ""), (
            f"the JobSet was refused, but not by Kueue's webhook: HTTP {refused.status} {(refused.body or '')[:300]}")
        assert kq.pods_of(api, ns, "unguarded") == {}, "a refused JobSet has pods"
    finally:
        kq.delete_jobsets(api, ns, ["unguarded"])
        q.delete(api)


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
        racks = node_labels(api, list(pods.values()), rack)
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


def _wait_all_bound(api, ns: str, name: str, n: int, profile, what: str, timeout: float | None = None) -> None:
    def describe(pods: dict) -> str:
        return (f"{sum(1 for v in pods.values() if v)} of {n} pods bound; "
                f"{kq.describe_workload(kq.workload_of(api, ns, name))}")
    wait_for(lambda: kq.pods_of(api, ns, name), until=lambda p: len(p) == n and all(p.values()),
             timeout=timeout or profile.gang_bind_timeout_s, interval=0.5,
             what=f"{what}: admitted and every pod bound", describe=describe, explain=describe)
