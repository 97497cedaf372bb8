"""Negative controls, bad input and cleanup for suites/test_taint_isolation.py.

The suite runs as a user would run it (a subprocess, ``--kubeconfig`` on this
session's embedded cluster, so the existing-cluster backend; the cluster is
simulated, so ``team_admission: auto`` installs the harness's policies):

- healthy, with the other foreign-toleration mode (``correct``): every check passes;
- one team node without its team taint: the checks for untolerating pods and
  team pods fail, naming that node;
- an admission step that injects a wildcard toleration
  (``team_admission=wildcard``, negative-control only): the team-pod check
  fails naming the pods that got it;
- bad input: a team with no nodes, a namespace without its team label, an
  invalid taint key / namespace label / mode: one clear line each;
- Ctrl-C in the middle of a check, and a run killed without cleanup (the
  next run's sweeper): nothing of the run is left -- no namespace, pod,
  policy, binding, PriorityClass, scratch node or added taint.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from fixtures import taints as t
from fixtures.kube import raw_request
from fixtures.nodes import node_bodies, node_name
from fixtures.profile import node_plan
from fixtures.run import ADDED_TAINTS, CLUSTER_SCOPED, OWNER_PID, RUN_LABEL, SCRATCH_LABEL, metadata
from fixtures.waiting import wait_for
from fixtures.watch import list_raw
from tests.harness import ROOT, allure_results, run_pytest

pytestmark = pytest.mark.selftest
SUITE = "suites/test_taint_isolation.py"
UNTOLERATED = "test_pod_without_team_toleration_never_lands_on_a_team_node"
EXACT = "test_team_pod_gets_exactly_its_toleration_and_stays_off_other_teams"


def _args(cluster, profile, run_id, *sets, select=None):
    return [SUITE, "--kubeconfig", str(cluster.kubeconfig), "--profile", profile.name, "--run-id", run_id,
            *(["-k", select] if select else []), *[f"--set={s}" for s in sets]]


def _run(cluster, profile, tmp_path, *sets, select=None, timeout=600):
    run_id = f"taintctl-{os.urandom(2).hex()}"
    return run_id, run_pytest(_args(cluster, profile, run_id, *sets, select=select), tmp_path, timeout=timeout)


def leftovers(cluster, profile, session_run: str, run_id: str, broken: tuple[str, ...] = ()) -> list[str]:
    """Everything of ``run_id`` still on the cluster, and every planned node whose taints differ from
    the plan (except the ``broken`` ones a control changed on purpose)."""
    api, sel = cluster.api, {"labelSelector": f"{RUN_LABEL}={run_id}"}
    left = [f"namespace {n['metadata']['name']}" for n in list_raw(api, "/api/v1/namespaces", sel)["items"]]
    left += [f"pod {p['metadata']['namespace']}/{p['metadata']['name']}"
             for p in list_raw(api, "/api/v1/pods", sel)["items"]]
    for path in CLUSTER_SCOPED:
        try:
            left += [f"{path.rsplit('/', 1)[1]}/{o['metadata']['name']}" for o in list_raw(api, path, sel)["items"]]
        except t.client.ApiException as e:
            if e.status != 404:
                raise
    nodes = {n["metadata"]["name"]: n for n in list_raw(api, "/api/v1/nodes")["items"]}
    left += [f"scratch node {n}" for n, o in nodes.items() if SCRATCH_LABEL in (o["metadata"].get("labels") or {})]
    left += [f"added-taints record on node {n}" for n, o in nodes.items()
             if ADDED_TAINTS in (o["metadata"].get("annotations") or {})]
    managed = {profile.team_taint_key, profile.preflight_taint_key, SCRATCH_LABEL}
    for body in node_bodies(profile, session_run):
        name = body["metadata"]["name"]
        if name in broken:
            continue
        want = {(x["key"], x["value"], x["effect"]) for x in body["spec"]["taints"]}
        have = {(x["key"], x.get("value", ""), x["effect"]) for x in nodes[name]["spec"].get("taints") or []
                if x["key"] in managed}
        if want != have:
            left.append(f"node {name} taints {sorted(have)} instead of {sorted(want)}")
    return left


def _assert_nothing_left(cluster, profile, session_run, run_id, broken=()):
    # Namespaces go in the background: give the namespace controller a bound.
    wait_for(lambda: leftovers(cluster, profile, session_run, run_id, broken), until=lambda left: not left,
             timeout=180, interval=1, what=f"nothing of run {run_id} left")


def _team_node(profile, team_index: int, i: int = 0) -> str:
    team = profile.teams[team_index]
    return node_name(profile, next(p for p in node_plan(profile) if p.name == f"team-{team}"), i)


# --- the suite passes on a healthy cluster (the other mode) ----------------------------

def test_suite_passes_with_admission_that_corrects_foreign_tolerations(cluster, profile, run_id, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "team_foreign_toleration=correct")
    assert run.returncode == 0 and not run.failures, run.output[-3000:]
    assert len(run.passed) == 7, run.output[-3000:]
    assert "test_foreign_team_toleration_is_refused_as_declared[correct]" in run.passed
    res = allure_results(tmp_path)
    atts = {a["name"] for a in res[EXACT].get("attachments", [])}
    assert "placement: team pods (pods per team per node pool)" in atts, atts
    _assert_nothing_left(cluster, profile, run_id, rid)


# --- negative controls -------------------------------------------------------------------

@pytest.fixture
def untainted_team_node(cluster, profile):
    """One node of the second team's pool without its team taint; put back afterwards."""
    name = _team_node(profile, 1)
    taint = {"key": profile.team_taint_key, "value": profile.teams[1], "effect": "NoSchedule"}
    t.remove_taint(cluster.api, name, taint)
    try:
        yield name
    finally:
        t.add_taint(cluster.api, name, taint)


def test_team_node_missing_its_taint_fails_naming_the_node(cluster, profile, run_id, untainted_team_node,
                                                          tmp_path):
    rid, run = _run(cluster, profile, tmp_path, select="never_lands or exactly")
    assert run.returncode == 1, run.output[-3000:]
    assert set(run.failures) == {UNTOLERATED, EXACT}, run.output[-3000:]
    node = untainted_team_node
    assert (f"landed on team node {node} (pool team-{profile.teams[1]}; carries no {profile.team_taint_key} "
            "taint)") in run.failures[UNTOLERATED], run.failures[UNTOLERATED]
    into = f"{profile.teams[0]}-into-{profile.teams[1]} of team {profile.teams[0]} landed on node {node} " \
           f"of pool team-{profile.teams[1]}"
    assert into in run.failures[EXACT], run.failures[EXACT]
    assert "Traceback" not in run.failures[EXACT]
    _assert_nothing_left(cluster, profile, run_id, rid, broken=(node,))


def test_wildcard_injecting_admission_fails_naming_the_pods(cluster, profile, run_id, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, "team_admission=wildcard", select="exactly or foreign")
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get(EXACT, "")
    team = profile.teams[0]
    assert "got a wildcard toleration (<any key> Exists (any effect))" in msg, run.output[-3000:]
    assert f"/{team}-own-pool got a wildcard toleration" in msg, msg
    # Placement gives it away too: the wildcard lets the pod onto the other team's nodes.
    assert f"{team}-into-{profile.teams[1]} of team {team} landed on node" in msg, msg
    # No validating policy in this broken set-up: foreign tolerations get through as well.
    foreign = run.failed("test_foreign_team_toleration_is_refused_as_declared")
    assert foreign and "was admitted (team_foreign_toleration: reject)" in next(iter(foreign.values()))
    res = allure_results(tmp_path)
    params = {p["value"] for p in res[EXACT].get("parameters", [])}
    assert any("NEGATIVE CONTROL" in v for v in params), params
    _assert_nothing_left(cluster, profile, run_id, rid)


# --- bad input ---------------------------------------------------------------------------

def _one_line(run, expected: str, tests: int = 1):
    assert run.returncode == 1, run.output[-3000:]
    assert len(run.failures) == tests, run.output[-3000:]
    for msg in run.failures.values():
        assert expected in msg, msg
        assert "Traceback" not in msg and "\n  File " not in msg, msg


def test_team_with_no_nodes_is_one_clear_line(cluster, profile, run_id, tmp_path):
    rid, run = _run(cluster, profile, tmp_path, f"teams={','.join(profile.teams)},ghost", select="exactly")
    _one_line(run, f"team ghost has no nodes: no node on {cluster.api.configuration.host} is labelled "
                   f"{profile.pool_label}=team-<team>")
    assert not run.passed
    _assert_nothing_left(cluster, profile, run_id, rid)


@pytest.fixture
def unlabelled_namespace(cluster, run_id):
    name = f"cp-{run_id[-4:]}-unlabelled-{os.urandom(2).hex()}"
    t.create_namespace(cluster.api, name, run_id)
    try:
        yield name
    finally:
        t.delete_namespace(cluster.api, name)


def test_namespace_without_team_label_is_one_clear_line(cluster, profile, run_id, unlabelled_namespace, tmp_path):
    team = profile.teams[0]
    rid, run = _run(cluster, profile, tmp_path, f"team_namespaces={team}={unlabelled_namespace}", select="exactly")
    _one_line(run, f"namespace {unlabelled_namespace} (team {team} in team_namespaces) has no label "
                   f"{profile.team_namespace_label}: admission decides a pod's team by that label")
    _assert_nothing_left(cluster, profile, run_id, rid)


@pytest.mark.parametrize("setting,expected", [
    pytest.param("team_taint_key=openai.com/team/x", "team_taint_key 'openai.com/team/x' is not a valid "
                 "label/taint key", id="taint-key-not-a-label-key"),
    pytest.param("team_namespace_label=-team", "team_namespace_label '-team' is not a valid label/taint key",
                 id="namespace-label-not-a-label-key"),
    pytest.param("team_foreign_toleration=ignore", "team_foreign_toleration must be one of reject, correct",
                 id="unknown-foreign-mode"),
    pytest.param("team_namespaces=ghost=ml-ghost", "team_namespaces entry 'ghost=ml-ghost' must be "
                 "<team>=<namespace> with a team of teams", id="namespace-of-unknown-team"),
])
def test_bad_taint_profile_values_end_the_run_with_one_line(setting, expected, tmp_path):
    """Caught when the profile loads: exit 4 before any cluster is started."""
    run = run_pytest([SUITE, "--profile", "smoke", f"--set={setting}"], tmp_path, timeout=120)
    assert run.returncode == 4, run.output[-2000:]
    assert expected in run.output, run.output[-2000:]
    assert "Traceback" not in run.output


# --- nothing is left behind ------------------------------------------------------------------

def test_interrupted_run_removes_policies_namespaces_and_scratch_node(cluster, profile, run_id, tmp_path):
    """Ctrl-C while the NoExecute check has its scratch node up: the run still undoes everything."""
    rid = f"taintctl-{os.urandom(2).hex()}"
    cmd = [sys.executable, "-m", "pytest", "-q", f"--alluredir={tmp_path / 'allure'}",
           *_args(cluster, profile, rid, "taint_observe_s=60", select="noexecute")]
    # SIGINT back to default in the child: a parent started in the background
    # without job control (nohup ... &, some CI runners) passes it on as
    # ignored, and then Python never raises KeyboardInterrupt.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        def scratch_up():
            if proc.poll() is not None:
                raise AssertionError(f"the run ended early:\n{proc.stdout.read()[-2000:]}")
            return list_raw(cluster.api, "/api/v1/nodes", {"labelSelector": f"{RUN_LABEL}={rid}"})["items"]
        wait_for(scratch_up, timeout=120, interval=0.5, what=f"run {rid} created its scratch node")
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "KeyboardInterrupt" in out or "Interrupted" in out or "!!!" in out, out[-2000:]
    _assert_nothing_left(cluster, profile, run_id, rid)


@pytest.fixture
def dead_runs_leftovers(cluster, profile, run_id):
    """What a killed run leaves: a policy + binding, a PriorityClass, a scratch node, and a taint it
    added to a node it did not create -- owned by a dead process on this host."""
    api, dead = cluster.api, f"dead-{os.urandom(2).hex()}"
    meta = lambda name: {**metadata(name, dead), "annotations": {**metadata(name, dead)["annotations"],  # noqa: E731
                                                                 OWNER_PID: "999999999"}}
    from fixtures import admission as adm
    version = t.served_map_version(api)
    rules = adm.TeamRules.from_profile(profile)
    policy = adm.mutating_policy(rules, f"cp-{dead}", dead, version)
    policy["metadata"] = meta(f"cp-{dead}")
    bind = adm.binding("MutatingAdmissionPolicyBinding", version, f"cp-{dead}", f"cp-{dead}", dead)
    bind["metadata"] = meta(f"cp-{dead}")
    raw_request(api, "POST", f"/apis/{version}/mutatingadmissionpolicies", body=policy).data
    raw_request(api, "POST", f"/apis/{version}/mutatingadmissionpolicybindings", body=bind).data
    raw_request(api, "POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                body={"metadata": meta(f"cp-{dead}"), "value": -20}).data
    scratch = {**meta(f"cp-gpu-scratch-{dead}")}
    scratch["labels"][SCRATCH_LABEL] = dead
    scratch["annotations"]["kwok.x-k8s.io/node"] = "fake"
    raw_request(api, "POST", "/api/v1/nodes", body={
        "metadata": scratch, "spec": {"taints": [{"key": SCRATCH_LABEL, "value": dead, "effect": "NoSchedule"}]}}).data
    victim = node_name(profile, next(p for p in node_plan(profile) if p.name == "shared"), 5)
    taint = {"key": SCRATCH_LABEL, "value": dead, "effect": "NoSchedule"}
    record = {"run": dead, **meta("x")["annotations"], "taints": [taint]}
    raw_request(api, "PATCH", f"/api/v1/nodes/{victim}",
                headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                body={"metadata": {"annotations": {ADDED_TAINTS: json.dumps(record)}}}).data
    t.add_taint(api, victim, taint)
    try:
        yield dead, victim
    finally:  # whatever the sweeper did not do
        for path in CLUSTER_SCOPED:
            try:
                raw_request(api, "DELETE", f"{path}/cp-{dead}").data
            except t.client.ApiException:
                pass
        try:
            raw_request(api, "DELETE", f"/api/v1/nodes/cp-gpu-scratch-{dead}").data
        except t.client.ApiException:
            pass
        t.remove_taint(api, victim, taint)
        raw_request(api, "PATCH", f"/api/v1/nodes/{victim}",
                    headers={"Content-Type": "application/merge-patch+json", "Accept": "application/json"},
                    body={"metadata": {"annotations": {ADDED_TAINTS: None}}}).data


def test_next_run_sweeps_what_a_killed_run_left(cluster, profile, run_id, dead_runs_leftovers, tmp_path):
    dead, victim = dead_runs_leftovers
    rid, run = _run(cluster, profile, tmp_path, select="preflight_nodes_receive_no_work")
    assert run.returncode == 0, run.output[-3000:]
    assert "cluster-scoped object(s) left by earlier runs" in run.output, run.output[-3000:]
    for what in (f"mutatingadmissionpolicybindings/cp-{dead}", f"mutatingadmissionpolicies/cp-{dead}",
                 f"priorityclasses/cp-{dead}", f"nodes/cp-gpu-scratch-{dead}", f"taints on nodes/{victim}"):
        assert what in run.output, run.output[-3000:]
    assert not leftovers(cluster, profile, run_id, dead)
    _assert_nothing_left(cluster, profile, run_id, rid)


def test_borrowed_node_on_real_hardware_gets_its_taints_back(cluster, profile, run_id):
    """The real-hardware path of the scratch node (an idle shared node, tainted and recorded),
    exercised here on simulated nodes: release takes exactly the added taints and the record off."""
    extra = {"key": profile.preflight_taint_key, "value": "pending", "effect": "NoSchedule"}
    node = t.borrow_idle_node(cluster.api, profile, run_id, [extra])
    try:
        n = list_raw(cluster.api, f"/api/v1/nodes/{node.name}")
        assert n["metadata"]["labels"][profile.pool_label] == "shared"
        keys = {(x["key"], x.get("value")) for x in n["spec"].get("taints") or []}
        assert {(SCRATCH_LABEL, node.name), (profile.preflight_taint_key, "pending")} <= keys, keys
        record = json.loads(n["metadata"]["annotations"][ADDED_TAINTS])
        assert record["run"] == run_id and len(record["taints"]) == 2, record
    finally:
        node.release()
    n = list_raw(cluster.api, f"/api/v1/nodes/{node.name}")
    assert not n["spec"].get("taints"), n["spec"]
    assert ADDED_TAINTS not in (n["metadata"].get("annotations") or {})
