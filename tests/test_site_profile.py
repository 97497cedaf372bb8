"""``clusterproof profile --from-cluster``: a site's profile read from its nodes, and what it could not infer.

- pure: the embedded cluster's own nodes (``node_bodies`` of the smoke
  profile) read back give the smoke profile's node plan; a site's nodes (its
  own label and taint keys, a control-plane node, names of its own) give a
  profile that loads and whose plan is the cluster's;
- negative cases, said and not guessed: two labels that both name the pools,
  two taints that both could name teams, a label that splits the nodes but
  names its pools otherwise, uneven team pools, GPUs that differ;
- the command: bad input is one line, exit 4; against the session cluster, as
  the shipped ServiceAccount (read-only), it writes a profile that loads and
  whose node plan matches the session's nodes.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from clusterproof.cluster.node_plan import node_plan
from clusterproof.cluster.nodes import node_bodies
from clusterproof.cluster.site_profile import infer, plan_differences, render
from clusterproof.config.profile import load_profile
from tests import guest
from tests.harness import ROOT

CAPACITY = {"cpu": "96", "memory": "1800Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "7000Gi"}


def _node(name, labels=None, taints=(), capacity=None):
    cap = capacity or CAPACITY
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "type": "kwok", **(labels or {})}},
            "spec": {"taints": [dict(zip(("key", "value", "effect"), t)) for t in taints]},
            "status": {"capacity": cap, "allocatable": cap}}


def site_nodes(pools=None, pool_key="acme.io/pool", team_key="acme.io/team", preflight_key="acme.io/gpu-check",
               extra_labels=None) -> list[dict]:
    """A site's GPU nodes as it labels and taints them, and a control-plane node outside the pools."""
    pools = pools or {"team-research": 40, "team-applied": 40, "preflight": 4, "shared": 116}
    nodes = [_node("cp-0", {"node-role.kubernetes.io/control-plane": ""},
                   [("node-role.kubernetes.io/control-plane", "", "NoSchedule")], {"cpu": "8", "memory": "32Gi"})]
    for pool, count in pools.items():
        for _ in range(count):
            labels, taints = {pool_key: pool, **(extra_labels or {}).get(pool, {})}, []
            if pool.startswith("team-"):
                labels[team_key] = pool.removeprefix("team-")
                taints.append((team_key, pool.removeprefix("team-"), "NoSchedule"))
            elif pool == "preflight":
                taints.append((preflight_key, "pending", "NoSchedule"))
            nodes.append(_node(f"ip-10-0-{len(nodes) // 250}-{len(nodes) % 250}", labels, taints))
    return nodes


def _loaded(tmp_path, inf, nodes):
    path = tmp_path / "site.yaml"
    path.write_text(render(inf, "https://api.example:6443"))
    profile = load_profile(str(path), [])
    return profile, plan_differences(profile, nodes), path.read_text()


@pytest.mark.cluster
def test_the_embedded_clusters_own_nodes_give_back_its_node_plan(tmp_path):
    smoke = load_profile("smoke", [])
    nodes = list(node_bodies(smoke, "r1"))
    inf = infer(nodes)
    assert {k: inf.keys[k] for k in ("nodes", "pool_label", "team_fraction", "team_taint_key", "preflight_fraction",
                                     "preflight_taint_key", "node_gpus", "node_cpu", "node_memory", "node_max_pods",
                                     "node_ephemeral_storage", "node_name_prefix")} == {
        k: smoke[k] for k in ("nodes", "pool_label", "team_fraction", "team_taint_key", "preflight_fraction",
                              "preflight_taint_key", "node_gpus", "node_cpu", "node_memory", "node_max_pods",
                              "node_ephemeral_storage", "node_name_prefix")}
    assert sorted(inf.keys["teams"]) == sorted(smoke.teams) and inf.keys["real_nodes"] == 0
    profile, differences, _ = _loaded(tmp_path, inf, nodes)
    assert differences == [] and [(p.name, p.count) for p in node_plan(profile)] == sorted(
        [(p.name, p.count) for p in node_plan(smoke)], key=lambda pc: [p.name for p in node_plan(profile)].index(pc[0]))


@pytest.mark.unit
def test_a_sites_nodes_give_a_profile_that_loads_and_plans_its_pools(tmp_path):
    nodes = site_nodes()
    inf = infer(nodes)
    assert inf.keys["pool_label"] == "acme.io/pool" and inf.keys["team_taint_key"] == "acme.io/team"
    assert inf.keys["preflight_taint_key"] == "acme.io/gpu-check" and inf.keys["nodes"] == 200
    assert inf.keys["teams"] == ["applied", "research"] and inf.keys["team_fraction"] == 0.4
    assert inf.keys["preflight_fraction"] == 0.02 and inf.keys["node_gpus"] == 8
    profile, differences, text = _loaded(tmp_path, inf, nodes)
    assert differences == [], differences
    assert profile.pool_label == "acme.io/pool" and profile.real_nodes == 0
    # what it wrote, it says how it read; what it left, it says why
    assert "pool_label: acme.io/pool" in text and "# pools preflight (4), shared (116), team-applied (40)" in text
    assert "# Could not infer (left at the default of base.yaml):" in text
    assert "# - node_name_prefix: node names (e.g. ip-10-0-0-1) are not <prefix>-<pool>-<index>" in text
    assert "# - gang_scheduler_name: " in text
    assert yaml.safe_load(text)["teams"] == ["applied", "research"]


@pytest.mark.unit
def test_a_team_count_that_does_not_round_is_still_planned_exactly(tmp_path):
    """29 of 100: 0.29 x 100 is 28.999... in floating point; the fraction written must plan 29."""
    nodes = site_nodes({"team-a": 15, "team-b": 14, "preflight": 3, "shared": 68})
    inf = infer(nodes)
    _, differences, _ = _loaded(tmp_path, inf, nodes)
    assert differences == [] and inf.keys["teams"] == ["a", "b"], (differences, inf.keys)


@pytest.mark.unit
def test_two_labels_that_both_name_the_pools_are_said_not_guessed():
    same = {p: {"acme.io/nodegroup": p} for p in ("team-research", "team-applied", "preflight", "shared")}
    inf = infer(site_nodes(extra_labels=same))
    assert "pool_label" not in inf.keys
    assert "acme.io/nodegroup, acme.io/pool" in inf.unknown["pool_label"], inf.unknown["pool_label"]
    assert inf.keys["nodes"] == 201        # no pool label: every node, and it says so
    assert "no pool label inferred" in inf.how["nodes"]


@pytest.mark.unit
def test_two_taints_that_both_could_name_teams_are_said_not_guessed():
    nodes = site_nodes()
    for n in nodes:
        for t in list(n["spec"]["taints"]):
            if t["key"] == "acme.io/team":      # a second team-like taint, labelled too: both fit alike
                n["spec"]["taints"].append({"key": "acme.io/owner", "value": t["value"], "effect": "NoSchedule"})
                n["metadata"]["labels"]["acme.io/owner"] = t["value"]
    inf = infer(nodes)
    assert "team_taint_key" not in inf.keys
    assert "acme.io/owner, acme.io/team" in inf.unknown["team_taint_key"], inf.unknown
    assert inf.keys["teams"] == ["applied", "research"]     # the pools still name them


@pytest.mark.unit
def test_a_label_that_names_its_pools_otherwise_is_said_with_what_to_do():
    renamed = site_nodes()
    for n in renamed:
        labels = n["metadata"]["labels"]
        if "acme.io/pool" in labels:
            labels["acme.io/pool"] = labels["acme.io/pool"].replace("team-", "gpu-")
    inf = infer(renamed)
    assert "pool_label" not in inf.keys
    assert inf.unknown["pool_label"].startswith("acme.io/pool (gpu-applied, gpu-research, preflight, shared) "
                                                "split(s) the nodes as the taints do"), inf.unknown["pool_label"]
    assert "team-<team>, preflight, shared" in inf.unknown["pool_label"]
    assert inf.keys["team_taint_key"] == "acme.io/team" and inf.keys["teams"] == ["applied", "research"]


@pytest.mark.unit
def test_uneven_team_pools_and_differing_gpus_are_said():
    nodes = site_nodes({"team-research": 60, "team-applied": 20, "shared": 20})
    nodes[-1]["status"]["allocatable"] = {**CAPACITY, "nvidia.com/gpu": "4"}
    inf = infer(nodes)
    assert inf.keys["teams"] == ["research", "applied"]      # largest first: the plan gives remainders to the first
    assert "team pools are not of one size (research 60, applied 20)" in inf.unknown["team_fraction"]
    assert "node_gpus" not in inf.keys and "8 on 99, 4 on 1" in inf.unknown["node_gpus"], inf.unknown
    assert "no NoSchedule taint has the value pending" in inf.unknown["preflight_taint_key"]
    assert inf.keys["preflight_fraction"] == 0.0


def _command(*args):
    return subprocess.run([sys.executable, "-m", "clusterproof", "profile", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)


@pytest.mark.parametrize("args, says", [
    ((), "the following arguments are required: --from-cluster"),
    (("--from-cluster", "--cp-kubeconfig", "/nonexistent/kc"), "kubeconfig /nonexistent/kc does not exist"),
])
@pytest.mark.cluster
def test_bad_input_is_one_line_and_exit_4(args, says):
    run = _command(*args)
    assert run.returncode == 4 and says in run.stderr and len(run.stderr.strip().splitlines()) == 1, run.stderr


@pytest.mark.cluster
def test_the_session_clusters_nodes_give_its_profile_as_the_service_account(cluster, profile, tmp_path):
    """Read-only, with the shipped ServiceAccount's token: one LIST of nodes."""
    kubeconfig, _ = guest.kubeconfig_for(cluster.api, tmp_path)
    out = tmp_path / "session.yaml"
    run = _command("--from-cluster", "--cp-kubeconfig", str(kubeconfig), "-o", str(out))
    assert run.returncode == 0, run.stderr
    assert f"to {out}" in run.stderr and "could not infer are listed at its end" in run.stderr, run.stderr
    got = load_profile(str(out), [])
    for key in ("nodes", "pool_label", "team_fraction", "preflight_fraction", "team_taint_key", "preflight_taint_key",
                "node_gpus"):
        assert got[key] == profile[key], (key, got[key], profile[key], out.read_text())
    assert sorted(got.teams) == sorted(profile.teams) and got.real_nodes == 0
    assert "differs from the nodes" not in out.read_text(), out.read_text()
