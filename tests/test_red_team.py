"""A red team against every identity the harness can mint: what each can *build*, not what can-i answers.

A security reviewer judges the manifests by the requests their identities can get admitted: a pod is a path to
its node's host, a RoleBinding a path to anyone, a FlowSchema a path past API Priority and Fairness, a node patch a
path through every team's isolation, a ConfigMap a path to filling etcd. Here every such request (``requests``;
docs/rbac.md, "Escalation paths", names what closes each) is sent -- a real request to the real API server, as a
server-side dry run, so nothing is stored -- with both manifests applied as an SRE applies them, to a pool namespace
provisioned the way docs/real-cluster.md adds one, beside a team namespace of the cluster's own (a team's pod,
Service, Secret, claim and powerful ServiceAccount), the team's tainted nodes, a busy node and the cluster's high
PriorityClass. Each is sent as the identity it names:

- ``harness``: the ServiceAccount clusterproof/clusterproof;
- ``load``: the load identity it mints (kube/tokens.py, run as the harness: so the harness's own path is admitted);
- ``minted``: a ServiceAccount it might mint and bind (``evil``). The policies refuse that minting; to judge the
  next step of the chain anyway, an admin creates and binds it -- every step of make, bind, act-as is judged.

Every request must be refused, and refused by the closer the docs name.

Negative controls, two generations of the manifests (tests/data), each applied for another ServiceAccount with
namespaces of its own, under the same requests: the manifests of before issue 35 (no admission policy) must admit
each request of that review, and those of before issue 48 (policies by name and by forbidden field, no quota) each
request of this one; each control names every request that was not admitted.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields

import pytest
import yaml
from kubernetes import client

from clusterproof.core.run import metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube import access
from clusterproof.kube.client import (
    api_message,
    create_if_absent,
    delete_if_present,
    list_raw,
    load_client,
    raw_request,
)
from clusterproof.kube.node_taints import record_note
from clusterproof.kube.pod_spec import POD_SECURITY_LABELS, pod_body
from clusterproof.kube.tokens import LOAD_RULES, create_load_identity
from tests import guest
from tests.harness import ROOT

pytestmark = [pytest.mark.coscheduling]   # a PodGroup request needs its CRD

DATA = ROOT / "tests" / "data"
BEFORE = {35: [DATA / "rbac-before-issue-35.yaml", DATA / "rbac-destructive-before-issue-35.yaml"],
          48: [DATA / "rbac-before-issue-48.yaml", DATA / "rbac-destructive-before-issue-48.yaml"]}
PSA = "violates PodSecurity"                       # what Pod Security Admission's refusal says
RBAC_ESCALATION = "attempting to grant RBAC permissions not currently held"
TEAM_TAINT = "clusterproof.io/team"                 # the smoke profile's team_taint_key
MERGE, STRATEGIC, JSON_PATCH = ("application/merge-patch+json", "application/strategic-merge-patch+json",
                                "application/json-patch+json")
VAP = "ValidatingAdmissionPolicy '{}'"
RED = "red-team"                                    # the run label of the red team's own objects
LAUNDERED = "rt-laundered"                          # the Role a load identity would hold had its maker laundered one
MINTED = "evil"


@dataclass
class Scene:
    """Where the requests go, for one generation of the manifests: its home and pool namespace, a team namespace of
    the cluster's own (the team's pod, Service, Secret, claim and ServiceAccount, and a pod of the harness's own
    there), a pod of the harness's own in the pool, the team's node, a busy node, a node of the pool a run may
    borrow, any node, a production node, and the cluster's high PriorityClass."""
    home: str
    pool: str
    pool_role: str                      # the ClusterRole bound in the pool
    flow_namespace: str                 # a pool namespace as its manifests' flow policy knows one (by name)
    team_ns: str
    team_pod: str
    team_pod_uid: str
    team_service: str
    team_secret: str
    team_claim: str
    team_sa: str
    own_team_pod: str
    own_pool_pod: str
    team_node: str
    team_taint: dict
    busy_node: str
    borrowable_node: str
    any_node: str
    high_priority: str
    production_node: str
    taints: dict[str, list[dict]] = field(default_factory=dict)    # node -> its taints as read (a patch replaces all)

    def taints_of(self, node: str) -> list[dict]:
        return [dict(t) for t in self.taints.get(node, [])]


@dataclass(frozen=True)
class Request:
    id: str
    what: str                          # the request, as a reviewer would put it
    why: str                           # what it would give an attacker
    closer: str                        # a substring of the refusal that names what closes it
    method: str
    path: str
    body: dict | list | None = None
    patch: str = MERGE
    refused_before: str = ""           # the manifests of its review refused it too (and what said so)
    as_: str = "harness"               # which identity sends it: harness, load or minted
    since: int = 35                    # the review that found it: its control must admit it


def _pod(name: str, **spec) -> dict:
    body = pod_body(name, RED)
    body["spec"].update(spec)
    return body


def _container(name: str, **fields) -> dict:
    """A pod whose one container has ``fields`` too."""
    body = pod_body(name, RED)
    body["spec"]["containers"][0].update(fields)
    return body


# Root on a node without the word "privileged" (which the embedded cluster refuses to everyone: --allow-privileged=
# false, so a request that asked for it would be refused whatever the manifests say): uid 0, the node's process and
# network namespaces, CAP_SYS_ADMIN, and the node's / mounted -- `chroot /host` or `nsenter -t 1` and it is the node.
ROOT_ON_NODE = {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": True,
                "capabilities": {"add": ["SYS_ADMIN", "SYS_PTRACE"]}}


def _root_pod(name: str, node: str) -> dict:
    """The issue's pod: root on a node it chose, past the scheduler and every taint."""
    body = pod_body(name, RED)
    body["spec"] = {"nodeName": node, "hostPID": True, "hostNetwork": True,
                    "containers": [{"name": "x", "image": "busybox", "securityContext": dict(ROOT_ON_NODE),
                                    "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                    "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
    return body


def requests(s: Scene) -> list[Request]:
    """Every escalating request, against the scene of one generation of the manifests."""
    pool, team = f"/api/v1/namespaces/{s.pool}", f"/api/v1/namespaces/{s.team_ns}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{s.pool}"
    fs, pl = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas", \
        "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations"
    node, team_node = f"/api/v1/nodes/{s.any_node}", f"/api/v1/nodes/{s.team_node}"
    load = "clusterproof-load"
    sa_subject = {"kind": "ServiceAccount", "serviceAccount": {"namespace": s.flow_namespace, "name": load}}
    everyone = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]
    authenticated = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]

    def binding(role_kind: str, role: str, subjects: list[dict]) -> dict:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": RED, "labels": {"clusterproof.io/run": RED}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                "subjects": subjects}

    def flow(level: str, subject: dict = sa_subject) -> dict:
        return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                "metadata": {"name": "clusterproof-flood"},
                "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": 1000,
                         "rules": [{"subjects": [subject],
                                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}

    def token(name: str, **spec) -> dict:
        return {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}

    def claim(name: str, effect: str = "NoSchedule") -> dict:
        """The claim a run writes (kube/node_taints.py), with ``effect``."""
        taint = {"key": "clusterproof.io/scratch", "value": RED, "effect": effect}
        return {"metadata": {"annotations": record_note(RED, [taint], {"metadata": {"name": name}})},
                "spec": {"taints": [*s.taints_of(name), taint]}}

    secret_volume = [{"name": "s", "secret": {"secretName": s.team_secret}}]
    other_taints = [t for t in [s.team_taint] if t]
    team_tol = {"key": TEAM_TAINT, "operator": "Equal", "value": s.team_taint.get("value", "x"), "effect": "NoSchedule"}
    on_team_node = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [s.team_node]}]}]}}}
    restricted_init = {**pod_body("x", RED)["spec"]["containers"][0], "name": "before"}
    pods = VAP.format("clusterproof-pods")
    return [
        # === the first review (issue 35): what RBAC alone could not say ===============================================
        # --- pods in its pool namespace: a path to the node's host --------------------------------------------
        Request("pool-pod-root-on-a-chosen-node", f"a pod in {s.pool} as root with CAP_SYS_ADMIN, hostPID, "
                "hostNetwork, a hostPath of / and nodeName of a node it chose",
                "root on any node, past the scheduler and every taint",
                PSA, "POST", f"{pool}/pods", _root_pod("red-root", s.any_node)),
        Request("pool-pod-by-node-name", f"a restricted pod in {s.pool} bound by spec.nodeName",
                "a pod on any node past the scheduler: every NoSchedule taint, a team's or a preflight's, ignored",
                pods, "POST", f"{pool}/pods", _pod("red-nodename", nodeName=s.any_node)),
        Request("pool-pod-with-a-token", f"a pod in {s.pool} with its ServiceAccount token mounted",
                "a credential inside a container the harness does not control",
                pods, "POST", f"{pool}/pods", _pod("red-token", automountServiceAccountToken=True)),
        Request("pool-pod-outranking-tenants", f"a pod in {s.pool} of the cluster's PriorityClass {s.high_priority}",
                "preempting a team's training pods", pods, "POST",
                f"{pool}/pods", _pod("red-priority", priorityClassName=s.high_priority)),
        Request("pool-pod-with-a-projected-token", f"a pod in {s.pool} with a projected token of another audience",
                "a credential for another system (a vault, a cloud) inside a container", pods, "POST",
                f"{pool}/pods", _pod("red-projected", volumes=[{"name": "t", "projected": {"sources": [
                    {"serviceAccountToken": {"audience": "vault.example.com", "path": "t"}}]}}])),
        # --- bindings: a path to anyone --------------------------------------------------------------------------
        Request("pool-role-bound-to-everyone", f"a RoleBinding in {s.pool} of {access.POOL_ROLE} to "
                "system:unauthenticated", "anyone who reaches the API server creates pods there; no run label, so "
                "no sweeper removes it", VAP.format("clusterproof-rolebindings"), "POST", f"{rbac}/rolebindings",
                binding("ClusterRole", s.pool_role, everyone)),
        Request("pool-role-bound-to-a-user", f"a RoleBinding in {s.pool} of {access.POOL_ROLE} to the user mallory",
                "a standing grant for someone else", VAP.format("clusterproof-rolebindings"), "POST",
                f"{rbac}/rolebindings", binding("ClusterRole", s.pool_role,
                                                [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                                  "name": "mallory"}])),
        Request("admin-bound-to-everyone", f"a RoleBinding in {s.pool} of admin to system:unauthenticated",
                "admin of the namespace for anyone", RBAC_ESCALATION, "POST", f"{rbac}/rolebindings",
                binding("ClusterRole", "admin", everyone), refused_before="RBAC's escalation check"),
        # --- Services: a path to other tenants' traffic --------------------------------------------------------------
        Request("service-capturing-an-address", f"a Service in {s.pool} with externalIPs 10.96.0.1",
                "every node's proxy sends that address's traffic to the harness's pods (CVE-2020-8554)",
                VAP.format("clusterproof-services"), "POST", f"{pool}/services",
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "red-externalip"},
                 "spec": {"selector": {"app": "red"}, "ports": [{"port": 443}], "externalIPs": ["10.96.0.1"]}}),
        Request("service-opening-every-node", f"a NodePort Service in {s.pool}", "a port open on every node",
                VAP.format("clusterproof-services"), "POST", f"{pool}/services",
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "red-nodeport"},
                 "spec": {"type": "NodePort", "selector": {"app": "red"}, "ports": [{"port": 80}]}}),
        # --- a team's namespace, beside the team's own objects -------------------------------------------------------
        Request("team-pod-root-on-its-node", f"a pod in the team namespace {s.team_ns} (no Pod Security there) as "
                "root with CAP_SYS_ADMIN in the node's process namespace", "root on a team's node",
                pods, "POST", f"{team}/pods",
                _pod("red-root", hostPID=True, securityContext={},
                     containers=[{**_pod("x")["spec"]["containers"][0], "securityContext": dict(ROOT_ON_NODE)}])),
        Request("team-pod-reading-a-secret", f"a pod in {s.team_ns} mounting the team's Secret {s.team_secret}",
                "the team's credentials", pods, "POST", f"{team}/pods",
                _pod("red-secret", volumes=secret_volume,
                     containers=[{**_pod("x")["spec"]["containers"][0],
                                  "volumeMounts": [{"name": "s", "mountPath": "/s"}]}])),
        Request("team-pod-mounting-the-teams-claim", f"a pod in {s.team_ns} mounting the team's volume claim "
                f"{s.team_claim}", "the team's data, read and written", pods, "POST", f"{team}/pods",
                _pod("red-claim", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": s.team_claim}}])),
        Request("team-pod-as-the-teams-identity", f"a pod in {s.team_ns} running as the team's ServiceAccount "
                f"{s.team_sa}", "whatever the team's pipelines may do", pods,
                "POST", f"{team}/pods", _pod("red-teamsa", serviceAccountName=s.team_sa)),
        Request("team-pod-image-swapped", f"the team's running pod {s.team_pod} given another image",
                "code of the attacker's running with the team's identity and Secrets",
                pods, "PATCH", f"{team}/pods/{s.team_pod}",
                {"spec": {"containers": [{"name": "work", "image": "registry.example/evil:1"}]}}, patch=STRATEGIC),
        Request("team-pod-deleted", f"the team's pod {s.team_pod} deleted", "a team's training rank killed",
                pods, "DELETE", f"{team}/pods/{s.team_pod}"),
        # --- API Priority and Fairness: a path past it ---------------------------------------------------------------
        Request("flow-at-exempt", "the FlowSchema clusterproof-flood at the priority level exempt",
                "the flood bypasses API Priority and Fairness", VAP.format("clusterproof-fixed-names"),
                "POST", fs, flow("exempt")),
        Request("flow-beside-the-kubelets", "the FlowSchema clusterproof-flood at the priority level node-high",
                "the flood competes with every kubelet's heartbeat",
                VAP.format("clusterproof-fixed-names"), "POST", fs, flow("node-high")),
        # --- nodes: a path through every team's isolation -------------------------------------------------------------
        Request("node-noexecute-taint", f"node {s.any_node} given the taint evil=x:NoExecute",
                "every pod of the node evicted", VAP.format("clusterproof-nodes"), "PATCH", node,
                {"spec": {"taints": [*s.taints_of(s.any_node), {"key": "evil", "value": "x", "effect": "NoExecute"}]}}),
        Request("node-team-taint-removed", f"team node {s.team_node} without its team taint",
                "every team's pods land on it", VAP.format("clusterproof-nodes"), "PATCH", team_node,
                {"spec": {"taints": [t for t in s.taints_of(s.team_node) if t not in other_taints]}}),
        Request("node-labelled", f"node {s.any_node} labelled into another pool",
                "a team's node selector now matches it", VAP.format("clusterproof-nodes"), "PATCH",
                node, {"metadata": {"labels": {"example.com/pool": "red-team"}}}),
        Request("node-cordoned", f"node {s.any_node} cordoned", "a node taken out of service",
                VAP.format("clusterproof-nodes"), "PATCH", node, {"spec": {"unschedulable": True}}),
        Request("node-called-simulated", f"production node {s.production_node} annotated kwok.x-k8s.io/node=fake",
                "a production node the harness then treats as its simulation",
                VAP.format("clusterproof-nodes"), "PATCH", f"/api/v1/nodes/{s.production_node}",
                {"metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}}}),

        # === the second review (issue 48): identities the policies never looked at, fields they did not read ======
        # --- make, bind, act as: each step of the chain, as the identity that would take it ------------------------
        Request("pool-role-that-binds", f"a Role in {s.pool} that may create RoleBindings",
                "a maker of bindings to hand to the load identity: the first step of laundering the pool's rights",
                VAP.format("clusterproof-roles"), "POST", f"{rbac}/roles",
                {"metadata": metadata(RED, RED), "rules": [{"apiGroups": ["rbac.authorization.k8s.io"],
                                                            "resources": ["rolebindings"], "verbs": ["create"]}]},
                since=48),
        Request("pool-role-that-mints-tokens", f"a Role in {s.pool} with the load's rules and "
                "serviceaccounts/token", "a load identity that mints tokens for every account of the pool",
                VAP.format("clusterproof-roles"), "POST", f"{rbac}/roles",
                {"metadata": metadata(RED, RED), "rules": [*LOAD_RULES, {"apiGroups": [""],
                                                                          "resources": ["serviceaccounts/token"],
                                                                          "verbs": ["create"]}]}, since=48),
        Request("load-binds-its-role-to-everyone", f"as the load identity, holding a laundered Role {LAUNDERED}: that "
                "Role bound to system:authenticated", "every identity of the cluster may bind in the pool",
                VAP.format("clusterproof-rolebindings"), "POST", f"{rbac}/rolebindings",
                binding("Role", LAUNDERED, authenticated), as_="load", since=48),
        Request("load-binds-a-new-identity", f"as the load identity: {LAUNDERED} bound to a new ServiceAccount "
                f"{MINTED}", "an identity no policy looked at", VAP.format("clusterproof-rolebindings"), "POST",
                f"{rbac}/rolebindings", binding("Role", LAUNDERED, [{"kind": "ServiceAccount", "name": MINTED,
                                                                    "namespace": s.pool}]), as_="load", since=48),
        Request("load-opens-a-node-port", f"as the load identity: a NodePort Service in {s.pool}",
                "a port open on every node", VAP.format("clusterproof-services"), "POST", f"{pool}/services",
                {"apiVersion": "v1", "kind": "Service", "metadata": metadata("red-nodeport", RED),
                 "spec": {"type": "NodePort", "selector": {"clusterproof.io/run": RED}, "ports": [{"port": 80}]}},
                as_="load", since=48),
        Request("minting-an-identity", f"a ServiceAccount {RED} in {s.pool}", "an identity of its own making",
                VAP.format("clusterproof-serviceaccounts"), "POST", f"{pool}/serviceaccounts",
                {"metadata": metadata(RED, RED)}, since=48),
        Request("minted-identity-pod-on-a-chosen-node", f"as {MINTED} (bound to the pool's role): a pod bound by "
                f"nodeName to {s.any_node} at the PriorityClass {s.high_priority}",
                "past every taint, preempting a team's training pods", pods, "POST", f"{pool}/pods",
                _pod("red-minted", nodeName=s.any_node, priorityClassName=s.high_priority), as_="minted", since=48),
        Request("minted-identity-binds-everyone", f"as {MINTED}: the pool's role bound to system:authenticated",
                "the pool's rights for every identity of the cluster", VAP.format("clusterproof-rolebindings"), "POST",
                f"{rbac}/rolebindings", binding("ClusterRole", s.pool_role, authenticated), as_="minted", since=48),
        Request("token-for-the-namespaces-default-account", f"a token of the ServiceAccount default of {s.pool}",
                "a credential of an account the harness did not make", VAP.format("clusterproof-serviceaccounts"),
                "POST", f"{pool}/serviceaccounts/default/token", token("default"), since=48),
        Request("token-for-another-audience", "a token of clusterproof-load for the audience vault.example.com",
                "a credential for another system that trusts the cluster's issuer",
                VAP.format("clusterproof-serviceaccounts"), "POST", f"{pool}/serviceaccounts/{load}/token",
                token(load, audiences=["vault.example.com"]), since=48),
        Request("token-for-a-year", "a token of clusterproof-load that lives a year", "a credential that outlives "
                "every run", VAP.format("clusterproof-serviceaccounts"), "POST", f"{pool}/serviceaccounts/{load}/token",
                token(load, expirationSeconds=31536000), since=48),
        # --- fields the pod policy did not read ----------------------------------------------------------------------
        Request("team-pod-env-from-a-secret", f"a pod in {s.team_ns} with an environment variable from the team's "
                f"Secret {s.team_secret}", "the team's credential, then in the pod's log and termination message "
                "for anyone who may read pods", pods, "POST", f"{team}/pods",
                _container("red-env", env=[{"name": "T", "valueFrom": {"secretKeyRef": {
                    "name": s.team_secret, "key": "token"}}}]), since=48),
        Request("team-pod-env-from-a-configmap", f"a pod in {s.team_ns} with a whole ConfigMap of the team's in its "
                "environment", "the team's configuration", pods, "POST", f"{team}/pods",
                _container("red-envfrom", envFrom=[{"configMapRef": {"name": "kube-root-ca.crt"}}]), since=48),
        Request("team-pod-pulling-with-the-teams-secret", f"a pod in {s.team_ns} pulling with the team's Secret",
                "the team's registry credential", pods, "POST", f"{team}/pods",
                _pod("red-pull", imagePullSecrets=[{"name": s.team_secret}]), since=48),
        Request("team-pod-claiming-a-device", f"a pod in {s.team_ns} naming a resource claim of the team's",
                "a device (DRA) of someone else's claim", pods, "POST", f"{team}/pods",
                _pod("red-dra", resourceClaims=[{"name": "gpu", "resourceClaimName": "team-gpus"}]), since=48),
        Request("pool-pod-tolerating-everything", f"a pod in {s.pool} tolerating every taint (operator Exists), "
                f"pinned by affinity to the team's node {s.team_node}", "a pod on any node past every taint",
                pods, "POST", f"{pool}/pods", _pod("red-wild", tolerations=[{"operator": "Exists"}],
                                                   affinity=on_team_node), since=48),
        Request("pool-pod-tolerating-every-team", f"a pod in {s.pool} tolerating the team key whatever its value",
                "every team's nodes", pods, "POST", f"{pool}/pods",
                _pod("red-key", tolerations=[{"key": TEAM_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
                     affinity=on_team_node), since=48),
        Request("pool-pod-tolerating-every-effect", f"a pod in {s.pool} tolerating the team's taint with no effect "
                "named", "the team's NoExecute taint too: it is never evicted", pods, "POST", f"{pool}/pods",
                _pod("red-effect", tolerations=[{k: v for k, v in team_tol.items() if k != "effect"}]), since=48),
        Request("team-pod-on-a-host-port", f"a pod in {s.team_ns} with a hostPort", "a port of the team's node",
                pods, "POST", f"{team}/pods", _container("red-hostport", ports=[{"containerPort": 8080,
                                                                                  "hostPort": 8080}])),
        Request("team-pod-unconfined", f"a pod in {s.team_ns} without AppArmor or seccomp (Unconfined)",
                "a weaker sandbox than Pod Security restricted", pods, "POST", f"{team}/pods",
                _pod("red-unconfined", securityContext={"runAsNonRoot": True, "runAsUser": 65534,
                                                        "seccompProfile": {"type": "Unconfined"},
                                                        "appArmorProfile": {"type": "Unconfined"}})),
        Request("team-pod-with-kernel-settings", f"a pod in {s.team_ns} with sysctls", "kernel settings of the "
                "pod's namespaces", pods, "POST", f"{team}/pods",
                _pod("red-sysctl", securityContext={**pod_body("x", RED)["spec"]["securityContext"],
                                                    "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start",
                                                                 "value": "0"}]}), since=48),
        Request("team-pod-taking-the-teams-traffic", f"a pod in {s.team_ns} labelled as the team's pods "
                f"(the selector of its Service {s.team_service})", "the team's Service sends it their traffic",
                pods, "POST", f"{team}/pods", pod_body("red-label", RED, labels={"app": "training"}), since=48),
        Request("team-pod-under-the-teams-name", f"a pod in {s.team_ns} with hostname and subdomain "
                f"{s.team_service}", "a DNS name under the team's Service", pods, "POST", f"{team}/pods",
                _pod("red-dns", hostname="rank-0", subdomain=s.team_service), since=48),
        Request("team-pod-that-never-goes", f"a pod in {s.team_ns} with a finalizer",
                "a pod, and the team's namespace, that cannot be deleted until someone removes it", pods, "POST",
                f"{team}/pods", {**pod_body("red-finalizer", RED), "metadata": {
                    **metadata("red-finalizer", RED), "finalizers": ["example.com/keep"]}}, since=48),
        Request("team-pod-owned-by-the-teams-pod", f"a pod in {s.team_ns} owned by the team's pod {s.team_pod}",
                "tied to a tenant's object: the garbage collector, not the harness, decides when it goes", pods,
                "POST", f"{team}/pods", {**pod_body("red-owner", RED), "metadata": {
                    **metadata("red-owner", RED), "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                                                       "name": s.team_pod, "uid": s.team_pod_uid}]}},
                since=48),
        Request("team-pod-joining-the-teams-gang", f"a pod in {s.team_ns} labelled into the team's pod group",
                "a member the team's gang waits for, or counts, that is not the team's", pods, "POST", f"{team}/pods",
                pod_body("red-gang", RED, labels={"scheduling.x-k8s.io/pod-group": "training"}), since=48),
        Request("pool-pod-of-a-megabyte", f"a pod in {s.pool} with a command of 800 kB",
                "etcd filled, pod by pod, up to the pool's quota", pods, "POST", f"{pool}/pods",
                _container("red-big", command=["x" * 4000] * 200), since=48),
        Request("pool-pod-with-a-thousand-annotations", f"a pod in {s.pool} with 1,000 small clusterproof.io "
                "annotations", "etcd filled, pod by pod, under the per-value bound", pods, "POST", f"{pool}/pods",
                {**pod_body("red-many", RED), "metadata": {**metadata("red-many", RED), "annotations": {
                    f"clusterproof.io/a-{i}": "x" * 200 for i in range(1000)}}}, since=48),
        Request("pool-pod-with-a-second-container", f"a pod in {s.pool} with a second container beside the one "
                "the harness means", "code of the attacker's running beside a check's", pods, "POST", f"{pool}/pods",
                _pod("red-sidecar", containers=[*pod_body("x", RED)["spec"]["containers"], restricted_init]),
                since=48),
        Request("team-pod-in-the-root-group", f"a pod in {s.team_ns} running as group 0", "files of the root group "
                "in the image and on shared volumes", pods, "POST", f"{team}/pods",
                _pod("red-gid0", securityContext={**pod_body("x", RED)["spec"]["securityContext"], "runAsGroup": 0}),
                since=48),
        Request("pool-pod-with-an-init-container", f"a pod in {s.pool} with an init container",
                "code that runs before the one the harness means", pods, "POST", f"{pool}/pods",
                _pod("red-init", initContainers=[restricted_init]), since=48),
        Request("team-pod-adds-a-wildcard-later", f"the harness's own running pod {s.own_team_pod} in {s.team_ns} "
                "given a toleration of every team", "a running pod that now stays on every team's node", pods,
                "PATCH", f"{team}/pods/{s.own_team_pod}",
                [{"op": "add", "path": "/spec/tolerations/-", "value": {"key": TEAM_TAINT, "operator": "Exists",
                                                                         "effect": "NoExecute"}}],
                patch=JSON_PATCH, since=48),
        Request("team-pod-relabelled-later", f"the harness's own running pod {s.own_team_pod} relabelled as the "
                "team's", "the team's Service sends it their traffic", pods, "PATCH", f"{team}/pods/{s.own_team_pod}",
                {"metadata": {"labels": {"app": "training"}}}, since=48),
        Request("pool-pod-status-forged", f"the status of the harness's own pod {s.own_pool_pod}: another address "
                "and phase", "an endpoint of its Service pointing anywhere", pods, "PATCH",
                f"{pool}/pods/{s.own_pool_pod}/status", {"status": {"podIP": "10.96.0.1", "podIPs": [
                    {"ip": "10.96.0.1"}]}}, since=48),
        Request("pool-podtemplate-with-the-nodes-root", f"a PodTemplate in {s.pool} mounting the node's /",
                "a pod spec for anything that instantiates templates", pods, "POST", f"{pool}/podtemplates",
                {"metadata": metadata("red-template", RED), "template": {"spec": {
                    **pod_body("x", RED)["spec"], "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}}},
                since=48),
        Request("pool-gang-reserving-the-cluster", f"a PodGroup in {s.pool} asking for 60,000 GPUs",
                "a gang whose reservation the scheduler holds against every team", VAP.format("clusterproof-gangs"),
                "POST", f"/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{s.pool}/podgroups", {
                    "apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup", "metadata": metadata(RED, RED),
                    "spec": {"minMember": 1, "minResources": {"nvidia.com/gpu": "60000"}}}, since=48),
        # --- the harness's own names as weapons ----------------------------------------------------------------------
        Request("node-check-taint-evicting-a-busy-node", f"node {s.busy_node}, busy with a team's pod and claimed by "
                "no run, given check.clusterproof.io/evict:NoExecute", "every pod of the node evicted",
                VAP.format("clusterproof-nodes"), "PATCH", f"/api/v1/nodes/{s.busy_node}",
                {"spec": {"taints": [*s.taints_of(s.busy_node), {"key": "check.clusterproof.io/evict", "value": "x",
                                                                  "effect": "NoExecute"}]}}, since=48),
        Request("node-claimed-outside-the-borrowable-pool", f"the team's node {s.team_node} claimed "
                "(clusterproof.io/scratch)", "a team's node taken out of its hands",
                VAP.format("clusterproof-nodes"), "PATCH", team_node, claim(s.team_node), since=48),
        Request("node-claim-that-evicts", f"node {s.borrowable_node} claimed with a NoExecute clusterproof.io/scratch",
                "every pod of the node evicted by the claim itself", VAP.format("clusterproof-nodes"), "PATCH",
                f"/api/v1/nodes/{s.borrowable_node}", claim(s.borrowable_node, "NoExecute"), since=48),
        Request("node-record-of-250-kb", f"node {s.any_node} given a 250 kB clusterproof.io/added-taints record",
                "every node object a quarter megabyte larger, for every watcher of nodes",
                VAP.format("clusterproof-nodes"), "PATCH", node,
                {"metadata": {"annotations": {f"clusterproof.io/added-taints.{RED}": "x" * 250_000}}}, since=48),
        # --- API Priority and Fairness, bounded explicitly ----------------------------------------------------------
        Request("flow-level-borrowing-without-bound", "the priority level clusterproof-flood with no "
                "borrowingLimitPercent", "a missing limit means unlimited borrowing: the flood takes every level's "
                "seats", VAP.format("clusterproof-fixed-names"), "POST", pl,
                {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
                 "metadata": {"name": "clusterproof-flood"},
                 "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": 1, "lendablePercent": 0,
                                                          "limitResponse": {"type": "Reject"}}}}, since=48),
        Request("flow-capturing-a-sites-namespace", "the FlowSchema clusterproof-flood matching clusterproof-load of "
                "clusterproof-site, a site's own namespace", "a site's traffic sent to the flood's level",
                VAP.format("clusterproof-fixed-names"), "POST", fs,
                flow("clusterproof-flood", {"kind": "ServiceAccount", "serviceAccount": {
                    "namespace": "clusterproof-site", "name": load}}), since=48),
        Request("flow-capturing-every-account-of-the-pool", f"the FlowSchema clusterproof-flood matching every "
                f"ServiceAccount of {s.pool}", "accounts that are not the flood's sent to its level",
                VAP.format("clusterproof-fixed-names"), "POST", fs,
                flow("clusterproof-flood", {"kind": "ServiceAccount", "serviceAccount": {
                    "namespace": s.flow_namespace, "name": "*"}}), since=48),
        # --- volume: what it may store ---------------------------------------------------------------------------
        Request("home-configmap-of-a-megabyte", f"a ConfigMap of 1 MB in {s.home}", "etcd filled, ConfigMap by "
                "ConfigMap, until the whole cluster is read-only", VAP.format("clusterproof-configmaps"), "POST",
                f"/api/v1/namespaces/{s.home}/configmaps",
                {"metadata": metadata("clusterproof-run-red-team", RED), "data": {"x": "x" * 1_000_000}}, since=48),
        Request("home-lease-of-a-quarter-megabyte", f"a Lease in {s.home} with a 200 kB annotation",
                "etcd filled, Lease by Lease", VAP.format("clusterproof-leases"), "POST",
                f"/apis/coordination.k8s.io/v1/namespaces/{s.home}/leases",
                {"metadata": {**metadata("clusterproof-run-red-team", RED),
                              "annotations": {"clusterproof.io/x": "x" * 200_000}}}, since=48),
    ]


def send(api: client.ApiClient, r: Request) -> tuple[int, str]:
    """(status, message) of ``r`` as a server-side dry run; (200, "") when admitted."""
    headers = {"Content-Type": r.patch} if r.method == "PATCH" else None
    try:
        raw_request(api, r.method, r.path, {"dryRun": "All"}, headers=headers, body=r.body).data
        return 200, ""
    except client.ApiException as e:
        return e.status, api_message(e)


# --- the identities and their scenes ---------------------------------------------------------------------------

def _rename_before(docs: list[dict], sa: str, home: str, pool: str, suffix: str) -> list[dict]:
    """The old manifests for another ServiceAccount ``home/sa``: one pool namespace ``pool``, every cluster-scoped
    name suffixed, its admission policies matching that ServiceAccount and its load identity only (never the
    shipped manifests' identities, whose namespaces these names do not share)."""
    out = []
    user = f"system:serviceaccount:{access.HOME}:{access.SERVICE_ACCOUNT}"
    for d in json.loads(json.dumps(docs)):
        kind, meta = d["kind"], d["metadata"]
        ns = meta.get("namespace")
        if kind == "Namespace":
            if meta["name"] not in (access.HOME, "clusterproof-0"):
                continue
            meta["name"] = home if meta["name"] == access.HOME else pool
            meta["labels"] = {}
        elif ns is not None:
            if ns not in (access.HOME, "clusterproof-0"):
                continue
            meta["namespace"] = home if ns == access.HOME else pool
        if kind in ("ClusterRole", "ClusterRoleBinding", "ValidatingAdmissionPolicy",
                    "ValidatingAdmissionPolicyBinding"):
            meta["name"] += suffix
        if kind == "ServiceAccount":
            meta["name"] = sa
        if "roleRef" in d and d["roleRef"]["kind"] == "ClusterRole":
            d["roleRef"]["name"] += suffix
        if "subjects" in d:
            d["subjects"] = [{"kind": "ServiceAccount", "name": sa, "namespace": home}]
        if kind == "ValidatingAdmissionPolicy":
            for c in d["spec"].get("matchConditions") or []:
                c["expression"] = c["expression"].replace(user, f"system:serviceaccount:{home}:{sa}").replace(
                    "endsWith(':clusterproof-load')", f"endsWith(':{pool}:clusterproof-load')")
        if kind == "ValidatingAdmissionPolicyBinding":
            d["spec"]["policyName"] += suffix
        out.append(d)
    return out


def _team_docs(ns: str, sa: str, bind: list[tuple[str, str, str]]) -> list[dict]:
    """A team namespace of the cluster's own (no Pod Security label, as many sites have) with a ServiceAccount of
    edit rights there (the team's pipeline), and the team bindings ``bind`` ((team role, ServiceAccount
    namespace, ServiceAccount name) each)."""
    docs = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"example.com/team": "red"}}},
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": f"{sa}-edit", "namespace": ns},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "edit"},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}]
    for role, sa_ns, sa_name in bind:
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": f"team-{sa_name}", "namespace": ns},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                     "subjects": [{"kind": "ServiceAccount", "name": sa_name, "namespace": sa_ns}]})
    return docs


def _pool_namespace(name: str) -> list[dict]:
    """A pool namespace added as docs/real-cluster.md says an SRE adds one: the label, Pod Security, the RoleBinding
    of the pool role, and the pool's quota copied from the manifest."""
    quota = next(d for d in access.manifest_docs(False) if d["kind"] == "ResourceQuota"
                 and d["metadata"]["namespace"] == "clusterproof-0")
    return [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": {
                access.POOL_LABEL: "true", **POD_SECURITY_LABELS}}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
             "metadata": {"name": "clusterproof", "namespace": name},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": access.POOL_ROLE},
             "subjects": [{"kind": "ServiceAccount", "name": access.SERVICE_ACCOUNT, "namespace": access.HOME}]},
            {**quota, "metadata": {**quota["metadata"], "namespace": name}}]


def _givens(pool: str, pool_role: str, load: str) -> list[dict]:
    """What an admin makes to judge the chain's later steps as if its earlier ones had been admitted: a laundered
    Role (binding, Services) held by the load identity, and a minted ServiceAccount bound to the pool's role."""
    rb = lambda name, kind, role, sa: {  # noqa: E731
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": pool},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": kind, "name": role},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": pool}]}
    return [{"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
             "metadata": {"name": LAUNDERED, "namespace": pool},
             "rules": [{"apiGroups": ["rbac.authorization.k8s.io"], "resources": ["rolebindings"], "verbs": ["create"]},
                       {"apiGroups": [""], "resources": ["services"], "verbs": ["create"]}]},
            rb(LAUNDERED, "Role", LAUNDERED, load),
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": MINTED, "namespace": pool}},
            rb(MINTED, "ClusterRole", pool_role, MINTED)]


def _wait_bound(api, path: str) -> dict:
    return wait_for(lambda: json.loads(raw_request(api, "GET", path).data), timeout=60, interval=0.5,
                    until=lambda p: p["spec"].get("nodeName") and any(
                        c["type"] == "Ready" for c in (p.get("status") or {}).get("conditions") or []),
                    what=f"{path} bound and running")


@pytest.fixture(scope="module")
def scenes(cluster, run_id, tmp_path_factory):
    """{"shipped": ({identity: client}, Scene), "before-35": (...), "before-48": (...)}: the shipped manifests and
    both controls set up side by side, each with its identities."""
    api, tag = cluster.api, run_id[-4:]
    work = tmp_path_factory.mktemp("red-team")
    team_ns, secret_name, team_sa, team_pod = f"team-red-{tag}", "team-credentials", "team-pipeline", "team-rank-0"
    own_team_pod, own_pool_pod = "harness-rank", "harness-rank"
    shipped_pool = f"{access.POOL_PREFIX}rt-{tag}"
    controls = {gen: (f"rt{gen}-{tag}", f"rt{gen}-{tag}", f"rt{gen}-{tag}-0", f"-rt{gen}-{tag}") for gen in BEFORE}
    before = [d for gen, (sa, home, pool, suffix) in controls.items()
              for d in _rename_before([d for f in BEFORE[gen] for d in yaml.safe_load_all(f.read_text()) if d],
                                      sa, home, pool, suffix)]
    team = _team_docs(team_ns, team_sa, [(access.TEAM_ROLE, access.HOME, access.SERVICE_ACCOUNT),
                                         *[(access.TEAM_ROLE + suffix, home, sa)
                                           for sa, home, _pool, suffix in controls.values()]])
    extra = access.manifest_docs(True)[len(access.manifest_docs(False)):]
    high = f"red-team-high-{tag}"
    nodes = list_raw(api, "/api/v1/nodes")["items"]
    team_node = next((n for n in nodes if any(t["key"] == TEAM_TAINT for t in n["spec"].get("taints") or [])),
                     nodes[0])
    simulated = [n for n in nodes if n is not team_node
                 and (n["metadata"].get("labels") or {}).get("clusterproof.io/node-kind") != "real"]
    any_node = simulated[0]
    borrowable = next(n for n in simulated if (n["metadata"].get("labels") or {}).get(access.POOL_LABEL) == "shared"
                      and not any(t["key"] == "clusterproof.io/scratch" for t in n["spec"].get("taints") or []))
    pod = pod_body(team_pod, "team")
    pod["metadata"]["labels"] = {"app": "training"}      # the team's: no run label of the harness
    pod["spec"]["tolerations"] = [{"operator": "Exists"}]   # the team's own pod: anywhere, the team node too
    production = f"red-team-production-{tag}"
    team_path = f"/api/v1/namespaces/{team_ns}"
    made = [f"{team_path}/pods/{team_pod}", f"{team_path}/pods/{own_team_pod}", f"{team_path}/secrets/{secret_name}",
            f"{team_path}/services/training", f"{team_path}/persistentvolumeclaims/team-data",
            f"/apis/scheduling.k8s.io/v1/priorityclasses/{high}", f"/api/v1/nodes/{production}"]
    pools = {"shipped": (shipped_pool, access.POOL_ROLE, access.HOME),
             **{f"before-{gen}": (pool, access.POOL_ROLE + suffix, home)
                for gen, (_sa, home, pool, suffix) in controls.items()}}
    givens = [d for name, (pool, role, _home) in pools.items() if name != "before-35"
              for d in _givens(pool, role, "clusterproof-load")]
    with guest.applied(api, [*before, *team, *extra, *_pool_namespace(shipped_pool)]):
        try:
            create_if_absent(api, f"{team_path}/secrets", {
                "apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name, "namespace": team_ns},
                "stringData": {"token": "the team's credential"}})
            create_if_absent(api, f"{team_path}/pods", pod)
            create_if_absent(api, f"{team_path}/pods", pod_body(own_team_pod, RED))
            create_if_absent(api, f"{team_path}/services", {
                "apiVersion": "v1", "kind": "Service", "metadata": {"name": "training"},
                "spec": {"clusterIP": "None", "selector": {"app": "training"}, "ports": [{"port": 29500}]}})
            create_if_absent(api, f"{team_path}/persistentvolumeclaims", {
                "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "team-data"},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
            # Tainted, so no other pod lands on it while it exists; no kwok annotation: a real cluster's node.
            create_if_absent(api, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": production}, "spec": {"taints": [{"key": "red-team", "value": "x", "effect": "NoSchedule"}]}})
            create_if_absent(api, "/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": high},
                "value": 1000000, "description": "the cluster's own high priority (clusterproof red-team self-test)"})
            for pool, *_ in pools.values():
                create_if_absent(api, f"/api/v1/namespaces/{pool}/pods", pod_body(own_pool_pod, RED))
                made.append(f"/api/v1/namespaces/{pool}/pods/{own_pool_pod}")
            team_running = _wait_bound(api, f"{team_path}/pods/{team_pod}")
            for pool, *_ in pools.values():
                _wait_bound(api, f"/api/v1/namespaces/{pool}/pods/{own_pool_pod}")
            busy = team_running["spec"]["nodeName"]
            taints = {n["metadata"]["name"]: n["spec"].get("taints") or [] for n in nodes}
            common = dict(team_ns=team_ns, team_pod=team_pod, team_pod_uid=team_running["metadata"]["uid"],
                          team_service="training", team_secret=secret_name, team_claim="team-data", team_sa=team_sa,
                          own_team_pod=own_team_pod, own_pool_pod=own_pool_pod, team_node=team_node["metadata"]["name"],
                          team_taint=next((t for t in team_node["spec"].get("taints") or []
                                           if t["key"] == TEAM_TAINT), {}),
                          busy_node=busy, borrowable_node=borrowable["metadata"]["name"],
                          any_node=any_node["metadata"]["name"], high_priority=high, production_node=production,
                          taints=taints)
            identities = {"shipped": {"harness": load_client(guest.kubeconfig_for(api, work / "shipped")[0])},
                          **{f"before-{gen}": {"harness": load_client(
                              guest.kubeconfig_for(api, work / f"before-{gen}", home, sa)[0])}
                             for gen, (sa, home, _pool, _suffix) in controls.items()}}
            # Admission policies reach the API server's admission a moment after they are created.
            probe = next(r for r in requests(Scene(home=access.HOME, pool=shipped_pool, pool_role=access.POOL_ROLE,
                                                   flow_namespace=shipped_pool, **common))
                         if r.id == "pool-pod-by-node-name")
            wait_for(lambda: send(identities["shipped"]["harness"], probe), until=lambda a: a[0] >= 400, timeout=30,
                     interval=0.5, what="the shipped pod policy in force")
            # The load identity, minted by each harness as a run mints it; the chain's givens beside it.
            for name in ("shipped", "before-48"):
                pool = pools[name][0]
                load = create_load_identity(identities[name]["harness"], pool, RED, work / name / "load")
                identities[name]["load"] = load_client(guest.token_kubeconfig(
                    api, work / name, "load", load.token_file.read_text()))
            with guest.applied(api, givens):
                for name in ("shipped", "before-48"):
                    pool = pools[name][0]
                    identities[name]["minted"] = load_client(guest.kubeconfig_for(api, work / name, pool, MINTED)[0])
                # The controls' flow policies know a pool namespace by its name's prefix alone.
                flows = {name: pool if name == "shipped" else f"clusterproof-{pool}"
                         for name, (pool, _role, _home) in pools.items()}
                yield {name: (identities[name], Scene(home=home, pool=pool, pool_role=role, flow_namespace=flows[name],
                                                      **common))
                       for name, (pool, role, home) in pools.items()}
        finally:
            for path in made:
                delete_if_present(api, path, {"gracePeriodSeconds": "0"} if "/pods/" in path else None)
            for pool, *_ in pools.values():
                for kind in ("rolebindings", "roles"):
                    delete_if_present(api, f"/apis/rbac.authorization.k8s.io/v1/namespaces/{pool}/{kind}/"
                                           "clusterproof-load")
                delete_if_present(api, f"/api/v1/namespaces/{pool}/serviceaccounts/clusterproof-load")


@pytest.mark.cluster
def test_every_escalating_request_of_every_identity_is_refused_by_what_closes_it(scenes):
    clients, scene = scenes["shipped"]
    admitted, other = [], []
    for r in requests(scene):
        status, message = send(clients[r.as_], r)
        if status < 300:
            admitted.append(f"{r.id} (as {r.as_}): {r.what} -- ADMITTED, which gives {r.why}")
        elif r.closer not in message:
            other.append(f"{r.id} (as {r.as_}): refused ({status}), but not by {r.closer}: {message[:240]}")
    assert not admitted, f"{len(admitted)} escalating request(s) of the harness's identities were admitted " \
                         "(server-side dry run):\n" + "\n".join(admitted)
    assert not other, "refused by something other than the rule docs/rbac.md names:\n" + "\n".join(other)


@pytest.mark.parametrize("gen", [pytest.param(35, id="before-issue-35"), pytest.param(48, id="before-issue-48")])
@pytest.mark.cluster
def test_the_manifests_of_before_each_review_are_caught_request_by_request(scenes, gen):
    """Negative controls: the requests a review found, as the identities of the manifests shipped before it, come
    back admitted, each of them (but those the manifests of that time refused too) -- the check above can see
    every path."""
    clients, scene = scenes[f"before-{gen}"]
    not_admitted = []
    for r in requests(scene):
        if r.since != gen:
            continue
        status, message = send(clients[r.as_], r)
        if r.refused_before:
            if status < 300:
                not_admitted.append(f"{r.id}: admitted, yet {r.refused_before} refused it before")
            continue
        if status >= 300:
            not_admitted.append(f"{r.id} (as {r.as_}): {r.what} -- refused ({status}: {message[:200]})")
    assert not not_admitted, f"the manifests of before issue {gen} no longer admit these requests, so the red team " \
                             "cannot tell the shipped ones from them:\n" + "\n".join(not_admitted)


@pytest.mark.cluster
def test_a_pool_namespace_stores_no_more_than_its_quota(scenes, cluster):
    """As the harness, PodTemplates (the API-latency probe's kind) up to the pool's quota are admitted, and one more
    is refused by the quota, not by a policy; in the control's pool (the manifests of before issue 48: no quota)
    that one more is admitted."""
    clients, scene = scenes["shipped"]
    limit = int(next(d for d in access.manifest_docs(False) if d["kind"] == "ResourceQuota"
                     and d["metadata"]["namespace"] == "clusterproof-0")["spec"]["hard"]["count/podtemplates"])
    path = f"/api/v1/namespaces/{scene.pool}/podtemplates"

    def template(i: int) -> dict:
        return {"metadata": metadata(f"probe-{i}", RED), "template": {"spec": pod_body(f"probe-{i}", RED)["spec"]}}
    try:
        for i in range(limit):
            raw_request(clients["harness"], "POST", path, body=template(i)).data
        one_more = Request("pool-podtemplate-beyond-the-quota", "", "", "exceeded quota", "POST", path,
                           template(limit))
        # The quota's usage reaches its admission a moment after the creates.
        status, message = wait_for(lambda: send(clients["harness"], one_more), until=lambda a: a[0] >= 400,
                                   timeout=30, interval=1, what="the pool's quota used up")
    finally:
        for i in range(limit):
            delete_if_present(cluster.api, f"{path}/probe-{i}")
    assert status == 403 and "exceeded quota: clusterproof" in message and "count/podtemplates" in message, \
        (status, message)
    control_clients, control = scenes["before-48"]
    control_path = f"/api/v1/namespaces/{control.pool}/podtemplates"
    assert send(control_clients["harness"], Request("x", "", "", "", "POST", control_path, template(limit))) == \
        (200, ""), "the control's pool has no quota, so one more PodTemplate is admitted there"


@pytest.mark.unit
def test_docs_name_what_closes_every_escalation_path():
    """docs/rbac.md's table lists every request of the red team, with the rule or policy that closes it."""
    text = (ROOT / "docs" / "rbac.md").read_text()
    scene = Scene(**{f.name: {} if f.name == "team_taint" else "x" for f in fields(Scene) if f.name != "taints"})
    missing = [r.id for r in requests(scene) if f"`{r.id}`" not in text]
    assert not missing, f"docs/rbac.md does not list: {', '.join(missing)}"


@pytest.mark.unit
def test_the_pool_namespaces_of_the_manifest_enforce_the_pod_security_the_harness_labels_its_own_with():
    docs = [d for d in access.manifest_docs(False) if d["kind"] == "Namespace" and d["metadata"]["name"] != access.HOME]
    assert docs and all({k: v for k, v in d["metadata"]["labels"].items() if k.startswith("pod-security")}
                        == POD_SECURITY_LABELS for d in docs), [d["metadata"] for d in docs]


@pytest.mark.cluster
def test_the_load_worker_pods_of_the_docs_pass_pod_security_restricted(cluster):
    """The load workers an SRE runs as pods (docs/distributed-load.md, its Job manifest) pass Pod Security
    ``restricted`` like every pod of the harness: the Job's pod template, as a pod, server-side dry run in a pool
    namespace (which enforces it). Negative control: the same pod with its security context removed is refused."""
    text = (ROOT / "docs" / "distributed-load.md").read_text()
    job = next(d for block in text.split("```yaml")[1:] for d in yaml.safe_load_all(block.split("```")[0])
               if d and d.get("kind") == "Job")
    spec = job["spec"]["template"]["spec"]
    pool = access.pool_namespaces(cluster.api)[0]

    def answer(pod_spec: dict) -> tuple[int, str]:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "load-0"}, "spec": pod_spec}
        return send(cluster.api, Request("load-worker", "", "", "", "POST", f"/api/v1/namespaces/{pool}/pods", pod))
    assert answer(spec) == (200, ""), answer(spec)
    bare = json.loads(json.dumps(spec))
    bare.pop("securityContext")
    bare["containers"][0].pop("securityContext")
    status, message = answer(bare)
    assert status == 403 and PSA in message, (status, message)


@pytest.mark.cluster
def test_the_embedded_cluster_refuses_privileged_pods_even_to_its_admin(cluster):
    """Its real nodes run on this machine: kube-apiserver runs with --allow-privileged=false (kwokctl's default is
    true), so no identity -- the admin's included -- gets a privileged container onto the host. Dry run in
    ``default``, a namespace without Pod Security labels; the same pod unprivileged is admitted (the control)."""
    container = _pod("x")["spec"]["containers"][0]
    pod = _pod("privileged", containers=[{**container, "securityContext": {"privileged": True}}])
    path = "/api/v1/namespaces/default/pods"
    status, message = send(cluster.api, Request("privileged", "", "", "", "POST", path, pod))
    assert status in (403, 422) and "privileged" in message.lower(), (status, message)
    assert send(cluster.api, Request("unprivileged", "", "", "", "POST", path, _pod("unprivileged"))) == (200, "")


@pytest.mark.cluster
def test_the_old_manifests_are_kept_as_they_were_shipped():
    """The controls' data: unchanged copies (plus a header) of what 94aee8a and f7be94f shipped."""
    for gen, files in BEFORE.items():
        for f in files:
            text = f.read_text()
            assert text.startswith("# NEGATIVE CONTROL DATA"), f
            if gen == 35:
                assert "clusterproof-pods" not in text and "pod-security" not in text, f
            else:
                assert "ResourceQuota" not in text and "clusterproof-roles" not in text, f
