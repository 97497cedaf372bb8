"""Negative controls for suites/test_kueue_admission.py: each check, run against a cluster broken the way it
guards against, fails and names the fault.

The suite runs as a user would run it (a subprocess). Checks whose fault is a setting of the check itself run
on this session's embedded cluster (``--cp-kubeconfig``): JobSets submitted past Kueue, and (one run, each
fault caught by its own check) a ClusterQueue that never preempts or lets newer workloads past its head
(BestEffortFIFO), and nodes without topology labels. The two
whose fault is Kueue's own configuration run on an embedded cluster of their own, started with that
configuration broken: Kueue without waitForPodsReady, and Kueue's webhooks failurePolicy Ignore.

The healthy run is the gate's: ``./proof test`` runs the whole suite on smoke beside the self-tests. A
fault here never heals, so the controls wait less for it (``FAULT_BOUNDS``): 30 s for a gang that binds
in about a second on a healthy cluster (the suite's own figures, smoke), and Kueue's pods-ready timeout
at 20 s where the Kueue under test has none.
"""
from __future__ import annotations

import os

import pytest

from tests.harness import run_pytest

pytestmark = [pytest.mark.control, pytest.mark.kueue]
SUITE = "suites/test_kueue_admission.py"
WHOLE = "test_a_jobset_is_admitted_whole_or_not_at_all_under_its_quota"
PREEMPT = "test_a_higher_priority_jobset_preempts_a_whole_workload_never_part_of_one"
REQUEUE = "test_a_gang_that_cannot_become_ready_is_requeued_and_the_one_behind_it_admitted"
DOWN = "test_with_kueues_webhook_down_a_jobset_is_refused_never_admitted_without_quota"
TOPOLOGY = "test_a_jobset_that_requires_one_rack_lands_in_one_rack_or_is_not_admitted"
FIFO = "test_a_waiting_large_jobset_is_not_overtaken_by_smaller_ones_submitted_after_it"
FAIL_CLOSED = "test_kueues_webhooks_refuse_a_job_while_kueue_is_down_rather_than_admit_it"
FAULT_BOUNDS = ("gang_bind_timeout_s=30",)


def _run(profile, tmp_path, *sets, select: str, kubeconfig=None, timeout=900):
    args = [SUITE, "--cp-profile", profile.name, "--cp-run-id", f"kqctl-{os.urandom(2).hex()}", "-k", select,
            *(["--cp-kubeconfig", str(kubeconfig)] if kubeconfig else []),
            *[f"--cp-set={s}" for s in (*FAULT_BOUNDS, *sets)]]
    return run_pytest(args, tmp_path, timeout=timeout)


def test_jobsets_submitted_past_kueue_start_partly_and_the_check_says_so(cluster, profile, tmp_path, kueue_started):
    run = _run(profile, tmp_path, "kueue_admission=false", select=WHOLE, kubeconfig=cluster.kubeconfig)
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(WHOLE, "")
    assert f"JobSet waits ({profile.gang_nodes} pods against a quota of" in msg and "started partly" in msg, msg[:3000]


def test_a_queue_that_never_preempts_or_lets_newer_jobs_past_and_unlabelled_racks_are_caught(
        cluster, profile, tmp_path, kueue_started):
    run = _run(profile, tmp_path, "kueue_preemption=Never", "topology_nodes_per_rack=0",
               "kueue_queueing=BestEffortFIFO", select=f"{PREEMPT} or {TOPOLOGY} or {FIFO}",
               kubeconfig=cluster.kubeconfig)
    assert run.returncode == 1, run.output[-3000:]
    preempt, topology, fifo = (run.failures.get(name, "") for name in (PREEMPT, TOPOLOGY, FIFO))
    assert "JobSet large" in fifo and "overtaken by" in fifo and "newcomer-0" in fifo \
        and "BestEffortFIFO" in fifo, fifo[:3000]
    assert "JobSet high" in preempt and "admitted and every pod bound" in preempt and "0 of" in preempt, \
        preempt[:3000]
    assert "JobSet one-rack" in topology and "0 of" in topology, topology[:3000]


def test_kueue_without_pods_ready_deadlocks_and_with_its_webhooks_ignored_admits_and_the_checks_say_so(profile,
                                                                                                        tmp_path):
    """One embedded cluster of its own, Kueue broken twice: no waitForPodsReady, webhooks failurePolicy Ignore
    (which the read-only check finds in Kueue's webhook configurations, and the webhook-down check in a JobSet
    that starts while Kueue is down)."""
    run = _run(profile, tmp_path, "kueue_wait_for_pods_ready=false", "kueue_webhook_failure_policy=Ignore",
               "kueue_pods_ready_timeout_s=20", select=f"{REQUEUE} or {DOWN} or {FAIL_CLOSED}")
    assert run.returncode == 1, run.output[-3000:]
    deadlock, unguarded, open_ = (run.failures.get(name, "") for name in (REQUEUE, DOWN, FAIL_CLOSED))
    assert "of Kueue's webhooks fail open" in open_ and "failurePolicy Ignore" in open_, open_[:3000]
    assert "deadlock: JobSet stuck kept the quota" in deadlock and "JobSet behind" in deadlock, deadlock[:3000]
    assert "JobSet unguarded was created while Kueue's manager was down" in unguarded, unguarded[:3000]
