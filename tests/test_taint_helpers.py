"""Unit tests (no cluster) of the taint suite's pure helpers: policy generation,
the foreign-toleration rule, the scheduler-message pattern, the placement table,
and the profile checks of the taint keys."""
from __future__ import annotations

from collections import Counter

import pytest

from clusterproof.config.profile import load_profile
from clusterproof.core.errors import HarnessError
from clusterproof.core.keygroup import parse_team_namespaces
from clusterproof.core.run import RUN_LABEL
from clusterproof.kube import placement as pl
from clusterproof.taints import admission as adm

pytestmark = pytest.mark.unit
KEY = "openai.com/team"
RULES = adm.TeamRules(KEY, ("research", "applied"), "openai.com/team", "borrow", "reject")


def test_team_toleration_is_exact_and_equal():
    assert RULES.toleration("research") == {"key": KEY, "operator": "Equal", "value": "research",
                                            "effect": "NoSchedule"}


@pytest.mark.parametrize("tol,team,low,foreign", [
    pytest.param({"key": KEY, "operator": "Equal", "value": "research"}, "research", False, False, id="own-team"),
    pytest.param({"key": KEY, "value": "research"}, "research", False, False, id="own-team-default-operator"),
    pytest.param({"key": KEY, "operator": "Equal", "value": "applied"}, "research", False, True, id="other-team"),
    pytest.param({"key": KEY, "operator": "Exists"}, "research", False, True, id="every-team"),
    pytest.param({"operator": "Exists"}, "research", False, True, id="wildcard"),
    pytest.param({"operator": "Exists"}, "", True, True, id="wildcard-even-for-low-priority"),
    pytest.param({"key": KEY, "operator": "Equal", "value": "applied"}, "", True, False, id="low-priority-borrows"),
    pytest.param({"key": KEY, "operator": "Equal", "value": "research"}, "", False, True, id="no-team"),
    pytest.param({"key": "example.com/maintenance", "operator": "Exists"}, "research", False, False,
                 id="unrelated-key"),
])
def test_foreign_toleration_rule(tol, team, low, foreign):
    assert RULES.is_foreign(tol, team, low) is foreign


def test_mutating_policy_injects_by_namespace_label_with_a_json_patch():
    pol = adm.mutating_policy(RULES, "p", "run-1", "admissionregistration.k8s.io/v1beta1")
    spec = pol["spec"]
    assert pol["metadata"]["labels"] == {RUN_LABEL: "run-1"}
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    assert spec["failurePolicy"] == "Fail" and spec["reinvocationPolicy"] == "Never"
    v = {x["name"]: x["expression"] for x in spec["variables"]}
    assert 'namespaceObject.metadata.labels["openai.com/team"]' in v["team"]
    assert '["research", "applied"]' in v["team"]           # only known teams
    assert v["low"].endswith('== "borrow"')
    assert v["kept"] == "variables.tolerations"             # reject mode: nothing dropped here
    [m] = spec["mutations"]
    assert m["patchType"] == "JSONPatch"                     # not ApplyConfiguration: the list is atomic
    expr = m["jsonPatch"]["expression"]
    assert 'path: "/spec/tolerations"' in expr and 'operator: "Equal"' in expr
    assert "Exists" not in expr


def test_correcting_policy_drops_foreign_tolerations_and_broken_one_injects_a_wildcard():
    correct = adm.TeamRules(KEY, ("research",), KEY, "borrow", "correct")
    v = {x["name"]: x["expression"] for x in adm.mutating_policy(correct, "p", "r", "v")["spec"]["variables"]}
    assert v["kept"].startswith("variables.tolerations.filter(t, !")
    broken = adm.mutating_policy(RULES, "p", "r", "v", wildcard=True)
    assert 'Object.spec.tolerations{operator: "Exists"}' in broken["spec"]["mutations"][0]["jsonPatch"]["expression"]


@pytest.mark.parametrize("mode,ops", [pytest.param("reject", ["CREATE", "UPDATE"], id="reject"),
                                      pytest.param("correct", ["UPDATE"], id="correct")])
def test_validating_policy_refuses_foreign_tolerations(mode, ops):
    rules = adm.TeamRules(KEY, ("research",), KEY, "borrow", mode)
    pol = adm.validating_policy(rules, "v", "r")
    assert pol["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ops
    [val] = pol["spec"]["validations"]
    assert val["reason"] == "Forbidden" and "another team" in val["messageExpression"]


def test_bindings_select_only_this_runs_namespaces_or_named_ones():
    b = adm.binding("ValidatingAdmissionPolicyBinding", "v1", "b", "p", "run-1")
    assert b["spec"]["matchResources"]["namespaceSelector"] == {"matchLabels": {RUN_LABEL: "run-1"}}
    assert b["spec"]["validationActions"] == ["Deny"]
    named = adm.binding("MutatingAdmissionPolicyBinding", "v1", "b", "p", "run-1", ("ml-b", "ml-a"))
    assert named["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"][0]["values"] == ["ml-a", "ml-b"]
    assert "validationActions" not in named["spec"]


def test_untolerated_taint_count_from_the_1_35_scheduler_message():
    msg = ("0/100 nodes are available: 42 node(s) had untolerated taint(s), 58 node(s) didn't match "
           "Pod's node affinity/selector. preemption: 0/100 nodes are available: 100 Preemption is not helpful.")
    assert pl.untolerated_count([msg]) == 42
    assert pl.untolerated_count(["0/100 nodes are available: 100 Insufficient nvidia.com/gpu."]) is None
    assert pl.untolerated_count([]) is None


def _pod(ns, node, pc=None):
    return {"metadata": {"namespace": ns}, "spec": {"nodeName": node, "priorityClassName": pc}}


def test_placement_table_counts_pods_per_team_per_pool():
    pods = [_pod("ns-r", "n1"), _pod("ns-r", "n1"), _pod("ns-r", None), _pod("ns-x", "n2"),
            _pod("ns-x", "n3", "borrow"), _pod("ns-r", "n9")]
    pool_of = {"n1": "team-research", "n2": "shared", "n3": "team-applied"}
    counts = pl.placement_counts(pods, pool_of, {"ns-r": "research"}, "borrow")
    assert counts == {"research": Counter({"team-research": 2, "Pending": 1, "(unknown node)": 1}),
                      pl.NO_TEAM: Counter({"shared": 1}), pl.LOW: Counter({"team-applied": 1})}
    pools = ["team-research", "team-applied", "preflight", "shared"]
    table = pl.render_placement(counts, pools, ["research", "applied"]).splitlines()
    assert table[0] == "| pods of \\ on pool | team-research | team-applied | shared | (unknown node) | Pending |"
    assert table[2] == "| research | 2 | 0 | 0 | 1 | 1 |"
    assert table[3] == "| no team | 0 | 0 | 1 | 0 | 0 |"
    assert table[4] == "| low priority | 0 | 1 | 0 | 0 | 0 |"
    csv = pl.placement_csv(counts, pools, ["research", "applied"]).splitlines()
    assert csv[0] == "team,team-research,team-applied,shared,(unknown node),Pending"
    assert csv[1] == "research,2,0,0,1,1"
    assert pl.render_placement({}, pools, []) == "(no pods)"


def test_describe_toleration_names_wildcards():
    assert adm.describe_toleration({"operator": "Exists"}) == "<any key> Exists (any effect)"
    assert adm.describe_toleration(RULES.toleration("applied")) == f"{KEY}=applied:NoSchedule"


@pytest.mark.parametrize("override,message", [
    pytest.param("team_taint_key=openai.com/team/x", "is not a valid label/taint key", id="bad-taint-key"),
    pytest.param("team_taint_key=clusterproof.io/preflight", "must differ", id="taint-key-is-preflight-key"),
    pytest.param("team_admission=webhook", "team_admission must be one of", id="unknown-admission"),
    pytest.param("low_priority_class=system-low", "not a valid PriorityClass name", id="reserved-class-name"),
    pytest.param("team_namespaces=research", "must be <team>=<namespace>", id="namespace-without-team"),
    pytest.param("team_namespaces=research=Bad_NS", "must be <team>=<namespace>", id="bad-namespace-name"),
    pytest.param("taint_borrow_nodes=21", "more than the 20 nodes of team-research", id="borrow-more-than-pool"),
])
def test_taint_profile_values_are_checked(override, message):
    with pytest.raises(HarnessError, match=message):
        load_profile("smoke", [override])


def test_team_namespaces_override_parses():
    p = load_profile("smoke", ["team_namespaces=research=ml-research,applied=ml-applied",
                               "team_taint_key=openai.com/team"])
    assert parse_team_namespaces(p.team_namespaces) == {"research": "ml-research", "applied": "ml-applied"}
    assert adm.resolve_admission("auto", owned=True) == "harness"
    assert adm.resolve_admission("auto", owned=False) == "cluster"


# --- what the checks measure (clusterproof.taints.measure) -------------------------------------------------

def _node(name: str, pool: str, *taints: dict, unschedulable: bool = False) -> pl.NodeInfo:
    return pl.NodeInfo(name, pool, list(taints), True, unschedulable)


def test_untolerated_pods_are_judged_by_where_they_landed_and_what_the_scheduler_said():
    from clusterproof.taints.measure import UntoleratedRun
    team = {"key": KEY, "value": "research", "effect": "NoSchedule"}
    nodes = {n.name: n for n in [_node("t1", "team-research", team), _node("t2", "team-research", team),
                                 _node("t3", "team-applied", team, unschedulable=True), _node("s1", "shared"),
                                 _node("bare", "team-applied")]}
    run = UntoleratedRun(None, "ns", "sel", 5)
    run.placed = {"ok": "s1", "on-team": "t1", "bare": "bare", "refused": None, "short": None, "silent": None}
    run.events = {"refused": ["0/5 nodes are available: 2 node(s) had untolerated taint(s)"],
                  "short": ["0/5 nodes are available: 1 node(s) had untolerated taint {x}"]}
    names = sorted(run.placed)
    assert run.count_silent_refusals(names, {"refused": ["..."]}) == 1      # "short" was refused with no event
    r = run.judge(names, nodes, KEY, "clusterproof.io/preflight")
    assert r.guarded == 2, "the unschedulable team node and the untainted one owe no refusal"
    assert (r.pending, r.bound, r.misplaced) == (3, 2, 4)
    assert any("on-team landed on team node t1" in p for p in r.problems)
    assert any("bare landed on team node bare (pool team-applied; carries no" in p for p in r.problems)
    assert any("silent is Pending without the scheduler refusing it" in p for p in r.problems)
    assert any("short: the scheduler refused only 1 node(s)" in p for p in r.problems)
    got = {f.name: (f.value, f.unit) for f in run.gather()}
    assert got == {"pods": (5.0, "pods"), "settle_s": (None, "s"), "refused_without_event": (1.0, "pods"),
                   "bound": (2.0, "pods"), "pending": (3.0, "pods"), "problems": (4.0, "")}


def test_team_pods_stay_on_their_pools_and_a_pod_sent_elsewhere_is_refused():
    from clusterproof.taints.measure import TeamPods
    refused = ["0/9 nodes are available: 3 node(s) had untolerated taint(s)"]
    settled = {"ns-r": ({"own": "n-r", "shared": "n-s", "stray": "n-a", "into-applied": None, "into-silent": None},
                        {"into-applied": refused, "into-silent": ["0/9 nodes: Insufficient cpu"]}),
               "ns-a": ({"into-research": "n-r"}, {})}
    off = {("ns-r", "into-applied"): "applied", ("ns-r", "into-silent"): "applied",
           ("ns-a", "into-research"): "research"}
    pools = {"n-r": "team-research", "n-a": "team-applied", "n-s": "shared"}
    run = TeamPods(settle_s=1.5, wrong_tolerations=["pod ns-r/x got a wildcard toleration"])
    run.judge_placement(settled, {"ns-r": "research", "ns-a": "applied"}, off, pools)
    assert run.misplaced == [
        "pod ns-r/stray of team research landed on node n-a of pool team-applied",
        "pod ns-r/into-silent is Pending without an untolerated-taint refusal from the scheduler "
        "(last: 0/9 nodes: Insufficient cpu)",
        "pod ns-a/into-research of team applied landed on node n-r of pool team-research"]
    assert {f.name: f.value for f in run.gather()} == {"settle_s": 1.5, "misplaced": 3, "wrong_tolerations": 1}


def test_a_judged_check_gathers_its_timings_and_counts_its_problems():
    from clusterproof.taints.measure import Borrowing, Eviction, NewNode
    assert {f.name: f.value for f in Borrowing(["a", "b"], borrow_s=2.0).gather()} == {
        "borrow_s": 2.0, "reclaim_s": None, "problems": 2}
    assert [f.name for f in Eviction().gather()] == ["evict_s", "problems"]
    assert NewNode(bind_s=1.0).problem_count == 0
