"""The SRE's side of a guest run, done on the self-tests' embedded cluster as an admin would.

Why a module: the permission self-tests need a cluster set up exactly as a
security team would set up a real one -- the shipped manifests applied, a
token for the ``clusterproof`` ServiceAccount, team namespaces of the
cluster's own (labelled, bound to ``clusterproof-team``) and the cluster's
own team admission -- and nothing more. Everything here is done with the
session's admin identity; the run under test then uses only the token.
"""
from __future__ import annotations

import json
import os
import threading
from contextlib import contextmanager
from pathlib import Path

import yaml

from clusterproof.core.run import metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube import access
from clusterproof.kube.client import create_if_absent, delete_if_present, list_raw, raw_request
from clusterproof.kube.namespaces import create_namespace
from clusterproof.kube.pods import delete_run_pods
from clusterproof.taints import admission as adm
from clusterproof.taints.isolation import PRIORITY_CLASSES
from clusterproof.watch.measure import node_tolerations, pool_nodes
from clusterproof.watch.pernode_service import PerNodeService, Step

RBAC_API = "/apis/rbac.authorization.k8s.io/v1"


def kubeconfig_for(api, directory: Path, namespace: str = access.HOME, name: str = access.SERVICE_ACCOUNT,
                   expiration_s: int = 7200) -> tuple[Path, str]:
    """A kubeconfig (0600) holding a fresh token of ServiceAccount ``namespace/name``; (path, token)."""
    token = json.loads(raw_request(api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                   body={"spec": {"expirationSeconds": expiration_s}}).data)["status"]["token"]
    return token_kubeconfig(api, directory, name, token), token


def token_kubeconfig(api, directory: Path, name: str, token: str) -> Path:
    """A kubeconfig (0600) for ``api``'s server holding ``token`` (one the harness minted, say)."""
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "sa",
           "clusters": [{"name": "c", "cluster": {"server": api.configuration.host,
                                                  "certificate-authority": api.configuration.ssl_ca_cert}}],
           "users": [{"name": "sa", "user": {"token": token}}],
           "contexts": [{"name": "sa", "context": {"cluster": "c", "user": "sa"}}]}
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.kubeconfig"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(cfg))
    return path


@contextmanager
def applied(api, docs: list[dict]):
    """``docs`` created (what was already there is kept), and what was created here removed afterwards.

    Returns once every binding among them is in effect: the authorizer reads RBAC objects from a cache,
    and a run started right after ``kubectl apply`` may otherwise be refused what was just granted."""
    made = []
    try:
        for path, doc in access.object_paths(docs):
            if create_if_absent(api, path, doc):
                made.append(f"{path}/{doc['metadata']['name']}")
        for doc in docs:
            _wait_effective(api, doc, docs)
        yield
    finally:
        for path in reversed(made):
            delete_if_present(api, path)


def _wait_effective(api, binding: dict, docs: list[dict]) -> None:
    """Until the first rule of ``binding``'s role (if it is among ``docs``) is allowed to its first subject,
    as the API server's authorizer answers (a SubjectAccessReview, asked by the admin)."""
    if binding.get("kind") not in ("ClusterRoleBinding", "RoleBinding") or not binding.get("subjects"):
        return
    ref = binding["roleRef"]
    role = next((d for d in (*docs, *access.manifest_docs(True))
                 if d["kind"] == ref["kind"] and d["metadata"]["name"] == ref["name"]), None)
    rule = next((r for r in (role or {}).get("rules") or [] if r.get("resources")), None)
    if rule is None:
        return
    sa = binding["subjects"][0]
    user = f"system:serviceaccount:{sa['namespace']}:{sa['name']}"
    attrs = {"group": rule["apiGroups"][0], "resource": rule["resources"][0].split("/")[0],
             "verb": rule["verbs"][0], "namespace": binding["metadata"].get("namespace", "")}
    if "/" in rule["resources"][0]:
        attrs["subresource"] = rule["resources"][0].split("/", 1)[1]
    if rule.get("resourceNames"):
        attrs["name"] = rule["resourceNames"][0]

    def allowed() -> bool:
        review = json.loads(raw_request(api, "POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", body={
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": ["system:serviceaccounts", f"system:serviceaccounts:{sa['namespace']}",
                                              "system:authenticated"], "resourceAttributes": attrs}}).data)
        return bool(review["status"].get("allowed"))
    wait_for(allowed, timeout=30, interval=0.2, what=f"{binding['kind']} {binding['metadata']['name']} in effect")


@contextmanager
def team_namespaces(api, profile, sre: str):
    """The cluster's own team namespaces (labelled with the team), the harness's team RoleBindings in them,
    the cluster's own team admission and low-priority class: {team: namespace}.

    The admission acts where the harness's pods go (the team namespaces and the pool), as a cluster's
    own admission acts on every tenant namespace."""
    rules = adm.TeamRules.from_profile(profile)
    names = {team: f"team-{team}-{sre}"[:63] for team in profile.teams}
    docs = [{"apiVersion": "v1", "kind": "Namespace",
             "metadata": {"name": ns, "labels": {rules.namespace_label: team}}} for team, ns in names.items()]
    docs += access.team_bindings(list(names.values()))
    with applied(api, docs):
        admission = adm.install_admission(api, rules, sre, "harness",
                                          (*names.values(), *access.pool_namespaces(api)))
        pc = create_if_absent(api, PRIORITY_CLASSES, {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
            "metadata": metadata(profile.low_priority_class, sre), "value": profile.low_priority_value,
            "preemptionPolicy": "Never", "description": "the cluster's own low priority (clusterproof self-test)"})
        try:
            yield names
        finally:
            admission.remove(api)
            if pc:
                delete_if_present(api, f"{PRIORITY_CLASSES}/{profile.low_priority_class}")


def team_setting(names: dict[str, str]) -> str:
    """``--cp-set`` value naming the team namespaces."""
    return "team_namespaces=" + ",".join(f"{team}={ns}" for team, ns in names.items())


@contextmanager
def churned_service(api, profile, owner: str, endpoints: int = 150, pool: str | None = None, share: float = 1.0):
    """Someone else's Service, as on a real cluster: a per-node Service of ``endpoints`` endpoints in a
    namespace of ``owner``'s, one of its pods flipped ready/unready every second by a thread (what the
    watch suite's read-only mode measures, ``watch_service=<namespace>/<name>``); removed afterwards.
    ``pool``: only that node pool's nodes (default: the profile's ``watch_pool``); ``share``: only that
    share of them (the first, by name), the others left idle."""
    ns = f"cp-{owner[-4:]}-existing-{os.urandom(2).hex()}"
    create_namespace(api, ns, owner)
    nodes = (pool_nodes(api, profile) if pool is None else
             sorted(n["metadata"]["name"] for n in list_raw(api, "/api/v1/nodes",
                                                           {"labelSelector": f"{profile.pool_label}={pool}"})["items"]))
    nodes = nodes[:max(1, round(len(nodes) * share))]
    # each pod tolerates exactly its node's taints (a blanket ``Exists``, as node-exporter's manifest has, is
    # refused by a team admission policy in a namespace that is no team's)
    by_name = {n["metadata"]["name"]: n for n in list_raw(api, "/api/v1/nodes")["items"]}
    svc = PerNodeService(api, ns, owner, nodes, "node-exporter",
                         tolerations=node_tolerations([by_name[n] for n in nodes]))
    stop = threading.Event()

    def churn():
        i = 0
        while not stop.wait(1.0):
            svc.apply(Step("unready" if i % 2 == 0 else "ready", slot=17), endpoints)
            i += 1
    try:
        svc.create()
        svc.grow(endpoints)
        wait_for(svc.differences, until=lambda d: not d, timeout=120, interval=1, what="the existing Service settled")
        threading.Thread(target=churn, daemon=True).start()
        yield f"{ns}/{svc.name}", svc
    finally:
        stop.set()
        delete_run_pods(api, ns, owner)
        delete_if_present(api, f"/api/v1/namespaces/{ns}")
