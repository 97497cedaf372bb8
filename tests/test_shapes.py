"""The allowlist of the harness's shapes: one table (clusterproof/kube/shapes.py), the policies that enforce it, the
server's own schema.

- Each policy's key lists are the table's admitted keys, and the Role policy's rules are the load identity's.
- Every policy of both manifests holds the same identities, and the permission check has a request for each.
- Every field of the pod schema the server under test serves (its OpenAPI) is classified, allowed with a reason or
  refused: a field a later Kubernetes adds is named here, and refused by the policies until someone adds it.
Negative controls: a schema with a field the table does not know, and a type it has no table for, are named.
"""
from __future__ import annotations

import ast
import base64
import copy
import json

import pytest

from clusterproof.kube import access, shapes
from clusterproof.kube.client import raw_request
from clusterproof.kube.tokens import LOAD_RULES

pytestmark = [pytest.mark.selftest]


def _policies(destructive: bool = True) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in access.manifest_docs(destructive)
            if d["kind"] == "ValidatingAdmissionPolicy"}


def _variable(policy: dict, name: str) -> str:
    return next(v["expression"] for v in policy["spec"].get("variables") or [] if v["name"] == name)


@pytest.mark.parametrize("policy,variable", [pytest.param(p, v, id=f"{p}.{v}") for p, v in shapes.POLICY_KEYS])
def test_each_key_list_of_the_policies_is_the_tables(policy, variable):
    listed = json.loads(_variable(_policies()[policy], variable))
    wanted = shapes.admitted(shapes.POLICY_KEYS[(policy, variable)])
    assert sorted(listed) == wanted, f"{policy} {variable}: {sorted(set(listed) ^ set(wanted))} differ"


def test_every_policy_holds_object_metadata_to_the_tables_keys():
    wanted = shapes.admitted(shapes.META + "ObjectMeta")
    with_meta = {n: json.loads(_variable(p, "metaKeys")) for n, p in _policies().items()
                 if any(v["name"] == "metaKeys" for v in p["spec"].get("variables") or [])}
    assert len(with_meta) >= 9, sorted(with_meta)
    assert all(sorted(keys) == wanted for keys in with_meta.values()), with_meta


def test_the_role_policy_admits_exactly_the_load_identitys_rules():
    rules = ast.literal_eval(" ".join(_variable(_policies()["clusterproof-roles"], "loadRules").split()))
    assert rules == LOAD_RULES


def test_every_policy_of_both_manifests_holds_the_same_identities():
    """One definition of who the harness is: every ServiceAccount of its home and pool namespaces."""
    conditions = {n: p["spec"]["matchConditions"] for n, p in _policies().items()}
    assert len({json.dumps(c, sort_keys=True) for c in conditions.values()}) == 1, conditions
    expression = next(iter(conditions.values()))[0]["expression"]
    assert f"system:serviceaccount:{access.HOME}:" in expression and \
        f"system:serviceaccount:{access.POOL_PREFIX}" in expression


def test_the_permission_check_sends_a_request_each_policy_must_refuse():
    node = {"metadata": {"name": "n1", "resourceVersion": "1"}, "spec": {}}
    probed = {p.policy for p in access.probes("clusterproof-0", "n1", True, node, frozenset({"podgroups"}))
              if not p.admit}
    assert probed == set(_policies()), sorted(set(_policies()) ^ probed)


def test_a_token_says_its_audiences_and_nothing_else_is_read():
    payload = base64.urlsafe_b64encode(json.dumps({"aud": ["https://a", "https://b"], "sub": "x"}).encode()).decode()
    assert access.token_audiences(f"h.{payload.rstrip('=')}.sig") == ["https://a", "https://b"]
    assert access.token_audiences("not-a-jwt") == [] and access.token_audiences("a.!!!.c") == []


def test_the_pool_quota_fits_the_nightly_profiles_largest_check():
    from clusterproof.config.profile import load_profile
    hard = next(d for d in access.manifest_docs(False) if d["kind"] == "ResourceQuota"
                and d["metadata"]["namespace"] == "clusterproof-0")["spec"]["hard"]
    needs = access.pool_needs(load_profile("nightly", []))
    assert needs["pods"][0] <= int(hard["pods"]) and needs["requests.nvidia.com/gpu"][0] <= int(
        hard["requests.nvidia.com/gpu"]), (needs, hard)
    bigger = access.pool_needs(load_profile("nightly", ["watch_sizes=9000"]))
    assert bigger["pods"] == (9000, "watch_sizes")


@pytest.fixture(scope="module")
def pod_schemas(cluster) -> dict:
    return json.loads(raw_request(cluster.api, "GET", "/openapi/v3/api/v1").data)["components"]["schemas"]


def test_every_field_of_the_servers_pod_schema_is_allowed_with_a_reason_or_refused(pod_schemas):
    missing = shapes.unclassified(pod_schemas)
    assert not missing, "fields of the server's schema that clusterproof/kube/shapes.py does not classify (the " \
                        "policies refuse them meanwhile; add each, allowed with a reason or refused): " + \
                        ", ".join(missing)


def test_a_field_the_table_does_not_know_is_named(pod_schemas):
    """Negative control: the schema of a later Kubernetes, with one more field in the pod's spec, in a container's
    security context and in the pod's metadata, and a type the table has never seen under an admitted field."""
    later = copy.deepcopy(pod_schemas)
    later[shapes.CORE + "PodSpec"]["properties"]["schedulingGroup"] = {"type": "object"}
    later[shapes.CORE + "SecurityContext"]["properties"]["userNamespace"] = {"type": "string"}
    later[shapes.META + "ObjectMeta"]["properties"]["owner"] = {"type": "string"}
    later[shapes.CORE + "Toleration"]["properties"]["window"] = {
        "allOf": [{"$ref": "#/components/schemas/" + shapes.CORE + "TolerationWindow"}]}
    later[shapes.CORE + "TolerationWindow"] = {"properties": {"from": {"type": "string"}}}
    named = shapes.unclassified(later)
    assert named == sorted([f"{shapes.CORE}PodSpec.schedulingGroup", f"{shapes.CORE}SecurityContext.userNamespace",
                            f"{shapes.META}ObjectMeta.owner", f"{shapes.CORE}Toleration.window"]), named
    later[shapes.CORE + "Toleration"]["properties"].pop("window")
    with_type = copy.deepcopy(later)
    with_type[shapes.CORE + "Container"]["properties"]["securityContext"] = {
        "allOf": [{"$ref": "#/components/schemas/" + shapes.CORE + "NewSecurityContext"}]}
    with_type[shapes.CORE + "NewSecurityContext"] = {"properties": {"x": {"type": "string"}}}
    assert f"{shapes.CORE}NewSecurityContext (a type no table classifies)" in shapes.unclassified(with_type)
