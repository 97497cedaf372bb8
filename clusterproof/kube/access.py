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

import yaml
from kubernetes import client

from clusterproof.core import kubeversions
from clusterproof.core.errors import HarnessError
from clusterproof.kube.apicalls import Call
from clusterproof.kube.client import api_message, raw_request, server_url, serving
from clusterproof.kube.manifests import RBAC, RBAC_DESTRUCTIVE, manifest_docs, policy_names  # noqa: F401 (re-exported)

SERVICE_ACCOUNT = "clusterproof"
# The home namespace (the ServiceAccount's): run Leases, owner records, pool claims.
HOME = "clusterproof"
# Namespaces an SRE provisioned for the harness carry this label (and a RoleBinding to POOL_ROLE), and a name
# with this prefix: the admission policies hold every ServiceAccount of a namespace so named.
POOL_LABEL = "clusterproof.io/pool"
POOL_PREFIX = "clusterproof-"
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


# --- what it must never be able to do -------------------------------------------------------

# (call, why a reviewer cares). Checked against the manifest (tests, no cluster) and, as the
# ServiceAccount, against a live cluster (tests/test_permission_controls.py).
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


# Every verb on every resource of every group cluster-wide, and on every non-resource path: only a rule of
# "*" grants it (RBAC matches a requested "*" literally), as cluster-admin's and system:masters' do. Such an
# identity has each item of any manifest, so two reviews stand for one per item (about 180 in a destructive
# run on eight pool namespaces: a fifth of a worker's API requests over the self-tests, docs/benchmarks.md).
SUPERUSER = ({"resourceAttributes": {"verb": "*", "group": "*", "resource": "*"}},
             {"nonResourceAttributes": {"verb": "*", "path": "*"}})


def missing(api: client.ApiClient, manifest: Manifest) -> list[str]:
    """What the identity may not do of what the manifest grants it, grouped by resource and role
    ("list,watch nodes cluster-wide (clusterproof)", "list roles (rbac...) in namespaces a, b (clusterproof-pool)")."""
    items = manifest.items
    if all(allowed(api, spec) for spec in SUPERUSER):
        return []
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


def check(api: client.ApiClient, destructive: bool, team_namespaces: tuple[str, ...] = (),
          needs: dict[str, tuple[int, str]] | None = None, pool_label: str = "") -> Manifest:
    """The manifest this run works under, bound to the pool found on the cluster; one line naming what is
    missing (permissions, the home namespace, the pool, its quotas, a policy), and how to grant it. ``needs``:
    what the profile's largest check stores in one pool namespace (``pool_needs``), held to the pool's quota;
    ``pool_label``: the profile's node pool label (a destructive run borrows nodes labelled <it>=shared)."""
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
        misnamed = [ns for ns in pool if not ns.startswith(POOL_PREFIX)]
        if misnamed:
            raise HarnessError(f"pool namespace(s) {', '.join(misnamed)} on {server_url(api)} are not named "
                               f"{POOL_PREFIX}<something>: the admission policies of clusterproof/kube/rbac.yaml "
                               "hold every ServiceAccount of the harness's namespaces by that prefix, so one in "
                               "another namespace would be held by none; name a pool namespace like the shipped "
                               "ones (clusterproof-0 .. -7)")
    manifest = Manifest.shipped(destructive, team_namespaces, pool)
    user = whoami(api)
    gaps = missing(api, manifest)
    if gaps:
        teams = (" and the team bindings (python -m clusterproof.kube.access team-bindings --cp-profile ...)"
                 if team_namespaces else "")
        raise HarnessError(f"{user} may not {'; '.join(gaps)}: the harness runs as ServiceAccount "
                           f"{HOME}/{SERVICE_ACCOUNT} with {files}{teams} applied; see docs/real-cluster.md")
    check_policies(api, manifest, destructive, user, pool_label)
    check_quotas(api, manifest, needs or {}, user)
    return manifest


def _pool_objects(api: client.ApiClient) -> list[dict]:
    from clusterproof.kube.client import list_all
    return [n for n in list_all(api, "/api/v1/namespaces", {"labelSelector": f"{POOL_LABEL}=true"})
            if not n["metadata"].get("deletionTimestamp")]


# --- what RBAC cannot say: the manifests' admission policies, proven in force ----------------------

# The identity that checks the policies: the harness's ServiceAccount (they hold it, every other ServiceAccount of
# its namespaces, and its load identities: the policies' matchConditions).
POLICY_USER = f"system:serviceaccount:{HOME}:{SERVICE_ACCOUNT}"
VAP_API = "/apis/admissionregistration.k8s.io/v1"
# The run's own label; a probe carries one that no run has.
PROBE_RUN = "policy-probe"


@dataclass(frozen=True)
class Probe:
    """A request sent as a server-side dry run (nothing is stored): one the policy ``policy`` must refuse, or, with
    ``admit``, one it must let through (the harness's own shape, as a run sends it)."""
    policy: str
    what: str                        # the request, as the refusal line names it
    method: str
    path: str
    body: dict
    admit: bool = False
    fix: str = ""                    # for an admitted probe that was refused: what to change

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

    def as_expected(self, status: int, message: str) -> bool:
        if not self.admit:
            return self.refused_by_policy(status, message)
        # A full pool namespace refuses even the harness's own pod by its quota: that says nothing of the policy.
        return status < 300 or "exceeded quota" in message


def probes(pool: str, node: str | None, destructive: bool, borrowable: dict | None = None,
           served: frozenset[str] = frozenset()) -> list[Probe]:
    """One request per policy that only that policy refuses (RBAC allows each to the ServiceAccount, and no quota
    counts what is wrong with it): a pod bound by ``nodeName``, a Service with externalIPs, a ServiceAccount of
    another name, a Role that may bind, ``clusterproof-pool`` bound to everyone, a ConfigMap and a Lease of names no
    run uses, a PodGroup or Workload of a shape no run makes (when ``served`` names it: 'podgroups' for
    Coscheduling's, or the native gang's group/version, e.g. 'scheduling.k8s.io/v1beta1'); destructive, the
    flood's FlowSchema at the ``exempt`` level and a label on ``node``. And two the policies must admit: a pod
    as a run builds it, and, on ``borrowable`` (a node of the pool a run borrows from,
    unclaimed), the claim a run writes."""
    from clusterproof.core.run import SCRATCH_LABEL, metadata
    from clusterproof.kube.node_taints import record_note
    from clusterproof.kube.pod_spec import pod_body
    from clusterproof.kube.tokens import SERVICE_ACCOUNT as LOAD
    name = "clusterproof-policy-probe"
    pod = pod_body(name, PROBE_RUN)
    pod["spec"]["nodeName"] = node or name
    ns, rbac = f"/api/v1/namespaces/{pool}", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{pool}"
    home = f"/api/v1/namespaces/{HOME}"
    out = [Probe("clusterproof-pods", f"a pod in {pool} bound to a node by spec.nodeName", "POST", f"{ns}/pods", pod),
           Probe("clusterproof-pods", f"a pod in {pool} as a run builds it", "POST", f"{ns}/pods",
                 pod_body(name, PROBE_RUN, gpus=1), admit=True,
                 fix="something on the cluster changes or refuses the harness's pods there (a mutating webhook "
                     "that adds a sidecar, a label or a toleration the allowlist does not know), so every check "
                     "would be refused too"),
           Probe("clusterproof-services", f"a Service in {pool} with externalIPs", "POST", f"{ns}/services", {
               "apiVersion": "v1", "kind": "Service", "metadata": metadata(name, PROBE_RUN),
               "spec": {"selector": {"clusterproof.io/none": "x"}, "ports": [{"port": 80}],
                        "externalIPs": ["192.0.2.1"]}}),
           Probe("clusterproof-serviceaccounts", f"a ServiceAccount {name} in {pool}", "POST",
                 f"{ns}/serviceaccounts", {"metadata": metadata(name, PROBE_RUN)}),
           Probe("clusterproof-roles", f"a Role in {pool} that may create RoleBindings", "POST", f"{rbac}/roles", {
               "metadata": metadata(LOAD, PROBE_RUN), "rules": [{"apiGroups": ["rbac.authorization.k8s.io"],
                                                                 "resources": ["rolebindings"], "verbs": ["create"]}]}),
           Probe("clusterproof-rolebindings", f"a RoleBinding in {pool} of {POOL_ROLE} to system:unauthenticated",
                 "POST", f"{rbac}/rolebindings", {
                     "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": metadata(name, PROBE_RUN),
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": POOL_ROLE},
                     "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group",
                                   "name": "system:unauthenticated"}]}),
           Probe("clusterproof-configmaps", f"a ConfigMap {name} in {HOME}", "POST", f"{home}/configmaps",
                 {"metadata": metadata(name, PROBE_RUN), "data": {}}),
           Probe("clusterproof-leases", f"a Lease {name} in {HOME}", "POST",
                 f"/apis/coordination.k8s.io/v1/namespaces/{HOME}/leases", {"metadata": metadata(name, PROBE_RUN)})]
    if "podgroups" in served:
        out.append(Probe("clusterproof-gangs", f"a PodGroup in {pool} with minResources", "POST",
                         f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{pool}/podgroups", {
                             "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
                             "metadata": metadata(name, PROBE_RUN),
                             "spec": {"minMember": 1, "minResources": {"cpu": "1"}}}))
    elif native := next((gv for gv in kubeversions.NATIVE_GANG_APIS if gv in served), None):
        legacy = native == kubeversions.LEGACY_NATIVE_GANG_API
        out.append(Probe("clusterproof-gangs", f"a Workload in {pool} of another shape", "POST",
                         f"/apis/{native}/namespaces/{pool}/workloads", {
                             "apiVersion": native, "kind": "Workload", "metadata": metadata(name, PROBE_RUN),
                             "spec": {"podGroups": [{"name": "workers", "policy": {"basic": {}}}]} if legacy else
                             {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"basic": {}}}]}}))
        if not legacy:   # from 1.36 the PodGroup is an object of its own: one no run makes (disrupted as a whole)
            out.append(Probe("clusterproof-gangs", f"a native PodGroup in {pool} of another shape", "POST",
                             f"/apis/{native}/namespaces/{pool}/podgroups", {
                                 "apiVersion": native, "kind": "PodGroup", "metadata": metadata(name, PROBE_RUN),
                                 "spec": {**({"podGroupTemplateRef": {"workload": {
                                              "workloadName": name, "podGroupTemplateName": "workers"}}}
                                             if native.endswith("/v1alpha2") else
                                             {"workloadRef": {"workloadName": name, "templateName": "workers"}}),
                                          "schedulingPolicy": {"gang": {"minCount": 1}},
                                          "disruptionMode": {"all": {}}}}))
    if destructive:
        out.append(Probe("clusterproof-fixed-names", "the flood's FlowSchema at the exempt priority level", "POST",
                         "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", {
                             "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                             "metadata": metadata("clusterproof-flood", PROBE_RUN),
                             "spec": {"priorityLevelConfiguration": {"name": "exempt"}, "matchingPrecedence": 1000,
                                      "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                                          "namespace": pool, "name": LOAD}}],
                                          "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}))
        if node:
            out.append(Probe("clusterproof-nodes", f"a label on node {node}", "PATCH", f"/api/v1/nodes/{node}",
                             {"metadata": {"labels": {"clusterproof.io/policy-probe": "true"}}}))
        if borrowable:
            n = borrowable["metadata"]["name"]
            claim = {"key": SCRATCH_LABEL, "value": PROBE_RUN, "effect": "NoSchedule"}   # scratch_nodes' claim
            out.append(Probe("clusterproof-nodes", f"the claim a run writes on node {n}", "PATCH", f"/api/v1/nodes/{n}",
                             {"metadata": {"annotations": record_note(PROBE_RUN, [claim], borrowable)},
                              "spec": {"taints": [*(borrowable["spec"].get("taints") or []), claim]}},
                             admit=True, fix=BORROWABLE_FIX))
    return out


BORROWABLE_FIX = ("the variable borrowable of clusterproof-nodes (clusterproof/kube/rbac-destructive.yaml) names "
                  "another pool label than the profile's pool_label: make them the same")


def check_policies(api: client.ApiClient, manifest: Manifest, destructive: bool, user: str,
                   pool_label: str = "") -> None:
    """The manifests' admission policies exist, are bound and refuse what they must, as the API server answers,
    and let through the harness's own shapes; otherwise one line (HarnessError): the API server too old to serve
    them, a policy missing, not bound, not in force, or refusing what a run sends. Only for the identity they hold
    (``POLICY_USER``): any other one (an admin's) is not theirs to hold, and the run says so."""
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
    live = {}
    for name in policy_names(destructive):
        live[name] = get_if_present(api, f"{VAP_API}/validatingadmissionpolicies/{name}")
        if live[name] is None:
            raise HarnessError(f"ValidatingAdmissionPolicy {name} is missing on {where}: it holds what RBAC cannot "
                               f"say about the harness's requests (docs/rbac.md); kubectl apply -f {files}")
        binding = get_if_present(api, f"{VAP_API}/validatingadmissionpolicybindings/{bindings[name]}")
        if binding is None or (binding.get("spec") or {}).get("policyName") != name \
                or "Deny" not in (binding.get("spec") or {}).get("validationActions", []):
            raise HarnessError(f"ValidatingAdmissionPolicy {name} on {where} is not bound to deny (binding "
                               f"{bindings[name]} {'missing' if binding is None else 'changed'}): it refuses "
                               f"nothing; kubectl apply -f {files}")
    _check_audiences(api, live["clusterproof-serviceaccounts"], where)
    nodes = list_raw(api, "/api/v1/nodes", {"limit": "1"})["items"]
    borrowable = None
    if destructive and pool_label:
        borrowable = next((n for n in list_raw(api, "/api/v1/nodes", {"labelSelector": f"{pool_label}=shared",
                                                                      "limit": "50"})["items"]
                           if not any(t["key"] == "clusterproof.io/scratch" for t in n["spec"].get("taints") or [])),
                          None)
    coscheduling = serving(api, ("scheduling.x-k8s.io/v1alpha1",), "podgroups")
    gangs = frozenset(filter(None, ("podgroups" if coscheduling else None,
                                    serving(api, kubeversions.NATIVE_GANG_APIS, "workloads"))))
    for probe in probes(manifest.pool[0], nodes[0]["metadata"]["name"] if nodes else None, destructive, borrowable,
                        gangs):
        # A policy reaches the API server's admission a moment after it is created: ask a few times.
        try:
            wait_for(lambda p=probe: p.send(api), until=lambda a, p=probe: p.as_expected(*a), timeout=10,
                     interval=1, what=f"ValidatingAdmissionPolicy {probe.policy} in force")
        except WaitTimeout:
            status, message = probe.send(api)
            if probe.admit:
                raise HarnessError(f"{probe.what}, sent as {user} (server-side dry run), was refused on {where} "
                                   f"({status}: {message[:600]}): {probe.fix}") from None
            said = "admitted" if status < 300 else f"refused otherwise ({status}: {message[:200]})"
            raise HarnessError(f"ValidatingAdmissionPolicy {probe.policy} on {where} is not in force: "
                               f"{probe.what}, sent as {user} (server-side dry run), was {said}; "
                               f"kubectl apply -f {files}") from None


def _check_audiences(api: client.ApiClient, policy: dict, where: str) -> None:
    """The load identity's token is asked for without an audience, so it gets the API server's own; the policy
    admits only the audiences its variable apiAudiences lists. The harness's own token carries this server's
    audiences: each must be in the list, or every load check would be refused its token (one line)."""
    keys = api.configuration.api_key or {}
    token = str(keys.get("BearerToken") or keys.get("authorization") or "").removeprefix("Bearer ").strip()
    audiences = token_audiences(token)
    if not audiences:
        return
    listed = next((json.loads(v["expression"]) for v in (policy.get("spec") or {}).get("variables") or []
                   if v.get("name") == "apiAudiences"), [])
    unknown = [a for a in audiences if a not in listed]
    if unknown:
        raise HarnessError(f"this API server's tokens are for {', '.join(unknown)} (the audience of the kubeconfig's "
                           f"token), but ValidatingAdmissionPolicy clusterproof-serviceaccounts on {where} admits a "
                           f"load identity's token only for {', '.join(listed) or 'no audience'}: add them to its "
                           "variable apiAudiences (clusterproof/kube/rbac.yaml) and apply it")


def token_audiences(token: str) -> list[str]:
    """The ``aud`` claim of a ServiceAccount token (a JWT), or [] for any other credential. Reads the payload
    only; the token itself is never shown."""
    import base64
    parts = token.split(".")
    if len(parts) != 3:
        return []
    try:
        claims = json.loads(base64.urlsafe_b64decode(parts[1] + "=" * (-len(parts[1]) % 4)))
    except ValueError:
        return []
    aud = claims.get("aud") if isinstance(claims, dict) else None
    return [aud] if isinstance(aud, str) else [a for a in aud or [] if isinstance(a, str)]


# --- quotas: how much the harness's identities may store, proven in force -----------------------------

QUOTA = "clusterproof"


def pool_needs(profile) -> dict[str, tuple[int, str]]:
    """What the profile's largest destructive check stores in one pool namespace at once: {quota resource: (how
    much, the profile key it comes from)} -- pods and whole-node GPUs (burst ranks, the scale gang, untolerated
    pods, per-node pods of the watch suite, the flood, borrowing pods)."""
    gpu_pods = {"gang_scale_size": profile.gang_scale_size, "taint_untolerated_pods": profile.taint_untolerated_pods,
                "burst_steady_pods": profile.burst_steady_pods,
                "burst_jobs x burst_job_size": profile.burst_jobs * profile.burst_job_size,
                "teams x taint_borrow_nodes": len(profile.teams) * profile.taint_borrow_nodes}
    # The scale gang's namespace also holds its scheduler probe; the watch suite's and the flood's pods ask no GPU.
    counts = {**gpu_pods, "gang_scale_size": profile.gang_scale_size + 1,
              "watch_sizes": max(profile.watch_sizes or [0]), "apf_flood_pods": profile.apf_flood_pods}
    pods_key = max(counts, key=counts.get)
    gpu_counts = {k: v * profile.node_gpus for k, v in gpu_pods.items()}
    gpus_key = max(gpu_counts, key=gpu_counts.get)
    return {"pods": (counts[pods_key], pods_key), "requests.nvidia.com/gpu": (gpu_counts[gpus_key], gpus_key)}


def check_quotas(api: client.ApiClient, manifest: Manifest, needs: dict[str, tuple[int, str]], user: str) -> None:
    """The manifest's ResourceQuota is in the home namespace and in every pool namespace, bounds what the shipped
    one bounds, is in force (the quota controller took it up: its status has the same hard limits), and lets the
    profile's largest check fit; otherwise one line. Only for the harness's identity (an admin's run is not
    bounded by them)."""
    from kubernetes.utils import parse_quantity

    from clusterproof.core.waiting import WaitTimeout, wait_for
    from clusterproof.kube.client import get_if_present
    if user != POLICY_USER:
        return
    where = server_url(api)
    shipped = {d["metadata"]["namespace"]: d["spec"]["hard"] for d in manifest_docs(False)
               if d["kind"] == "ResourceQuota"}
    pool_hard = shipped["clusterproof-0"]
    for ns in (manifest.home, *manifest.pool):
        path = f"/api/v1/namespaces/{ns}/resourcequotas/{QUOTA}"
        want = shipped.get(ns, pool_hard)
        quota = get_if_present(api, path)
        if quota is None:
            raise HarnessError(f"ResourceQuota {QUOTA} is missing in namespace {ns} on {where}: it bounds how much "
                               "the harness's identities may store there (docs/rbac.md); kubectl apply -f "
                               "clusterproof/kube/rbac.yaml (or copy a pool namespace's for one you added)")
        hard = quota["spec"].get("hard") or {}
        unbounded = [r for r in want if r not in hard]
        if unbounded:
            raise HarnessError(f"ResourceQuota {QUOTA} in namespace {ns} on {where} does not bound "
                               f"{', '.join(unbounded)}: kubectl apply -f clusterproof/kube/rbac.yaml")
        try:
            wait_for(lambda p=path: get_if_present(api, p) or {}, timeout=10, interval=1,
                     until=lambda q: (q.get("status") or {}).get("hard") == (q.get("spec") or {}).get("hard"),
                     what=f"ResourceQuota {QUOTA} in {ns} in force")
        except WaitTimeout:
            raise HarnessError(f"ResourceQuota {QUOTA} in namespace {ns} on {where} is not in force (its status does "
                               "not show its limits: is kube-controller-manager's resourcequota controller running?)"
                               ) from None
        if ns == manifest.home:
            continue
        for resource, (need, key) in needs.items():
            limit = hard.get(resource)
            if limit is not None and parse_quantity(limit) < need:
                raise HarnessError(f"ResourceQuota {QUOTA} in pool namespace {ns} on {where} allows {resource} "
                                   f"{int(parse_quantity(limit))}, but the profile's largest check needs {need} at "
                                   f"once ({key}): lower that key, or raise the pool's quota "
                                   "(clusterproof/kube/rbac.yaml) and apply it")


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
    "ResourceQuota": "/api/v1/namespaces/{ns}/resourcequotas",
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
