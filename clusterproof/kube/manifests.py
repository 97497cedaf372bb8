"""The shipped manifests (clusterproof/kube/rbac.yaml, rbac-destructive.yaml), read: their documents and the names of
their admission policies.

Why a leaf module: the permission check (``kube.access``) reads them to check a cluster, and the request record
(``kube.apicalls``) to tell a refusal by one of these policies from one by the cluster's own (whose names may share
the prefix ``clusterproof-``); neither may import the other's way round. Pure: no Kubernetes client.
"""
from __future__ import annotations

import functools
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
RBAC = HERE / "rbac.yaml"
RBAC_DESTRUCTIVE = HERE / "rbac-destructive.yaml"


def manifest_docs(destructive: bool) -> list[dict]:
    files = [RBAC] + ([RBAC_DESTRUCTIVE] if destructive else [])
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


@functools.cache
def policy_names(destructive: bool) -> tuple[str, ...]:
    """The ValidatingAdmissionPolicies of the manifests a run works under, in the manifests' order."""
    return tuple(d["metadata"]["name"] for d in manifest_docs(destructive)
                 if d["kind"] == "ValidatingAdmissionPolicy")
