"""Negative control for suites/test_cluster_scale.py.

A healthy embedded cluster first passes the suite through the existing-cluster
backend (``--cp-kubeconfig``); then one node is deleted, one team node loses its
team taint and one node reports 4 GPUs instead of 8, and the same suite must
fail on exactly those nodes, with messages that name them. The latency SLO
checks are shown to fail too, with an impossible threshold.
"""
from __future__ import annotations

import pytest

from clusterproof.cluster.node_plan import node_plan
from clusterproof.cluster.nodes import node_bodies, node_name
from clusterproof.kube.client import delete_if_present, merge_patch, raw_request
from tests.harness import allure_results, run_pytest

pytestmark = pytest.mark.control
SUITE = "suites/test_cluster_scale.py"


def _pool(profile, name):
    return next(p for p in node_plan(profile) if p.name == name)


@pytest.fixture(scope="module")
def victims(profile):
    return {
        "missing": node_name(profile, _pool(profile, "shared"), 3),
        "untainted": node_name(profile, _pool(profile, f"team-{profile.teams[0]}"), 1),
        "misshaped": node_name(profile, _pool(profile, f"team-{profile.teams[1]}"), 2),
    }


@pytest.fixture
def broken_cluster(cluster, profile, run_id, victims):
    """Break three nodes of the embedded cluster; put them back afterwards."""
    api, nodes = cluster.api, "/api/v1/nodes"
    original = {b["metadata"]["name"]: b for b in node_bodies(profile, run_id)}
    delete_if_present(api, f"{nodes}/{victims['missing']}")
    merge_patch(api, f"{nodes}/{victims['untainted']}", {"spec": {"taints": None}})
    gpus = {"nvidia.com/gpu": "4"}
    merge_patch(api, f"{nodes}/{victims['misshaped']}/status", {"status": {"capacity": gpus, "allocatable": gpus}})
    yield cluster
    raw_request(api, "POST", nodes, body=original[victims["missing"]]).data
    merge_patch(api, f"{nodes}/{victims['untainted']}", {"spec": original[victims["untainted"]]["spec"]})
    merge_patch(api, f"{nodes}/{victims['misshaped']}/status", {"status": original[victims["misshaped"]]["status"]})


def _args(cluster, profile, *extra):
    return [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name,
            *[f"--cp-set={s}" for s in extra]]


def test_scale_suite_passes_on_a_healthy_cluster(cluster, profile, tmp_path):
    run = run_pytest(_args(cluster, profile), tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]


def test_scale_suite_names_missing_untainted_and_misshaped_nodes(broken_cluster, profile, victims,
                                                               tmp_path):
    run = run_pytest(_args(broken_cluster, profile, "slo_mutating_p99_s=0.000001",
                           "slo_list_p99_s=0.000001"), tmp_path)
    assert run.returncode == 1, run.output[-3000:]
    team0, team1 = (f"team-{t}" for t in profile.teams[:2])

    registered = run.failed("test_every_planned_node_is_registered")
    assert list(registered) == ["test_every_planned_node_is_registered[shared]"], registered
    assert f"missing: {victims['missing']}" in registered[
        "test_every_planned_node_is_registered[shared]"]

    taints = run.failed("test_every_node_has_its_pool_labels_and_taints")
    assert list(taints) == [f"test_every_node_has_its_pool_labels_and_taints[{team0}]"], taints
    msg = next(iter(taints.values()))
    assert victims["untainted"] in msg
    assert f"missing taint {profile.team_taint_key}={profile.teams[0]}:NoSchedule" in msg

    shape = run.failed("test_every_node_has_its_pool_capacity")
    assert list(shape) == [f"test_every_node_has_its_pool_capacity[{team1}]"], shape
    msg = next(iter(shape.values()))
    assert victims["misshaped"] in msg and "nvidia.com/gpu=4 (want 8)" in msg

    for name in ("test_mutating_api_calls_meet_the_latency_slo", "test_list_calls_meet_the_latency_slo"):
        assert "latency SLO (p99 <= 1e-06 s) broken" in run.failures.get(name, ""), run.output[-3000:]

    assert not run.failed("test_every_node_is_ready"), run.failed("test_every_node_is_ready")

    # The report explains each failure: cluster summary and events are attached.
    results = allure_results(tmp_path)
    failed = results[f"test_every_node_has_its_pool_capacity[{team1}]"]
    assert failed["status"] == "failed"
    names = {a["name"] for a in failed.get("attachments", [])} | {
        a["name"] for step in failed.get("steps", []) for a in step.get("attachments", [])}
    assert {"cluster summary", "events in this run's namespaces"} <= names, names
    assert "simulated" in {t["value"] for t in failed["labels"] if t["name"] == "tag"}
