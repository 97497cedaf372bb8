"""A red team against the harness's own identity: what it can *build*, not what can-i answers.

A security reviewer judges the ServiceAccount of the shipped manifests by the requests it can get admitted:
a pod is a path to its node's host unless something forbids it, a RoleBinding a path to anyone, a FlowSchema
a path past API Priority and Fairness, a node patch a path through every team's isolation. Here every such
request (``REQUESTS``; docs/rbac.md, "Escalation paths", names the rule or policy that closes each) is sent
as that ServiceAccount -- a real request to the real API server, as a server-side dry run, so nothing is
stored -- with both manifests applied, as an SRE applies them, beside a team namespace of the cluster's own
(a team's pod, Secret and powerful ServiceAccount) and the team's tainted nodes. Every request must be
refused, and refused by the closer the docs name.

Negative control: the manifests as shipped before issue 35 (tests/data/*-before-issue-35.yaml), applied for
another ServiceAccount with namespaces of its own, under the same requests: each must come back admitted
(except the one RBAC's escalation check refused even then), and the control names every request that was not.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
import yaml
from kubernetes import client

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
from clusterproof.kube.pod_spec import POD_SECURITY_LABELS, pod_body
from tests import guest
from tests.harness import ROOT

pytestmark = [pytest.mark.selftest]

BEFORE = [ROOT / "tests" / "data" / "rbac-before-issue-35.yaml",
          ROOT / "tests" / "data" / "rbac-destructive-before-issue-35.yaml"]
PSA = "violates PodSecurity"                       # what Pod Security Admission's refusal says
RBAC_ESCALATION = "attempting to grant RBAC permissions not currently held"
TEAM_TAINT = "clusterproof.io/team"                 # the smoke profile's team_taint_key


@dataclass
class Scene:
    """Where the requests go, for one identity: its pool namespace, a team namespace of the cluster's own with a
    team's pod, Secret and ServiceAccount, a team node and any node, and the cluster's high PriorityClass."""
    pool: str
    team_ns: str
    team_pod: str
    team_secret: str
    team_sa: str
    team_node: str
    team_taint: dict
    any_node: str
    high_priority: str
    production_node: str                # a node without the kwok annotation, as a real cluster's nodes are
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
    body: dict | None = None
    patch: str = "application/merge-patch+json"
    refused_before: str = ""           # the old manifests refused it too (and what said so)


def _pod(name: str, **spec) -> dict:
    body = pod_body(name, "red-team")
    body["spec"].update(spec)
    return body


# Root on a node without the word "privileged" (which the embedded cluster refuses to everyone: --allow-privileged=
# false, so a request that asked for it would be refused whatever the manifests say): uid 0, the node's process and
# network namespaces, CAP_SYS_ADMIN, and the node's / mounted -- `chroot /host` or `nsenter -t 1` and it is the node.
ROOT_ON_NODE = {"runAsUser": 0, "runAsNonRoot": False, "allowPrivilegeEscalation": True,
                "capabilities": {"add": ["SYS_ADMIN", "SYS_PTRACE"]}}


def _root_pod(name: str, node: str) -> dict:
    """The issue's pod: root on a node it chose, past the scheduler and every taint."""
    body = pod_body(name, "red-team")
    body["spec"] = {"nodeName": node, "hostPID": True, "hostNetwork": True,
                    "containers": [{"name": "x", "image": "busybox", "securityContext": dict(ROOT_ON_NODE),
                                    "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
                    "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}
    return body


def requests(s: Scene) -> list[Request]:
    """Every escalating request, against the scene of one identity."""
    pool, team = f"/api/v1/namespaces/{s.pool}", f"/api/v1/namespaces/{s.team_ns}"
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{s.pool}/rolebindings"
    fs = "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas"
    node, team_node = f"/api/v1/nodes/{s.any_node}", f"/api/v1/nodes/{s.team_node}"
    sa_subject = {"kind": "ServiceAccount", "serviceAccount": {"namespace": s.pool, "name": "clusterproof-load"}}
    everyone = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]

    def binding(role_kind: str, role: str, subjects: list[dict]) -> dict:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "red-team", "labels": {"clusterproof.io/run": "red-team"}},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
                "subjects": subjects}

    def flow(level: str) -> dict:
        return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
                "metadata": {"name": "clusterproof-flood"},
                "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": 1000,
                         "rules": [{"subjects": [sa_subject],
                                    "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}

    secret_volume = [{"name": "s", "secret": {"secretName": s.team_secret}}]
    other_taints = [t for t in [s.team_taint] if t]
    return [
        # --- pods in its pool namespace: a path to the node's host --------------------------------------------
        Request("pool-pod-root-on-a-chosen-node", f"a pod in {s.pool} as root with CAP_SYS_ADMIN, hostPID, "
                "hostNetwork, a hostPath of / and nodeName of a node it chose",
                "root on any node, past the scheduler and every taint",
                PSA, "POST", f"{pool}/pods", _root_pod("red-root", s.any_node)),
        Request("pool-pod-by-node-name", f"a restricted pod in {s.pool} bound by spec.nodeName",
                "a pod on any node past the scheduler: every NoSchedule taint, a team's or a preflight's, ignored",
                "ValidatingAdmissionPolicy 'clusterproof-pods'", "POST", f"{pool}/pods",
                _pod("red-nodename", nodeName=s.any_node)),
        Request("pool-pod-with-a-token", f"a pod in {s.pool} with its ServiceAccount token mounted",
                "a credential inside a container the harness does not control",
                "ValidatingAdmissionPolicy 'clusterproof-pods'", "POST", f"{pool}/pods",
                _pod("red-token", automountServiceAccountToken=True)),
        Request("pool-pod-outranking-tenants", f"a pod in {s.pool} of the cluster's PriorityClass {s.high_priority}",
                "preempting a team's training pods", "ValidatingAdmissionPolicy 'clusterproof-pods'", "POST",
                f"{pool}/pods", _pod("red-priority", priorityClassName=s.high_priority)),
        # --- bindings: a path to anyone --------------------------------------------------------------------------
        Request("pool-role-bound-to-everyone", f"a RoleBinding in {s.pool} of {access.POOL_ROLE} to "
                "system:unauthenticated", "anyone who reaches the API server creates pods there; no run label, so "
                "no sweeper removes it", "ValidatingAdmissionPolicy 'clusterproof-rolebindings'", "POST", rbac,
                binding("ClusterRole", access.POOL_ROLE, everyone)),
        Request("pool-role-bound-to-a-user", f"a RoleBinding in {s.pool} of {access.POOL_ROLE} to the user mallory",
                "a standing grant for someone else", "ValidatingAdmissionPolicy 'clusterproof-rolebindings'", "POST",
                rbac, binding("ClusterRole", access.POOL_ROLE,
                              [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}])),
        Request("admin-bound-to-everyone", f"a RoleBinding in {s.pool} of admin to system:unauthenticated",
                "admin of the namespace for anyone", RBAC_ESCALATION, "POST", rbac,
                binding("ClusterRole", "admin", everyone), refused_before="RBAC's escalation check"),
        # --- Services: a path to other tenants' traffic --------------------------------------------------------------
        Request("service-capturing-an-address", f"a Service in {s.pool} with externalIPs 10.96.0.1",
                "every node's proxy sends that address's traffic to the harness's pods (CVE-2020-8554)",
                "ValidatingAdmissionPolicy 'clusterproof-services'", "POST", f"{pool}/services",
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "red-externalip"},
                 "spec": {"selector": {"app": "red"}, "ports": [{"port": 443}], "externalIPs": ["10.96.0.1"]}}),
        Request("service-opening-every-node", f"a NodePort Service in {s.pool}", "a port open on every node",
                "ValidatingAdmissionPolicy 'clusterproof-services'", "POST", f"{pool}/services",
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "red-nodeport"},
                 "spec": {"type": "NodePort", "selector": {"app": "red"}, "ports": [{"port": 80}]}}),
        # --- a team's namespace, beside the team's own objects -------------------------------------------------------
        Request("team-pod-root-on-its-node", f"a pod in the team namespace {s.team_ns} (no Pod Security there) as "
                "root with CAP_SYS_ADMIN in the node's process namespace", "root on a team's node",
                "ValidatingAdmissionPolicy 'clusterproof-pods'", "POST", f"{team}/pods",
                _pod("red-root", hostPID=True, securityContext={},
                     containers=[{**_pod("x")["spec"]["containers"][0], "securityContext": dict(ROOT_ON_NODE)}])),
        Request("team-pod-reading-a-secret", f"a pod in {s.team_ns} mounting the team's Secret {s.team_secret}",
                "the team's credentials", "ValidatingAdmissionPolicy 'clusterproof-pods'", "POST", f"{team}/pods",
                _pod("red-secret", volumes=secret_volume,
                     containers=[{**_pod("x")["spec"]["containers"][0],
                                  "volumeMounts": [{"name": "s", "mountPath": "/s"}]}])),
        Request("team-pod-as-the-teams-identity", f"a pod in {s.team_ns} running as the team's ServiceAccount "
                f"{s.team_sa}", "whatever the team's pipelines may do", "ValidatingAdmissionPolicy 'clusterproof-pods'",
                "POST", f"{team}/pods", _pod("red-teamsa", serviceAccountName=s.team_sa)),
        Request("team-pod-image-swapped", f"the team's running pod {s.team_pod} given another image",
                "code of the attacker's running with the team's identity and Secrets",
                "ValidatingAdmissionPolicy 'clusterproof-pods'", "PATCH", f"{team}/pods/{s.team_pod}",
                {"spec": {"containers": [{"name": "work", "image": "registry.example/evil:1"}]}},
                patch="application/strategic-merge-patch+json"),
        Request("team-pod-deleted", f"the team's pod {s.team_pod} deleted", "a team's training rank killed",
                "ValidatingAdmissionPolicy 'clusterproof-pods'", "DELETE", f"{team}/pods/{s.team_pod}"),
        # --- API Priority and Fairness: a path past it ---------------------------------------------------------------
        Request("flow-at-exempt", "the FlowSchema clusterproof-flood at the priority level exempt",
                "the flood bypasses API Priority and Fairness", "ValidatingAdmissionPolicy 'clusterproof-fixed-names'",
                "POST", fs, flow("exempt")),
        Request("flow-beside-the-kubelets", "the FlowSchema clusterproof-flood at the priority level node-high",
                "the flood competes with every kubelet's heartbeat",
                "ValidatingAdmissionPolicy 'clusterproof-fixed-names'", "POST", fs, flow("node-high")),
        # --- nodes: a path through every team's isolation -------------------------------------------------------------
        Request("node-noexecute-taint", f"node {s.any_node} given the taint evil=x:NoExecute",
                "every pod of the node evicted", "ValidatingAdmissionPolicy 'clusterproof-nodes'", "PATCH", node,
                {"spec": {"taints": [*s.taints_of(s.any_node), {"key": "evil", "value": "x", "effect": "NoExecute"}]}}),
        Request("node-team-taint-removed", f"team node {s.team_node} without its team taint",
                "every team's pods land on it", "ValidatingAdmissionPolicy 'clusterproof-nodes'", "PATCH", team_node,
                {"spec": {"taints": [t for t in s.taints_of(s.team_node) if t not in other_taints]}}),
        Request("node-labelled", f"node {s.any_node} labelled into another pool",
                "a team's node selector now matches it", "ValidatingAdmissionPolicy 'clusterproof-nodes'", "PATCH",
                node, {"metadata": {"labels": {"example.com/pool": "red-team"}}}),
        Request("node-cordoned", f"node {s.any_node} cordoned", "a node taken out of service",
                "ValidatingAdmissionPolicy 'clusterproof-nodes'", "PATCH", node, {"spec": {"unschedulable": True}}),
        Request("node-called-simulated", f"production node {s.production_node} annotated kwok.x-k8s.io/node=fake",
                "a production node the harness then treats as its simulation",
                "ValidatingAdmissionPolicy 'clusterproof-nodes'", "PATCH", f"/api/v1/nodes/{s.production_node}",
                {"metadata": {"annotations": {"kwok.x-k8s.io/node": "fake"}}}),
    ]


def send(api: client.ApiClient, r: Request) -> tuple[int, str]:
    """(status, message) of ``r`` as a server-side dry run; (200, "") when admitted."""
    headers = {"Content-Type": r.patch} if r.method == "PATCH" else None
    try:
        raw_request(api, r.method, r.path, {"dryRun": "All"}, headers=headers, body=r.body).data
        return 200, ""
    except client.ApiException as e:
        return e.status, api_message(e)


# --- the two identities and their scenes -----------------------------------------------------------------------

def _rename_before(docs: list[dict], sa: str, home: str, pool: str, suffix: str) -> list[dict]:
    """The old manifests for another ServiceAccount ``home/sa``: one pool namespace ``pool``, every cluster-scoped
    name suffixed, its admission policy matching that ServiceAccount."""
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
                c["expression"] = c["expression"].replace(user, f"system:serviceaccount:{home}:{sa}")
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


@pytest.fixture(scope="module")
def scenes(cluster, run_id, tmp_path_factory):
    """{"shipped": (ServiceAccount client, Scene), "before": (...)}: both identities set up side by side."""
    api, tag = cluster.api, run_id[-4:]
    work = tmp_path_factory.mktemp("red-team")
    old_sa, old_home, old_pool, suffix = f"rt-old-{tag}", f"clusterproof-rt-{tag}", f"clusterproof-rt-{tag}-0", \
        f"-rt-{tag}"
    team_ns, secret_name, team_sa, team_pod = f"team-red-{tag}", "team-credentials", "team-pipeline", "team-rank-0"
    before = _rename_before([d for f in BEFORE for d in yaml.safe_load_all(f.read_text()) if d],
                            old_sa, old_home, old_pool, suffix)
    team = _team_docs(team_ns, team_sa,
                      [(access.TEAM_ROLE, access.HOME, access.SERVICE_ACCOUNT),
                       (access.TEAM_ROLE + suffix, old_home, old_sa)])
    extra = access.manifest_docs(True)[len(access.manifest_docs(False)):]
    high = f"red-team-high-{tag}"
    nodes = list_raw(api, "/api/v1/nodes")["items"]
    team_node = next((n for n in nodes if any(t["key"] == TEAM_TAINT for t in n["spec"].get("taints") or [])),
                     nodes[0])
    any_node = next(n for n in nodes if n is not team_node and not (n["metadata"].get("labels") or {}).get(
        "clusterproof.io/node-kind") == "real")
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret_name, "namespace": team_ns},
              "stringData": {"token": "the team's credential"}}
    pod = pod_body(team_pod, "team")
    pod["metadata"]["labels"] = {"app": "training"}      # the team's: no run label of the harness
    production = f"red-team-production-{tag}"
    made = [f"/api/v1/namespaces/{team_ns}/secrets/{secret_name}", f"/api/v1/namespaces/{team_ns}/pods/{team_pod}",
            f"/apis/scheduling.k8s.io/v1/priorityclasses/{high}", f"/api/v1/nodes/{production}"]
    with guest.applied(api, [*before, *team, *extra]):
        try:
            create_if_absent(api, f"/api/v1/namespaces/{team_ns}/secrets", secret)
            create_if_absent(api, f"/api/v1/namespaces/{team_ns}/pods", pod)
            # Tainted, so no other pod lands on it while it exists; no kwok annotation: a real cluster's node.
            create_if_absent(api, "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": production}, "spec": {"taints": [{"key": "red-team", "value": "x", "effect": "NoSchedule"}]}})
            create_if_absent(api, "/apis/scheduling.k8s.io/v1/priorityclasses", {
                "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": high},
                "value": 1000000, "description": "the cluster's own high priority (clusterproof red-team self-test)"})
            shipped_api = load_client(guest.kubeconfig_for(api, work / "shipped")[0])
            old_api = load_client(guest.kubeconfig_for(api, work / "before", old_home, old_sa)[0])
            common = dict(team_ns=team_ns, team_pod=team_pod, team_secret=secret_name, team_sa=team_sa,
                          team_node=team_node["metadata"]["name"],
                          team_taint=next((t for t in team_node["spec"].get("taints") or []
                                           if t["key"] == TEAM_TAINT), {}),
                          any_node=any_node["metadata"]["name"], high_priority=high, production_node=production,
                          taints={n["metadata"]["name"]: n["spec"].get("taints") or [] for n in (team_node, any_node)})
            shipped = Scene(pool=access.pool_namespaces(api)[0], **common)
            old = Scene(pool=old_pool, **common)
            # Admission policies reach the API server's admission a moment after they are created.
            probe = next(r for r in requests(shipped) if r.id == "pool-pod-by-node-name")
            wait_for(lambda: send(shipped_api, probe), until=lambda a: a[0] >= 400, timeout=30, interval=0.5,
                     what="the shipped pod policy in force")
            yield {"shipped": (shipped_api, shipped), "before": (old_api, old)}
        finally:
            delete_if_present(api, made[1], {"gracePeriodSeconds": "0"})
            for path in (made[0], made[2], made[3]):
                delete_if_present(api, path)


def test_every_escalating_request_of_the_shipped_service_account_is_refused_by_what_closes_it(scenes):
    api, scene = scenes["shipped"]
    admitted, other = [], []
    for r in requests(scene):
        status, message = send(api, r)
        if status < 300:
            admitted.append(f"{r.id}: {r.what} -- ADMITTED, which gives {r.why}")
        elif r.closer not in message:
            other.append(f"{r.id}: refused ({status}), but not by {r.closer}: {message[:240]}")
    assert not admitted, f"{len(admitted)} escalating request(s) of {access.POLICY_USER} were admitted " \
                         "(server-side dry run):\n" + "\n".join(admitted)
    assert not other, "refused by something other than the rule docs/rbac.md names:\n" + "\n".join(other)


def test_the_manifests_shipped_before_issue_35_are_caught_request_by_request(scenes):
    """Negative control: the same requests, as a ServiceAccount bound to the old manifests, come back admitted,
    each of them (but the one RBAC refused even then) -- the check above can see every path."""
    api, scene = scenes["before"]
    not_admitted = []
    for r in requests(scene):
        status, message = send(api, r)
        if r.refused_before:
            if status < 300:
                not_admitted.append(f"{r.id}: admitted, yet {r.refused_before} refused it before")
            continue
        if status >= 300:
            not_admitted.append(f"{r.id}: {r.what} -- refused ({status}: {message[:200]})")
    assert not not_admitted, "the old manifests no longer admit these requests, so the red team cannot tell " \
                             "the shipped ones from them:\n" + "\n".join(not_admitted)


def test_docs_name_what_closes_every_escalation_path():
    """docs/rbac.md's table lists every request of the red team, with the rule or policy that closes it."""
    text = (ROOT / "docs" / "rbac.md").read_text()
    scene = Scene(*(["x"] * 6), {}, "x", "x", "x")   # names only
    missing = [r.id for r in requests(scene) if f"`{r.id}`" not in text]
    assert not missing, f"docs/rbac.md does not list: {', '.join(missing)}"


def test_the_pool_namespaces_of_the_manifest_enforce_the_pod_security_the_harness_labels_its_own_with():
    docs = [d for d in access.manifest_docs(False) if d["kind"] == "Namespace" and d["metadata"]["name"] != access.HOME]
    assert docs and all({k: v for k, v in d["metadata"]["labels"].items() if k.startswith("pod-security")}
                        == POD_SECURITY_LABELS for d in docs), [d["metadata"] for d in docs]


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


def test_the_old_manifests_are_kept_as_they_were_shipped():
    """The control's data: unchanged copies (plus a header) of what 94aee8a shipped."""
    for f in BEFORE:
        assert f.read_text().startswith("# NEGATIVE CONTROL DATA"), f
        assert "clusterproof-pods" not in f.read_text() and "pod-security" not in f.read_text(), f
