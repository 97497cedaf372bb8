"""Least privilege: what the harness may do on a cluster it does not own, stated once and checked.

Why: pre-upgrade validation runs with an identity a security team signs off,
a ServiceAccount with exactly what ``clusterproof/kube/rbac.yaml`` (and, for
``--cp-allow-destructive``, ``clusterproof/kube/rbac-destructive.yaml``) grant. This
module reads those manifests into a ``Manifest`` -- every role, and where
each is bound: cluster-wide, in the home namespace, in each pool namespace,
in each team namespace -- and uses it three ways:

- ``check``: before any test, one SelfSubjectAccessReview per rule item in
  every namespace it is bound in; a gap ends the run with one line (exit 4)
  naming the verb, the resource and the namespace;
- ``Manifest.allows``: which rule allows a recorded call
  (``clusterproof.kube.apicalls``): a self-test fails on any call the manifest does
  not allow, and on any rule no run used;
- ``FORBIDDEN``: what the identity must never be able to do (pods or tokens in
  kube-system, deleting namespaces or FlowSchemas it did not create, touching
  kube-node-lease...), checked against the manifest here and against the live
  cluster as the ServiceAccount in the self-test.

And what RBAC cannot say -- the shape of the pods, RoleBindings, Services,
FlowSchemas and node patches it may send -- the manifests say with
ValidatingAdmissionPolicies; ``check_policies`` proves, before any test, that
each exists, is bound and is in force (one request each must refuse, sent as
a server-side dry run), or ends the run in one line.

``python -m clusterproof.kube.access team-bindings --cp-profile P`` prints the
RoleBindings that give the harness its pods in the profile's team namespaces.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.kube.apicalls import Call
from clusterproof.kube.client import api_message, raw_request, server_url

HERE = Path(__file__).resolve().parent
RBAC = HERE / "rbac.yaml"
RBAC_DESTRUCTIVE = HERE / "rbac-destructive.yaml"
SERVICE_ACCOUNT = "clusterproof"
# The home namespace (the ServiceAccount's): run Leases, owner records, pool claims.
HOME = "clusterproof"
# Namespaces an SRE provisioned for the harness carry this label (and a RoleBinding to POOL_ROLE).
POOL_LABEL = "clusterproof.io/pool"
HOME_ROLE, POOL_ROLE, TEAM_ROLE = "clusterproof-home", "clusterproof-pool", "clusterproof-team"


@dataclass(frozen=True)
class RuleItem:
    """One (verb, group, resource[/subresource], name) a rule grants -- or (verb, URL) -- in one scope.

    ``scope``: "cluster", or the namespace it is granted in. ``role`` names the role it comes from.
    """
    role: str
    scope: str
    verb: str
    group: str = ""
    resource: str = ""           # with "/subresource" where the rule names one
    name: str = ""               # resourceNames entry ("" = any)
    url: str = ""

    def allows(self, call: Call) -> bool:
        if self.url:
            return not call.is_resource and self.verb in (call.verb, "*") and _url_matches(self.url, call.path)
        if not call.is_resource:
            return False
        if self.scope != "cluster" and self.scope != call.namespace:
            return False
        if self.verb not in (call.verb, "*") or self.group not in (call.group, "*"):
            return False
        wanted = call.resource + (f"/{call.subresource}" if call.subresource else "")
        if self.resource not in (wanted, "*") and not (self.resource == f"{call.resource}/*" and call.subresource):
            return False
        return not self.name or self.name == call.name

    def describe(self) -> str:
        if self.url:
            return f"{self.verb} {self.url} ({self.role})"
        what = self.resource + (f" {self.name}" if self.name else "") + (f" ({self.group})" if self.group else "")
        where = "cluster-wide" if self.scope == "cluster" else f"in namespace {self.scope}"
        return f"{self.verb} {what} {where} ({self.role})"

    def review(self) -> dict:
        """SelfSubjectAccessReview spec asking whether the identity has this item."""
        if self.url:
            return {"nonResourceAttributes": {"path": self.url, "verb": self.verb}}
        resource, _, sub = self.resource.partition("/")
        attrs = {"group": self.group, "resource": resource, "verb": self.verb}
        if sub:
            attrs["subresource"] = sub
        if self.name:
            attrs["name"] = self.name
        if self.scope != "cluster":
            attrs["namespace"] = self.scope
        return {"resourceAttributes": attrs}


def _url_matches(pattern: str, path: str) -> bool:
    return pattern == path or (pattern.endswith("*") and path.startswith(pattern[:-1]))


def rule_items(role: str, rules: list[dict], scope: str) -> list[RuleItem]:
    out = []
    for rule in rules or []:
        for verb in rule.get("verbs", []):
            if scope == "cluster":   # RBAC ignores non-resource URLs of a role bound in a namespace
                out += [RuleItem(role, "cluster", verb, url=url) for url in rule.get("nonResourceURLs", [])]
            for group in rule.get("apiGroups", []):
                for res in rule.get("resources", []):
                    out += [RuleItem(role, scope, verb, group, res, name)
                            for name in rule.get("resourceNames") or [""]]
    return out


# What every authenticated identity may do without any manifest: Kubernetes' bootstrap ClusterRoles
# bound to system:authenticated (system:basic-user: ask what it may do; system:discovery and
# system:public-info-viewer: discovery, version, health). The harness uses them; nobody grants them.
BUILT_IN = [RuleItem("system:basic-user", "cluster", "create", "authorization.k8s.io", r)
            for r in ("selfsubjectaccessreviews", "selfsubjectrulesreviews")] + \
           [RuleItem("system:basic-user", "cluster", "create", "authentication.k8s.io", "selfsubjectreviews")] + \
           [RuleItem("system:discovery", "cluster", "get", url=u)
            for u in ("/api", "/api/*", "/apis", "/apis/*", "/openapi", "/openapi/*", "/version", "/version/",
                      "/healthz", "/livez", "/readyz")]


@dataclass
class Manifest:
    """The roles of the shipped manifests and where they are bound for one identity."""
    items: list[RuleItem]
    home: str                                   # the namespace of the ServiceAccount (Leases, records)
    pool: list[str]                             # namespaces bound to the pool role
    namespaces: list[str] = field(default_factory=list)   # every Namespace the manifest creates
    roles: dict[str, list[dict]] = field(default_factory=dict)

    @classmethod
    def from_docs(cls, docs: list[dict], team_namespaces: tuple[str, ...] = (),
                  subject: tuple[str, str] = (HOME, SERVICE_ACCOUNT), pool: list[str] | None = None) -> "Manifest":
        """``subject``: (namespace, name) of the ServiceAccount whose grants count. ``pool``: the pool
        namespaces found on the cluster (bound to the pool role) instead of the manifest's own list."""
        roles = {(d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d.get("rules") or []
                 for d in docs if d and d.get("kind") in ("ClusterRole", "Role")}
        pool_override, pool = pool, []
        items: list[RuleItem] = []

        def bound(d: dict) -> bool:
            return any(s.get("kind") == "ServiceAccount" and (s.get("namespace"), s.get("name")) == subject
                       for s in d.get("subjects") or [])

        for d in docs:
            if not d or d.get("kind") not in ("ClusterRoleBinding", "RoleBinding") or not bound(d):
                continue
            ref, ns = d["roleRef"], d["metadata"].get("namespace", "")
            if ref["name"] == POOL_ROLE and ns:
                pool.append(ns)
                if pool_override is not None:
                    continue
            rules = roles.get((ref["kind"], ns if ref["kind"] == "Role" else "", ref["name"]), [])
            items += rule_items(ref["name"], rules, ns or "cluster")
        if pool_override is not None:
            pool = list(pool_override)
            items += [i for ns in pool
                      for i in rule_items(POOL_ROLE, roles.get(("ClusterRole", "", POOL_ROLE), []), ns)]
        team_rules = roles.get(("ClusterRole", "", TEAM_ROLE), [])
        for ns in team_namespaces:
            items += rule_items(TEAM_ROLE, team_rules, ns)
        return cls(items, subject[0], pool,
                   [d["metadata"]["name"] for d in docs if d and d.get("kind") == "Namespace"],
                   {name: rules for (_k, _ns, name), rules in roles.items()})

    @classmethod
    def shipped(cls, destructive: bool, team_namespaces: tuple[str, ...] = (),
                pool: list[str] | None = None) -> "Manifest":
        return cls.from_docs(manifest_docs(destructive), team_namespaces, pool=pool)

    def allows(self, call: Call) -> RuleItem | None:
        """The rule that allows ``call`` (the manifest's, or a built-in one every identity has)."""
        return next((i for i in (*self.items, *BUILT_IN) if i.allows(call)), None)

    def disallowed(self, calls) -> list[Call]:
        return sorted(c for c in calls if self.allows(c) is None)

    def unused(self, calls) -> list[RuleItem]:
        """Rule items no call used (a namespaced role counts as used if any of its namespaces used it)."""
        used = {(i.role, i.verb, i.group, i.resource, i.name, i.url) for c in calls for i in self.items
                if i.allows(c)}
        seen, out = set(), []
        for i in self.items:
            key = (i.role, i.verb, i.group, i.resource, i.name, i.url)
            if key not in used and key not in seen:
                seen.add(key)
                out.append(i)
        return out


def manifest_docs(destructive: bool) -> list[dict]:
    files = [RBAC] + ([RBAC_DESTRUCTIVE] if destructive else [])
    return [d for f in files for d in yaml.safe_load_all(f.read_text()) if d]


# --- what it must never be able to do -------------------------------------------------------

# (call, why a reviewer cares). Checked against the manifest (tests, no cluster) and, as the
# ServiceAccount, against a live cluster (tests/test_permissions.py).
FORBIDDEN: list[tuple[Call, str]] = [
    (Call("create", "", "pods", namespace="kube-system"), "a pod in kube-system runs as any ServiceAccount there"),
    (Call("create", "", "serviceaccounts", "token", "kube-system", "default"), "a token of a system ServiceAccount"),
    (Call("create", "", "serviceaccounts", "token", "default", "default"), "a token outside its namespaces"),
    (Call("get", "", "secrets", namespace="kube-system", name="x"), "Secrets"),
    (Call("list", "", "secrets"), "Secrets"),
    (Call("delete", "", "namespaces", name="kube-system"), "deleting a namespace it did not create"),
    (Call("delete", "", "namespaces", name="clusterproof-0"), "deleting a namespace provisioned for it"),
    (Call("create", "", "namespaces"), "creating namespaces"),
    (Call("delete", "", "pods", namespace="kube-system", name="x"), "deleting other tenants' pods"),
    (Call("deletecollection", "", "pods", namespace="default"), "deleting other tenants' pods"),
    (Call("create", "", "configmaps", namespace="kube-system"), "writing ConfigMaps outside its namespaces"),
    (Call("delete", "", "configmaps", namespace="default", name="x"), "deleting ConfigMaps outside its namespaces"),
    (Call("update", "coordination.k8s.io", "leases", namespace="kube-node-lease", name="n1"),
     "renewing or taking a kubelet's heartbeat Lease"),
    (Call("delete", "coordination.k8s.io", "leases", namespace="kube-node-lease", name="n1"),
     "deleting a kubelet's heartbeat Lease"),
    (Call("update", "coordination.k8s.io", "leases", namespace="kube-system", name="kube-scheduler"),
     "taking a leader-election lock"),
    (Call("delete", "flowcontrol.apiserver.k8s.io", "flowschemas", name="global-default"),
     "deleting a FlowSchema it did not create"),
    (Call("patch", "flowcontrol.apiserver.k8s.io", "flowschemas", name="system-nodes"),
     "changing a FlowSchema it did not create"),
    (Call("create", "rbac.authorization.k8s.io", "rolebindings", namespace="default"),
     "RoleBindings outside its namespaces"),
    (Call("create", "rbac.authorization.k8s.io", "clusterrolebindings"), "ClusterRoleBindings"),
    (Call("delete", "rbac.authorization.k8s.io", "clusterroles", name="admin"), "deleting a ClusterRole"),
    (Call("bind", "rbac.authorization.k8s.io", "clusterroles", name="edit"), "binding a role it does not hold"),
    (Call("bind", "rbac.authorization.k8s.io", "clusterroles", name="cluster-admin"), "binding cluster-admin"),
    (Call("escalate", "rbac.authorization.k8s.io", "clusterroles"), "escalating a role"),
    (Call("impersonate", "", "users", name="admin"), "impersonating a user"),
    (Call("impersonate", "", "serviceaccounts", namespace="kube-system", name="default"),
     "impersonating a ServiceAccount"),
    (Call("delete", "", "nodes", name="n1"), "deleting a node"),
    (Call("create", "", "nodes"), "registering a node"),
    (Call("patch", "", "nodes", "status", name="n1"), "faking a node's status"),
    (Call("delete", "scheduling.k8s.io", "priorityclasses", name="system-node-critical"),
     "deleting a PriorityClass"),
    (Call("create", "scheduling.k8s.io", "priorityclasses"), "creating a PriorityClass (globalDefault)"),
    (Call("delete", "admissionregistration.k8s.io", "validatingadmissionpolicies", name="x"),
     "deleting an admission policy"),
    (Call("create", "admissionregistration.k8s.io", "mutatingadmissionpolicies"), "mutating every pod"),
    (Call("create", "admissionregistration.k8s.io", "validatingwebhookconfigurations"), "admission webhooks"),
    (Call("create", "apiextensions.k8s.io", "customresourcedefinitions"), "CRDs"),
    (Call("create", "", "pods", "exec", "clusterproof-0", "x"), "exec (not needed)"),
    (Call("create", "", "pods", "eviction", "default", "x"), "evicting other tenants' pods"),
]


def over_broad(manifest: Manifest) -> list[str]:
    """Each forbidden thing the manifest allows, with the rule that allows it."""
    return [f"{call.describe()} -- {why} -- allowed by: {item.describe()}"
            for call, why in FORBIDDEN if (item := manifest.allows(call)) is not None]


# --- asked of the API server ----------------------------------------------------------------

def whoami(api: client.ApiClient) -> str:
    """The identity the API server sees (SelfSubjectReview); never a credential."""
    try:
        review = json.loads(raw_request(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                        body={"apiVersion": "authentication.k8s.io/v1",
                                              "kind": "SelfSubjectReview"}).data)
        return review["status"]["userInfo"].get("username", "?")
    except (client.ApiException, KeyError, ValueError):
        return "the kubeconfig's identity"


def allowed(api: client.ApiClient, spec: dict) -> bool:
    """One SelfSubjectAccessReview. A failing review is one line (HarnessError), not a traceback."""
    try:
        review = json.loads(raw_request(api, "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                        body={"apiVersion": "authorization.k8s.io/v1",
                                              "kind": "SelfSubjectAccessReview", "spec": spec}).data)
    except client.ApiException as e:
        raise HarnessError(f"the API server at {server_url(api)} refused a SelfSubjectAccessReview "
                           f"({e.status}: {api_message(e)}): the harness checks its permissions with it before "
                           "any test; every authenticated identity may ask it (ClusterRole system:basic-user) "
                           "unless that binding was removed") from None
    except ValueError:
        raise HarnessError(f"the API server at {server_url(api)} answered a SelfSubjectAccessReview "
                           "with something that is not JSON: is the kubeconfig's server a Kubernetes API "
                           "server?") from None
    return bool((review.get("status") or {}).get("allowed"))


def missing(api: client.ApiClient, manifest: Manifest) -> list[str]:
    """What the identity may not do of what the manifest grants it, grouped by resource and role
    ("list,watch nodes cluster-wide (clusterproof)", "list roles (rbac...) in namespaces a, b (clusterproof-pool)")."""
    items = manifest.items
    with ThreadPoolExecutor(max_workers=8) as pool:
        verdicts = list(pool.map(lambda i: allowed(api, i.review()), items))
    grouped: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for item, ok in zip(items, verdicts):
        if ok:
            continue
        what = item.url or (item.resource + (f" {item.name}" if item.name else "")
                            + (f" ({item.group})" if item.group else ""))
        verbs, scopes = grouped.setdefault((what, item.role), ([], []))
        verbs.append(item.verb) if item.verb not in verbs else None
        scopes.append(item.scope) if item.scope not in scopes else None
    out = []
    for (what, role), (verbs, scopes) in grouped.items():
        where = ("cluster-wide" if scopes == ["cluster"] else
                 f"in namespace {scopes[0]}" if len(scopes) == 1 else
                 f"in namespaces {', '.join(scopes[:3])}" + (f" and {len(scopes) - 3} more" if len(scopes) > 3 else ""))
        out.append(f"{','.join(verbs)} {what} {where} ({role})")
    return out


def pool_namespaces(api: client.ApiClient) -> list[str]:
    """The namespaces provisioned for the harness (label ``clusterproof.io/pool=true``), by name."""
    from clusterproof.kube.client import list_all
    return sorted(n["metadata"]["name"]
                  for n in list_all(api, "/api/v1/namespaces", {"labelSelector": f"{POOL_LABEL}=true"})
                  if not n["metadata"].get("deletionTimestamp"))


# Pod Security on the pool namespaces (clusterproof/kube/rbac.yaml): the one label that must hold.
PSA_ENFORCE = "pod-security.kubernetes.io/enforce"


def check(api: client.ApiClient, destructive: bool, team_namespaces: tuple[str, ...] = ()) -> Manifest:
    """The manifest this run works under, bound to the pool found on the cluster; one line naming what is
    missing (permissions, the home namespace, the pool), and how to grant it."""
    from clusterproof.kube.client import get_if_present
    files = "clusterproof/kube/rbac.yaml" + (" and clusterproof/kube/rbac-destructive.yaml" if destructive else "")
    pool: list[str] = []
    if allowed(api, {"resourceAttributes": {"resource": "namespaces", "verb": "list"}}):
        # Whether the manifest was applied at all, before what this identity may do in it.
        if get_if_present(api, f"/api/v1/namespaces/{HOME}") is None:
            raise HarnessError(f"namespace {HOME} (the harness's home: run Leases, owner records) does not exist "
                               f"on {server_url(api)}: kubectl apply -f clusterproof/kube/rbac.yaml")
        pool = pool_namespaces(api)
        if not pool:
            raise HarnessError(f"no namespace on {server_url(api)} is labelled {POOL_LABEL}=true: the "
                               "harness works only in namespaces provisioned for it (kubectl apply -f "
                               "clusterproof/kube/rbac.yaml)")
        lax = [n["metadata"]["name"] for n in _pool_objects(api)
               if (n["metadata"].get("labels") or {}).get(PSA_ENFORCE) != "restricted"]
        if lax:
            raise HarnessError(f"pool namespace(s) {', '.join(lax)} on {server_url(api)} do not enforce Pod Security "
                               f"restricted (label {PSA_ENFORCE}=restricted): a pod the harness's identity makes "
                               "there could reach its node's host; kubectl apply -f clusterproof/kube/rbac.yaml "
                               "labels the shipped ones")
    manifest = Manifest.shipped(destructive, team_namespaces, pool)
    user = whoami(api)
    gaps = missing(api, manifest)
    if gaps:
        teams = (" and the team bindings (python -m clusterproof.kube.access team-bindings --cp-profile ...)"
                 if team_namespaces else "")
        raise HarnessError(f"{user} may not {'; '.join(gaps)}: the harness runs as ServiceAccount "
                           f"{HOME}/{SERVICE_ACCOUNT} with {files}{teams} applied; see docs/real-cluster.md")
    check_policies(api, manifest, destructive, user)
    return manifest


def _pool_objects(api: client.ApiClient) -> list[dict]:
    from clusterproof.kube.client import list_all
    return [n for n in list_all(api, "/api/v1/namespaces", {"labelSelector": f"{POOL_LABEL}=true"})
            if not n["metadata"].get("deletionTimestamp")]


# --- what RBAC cannot say: the manifests' admission policies, proven in force ----------------------

# The identity every policy of the manifests holds (their matchConditions name it, and its load identities).
POLICY_USER = f"system:serviceaccount:{HOME}:{SERVICE_ACCOUNT}"
VAP_API = "/apis/admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class Probe:
    """A request the policy ``policy`` must refuse, sent as a server-side dry run (nothing is stored)."""
    policy: str
    what: str                        # the request, as the refusal line names it
    method: str
    path: str
    body: dict

    def send(self, api: client.ApiClient) -> tuple[int, str]:
        """(HTTP status, message): 2xx and "" when admitted."""
        headers = {"Content-Type": "application/merge-patch+json"} if self.method == "PATCH" else None
        try:
            raw_request(api, self.method, self.path, {"dryRun": "All"}, headers=headers, body=self.body).data
            return 200, ""
        except client.ApiException as e:
            return e.status, api_message(e)

    def refused_by_policy(self, status: int, message: str) -> bool:
        return status in (403, 422) and f"ValidatingAdmissionPolicy '{self.policy}'" in message


def policy_names(destructive: bool) -> list[str]:
    """The ValidatingAdmissionPolicies of the manifests a run works under, in the manifests' order."""
    return [d["metadata"]["name"] for d in manifest_docs(destructive) if d["kind"] == "ValidatingAdmissionPolicy"]


def probes(pool: str, node: str | None, destructive: bool) -> list[Probe]:
    """One request per policy that only that policy refuses (RBAC allows each to the ServiceAccount): a pod bound
    by ``nodeName``, ``clusterproof-pool`` bound to everyone, a NodePort Service, the flood's FlowSchema at the
    ``exempt`` level, a label on ``node``."""
    from clusterproof.kube.pod_spec import pod_body
    pod = pod_body("clusterproof-policy-probe", "policy-probe")
    pod["spec"]["nodeName"] = node or "clusterproof-policy-probe"
    ns = f"/api/v1/namespaces/{pool}"
    out = [Probe("clusterproof-pods", f"a pod in {pool} bound to a node by spec.nodeName", "POST", f"{ns}/pods", pod),
           Probe("clusterproof-rolebindings", f"a RoleBinding in {pool} of {POOL_ROLE} to system:unauthenticated",
                 "POST", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{pool}/rolebindings", {
                     "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": "clusterproof-policy-probe", "labels": {"clusterproof.io/run": "probe"}},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": POOL_ROLE},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                   "name": "system:unauthenticated"}]}),
           Probe("clusterproof-services", f"a NodePort Service in {pool}", "POST", f"{ns}/services", {
               "apiVersion": "v1", "kind": "Service", "metadata": {"name": "clusterproof-policy-probe"},
               "spec": {"type": "NodePort", "selector": {"app": "none"}, "ports": [{"port": 80}]}})]
    if destructive:
        out.append(Probe("clusterproof-fixed-names", "the flood's FlowSchema at the exempt priority level", "POST",
                         "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
                             "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                             "metadata": {"name": "clusterproof-flood"},
                             "spec": {"priorityLevelConfiguration": {"name": "exempt"}, "matchingPrecedence": 1000,
                                      "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                                          "namespace": pool, "name": "clusterproof-load"}}],
                                          "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}))
        if node:
            out.append(Probe("clusterproof-nodes", f"a label on node {node}", "PATCH", f"/api/v1/nodes/{node}",
                             {"metadata": {"labels": {"clusterproof.io/policy-probe": "true"}}}))
    return out


def check_policies(api: client.ApiClient, manifest: Manifest, destructive: bool, user: str) -> None:
    """The manifests' admission policies exist, are bound and refuse what they must, as the API server answers;
    otherwise one line (HarnessError): the API server too old to serve them, a policy missing, not bound, or
    not in force. Only for the identity they hold (``POLICY_USER``): any other one (an admin's) is not theirs to
    hold, and the run says so."""
    from clusterproof.core import progress
    from clusterproof.core.waiting import WaitTimeout, wait_for
    from clusterproof.kube.client import get_if_present, list_raw
    if user != POLICY_USER:
        progress.say(f"the manifests' admission policies hold {POLICY_USER}, not this run's identity {user}: "
                     "the run's requests are held by RBAC alone")
        return
    files = "clusterproof/kube/rbac.yaml" + (" and clusterproof/kube/rbac-destructive.yaml" if destructive else "")
    where = server_url(api)
    served = get_if_present(api, VAP_API) or {}
    if not any(r.get("name") == "validatingadmissionpolicies" for r in served.get("resources") or []):
        raise HarnessError(f"the API server at {where} does not serve ValidatingAdmissionPolicy "
                           f"({VAP_API[6:]}, Kubernetes 1.30 or later): the harness's identity is held by the "
                           f"admission policies of {files} (what RBAC cannot say: docs/rbac.md), so it does not run "
                           "there without them")
    bindings = {d["spec"]["policyName"]: d["metadata"]["name"] for d in manifest_docs(destructive)
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    for name in policy_names(destructive):
        if get_if_present(api, f"{VAP_API}/validatingadmissionpolicies/{name}") is None:
            raise HarnessError(f"ValidatingAdmissionPolicy {name} is missing on {where}: it holds what RBAC cannot "
                               f"say about the harness's requests (docs/rbac.md); kubectl apply -f {files}")
        binding = get_if_present(api, f"{VAP_API}/validatingadmissionpolicybindings/{bindings[name]}")
        if binding is None or (binding.get("spec") or {}).get("policyName") != name \
                or "Deny" not in (binding.get("spec") or {}).get("validationActions", []):
            raise HarnessError(f"ValidatingAdmissionPolicy {name} on {where} is not bound to deny (binding "
                               f"{bindings[name]} {'missing' if binding is None else 'changed'}): it refuses "
                               f"nothing; kubectl apply -f {files}")
    nodes = list_raw(api, "/api/v1/nodes", {"limit": "1"})["items"]
    for probe in probes(manifest.pool[0], nodes[0]["metadata"]["name"] if nodes else None, destructive):
        # A policy reaches the API server's admission a moment after it is created: ask a few times.
        try:
            wait_for(lambda p=probe: p.send(api), until=lambda a, p=probe: p.refused_by_policy(*a), timeout=10,
                     interval=1, what=f"ValidatingAdmissionPolicy {probe.policy} in force")
        except WaitTimeout:
            status, message = probe.send(api)
            said = "admitted" if status < 300 else f"refused otherwise ({status}: {message[:200]})"
            raise HarnessError(f"ValidatingAdmissionPolicy {probe.policy} on {where} is not in force: "
                               f"{probe.what}, sent as {user} (server-side dry run), was {said}; "
                               f"kubectl apply -f {files}") from None


# Where each kind of the manifests is created (provision).
_COLLECTIONS = {
    "Namespace": "/api/v1/namespaces",
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "Role": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    "RoleBinding": "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}


def object_paths(docs: list[dict]) -> list[tuple[str, dict]]:
    """(collection path, object) of every manifest document, in the manifest's order."""
    return [(_COLLECTIONS[d["kind"]].format(ns=d["metadata"].get("namespace", "")), d) for d in docs]


def provision(api: client.ApiClient, docs: list[dict] | None = None) -> None:
    """What an SRE applies once (``kubectl apply -f clusterproof/kube/rbac.yaml``), done by an admin identity:
    the embedded cluster is set up like a real one, so a run pointed at it with ``--cp-kubeconfig`` (as
    the ServiceAccount, or as admin) works in the same pool. Objects already there are kept."""
    from clusterproof.kube.client import create_if_absent
    for path, doc in object_paths(docs if docs is not None else manifest_docs(destructive=False)):
        create_if_absent(api, path, doc)


def team_bindings(team_namespaces: list[str]) -> list[dict]:
    """RoleBindings of ``clusterproof-team`` in each team namespace, for ``kubectl apply``."""
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "clusterproof", "namespace": ns,
                          "labels": {"app.kubernetes.io/name": "clusterproof"}},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": TEAM_ROLE},
             "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": SERVICE_ACCOUNT}]}
            for ns in team_namespaces]


def main(argv: list[str]) -> int:
    from clusterproof.config.profile import load_profile
    from clusterproof.core import exitcodes
    from clusterproof.core.errors import ArgumentParser
    from clusterproof.core.keygroup import parse_team_namespaces
    p = ArgumentParser(prog="python -m clusterproof.kube.access")
    sub = p.add_subparsers(dest="cmd", required=True)
    tb = sub.add_parser("team-bindings", help="RoleBindings for the profile's team_namespaces (kubectl apply -f -)")
    tb.add_argument("--cp-profile", "--profile", dest="profile", default="nightly")   # a run's spellings, both
    args = p.parse_args(argv)
    try:
        profile = load_profile(args.profile, [])
    except HarnessError as e:
        print(f"ERROR: clusterproof: {e}", file=sys.stderr)
        return exitcodes.USAGE
    namespaces = list(parse_team_namespaces(profile.team_namespaces).values())
    if not namespaces:
        print(f"# profile {profile.name} names no team_namespaces: nothing to bind", file=sys.stderr)
    print(yaml.safe_dump_all(team_bindings(namespaces), sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
