"""Least privilege: the harness says what it needs, checks it before any test, and gets by with it.

A ServiceAccount of this session's cluster stands in for the identity an
SRE hands out; its token goes into a kubeconfig of its own:

- bound to the built-in ``view`` ClusterRole (reads most namespaced
  objects, but no nodes and no /metrics): the run ends before any test with
  one line naming what is missing, exit 4, no traceback, no token printed;
- bound to the shipped ``clusterproof`` ClusterRole (fixtures/rbac.yaml):
  the read-only scale suite runs and passes.
"""
from __future__ import annotations

import json
import os

import pytest
import yaml

from fixtures.access import RBAC
from fixtures.kube import delete_if_present, get_if_present, raw_request
from fixtures.run import metadata
from tests.harness import assert_one_line, run_pytest

pytestmark = pytest.mark.selftest
SCALE = "suites/test_cluster_scale.py"
RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


@pytest.fixture
def shipped_roles(cluster, run_id):
    """The ClusterRoles of fixtures/rbac.yaml on this cluster (created here unless present)."""
    created = []
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and get_if_present(cluster.api, f"{RBAC_API}/clusterroles/{doc['metadata']['name']}") is None:
            raw_request(cluster.api, "POST", f"{RBAC_API}/clusterroles", body=doc).data
            created.append(doc["metadata"]["name"])
    try:
        yield
    finally:
        for name in created:
            delete_if_present(cluster.api, f"{RBAC_API}/clusterroles/{name}")


def _kubeconfig_for(cluster, run_id, role: str, tmp_path):
    """A ServiceAccount bound (cluster-wide) to ``role``, and a kubeconfig with its token."""
    api, ns, sa = cluster.api, f"cp-{run_id[-4:]}-perm-{os.urandom(2).hex()}", "clusterproof-tester"
    raw_request(api, "POST", "/api/v1/namespaces", body={"metadata": metadata(ns, run_id)}).data
    raw_request(api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", body={"metadata": {"name": sa}}).data
    binding = f"cp-{ns}"
    raw_request(api, "POST", f"{RBAC_API}/clusterrolebindings", body={
        "metadata": metadata(binding, run_id),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}).data
    token = json.loads(raw_request(api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token",
                                   body={"spec": {"expirationSeconds": 3600}}).data)["status"]["token"]
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sa",
           "clusters": [{"name": "c", "cluster": {"server": api.configuration.host,
                                                  "certificate-authority": api.configuration.ssl_ca_cert}}],
           "users": [{"name": "sa", "user": {"token": token}}],
           "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}
    path = tmp_path / "sa.kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    path.chmod(0o600)
    return path, token, (ns, binding)


@pytest.fixture
def identity(cluster, run_id, tmp_path, request):
    path, token, (ns, binding) = _kubeconfig_for(cluster, run_id, request.param, tmp_path)
    try:
        yield path, token
    finally:
        delete_if_present(cluster.api, f"{RBAC_API}/clusterrolebindings/{binding}")
        delete_if_present(cluster.api, f"/api/v1/namespaces/{ns}")


@pytest.mark.parametrize("identity", ["view"], indirect=True)
def test_a_view_only_identity_is_told_what_is_missing_in_one_line(identity, tmp_path):
    path, token = identity
    run = run_pytest([SCALE, "--kubeconfig", str(path)], tmp_path, timeout=120)
    assert_one_line(run, "may not get,list,watch nodes;", "; get /metrics",
                    "ClusterRole clusterproof from fixtures/rbac.yaml")
    assert token not in run.output


@pytest.mark.parametrize("identity", ["clusterproof"], indirect=True)
def test_the_shipped_role_is_enough_for_the_read_only_suite(shipped_roles, identity, cluster, tmp_path):
    path, token = identity
    run = run_pytest([SCALE, "--kubeconfig", str(path), "--profile", cluster.profile.name], tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]
    assert token not in run.output
