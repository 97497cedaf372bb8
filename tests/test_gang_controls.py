"""Negative control and bad input for suites/test_gang_scheduling.py.

The suite runs as a user would run it (a subprocess, ``--cp-kubeconfig`` on this
session's embedded cluster), pointed at:

- the stock kube-scheduler (``gang_scheduler_name=default-scheduler``, no
  gang plugin): every exactness check must fail, naming the partially bound
  gang;
- a cluster without the PodGroup CRD, a scheduler name nobody answers to, a
  gang larger than the cluster: one clear line each, no hang;
- native gangs on a scheduler without the GangScheduling plugin: red, naming
  the plugin (the Job controller's gang and the one-rack gang too); 1.35's
  gang manifest on the pinned (newer) server: refused, the check naming the
  version the server serves.

After every run, no pod, PodGroup or Workload of that run may be left.
"""
from __future__ import annotations

import os

import pytest

from clusterproof.cluster import coscheduling
from clusterproof.core import kubeversions
from clusterproof.core.waiting import wait_for
from clusterproof.gang import gangs as g
from clusterproof.provision import toolchain
from tests.harness import allure_results, run_pytest

pytestmark = [pytest.mark.control, pytest.mark.coscheduling]
SUITE = "suites/test_gang_scheduling.py"
EXACTNESS = {
    "test_gang_is_bound_all_together_or_not_at_all[coscheduling]": "gang one-too-many is partially bound",
    "test_competing_gangs_do_not_deadlock[coscheduling]": "is partially bound",
    "test_gang_timeout_releases_held_nodes[coscheduling]": "gang never-complete is partially bound",
}


def _run(cluster, profile, tmp_path, *sets, select="coscheduling and not starved", timeout=900):
    run_id = f"gangctl-{os.urandom(2).hex()}"
    args = [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name,
            "--cp-run-id", run_id, "-k", select, "--cp-set=gang_native=false",
            *[f"--cp-set={s}" for s in sets]]
    return run_id, run_pytest(args, tmp_path, timeout=timeout)


def _assert_nothing_left(cluster, run_id):
    # Namespaces are deleted in the background: give the namespace controller a bound.
    wait_for(lambda: g.leftovers(cluster.api, run_id), until=lambda left: not any(left.values()),
             timeout=180, interval=1, what=f"no pod, PodGroup or Workload of run {run_id} left")


@pytest.fixture
def without_podgroup_crd(cluster, run_id):
    """This session's cluster without the PodGroup CRD (it has it from the start); put back afterwards."""
    coscheduling.remove_crds(cluster.api, [coscheduling.PODGROUP_CRD])
    try:
        yield
    finally:
        coscheduling.apply_crds(cluster.api, run_id)


def test_missing_podgroup_crd_is_one_clear_line(cluster, profile, without_podgroup_crd, tmp_path):
    run_id, run = _run(cluster, profile, tmp_path, "gang_scheduler_name=clusterproof-coscheduling",
                       select="coscheduling and not large and not starved", timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == set(EXACTNESS), run.output[-3000:]
    for msg in run.failures.values():
        assert "the PodGroup CRD (podgroups.scheduling.x-k8s.io) is not installed" in msg, msg
        assert "Traceback" not in msg
    _assert_nothing_left(cluster, run_id)


def test_stock_scheduler_fails_naming_the_partially_bound_gang(cluster, profile, tmp_path):
    run_id, run = _run(cluster, profile, tmp_path, "gang_scheduler_name=default-scheduler",
                       "gang_bind_timeout_s=20", "gang_observe_s=10",
                       select="coscheduling and not large and not starved")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == set(EXACTNESS), run.output[-3000:]
    for test, expected in EXACTNESS.items():
        assert expected in run.failures[test], run.failures[test]
    # The report says which scheduler the checks ran against.
    res = allure_results(tmp_path)
    failed = res["test_gang_is_bound_all_together_or_not_at_all[coscheduling]"]
    assert "gang:coscheduling" in {t["value"] for t in failed["labels"] if t["name"] == "tag"}
    assert any("default-scheduler" in p["value"] for p in failed.get("parameters", [])), failed
    _assert_nothing_left(cluster, run_id)


def test_scheduler_that_is_not_running_fails_fast(cluster, profile, tmp_path):
    run_id, run = _run(cluster, profile, tmp_path, "gang_scheduler_name=clusterproof-nobody",
                       timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failures) == 4, run.output[-3000:]
    for msg in run.failures.values():
        assert "no scheduler named 'clusterproof-nobody' is running" in msg, msg
    _assert_nothing_left(cluster, run_id)


def test_gang_larger_than_the_cluster_is_one_clear_line(cluster, profile, tmp_path):
    run_id, run = _run(cluster, profile, tmp_path, "gang_scheduler_name=default-scheduler",
                       "gang_scale_size=100000", select="large and coscheduling", timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    [msg] = run.failures.values()
    assert "gang_scale_size=100000 is larger than the" in msg, msg
    _assert_nothing_left(cluster, run_id)


# Native gangs (Kubernetes' own GangScheduling plugin), on this session's cluster at the pinned version, which
# serves them (its row of clusterproof/core/kubeversions.py turns GenericWorkload and its API on).
NATIVE = ["gang_native=true", "gang_bind_timeout_s=20", "gang_observe_s=10"]


def test_native_gangs_on_a_scheduler_without_the_gang_plugin_fail_naming_the_plugin(cluster, profile, tmp_path):
    """The native checks pointed at a scheduler that has no GangScheduling plugin (the harness's Coscheduling
    build, Kubernetes 1.34 libraries: the plugin came in 1.35): the gangs bind member by member, and the
    exactness checks are red naming the partial gang and the plugin that should have decided it; the Job
    controller's gang gets no verdict on its PodGroup; a gang required in one rack is spread over two."""
    run_id, run = _run(cluster, profile, tmp_path, *NATIVE,
                       f"gang_native_scheduler_name={coscheduling.OWN_SCHEDULER}",
                       select="native and (all_together or deadlock or job_controller or one_rack)")
    assert run.returncode == 1, run.output[-3000:]
    # The gang that fits binds member by member too, but no scheduler writes its PodGroup's verdict.
    expected = {"test_gang_is_bound_all_together_or_not_at_all[native]": "the PodGroup has no such condition",
                "test_competing_gangs_do_not_deadlock[native]": "is partially bound",
                "test_a_gang_job_gets_its_pod_group_from_the_job_controller_and_is_bound_whole[native]":
                    "the PodGroup has no such condition"}
    rack = "test_a_pod_group_that_requires_one_rack_lands_in_one_rack_or_not_at_all[native]"
    assert set(run.failures) == {*expected, rack}, run.output[-3000:]
    for test, said in expected.items():
        msg = run.failures[test]
        assert said in msg and "GangScheduling plugin" in msg and repr(coscheduling.OWN_SCHEDULER) in msg, msg
    assert "gang wider-than-a-rack" in run.failures[rack] and "was bound across racks" in run.failures[rack], \
        run.failures[rack]
    _assert_nothing_left(cluster, run_id)


def test_a_135_gang_sent_to_a_newer_server_is_refused_naming_the_version_it_serves(cluster, profile, tmp_path):
    """1.35's manifest (a v1alpha1 Workload, pods' workloadRef) against the pinned server, which serves native
    gangs only in a later version: refused, and the check names the version the server serves."""
    served = kubeversions.release(toolchain.KUBERNETES_VERSION).workload_api
    assert served != g.LEGACY_NATIVE_API
    run_id, run = _run(cluster, profile, tmp_path, *NATIVE, f"gang_native_api={g.LEGACY_NATIVE_API}",
                       select="native and all_together", timeout=300)
    assert run.returncode == 1, run.output[-3000:]
    [msg] = run.failures.values()
    assert f"in {g.LEGACY_NATIVE_API} (404: that version is not served)" in msg, msg
    assert f"it serves native gangs in {served}" in msg and "written for Kubernetes 1.35" in msg, msg
    assert "Traceback" not in msg
    _assert_nothing_left(cluster, run_id)
