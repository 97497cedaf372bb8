"""Least privilege, asked of the API server and held at the door: what the shipped identity cannot do, and the
permission preflight's one line for each way a cluster falls short of the manifests.

The guest runs themselves (every suite as the ServiceAccount, tests/test_permissions.py) run alone after the
self-tests; these controls need no guest run, so they run on the workers, each against its worker's cluster:

- the ServiceAccount cannot do what a reviewer forbids (SelfSubjectAccessReview), and a ServiceAccount bound to
  the roles shipped before issue 20 is caught, rule by rule;
- a view-only identity, a binding missing one rule, an admission policy missing, unbound or not in force, a pool
  namespace named otherwise or without its quota, a profile larger than the pool's quota, a policy that would
  refuse the harness, a cluster that changes the harness's pods, an anonymous identity, a cluster without the
  namespace pool: each ends the run in one line naming what is missing and how to fix it.
"""
from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.core.waiting import wait_for
from clusterproof.kube import access
from clusterproof.kube.access import FORBIDDEN, Manifest
from clusterproof.kube.apicalls import Call
from clusterproof.kube.client import (
    api_message,
    create_if_absent,
    delete_if_present,
    get_if_present,
    load_client,
    merge_patch,
    raw_request,
)
from tests import guest
from tests.harness import ROOT, assert_one_line, run_pytest

pytestmark = [pytest.mark.coscheduling, pytest.mark.kueue]

OLD_ROLES = ROOT / "tests" / "data" / "rbac-over-broad.yaml"


# --- what the ServiceAccount cannot do, asked of the API server ----------------------------------

def _denied_forbidden(kubeconfig: Path) -> list[str]:
    """Each FORBIDDEN thing the identity of ``kubeconfig`` may do, as the API server answers."""
    api = load_client(kubeconfig)
    return [f"{call.describe()} ({why})" for call, why in FORBIDDEN
            if access.allowed(api, _review(call))]


def _review(call: Call) -> dict:
    attrs = {"group": call.group, "resource": call.resource, "verb": call.verb}
    attrs.update({k: v for k, v in (("subresource", call.subresource), ("namespace", call.namespace),
                                    ("name", call.name)) if v})
    return {"resourceAttributes": attrs}


@pytest.mark.cluster
def test_the_service_account_cannot_do_what_a_reviewer_forbids(cluster, tmp_path):
    """As the ServiceAccount, with both shipped manifests applied: no pods or tokens in kube-system, no
    deleting a namespace or FlowSchema it did not create, no touching kube-node-lease, ..."""
    extra = access.manifest_docs(True)[len(access.manifest_docs(False)):]
    with guest.applied(cluster.api, extra):
        kubeconfig, _ = guest.kubeconfig_for(cluster.api, tmp_path)
        allowed = _denied_forbidden(kubeconfig)
    assert not allowed, "the ServiceAccount may: " + "; ".join(allowed)


@pytest.mark.cluster
def test_only_a_wildcard_identity_skips_the_review_of_each_rule(cluster, tmp_path):
    """The permission check's shortcut (``access.SUPERUSER``: two reviews instead of one per rule) holds for the
    cluster's admin, and never for the ServiceAccount with both shipped manifests -- its gaps are still found
    rule by rule: with one rule unbound, ``missing`` names it."""
    assert all(access.allowed(cluster.api, spec) for spec in access.SUPERUSER)
    assert access.missing(cluster.api, Manifest.shipped(True, (), access.pool_namespaces(cluster.api))) == []
    extra = access.manifest_docs(True)[len(access.manifest_docs(False)):]
    with guest.applied(cluster.api, extra):
        kubeconfig, _ = guest.kubeconfig_for(cluster.api, tmp_path)
        sa = load_client(kubeconfig)
        assert not any(access.allowed(sa, spec) for spec in access.SUPERUSER)
        pool = access.pool_namespaces(cluster.api)
        assert access.missing(sa, Manifest.shipped(True, (), pool)) == []
        # a manifest granting more than the ServiceAccount holds: the extra rule is named, not skipped
        more = Manifest.shipped(True, ("kube-system",), pool)
        gaps = access.missing(sa, more)
        assert gaps and any("in namespace kube-system" in g for g in gaps), gaps


@pytest.mark.cluster
def test_a_service_account_bound_to_the_old_roles_is_caught(cluster, run_id, tmp_path):
    """Negative control of the probe above, live: the same questions asked as a ServiceAccount bound to
    the roles shipped before issue 20 come back allowed, and are named."""
    api, sa = cluster.api, f"cp-old-roles-{run_id[-4:]}"
    docs = [{**d, "metadata": {**d["metadata"], "name": f"{d['metadata']['name']}-{sa}"}}
            for d in yaml.safe_load_all(OLD_ROLES.read_text()) if d]
    docs += [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": access.HOME}}]
    docs += [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
              "metadata": {"name": d["metadata"]["name"]},
              "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                          "name": d["metadata"]["name"]},
              "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": access.HOME}]}
             for d in docs if d["kind"] == "ClusterRole"]
    with guest.applied(api, docs):
        kubeconfig, _ = guest.kubeconfig_for(api, tmp_path, name=sa)
        allowed = _denied_forbidden(kubeconfig)
    for expected in ("create pods in namespace kube-system", "delete namespaces kube-system",
                     "update leases n1 (coordination.k8s.io) in namespace kube-node-lease",
                     "delete flowschemas global-default"):
        assert any(a.startswith(expected) for a in allowed), (expected, allowed)


# --- the permission preflight: one line ----------------------------------------------------------

SCALE = "suites/test_cluster_scale.py"


@pytest.mark.control
def test_a_view_only_identity_is_told_what_is_missing_in_one_line(cluster, run_id, tmp_path):
    api, sa = cluster.api, f"cp-view-{run_id[-4:]}"
    docs = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": access.HOME}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": sa},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": access.HOME}]}]
    with guest.applied(api, docs):
        kubeconfig, token = guest.kubeconfig_for(api, tmp_path, name=sa)
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig)], tmp_path, timeout=120)
    assert_one_line(run, f"system:serviceaccount:{access.HOME}:{sa} may not", "get,list,watch nodes cluster-wide "
                    "(clusterproof)", "get /metrics", "ServiceAccount clusterproof/clusterproof with "
                    "clusterproof/kube/rbac.yaml")
    assert token not in run.output


@pytest.mark.control
def test_a_binding_missing_one_rule_ends_the_run_in_one_line_naming_it(cluster, run_id, tmp_path):
    """Negative control of the preflight: the shipped roles and bindings, under other names, for another
    ServiceAccount -- but the pool role without its pods/status rule. The run ends before any test naming
    the verb, the resource, the namespaces and the role."""
    api, sa = cluster.api, f"cp-short-{run_id[-4:]}"
    docs = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": access.HOME}}]
    for d in access.manifest_docs(False):
        if d["kind"] not in ("ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"):
            continue
        d = json.loads(json.dumps(d))
        d["metadata"]["name"] += f"-{sa}"
        if "roleRef" in d:
            d["roleRef"]["name"] += f"-{sa}"
            d["subjects"] = [{"kind": "ServiceAccount", "name": sa, "namespace": access.HOME}]
        if d["metadata"]["name"] == f"{access.POOL_ROLE}-{sa}":
            d["rules"] = [r for r in d["rules"] if r["resources"] != ["pods/status"]]
        docs.append(d)
    with guest.applied(api, docs):
        kubeconfig, _ = guest.kubeconfig_for(api, tmp_path, name=sa)
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig), "--cp-as-real-cluster"], tmp_path, timeout=120)
    assert_one_line(run, "may not patch pods/status in namespaces clusterproof-0, clusterproof-1, clusterproof-2 "
                    "and 5 more (clusterproof-pool):")


VAP = "/apis/admissionregistration.k8s.io/v1"


@contextlib.contextmanager
def _policy_changed(api, policy: str, how: str, variable: tuple[str, str] | None = None):
    """A policy of the manifests for one test: deleted, its binding deleted, its binding set to warn only, its
    validation made to admit everything, or (``variable``: name, expression) one variable changed; put back as
    the manifest has it afterwards."""
    docs = {(d["kind"], d["metadata"]["name"]): d for d in access.manifest_docs(True)}
    policy_path, binding_path = f"{VAP}/validatingadmissionpolicies/{policy}", \
        f"{VAP}/validatingadmissionpolicybindings/{policy}"
    try:
        if how == "missing":
            delete_if_present(api, policy_path)
        elif how == "unbound":
            delete_if_present(api, binding_path)
        elif how == "warn-only":
            merge_patch(api, binding_path, {"spec": {"validationActions": ["Warn"]}})
        elif how == "admits-all":
            merge_patch(api, policy_path, {"spec": {"validations": [{"expression": "true"}]}})
        elif how == "variable":
            merge_patch(api, policy_path, {"spec": {"variables": [
                {**v, "expression": variable[1]} if v["name"] == variable[0] else v
                for v in docs[("ValidatingAdmissionPolicy", policy)]["spec"]["variables"]]}})
        yield
    finally:
        for kind, path in (("ValidatingAdmissionPolicy", policy_path), ("ValidatingAdmissionPolicyBinding",
                                                                         binding_path)):
            delete_if_present(api, path)
            create_if_absent(api, path.rsplit("/", 1)[0], docs[(kind, policy)])


@pytest.mark.parametrize("how,expected", [
    pytest.param("missing", "ValidatingAdmissionPolicy clusterproof-services is missing on", id="missing"),
    pytest.param("unbound", "ValidatingAdmissionPolicy clusterproof-services on https", id="not-bound"),
    pytest.param("warn-only", "is not bound to deny (binding clusterproof-services changed)", id="warn-only"),
    pytest.param("admits-all", "ValidatingAdmissionPolicy clusterproof-services on https", id="not-in-force")])
@pytest.mark.control
def test_an_admission_policy_missing_unbound_or_not_in_force_ends_the_run_in_one_line(cluster, tmp_path, how,
                                                                                        expected):
    """Negative controls of the policy check: the run, as the ServiceAccount, ends before any test in one line
    naming the policy and what is wrong with it (and how to put it back)."""
    kubeconfig, token = guest.kubeconfig_for(cluster.api, tmp_path)
    with _policy_changed(cluster.api, "clusterproof-services", how):
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig), "--cp-as-real-cluster"], tmp_path, timeout=120)
    tail = {"missing": "kubectl apply -f clusterproof/kube/rbac.yaml",
            "unbound": "is not bound to deny (binding clusterproof-services missing)",
            "warn-only": "kubectl apply -f clusterproof/kube/rbac.yaml",
            "admits-all": "is not in force: a Service in clusterproof-0 with externalIPs, sent as "
                          "system:serviceaccount:clusterproof:clusterproof (server-side dry run), was admitted"}[how]
    assert_one_line(run, expected, tail)
    assert token not in run.output


@pytest.mark.unit
def test_an_api_server_without_admission_policies_is_told_in_one_line(monkeypatch):
    """An API server before 1.30 does not serve ValidatingAdmissionPolicy: the run ends in one line."""
    import clusterproof.kube.client as kube
    monkeypatch.setattr(kube, "get_if_present", lambda api, path, query=None: {"resources": [
        {"name": "validatingwebhookconfigurations"}]} if path == access.VAP_API else None)
    api = type("A", (), {"configuration": type("C", (), {"host": "https://10.0.0.1:6443"})()})()
    manifest = Manifest.shipped(False, pool=["clusterproof-0"])
    with pytest.raises(HarnessError, match=r"^the API server at https://10.0.0.1:6443 does not serve "
                                                  r"ValidatingAdmissionPolicy \(admissionregistration.k8s.io/v1, "
                                                  r"Kubernetes 1.30 or later\)"):
        access.check_policies(api, manifest, False, access.POLICY_USER)


@pytest.mark.control
def test_a_pool_namespace_named_otherwise_ends_the_run_in_one_line(cluster, run_id, tmp_path):
    """Negative control of the naming rule: the policies hold every ServiceAccount of a namespace named
    clusterproof-..., so a pool namespace named otherwise would hold identities no policy looks at."""
    ns = f"pool-{run_id[-4:]}"
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {
        access.POOL_LABEL: "true", "pod-security.kubernetes.io/enforce": "restricted"}}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "clusterproof", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": access.POOL_ROLE},
             "subjects": [{"kind": "ServiceAccount", "name": access.SERVICE_ACCOUNT, "namespace": access.HOME}]}]
    kubeconfig, token = guest.kubeconfig_for(cluster.api, tmp_path)
    with guest.applied(cluster.api, docs):
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig)], tmp_path, timeout=120)
    assert_one_line(run, f"pool namespace(s) {ns} on https", "are not named clusterproof-<something>")
    assert token not in run.output


@contextlib.contextmanager
def _quota_removed(api, namespace: str):
    quota = next(d for d in access.manifest_docs(False) if d["kind"] == "ResourceQuota"
                 and d["metadata"]["namespace"] == namespace)
    path = f"/api/v1/namespaces/{namespace}/resourcequotas"
    try:
        delete_if_present(api, f"{path}/{access.QUOTA}")
        yield
    finally:
        create_if_absent(api, path, quota)


@pytest.mark.control
def test_a_pool_namespace_without_its_quota_ends_the_run_in_one_line(cluster, tmp_path):
    kubeconfig, _ = guest.kubeconfig_for(cluster.api, tmp_path)
    with _quota_removed(cluster.api, "clusterproof-3"):
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig)], tmp_path, timeout=120)
    assert_one_line(run, "ResourceQuota clusterproof is missing in namespace clusterproof-3 on https",
                    "kubectl apply -f clusterproof/kube/rbac.yaml")


@pytest.mark.control
def test_a_profile_larger_than_the_pools_quota_ends_a_destructive_run_in_one_line(cluster, tmp_path):
    """The watch suite's per-node pods of a profile asking 9,000 at once, against the pool's 8,000."""
    kubeconfig, _ = guest.kubeconfig_for(cluster.api, tmp_path)
    with guest.applied(cluster.api, access.manifest_docs(True)[len(access.manifest_docs(False)):]):
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig), "--cp-allow-destructive",
                          "--cp-set=watch_sizes=100,9000"], tmp_path, timeout=120)
    assert_one_line(run, "allows pods 8000, but the profile's largest check needs 9000 at once (watch_sizes)")


@pytest.mark.parametrize("policy,variable,expected", [
    pytest.param("clusterproof-serviceaccounts", ("apiAudiences", '["https://elsewhere.example.com"]'),
                 "admits a load identity's token only for https://elsewhere.example.com: add them to its variable "
                 "apiAudiences", id="token-audiences"),
    pytest.param("clusterproof-nodes", ("borrowable", "oldObject.metadata.?labels[?'example.com/pool'].orValue('') "
                                                      "== 'shared'"),
                 "the variable borrowable of clusterproof-nodes", id="borrowable-pool")])
@pytest.mark.control
def test_a_policy_that_would_refuse_the_harness_ends_the_run_in_one_line(cluster, tmp_path, policy, variable,
                                                                         expected):
    """Negative controls of the admitted probes: a site whose API server's token audiences are not the ones the
    policy lists, or whose node policy names another pool label than the profile's, would have the harness's own
    requests refused mid-run (a false red); the run ends before any test instead, naming the variable."""
    kubeconfig, token = guest.kubeconfig_for(cluster.api, tmp_path)
    with guest.applied(cluster.api, access.manifest_docs(True)[len(access.manifest_docs(False)):]), \
            _policy_changed(cluster.api, policy, "variable", variable):
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig), "--cp-allow-destructive"], tmp_path,
                         timeout=120)
    assert_one_line(run, expected)
    assert token not in run.output


@pytest.mark.control
def test_a_cluster_that_changes_the_harnesss_pods_ends_the_run_in_one_line(cluster, run_id, tmp_path):
    """Negative control of the admitted pod probe: a cluster whose own mutating admission labels every pod of the
    pool (a sidecar injector's mark, say) would have the harness's allowlist refuse every pod it sends; the run
    ends before any test, naming what happened."""
    name = f"sidecar-marks-{run_id[-4:]}"
    version = next(v for v in ("v1", "v1beta1") if get_if_present(
        cluster.api, f"/apis/admissionregistration.k8s.io/{v}/mutatingadmissionpolicies") is not None)
    api = f"/apis/admissionregistration.k8s.io/{version}"
    paths = {"MutatingAdmissionPolicy": f"{api}/mutatingadmissionpolicies",
             "MutatingAdmissionPolicyBinding": f"{api}/mutatingadmissionpolicybindings"}
    docs = [{"apiVersion": f"admissionregistration.k8s.io/{version}", "kind": "MutatingAdmissionPolicy",
             "metadata": {"name": name},
             "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                              "operations": ["CREATE"], "resources": ["pods"]}]},
                      "reinvocationPolicy": "Never", "failurePolicy": "Fail",
                      "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": (
                          "[JSONPatch{op: 'add', path: '/metadata/labels/sidecar.example.com~1injected', "
                          "value: 'true'}]")}}]}},
            {"apiVersion": f"admissionregistration.k8s.io/{version}", "kind": "MutatingAdmissionPolicyBinding",
             "metadata": {"name": name}, "spec": {"policyName": name, "matchResources": {"namespaceSelector": {
                 "matchLabels": {access.POOL_LABEL: "true"}}}}}]
    kubeconfig, _ = guest.kubeconfig_for(cluster.api, tmp_path)
    try:
        for doc in docs:
            create_if_absent(cluster.api, paths[doc["kind"]], doc)
        run = run_pytest([SCALE, "--cp-kubeconfig", str(kubeconfig)], tmp_path, timeout=120)
    finally:
        for doc in reversed(docs):
            delete_if_present(cluster.api, f"{paths[doc['kind']]}/{name}")
    assert_one_line(run, "a pod in clusterproof-0 as a run builds it", "was refused",
                    "label sidecar.example.com/injected", "something on the cluster changes or refuses the harness's "
                                                          "pods there")


@pytest.mark.control
def test_an_anonymous_identity_is_told_in_one_line_that_it_cannot_ask(cluster, tmp_path):
    """A kubeconfig with no credentials: /version answers, the SelfSubjectAccessReview does not."""
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "anon",
           "clusters": [{"name": "c", "cluster": {"server": cluster.api.configuration.host,
                                                  "certificate-authority": cluster.api.configuration.ssl_ca_cert}}],
           "users": [{"name": "anon", "user": {}}],
           "contexts": [{"name": "anon", "context": {"cluster": "c", "user": "anon"}}]}
    path = tmp_path / "anon.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    run = run_pytest([SCALE, "--cp-kubeconfig", str(path)], tmp_path, timeout=120)
    assert_one_line(run, "refused a SelfSubjectAccessReview", "system:basic-user")


@pytest.fixture
def pool_unlabelled(cluster):
    """The pool namespaces without their pool label for one test (put back afterwards)."""
    names = access.pool_namespaces(cluster.api)
    try:
        for ns in names:
            merge_patch(cluster.api, f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {access.POOL_LABEL: None}}})
        yield names
    finally:
        for ns in names:
            merge_patch(cluster.api, f"/api/v1/namespaces/{ns}", {"metadata": {"labels": {access.POOL_LABEL: "true"}}})


@pytest.mark.control
def test_a_cluster_without_the_namespace_pool_is_told_in_one_line_how_to_provision_it(cluster, pool_unlabelled,
                                                                                     tmp_path):
    run = run_pytest([SCALE, "--cp-kubeconfig", str(cluster.kubeconfig)], tmp_path, timeout=120)
    assert_one_line(run, f"is labelled {access.POOL_LABEL}=true", "kubectl apply -f clusterproof/kube/rbac.yaml")


@pytest.mark.unit
def test_team_bindings_are_printed_for_the_profiles_team_namespaces(tmp_path):
    profile = tmp_path / "teams.yaml"
    profile.write_text("teams: [research, applied]\nteam_namespaces: [research=ml-research, applied=ml-applied]\n")
    import subprocess
    import sys
    out = subprocess.run([sys.executable, "-m", "clusterproof.kube.access", "team-bindings", "--cp-profile",
                          str(profile)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = list(yaml.safe_load_all(out.stdout))
    assert [(d["metadata"]["namespace"], d["roleRef"]["name"]) for d in docs] == \
        [("ml-research", access.TEAM_ROLE), ("ml-applied", access.TEAM_ROLE)]


@pytest.mark.parametrize("namespace", ["kube-system", "kube-node-lease", "default", "clusterproof", "clusterproof-3"])
@pytest.mark.unit
def test_team_bindings_refuse_a_namespace_that_is_not_a_teams_in_one_line(tmp_path, namespace):
    """Negative control of the command above: a profile naming kube-system (or default, or the harness's own
    namespaces) as a team's would have the SRE bind pod rights there -- any ServiceAccount of kube-system."""
    import subprocess
    import sys
    profile = tmp_path / "teams.yaml"
    profile.write_text(f"teams: [research]\nteam_namespaces: [research={namespace}]\n")
    out = subprocess.run([sys.executable, "-m", "clusterproof.kube.access", "team-bindings", "--cp-profile",
                          str(profile)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 4 and not out.stdout, (out.returncode, out.stdout, out.stderr)
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and f"{namespace} is not a team's namespace" in lines[0], out.stderr


@pytest.mark.parametrize("admission", ["harness", "wildcard"])
@pytest.mark.control
def test_a_guest_is_refused_installing_admission_policies_in_one_line(cluster, admission, tmp_path):
    """On a cluster it does not own the taint suite checks the cluster's own admission: a profile asking the
    harness to install its policies there ends the run before any test, saying why."""
    run = run_pytest([SCALE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-as-real-cluster",
                      f"--cp-set=team_admission={admission}"], tmp_path, timeout=120)
    assert_one_line(run, f"team_admission={admission} installs admission policies",
                    "test the cluster's own admission (team_admission: cluster)")


@pytest.mark.cluster
def test_the_destructive_manifest_lets_the_service_account_create_only_its_own_narrow_flow(cluster, tmp_path):
    """RBAC cannot restrict `create` by name; the ValidatingAdmissionPolicy of rbac-destructive.yaml does.
    As the ServiceAccount: a FlowSchema of another name, one named clusterproof-flood that would match
    everyone's requests, a level that lends seats and one that says nothing of borrowing (unlimited) are all
    refused; the narrow one is admitted (server-side dry run: nothing is stored)."""
    extra = access.manifest_docs(True)[len(access.manifest_docs(False)):]
    fs, pl = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", \
        "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations"
    pool = access.pool_namespaces(cluster.api)[0]

    def schema(name, subject):
        return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": {"name": name},
                "spec": {"priorityLevelConfiguration": {"name": "clusterproof-flood"}, "matchingPrecedence": 1000,
                         "rules": [{"subjects": [subject], "nonResourceRules": [{"verbs": ["*"],
                                                                                 "nonResourceURLs": ["*"]}]}]}}
    ours = {"kind": "ServiceAccount", "serviceAccount": {"namespace": pool, "name": "clusterproof-load"}}
    everyone = {"kind": "Group", "group": {"name": "system:authenticated"}}

    def level(shares, lendable=0, borrowing: int | None = 0):
        limited = {"nominalConcurrencyShares": shares, "lendablePercent": lendable, "limitResponse": {"type": "Reject"}}
        if borrowing is not None:
            limited["borrowingLimitPercent"] = borrowing
        return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
                "metadata": {"name": "clusterproof-flood"}, "spec": {"type": "Limited", "limited": limited}}
    with guest.applied(cluster.api, extra):
        sa = load_client(guest.kubeconfig_for(cluster.api, tmp_path)[0])

        def answer(path, body) -> str:
            try:
                raw_request(sa, "POST", path, {"dryRun": "All"}, body=body).data
                return "admitted"
            except client.ApiException as e:
                return f"{e.status}: {api_message(e)}"
        # The policy reaches the apiserver's admission cache asynchronously after it is applied.
        wait_for(lambda: answer(fs, schema("not-clusterproof", ours)), until=lambda a: a != "admitted", timeout=30,
                 interval=0.5, what="the fixed-name policy in effect")
        verdicts = {"other name": answer(fs, schema("not-clusterproof", ours)),
                    "matches everyone": answer(fs, schema("clusterproof-flood", everyone)),
                    "too many shares": answer(pl, level(100)),
                    "lends seats": answer(pl, level(1, lendable=50)),
                    "borrows without a bound": answer(pl, level(1, borrowing=None)),
                    "the narrow flow": answer(fs, schema("clusterproof-flood", ours)),
                    "the narrow level": answer(pl, level(1))}
    assert ("may create only the FlowSchema and priority level named clusterproof-flood"
            in verdicts["other name"]), verdicts
    assert "may match only its load ServiceAccount clusterproof-load of its pool namespaces" in \
        verdicts["matches everyone"], verdicts
    assert "must be Limited, at most 10 shares" in verdicts["too many shares"], verdicts
    assert "lending and borrowing nothing" in verdicts["lends seats"], verdicts
    assert "borrowingLimitPercent both present and 0" in verdicts["borrows without a bound"], verdicts
    assert verdicts["the narrow flow"] == verdicts["the narrow level"] == "admitted", verdicts
