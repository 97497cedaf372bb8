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

pytestmark = pytest.mark.selftest
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
