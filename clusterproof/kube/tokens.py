"""A non-exempt identity for load: a ServiceAccount token from the TokenRequest API.

Why: the embedded cluster's admin certificate is in ``system:masters``, which
API Priority and Fairness exempts; load sent with it would never be queued or
rejected, unlike a real user's. A ServiceAccount falls under the
``service-accounts`` FlowSchema (priority level ``workload-low``), as a
training-job launcher running in the cluster would.

The token is written to a 0600 file in a private directory and only that
path is passed around; it is never printed.
"""
from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kubernetes import client

from clusterproof.core.run import metadata
from clusterproof.kube.client import create_if_absent, raw_request

SERVICE_ACCOUNT = "clusterproof-load"
# What the load does, and nothing more: the burst and flood locustfiles (pods) and the well-behaved
# client beside the flood (clusterproof.apf.flood: ConfigMaps and pods). A Role of the namespace, not the
# built-in ``edit``: RBAC lets the harness grant only what it holds there itself, and it holds no
# ``bind`` (clusterproof/kube/rbac.yaml, clusterproof-pool).
LOAD_RULES = [
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "create", "delete"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "delete"]},
]


@dataclass
class LoadIdentity:
    username: str        # system:serviceaccount:<ns>:<name>
    token_file: Path
    ca_file: str | None  # the API server's CA bundle from the kubeconfig, if any


def create_load_identity(api: client.ApiClient, namespace: str, run_id: str, directory: Path,
                         expiration_s: int = 3600) -> LoadIdentity:
    """ServiceAccount + Role (``LOAD_RULES``) + RoleBinding in ``namespace``, and a short-lived token.

    Everything lives in the run's namespace and carries its run label, so giving the namespace back
    removes them.
    """
    ns_path = f"/api/v1/namespaces/{namespace}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    # Created, or kept as an earlier burst in the same namespace made it (same spec).
    create_if_absent(api, f"{ns_path}/serviceaccounts", {"metadata": metadata(SERVICE_ACCOUNT, run_id)})
    create_if_absent(api, f"{rbac}/roles", {"metadata": metadata(SERVICE_ACCOUNT, run_id), "rules": LOAD_RULES})
    create_if_absent(api, f"{rbac}/rolebindings",
                     {"metadata": metadata(SERVICE_ACCOUNT, run_id),
                      "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SERVICE_ACCOUNT},
                      "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]})
    resp = json.loads(raw_request(api, "POST", f"{ns_path}/serviceaccounts/{SERVICE_ACCOUNT}/token",
                                  body={"apiVersion": "authentication.k8s.io/v1",
                                        "kind": "TokenRequest",
                                        "spec": {"expirationSeconds": expiration_s}}).data)
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, stat.S_IRWXU)
    token_file = directory / "token"
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(resp["status"]["token"])
    return LoadIdentity(f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}", token_file,
                        api.configuration.ssl_ca_cert or None)

