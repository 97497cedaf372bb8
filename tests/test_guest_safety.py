"""A guest on a shared cluster touches only what is its own.

Each case runs against this session's embedded cluster, mostly through the
same command line a user types (``--cp-kubeconfig``, the existing-cluster
backend):

- two runs at once: a run's objects are protected by its live Lease, not by
  its age or its host, so a second run's sweeper leaves them alone;
- ownership a label cannot forge: the sweeper removes what a dead run's owner
  record names, uid for uid -- pods it left in a team's namespace included --
  and only reports a bystander's object that merely carries a run label;
- on real hardware the sweeper only lists what it would remove, unless asked;
- two runs borrowing a node at once get different nodes, and a release
  removes only the taints that run added; a node with anyone else's pod on
  it (judged after the claim) is never borrowed, nor given NoExecute;
- a cluster whose first nodes are kwok nodes but which has one real node is
  real hardware, and its destructive checks need the opt-in.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from clusterproof.cluster import scratch_nodes
from clusterproof.cluster.scratch_nodes import NotIdle, borrow_idle_node
from clusterproof.core.run import RUN_LABEL, SCRATCH_LABEL, metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube.access import HOME
from clusterproof.kube.client import delete_if_present, get_if_present, is_simulated, list_raw, raw_request
from clusterproof.kube.informer import watch_lines
from clusterproof.kube.liveness import RunLease, wait_expired
from clusterproof.kube.namespaces import create_namespace
from clusterproof.kube.node_taints import add_taint, records, remove_taint
from clusterproof.kube.ownership import OwnerRecord, is_recorded
from clusterproof.kube.pod_spec import pod_body
from tests.harness import KILLED_RUN_LEASE, ROOT, background_pytest, ended_early, kill_run, run_leftovers, run_pytest

pytestmark = pytest.mark.cluster
SCALE = "suites/test_cluster_scale.py"


def _existing(cluster, suite, run_id, *extra):
    return [suite, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", cluster.profile.name,
            "--cp-run-id", run_id, *extra]


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
           f"--cp-summary={tmp_path / 'summary.json'}", f"--cp-output-dir={tmp_path / 'out'}",
           *_existing(cluster, "suites/test_taint_isolation.py", ra, "-k", "noexecute",
                      "--cp-set=taint_observe_s=40")]
    a = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def a_working():
            if a.poll() is not None:
                raise AssertionError(f"run A ended early:\n{a.stdout.read()[-2000:]}")
            return [x for x in run_leftovers(cluster.api, ra) if x.startswith("scratch node")]
        wait_for(a_working, timeout=180, interval=0.5, what=f"run {ra} has its scratch node")
        owned = set(_kept(run_leftovers(cluster.api, ra)))
        b = run_pytest(_existing(cluster, SCALE, rb, "-k", "registered and shared"), tmp_path / "b")
        assert b.returncode == 0, b.output[-3000:]
        assert f"run {ra}" not in b.output, f"run B touched run A's objects:\n{b.output[-3000:]}"
        still = set(_kept(run_leftovers(cluster.api, ra)))
        assert owned <= still, f"run B removed {sorted(owned - still)} of the live run A"
        out, _ = a.communicate(timeout=300)
        assert a.returncode == 0, out[-3000:]
    finally:
        if a.poll() is None:
            a.kill()
    wait_for(lambda: run_leftovers(cluster.api, ra) + run_leftovers(cluster.api, rb), until=lambda x: not x,
             timeout=120, interval=1, what="nothing of either run left")


def _kept(leftovers: list[str]) -> list[str]:
    """What a live run keeps while it works. Not its pods: run A's check taints its node NoExecute, and the
    taint manager evicts the pods that lack the toleration -- A's own work, which a comparison of pods
    before and after B took for B's (red in a CI run)."""
    return [x for x in leftovers if not x.startswith("pod ")]


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


def _dead_run(api, tag: str) -> tuple[str, RunLease, OwnerRecord]:
    """What a killed run leaves in the home namespace: its Lease (expired) and its owner record."""
    dead = f"dead-{tag}-{os.urandom(2).hex()}"
    lease = RunLease(api, dead, HOME, duration_s=10).acquire()
    lease.abandon()
    return dead, lease, OwnerRecord(api, HOME, dead).create()


@pytest.fixture
def dead_run_namespace(cluster):
    """What a killed run left: a namespace it created (in its owner record, by uid), its Lease, expired."""
    dead, lease, record = _dead_run(cluster.api, "ns")
    ns = f"cp-{dead}-left"
    made = create_namespace(cluster.api, ns, dead)
    record.add(f"/api/v1/namespaces/{ns}", made["metadata"]["uid"])
    wait_expired(cluster.api, dead, timeout=60)
    try:
        yield dead, ns
    finally:
        delete_if_present(cluster.api, f"/api/v1/namespaces/{ns}")
        record.delete()
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
    line = f"sweep: would remove (pass --cp-sweep-leftovers to remove): namespaces/{ns} (run {dead}: lease"
    assert line in asked.output, asked.output[-3000:]
    assert _active(cluster.api, ns), f"the sweeper removed {ns} on real hardware without being asked"
    # The report records the sweep too (environment, and an attachment of the cluster fixture).
    env = (tmp_path / "ask" / "allure" / "environment.properties").read_text()
    assert "would remove" in env and ns in env, env
    assert "leftovers of earlier runs (sweep)" in _allure_attachment_names(tmp_path / "ask")

    removed = run_pytest(_existing(cluster, SCALE, f"sweep-{os.urandom(2).hex()}", "-k", "registered and shared",
                                   "--cp-sweep-leftovers"), tmp_path / "remove")
    assert removed.returncode == 0, removed.output[-3000:]
    assert f"sweep: removed: namespaces/{ns} (run {dead}: lease" in removed.output, removed.output[-3000:]
    assert not _active(cluster.api, ns)


# --- 3. ownership a label cannot forge ------------------------------------------------------------

def test_a_bystander_object_with_a_dead_runs_label_but_no_proof_survives_the_sweep(cluster, tmp_path):
    """Negative control of the sweeper: a namespace labelled clusterproof.io/run=<a dead run> that the run's
    owner record does not name (someone copied the label), and one created under a name the record holds
    after the run's own was deleted (same name, another uid). Both are reported, neither removed."""
    api = cluster.api
    dead, lease, record = _dead_run(api, "bystander")
    labelled, reused = f"team-x-{dead}", f"cp-{dead}-reused"
    try:
        create_namespace(api, labelled, dead)
        first = create_namespace(api, reused, dead)
        record.add(f"/api/v1/namespaces/{reused}", first["metadata"]["uid"])
        delete_if_present(api, f"/api/v1/namespaces/{reused}")
        wait_for(lambda: get_if_present(api, f"/api/v1/namespaces/{reused}"), until=lambda n: n is None,
                 timeout=60, interval=0.5, what=f"namespace {reused} gone")
        create_namespace(api, reused)   # someone else's
        wait_expired(api, dead, timeout=60)
        run = run_pytest(_existing(cluster, SCALE, f"sweep-{os.urandom(2).hex()}", "-k", "registered and shared"),
                         tmp_path)
        assert run.returncode == 0, run.output[-3000:]
        assert f"kept (a dead run's label, but in no owner record; remove it by hand if it is yours): " \
               f"namespaces/{labelled} (label clusterproof.io/run={dead})" in run.output, run.output[-3000:]
        assert _active(api, labelled), "the sweeper removed a namespace it could not prove a run made"
        assert _active(api, reused), "the sweeper removed a namespace made since under a name the run had used"
        assert record.path.rsplit("/", 1)[1] not in str(run_leftovers(api, dead)), "the dead run's record is left"
    finally:
        for ns in (labelled, reused):
            delete_if_present(api, f"/api/v1/namespaces/{ns}")
        record.delete()
        lease.release()


@pytest.fixture
def team_namespace(cluster, profile):
    """A team's own namespace, labelled with the team (the harness does not own it)."""
    ns = f"team-{profile.teams[0]}-{os.urandom(2).hex()}"
    create_namespace(cluster.api, ns, labels={profile.team_namespace_label: profile.teams[0]})
    try:
        yield ns
    finally:
        delete_if_present(cluster.api, f"/api/v1/namespaces/{ns}")


def test_the_pods_a_killed_run_left_in_a_team_namespace_are_swept_by_uid(cluster, profile, team_namespace, api_guard,
                                                                        tmp_path):
    """A run of the taint suite, SIGKILLed while its whole-node pods sit in a team's namespace: the next
    run removes exactly those pods (its owner record names them), and leaves the team's own pod."""
    api, rid = cluster.api, f"killed-{os.urandom(2).hex()}"
    teams = ",".join([f"{profile.teams[0]}={team_namespace}"])
    theirs = pod_body("the-teams-own", "someone-else")
    theirs["metadata"]["labels"] = {"app": "team"}
    raw_request(api, "POST", f"/api/v1/namespaces/{team_namespace}/pods", body=theirs).data
    # The run's pods live a few seconds (the check places them, reads them and deletes them): a watch started
    # before the run sees the first one arrive, and stops the run there and then (SIGSTOP to its process group,
    # from the watch itself), before it is killed -- a LIST every 0.5 s missed them on a busy machine, and so did
    # a kill from the test's own loop once (a self-test run on five workers: the run had deleted them first).
    path, sel = f"/api/v1/namespaces/{team_namespace}/pods", {"labelSelector": f"{RUN_LABEL}={rid}"}
    arrived, run_pid = threading.Event(), []

    def watch(rv: str) -> None:
        try:
            for event, _ in watch_lines(api, path, rv, sel, 300):
                if event.get("type") == "ADDED":
                    if run_pid:
                        os.killpg(run_pid[0], signal.SIGSTOP)
                    arrived.set()
                    return
        except Exception:   # the wait below then times out, naming what it waited for
            return
    threading.Thread(target=watch, args=(list_raw(api, path, sel)["metadata"]["resourceVersion"],),
                     daemon=True).start()
    with background_pytest(_existing(cluster, "suites/test_taint_isolation.py", rid, "-k", "team_pod_gets_exactly",
                                     f"--cp-set=team_namespaces={teams}", f"--cp-set={KILLED_RUN_LEASE}"),
                           tmp_path, new_session=True) as proc:
        run_pid.append(proc.pid)
        def pods_there():
            ended_early(proc)
            return arrived.is_set()
        wait_for(pods_there, timeout=240, interval=0.05, what=f"run {rid}'s pods in team namespace {team_namespace}")
        kill_run(proc, api_guard, new_session=True)
    left = [p["metadata"]["name"] for p in list_raw(api, f"/api/v1/namespaces/{team_namespace}/pods",
                                                     {"labelSelector": f"{RUN_LABEL}={rid}"})["items"]]
    assert left and all(is_recorded(api, HOME, rid, f"/api/v1/namespaces/{team_namespace}/pods/{n}") for n in left)
    wait_expired(api, rid, timeout=60)
    run = run_pytest(_existing(cluster, SCALE, f"next-{os.urandom(2).hex()}", "-k", "registered and shared"),
                     tmp_path / "next")
    assert run.returncode == 0, run.output[-3000:]
    assert f"sweep: removed: pods/{left[0]} in {team_namespace} (run {rid}: lease" in run.output, run.output[-3000:]
    wait_for(lambda: run_leftovers(api, rid), until=lambda x: not x, timeout=120, interval=1,
             what=f"nothing of the killed run {rid} left")
    assert get_if_present(api, f"/api/v1/namespaces/{team_namespace}/pods/the-teams-own") is not None


def _allure_attachment_names(tmp_path) -> set[str]:
    """Names of every attachment in a run's Allure results, set-up (container) ones included."""
    names = set()
    for f in (tmp_path / "allure").glob("*-container.json"):
        for fixture in json.loads(f.read_text()).get("befores", []):
            names |= {a["name"] for a in fixture.get("attachments", [])}
    return names


# --- 4. borrowed nodes ----------------------------------------------------------------------------

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


def _bystander_pod(api, namespace: str, node: str, name: str) -> None:
    """Someone else's pod, bound to ``node`` (no run label of the borrowing run)."""
    body = pod_body(name, "someone-else")
    body["spec"]["nodeName"] = node
    raw_request(api, "POST", f"/api/v1/namespaces/{namespace}/pods", body=body).data


def test_a_pod_bound_between_the_list_and_the_claim_makes_the_node_not_idle(cluster, profile, namespace,
                                                                           monkeypatch):
    """The claim is judged after it is written: a pod of someone else that lands on the first candidate
    right after the claim makes the run give that node back and take the next one."""
    api, run = cluster.api, f"borrow-r-{os.urandom(2).hex()}"
    raced, claim = [], scratch_nodes.claim_node

    def claim_then_a_pod_arrives(api_, node):
        won = claim(api_, node)
        if won and not raced:
            _bystander_pod(api_, namespace, node.name, "arrived-after-the-list")
            raced.append(node.name)
        return won
    monkeypatch.setattr(scratch_nodes, "claim_node", claim_then_a_pod_arrives)
    node = borrow_idle_node(api, profile, run)
    try:
        assert raced and node.name != raced[0], (raced, node.name)
        assert not any(t[0] == SCRATCH_LABEL for t in _taints(api, raced[0])), "the raced node kept the claim"
        assert run not in records(list_raw(api, f"/api/v1/nodes/{raced[0]}"))
    finally:
        node.release()


def test_noexecute_is_never_applied_to_a_borrowed_node_with_anyone_elses_pod(cluster, profile, namespace):
    api, run = cluster.api, f"borrow-n-{os.urandom(2).hex()}"
    node = borrow_idle_node(api, profile, run)
    try:
        _bystander_pod(api, namespace, node.name, "daemonset-like")
        noexecute = {"key": profile.team_taint_key, "value": profile.teams[0], "effect": "NoExecute"}
        with pytest.raises(NotIdle, match=f"borrowed node {node.name} now runs 1 pod.*a NoExecute taint would "
                                          "evict them, so it is not applied"):
            node.taint(noexecute)
        assert (noexecute["key"], noexecute["value"], "NoExecute") not in _taints(api, node.name)
    finally:
        node.release()


def test_no_node_running_anyone_elses_pods_is_borrowed(cluster, profile, namespace):
    """Every idle shared node but the ones of this test gets someone else's pod: borrowing says why not."""
    api = cluster.api
    shared = [n["metadata"]["name"] for n in list_raw(api, "/api/v1/nodes",
                                                       {"labelSelector": f"{profile.pool_label}=shared"})["items"]]
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i_n: _bystander_pod(api, namespace, i_n[1], f"occupant-{i_n[0]}"), enumerate(shared)))
    with pytest.raises(NotIdle, match=r"no idle node in the shared pool .* a borrowed node must run no pod of "
                                      r"anyone else, DaemonSets included \(.*: runs pods"):
        borrow_idle_node(api, profile, f"borrow-x-{os.urandom(2).hex()}")


# --- 5. simulated means every node -------------------------------------------------------------------

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
    assert re.search(r"pass --(cp-)?allow-destructive to run it", run.output), run.output[-3000:]
