"""A guest on a shared cluster touches only what is its own.

Each case runs against this session's embedded cluster, mostly through the
same command line a user types (``--kubeconfig``, the existing-cluster
backend):

- two runs at once: a run's objects are protected by its live Lease, not by
  its age or its host, so a second run's sweeper leaves them alone;
- on real hardware the sweeper only lists what it would remove, unless asked;
- two runs borrowing a node at once get different nodes, and a release
  removes only the taints that run added;
- a cluster whose first nodes are kwok nodes but which has one real node is
  real hardware, and its destructive checks need the opt-in.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from fixtures.kube import delete_if_present, get_if_present, is_simulated, list_raw, raw_request
from fixtures.liveness import RunLease, wait_expired
from fixtures.node_taints import add_taint, borrow_idle_node, records, remove_taint
from fixtures.run import SCRATCH_LABEL, metadata
from fixtures.waiting import wait_for
from tests.harness import ROOT, run_leftovers, run_pytest

pytestmark = pytest.mark.selftest
SCALE = "suites/test_cluster_scale.py"


def _existing(cluster, suite, run_id, *extra):
    return [suite, "--kubeconfig", str(cluster.kubeconfig), "--profile", cluster.profile.name,
            "--run-id", run_id, *extra]


def _taints(api, node) -> set[tuple]:
    n = list_raw(api, f"/api/v1/nodes/{node}")
    return {(t["key"], t.get("value", ""), t["effect"]) for t in n["spec"].get("taints") or []}


# --- 1. liveness is a Lease ------------------------------------------------------------------

def test_a_second_run_never_sweeps_what_a_live_run_owns(cluster, tmp_path):
    """Run A works (namespaces, admission policies, a scratch node); run B starts against the same
    cluster with an age bound that everything of A's exceeds. A's Lease is alive, so B removes
    nothing of A's, and A passes."""
    ra, rb = f"live-a-{os.urandom(2).hex()}", f"live-b-{os.urandom(2).hex()}"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", f"--alluredir={tmp_path / 'a'}",
           f"--summary={tmp_path / 'summary.json'}",
           *_existing(cluster, "suites/test_taint_isolation.py", ra, "-k", "noexecute",
                      "--set=taint_observe_s=40")]
    a = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def a_working():
            if a.poll() is not None:
                raise AssertionError(f"run A ended early:\n{a.stdout.read()[-2000:]}")
            return [x for x in run_leftovers(cluster.api, ra) if x.startswith("scratch node")]
        wait_for(a_working, timeout=180, interval=0.5, what=f"run {ra} has its scratch node")
        owned = set(run_leftovers(cluster.api, ra))
        b = run_pytest(_existing(cluster, SCALE, rb, "-k", "registered and shared",
                                 "--set=sweep_after_hours=0.0001"), tmp_path / "b")
        assert b.returncode == 0, b.output[-3000:]
        assert f"run {ra}" not in b.output, f"run B touched run A's objects:\n{b.output[-3000:]}"
        still = set(run_leftovers(cluster.api, ra))
        assert owned <= still, f"run B removed {sorted(owned - still)} of the live run A"
        out, _ = a.communicate(timeout=300)
        assert a.returncode == 0, out[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
    wait_for(lambda: run_leftovers(cluster.api, ra) + run_leftovers(cluster.api, rb), until=lambda x: not x,
             timeout=120, interval=1, what="nothing of either run left")


# --- 2. the sweeper asks first on real hardware --------------------------------------------------

@pytest.fixture
def real_node(cluster, run_id):
    """One node that is not a kwok node: from now on the cluster is real hardware to the harness."""
    name = f"zz-real-{os.urandom(2).hex()}"
    raw_request(cluster.api, "POST", "/api/v1/nodes", body={"metadata": metadata(name, run_id)}).data
    try:
        yield name
    finally:
        delete_if_present(cluster.api, f"/api/v1/nodes/{name}")


@pytest.fixture
def dead_run_namespace(cluster):
    """What a killed run left: a namespace, and its Lease, expired."""
    dead = f"dead-{os.urandom(2).hex()}"
    lease = RunLease(cluster.api, dead, duration_s=10).acquire()
    lease.abandon()
    ns = f"cp-{dead}-left"
    raw_request(cluster.api, "POST", "/api/v1/namespaces", body={"metadata": metadata(ns, dead)}).data
    wait_expired(cluster.api, dead, timeout=60)
    try:
        yield dead, ns
    finally:
        delete_if_present(cluster.api, f"/api/v1/namespaces/{ns}")
        lease.release()


def _active(api, ns: str) -> bool:
    obj = get_if_present(api, f"/api/v1/namespaces/{ns}")
    return obj is not None and obj["status"].get("phase") == "Active"


def test_on_real_hardware_the_sweeper_lists_and_removes_only_when_asked(cluster, real_node, dead_run_namespace,
                                                                        tmp_path):
    dead, ns = dead_run_namespace
    asked = run_pytest(_existing(cluster, SCALE, f"ask-{os.urandom(2).hex()}", "-k", "registered and shared"),
                       tmp_path / "ask")
    assert asked.returncode == 0, asked.output[-3000:]
    line = f"sweep: would remove (pass --sweep-leftovers to remove): namespace {ns} (run {dead}: lease"
    assert line in asked.output, asked.output[-3000:]
    assert _active(cluster.api, ns), f"the sweeper removed {ns} on real hardware without being asked"
    # The report records the sweep too (environment, and an attachment of the cluster fixture).
    env = (tmp_path / "ask" / "allure" / "environment.properties").read_text()
    assert "would remove" in env and ns in env, env
    assert "leftovers of earlier runs (sweep)" in _allure_attachment_names(tmp_path / "ask")

    removed = run_pytest(_existing(cluster, SCALE, f"sweep-{os.urandom(2).hex()}", "-k", "registered and shared",
                                   "--sweep-leftovers"), tmp_path / "remove")
    assert removed.returncode == 0, removed.output[-3000:]
    assert f"sweep: removed: namespace {ns} (run {dead}: lease" in removed.output, removed.output[-3000:]
    assert not _active(cluster.api, ns)


def _allure_attachment_names(tmp_path) -> set[str]:
    """Names of every attachment in a run's Allure results, set-up (container) ones included."""
    import json
    names = set()
    for f in (tmp_path / "allure").glob("*-container.json"):
        for fixture in json.loads(f.read_text()).get("befores", []):
            names |= {a["name"] for a in fixture.get("attachments", [])}
    return names


# --- 3. borrowed nodes ----------------------------------------------------------------------------

def test_two_runs_borrowing_at_once_get_different_nodes_and_release_only_their_own(cluster, profile):
    api = cluster.api
    extra = {"key": profile.preflight_taint_key, "value": "pending", "effect": "NoSchedule"}
    runs = [f"borrow-a-{os.urandom(2).hex()}", f"borrow-b-{os.urandom(2).hex()}"]
    with ThreadPoolExecutor(2) as pool:
        nodes = list(pool.map(lambda r: borrow_idle_node(api, profile, r, [extra]), runs))
    try:
        a, b = nodes
        assert a.name != b.name, f"runs {runs} both borrowed node {a.name}"
        before_b = _taints(api, b.name)
        a.release()
        assert _taints(api, b.name) == before_b, "run A's release changed run B's node"
        assert runs[1] in records(list_raw(api, f"/api/v1/nodes/{b.name}"))
        assert (SCRATCH_LABEL, runs[0], "NoSchedule") not in _taints(api, a.name)
    finally:
        for n in nodes:
            n.release()


def test_a_taint_the_node_already_had_is_not_the_runs_to_remove(cluster, profile):
    """A borrowed node already carries a taint (the cluster's own machinery put it there): the run
    adds the same taint for its check, but does not record it, and its release leaves it."""
    api, run = cluster.api, f"borrow-c-{os.urandom(2).hex()}"
    theirs = {"key": "example.com/maintenance", "value": "planned", "effect": "NoSchedule"}
    node = borrow_idle_node(api, profile, run)
    add_taint(api, node.name, theirs)           # someone else's, after the claim
    try:
        node.taint(theirs)
        node.taint({"key": profile.preflight_taint_key, "value": "pending", "effect": "NoSchedule"})
        recorded = {t["key"] for t in records(list_raw(api, f"/api/v1/nodes/{node.name}"))[run]}
        assert theirs["key"] not in recorded, "the run recorded a taint it did not add"
        node.release()
        assert (theirs["key"], theirs["value"], theirs["effect"]) in _taints(api, node.name)
        assert not any(k[0] in (SCRATCH_LABEL, profile.preflight_taint_key) for k in _taints(api, node.name))
    finally:
        node.release()
        remove_taint(api, node.name, theirs)


# --- 4. simulated means every node -------------------------------------------------------------------

@pytest.fixture
def mixed_cluster(cluster, run_id):
    """500 more kwok nodes listed before the profile's, and one real node listed last."""
    api, tag = cluster.api, os.urandom(2).hex()
    fake = [f"cp-aaa-{tag}-{i:03d}" for i in range(500)]
    taint = [{"key": SCRATCH_LABEL, "value": f"mixed-{tag}", "effect": "NoSchedule"}]

    def create(name, kwok=True):
        meta = metadata(name, run_id, {SCRATCH_LABEL: f"mixed-{tag}"})
        if kwok:
            meta["annotations"]["kwok.x-k8s.io/node"] = "fake"
        raw_request(api, "POST", "/api/v1/nodes", body={"metadata": meta, "spec": {"taints": taint}}).data
    real = f"zz-real-{tag}"
    try:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(create, fake))
        create(real, kwok=False)
        yield real
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda n: delete_if_present(api, f"/api/v1/nodes/{n}"), [*fake, real]))


def test_a_cluster_with_one_real_node_is_real_hardware(cluster, mixed_cluster, tmp_path):
    first = list_raw(cluster.api, "/api/v1/nodes", {"limit": "500"})["items"]
    assert all(n["metadata"].get("annotations", {}).get("kwok.x-k8s.io/node") == "fake" for n in first)
    assert not is_simulated(cluster.api)
    # ...so the destructive opt-in cannot be bypassed: the burst suite is skipped without it.
    run = run_pytest(_existing(cluster, "suites/test_burst_pod_creation.py", f"mixed-{os.urandom(2).hex()}"),
                     tmp_path)
    assert run.returncode == 0 and not run.passed and not run.failures, run.output[-3000:]
    assert "pass --allow-destructive to run it" in run.output, run.output[-3000:]
