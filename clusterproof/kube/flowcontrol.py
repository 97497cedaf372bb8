"""API Priority and Fairness as the apiserver applies it: FlowSchemas and PriorityLevels, how a request is
classified, and the apiserver's own per-flow counters.

Why a module: the overload suite, the always-on API health guard and the
report environment all ask the same questions -- "which flow schema and
priority level does this identity's request land in?", "how many requests
did each flow schema dispatch or reject between two scrapes?" -- and must
answer them one way.

- ``classify`` is the apiserver's own matching rule (``k8s.io/apiserver``
  ``pkg/util/flowcontrol/rule.go``: FlowSchemas by matchingPrecedence then
  name, first match wins; subjects by user, group or ServiceAccount; resource
  rules by verb, group, resource[/subresource], namespace or cluster scope;
  non-resource rules by URL with ``/*`` prefixes). It is pure: the read-only
  checks use it on a real cluster without sending a request as anyone.
- What the apiserver did is read from ``/metrics``:
  ``apiserver_flowcontrol_dispatched_requests_total`` and
  ``..._rejected_requests_total`` per flow schema and priority level, and
  ``apiserver_request_total`` by verb, resource and code.
- On a live request the response headers ``X-Kubernetes-PF-FlowSchema-UID`` /
  ``X-Kubernetes-PF-PriorityLevel-UID`` name the objects that served it; they
  are set on every response APF handled, 429s included.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.kube import apimetrics
from clusterproof.kube.client import list_raw

API = "/apis/flowcontrol.apiserver.k8s.io/v1"
FLOW_SCHEMAS = f"{API}/flowschemas"
PRIORITY_LEVELS = f"{API}/prioritylevelconfigurations"
FS_UID_HEADER = "X-Kubernetes-PF-FlowSchema-UID"
PL_UID_HEADER = "X-Kubernetes-PF-PriorityLevel-UID"
DISPATCHED = "apiserver_flowcontrol_dispatched_requests_total"
REJECTED = "apiserver_flowcontrol_rejected_requests_total"
IN_QUEUE = "apiserver_flowcontrol_current_inqueue_requests"
EXECUTING = "apiserver_flowcontrol_current_executing_requests"
REQUESTS = "apiserver_request_total"
METRICS = (DISPATCHED, REJECTED, IN_QUEUE, EXECUTING, REQUESTS)
EXEMPT = "exempt"
# Levels every request ends in when nothing more specific matched: never a system flow's own level.
FALLBACK_LEVELS = ("global-default", "catch-all")
SA_PREFIX = "system:serviceaccount:"


# --- the cluster's objects ---------------------------------------------------------------------

@dataclass
class ApfConfig:
    flow_schemas: list[dict]              # sorted as the apiserver matches them
    levels: dict[str, dict]               # by name

    def schema(self, name: str) -> dict | None:
        return next((f for f in self.flow_schemas if f["metadata"]["name"] == name), None)

    def level_of(self, schema: dict) -> str:
        return schema["spec"]["priorityLevelConfiguration"]["name"]

    def by_uid(self) -> dict[str, str]:
        """uid -> "flowschemas/<name>" / "prioritylevelconfigurations/<name>" (to read response headers)."""
        out = {f["metadata"]["uid"]: f"flowschemas/{f['metadata']['name']}" for f in self.flow_schemas}
        out.update({p["metadata"]["uid"]: f"prioritylevelconfigurations/{n}" for n, p in self.levels.items()})
        return out


def sort_schemas(schemas: list[dict]) -> list[dict]:
    return sorted(schemas, key=lambda f: (f["spec"].get("matchingPrecedence", 1000), f["metadata"]["name"]))


def read_config(api: client.ApiClient) -> ApfConfig:
    fs = list_raw(api, FLOW_SCHEMAS)["items"]
    pls = list_raw(api, PRIORITY_LEVELS)["items"]
    return ApfConfig(sort_schemas(fs), {p["metadata"]["name"]: p for p in pls})


# --- classification (pure) ----------------------------------------------------------------------

@dataclass(frozen=True)
class Request:
    """What APF classifies: who asks, and for what (a resource request unless ``path`` is set)."""
    what: str                          # for messages: "node heartbeat (update lease)"
    user: str
    groups: tuple[str, ...]
    verb: str
    api_group: str = ""
    resource: str = ""                 # "nodes/status" for a subresource
    namespace: str = ""                # "" for cluster-scoped
    path: str = ""                     # a non-resource request (e.g. /healthz)


def _contains(x: str, values: list[str] | None, wildcard: str) -> bool:
    values = values or []
    return (len(values) == 1 and values[0] == wildcard) or x in values


def _subject(req: Request, s: dict) -> bool:
    kind = s.get("kind")
    if kind == "User":
        name = (s.get("user") or {}).get("name")
        return name in ("*", req.user)
    if kind == "Group":
        name = (s.get("group") or {}).get("name")
        return name == "*" or name in req.groups
    if kind == "ServiceAccount":
        sa = s.get("serviceAccount") or {}
        if not req.user.startswith(SA_PREFIX):
            return False
        ns, _, name = req.user[len(SA_PREFIX):].partition(":")
        return ns == sa.get("namespace") and sa.get("name") in ("*", name)
    return False


def _url(path: str, rules: list[str]) -> bool:
    for rule in rules or []:
        if rule in ("*", path):
            return True
        prefix = rule.removesuffix("*")
        prefix = prefix if prefix.endswith("/") else prefix + "/"
        if path.startswith(prefix):
            return True
    return False


def rule_matches(req: Request, rule: dict) -> bool:
    if not any(_subject(req, s) for s in rule.get("subjects") or []):
        return False
    if req.path:
        return any(_contains(req.verb, r.get("verbs"), "*") and _url(req.path, r.get("nonResourceURLs"))
                   for r in rule.get("nonResourceRules") or [])
    for r in rule.get("resourceRules") or []:
        if not (_contains(req.verb, r.get("verbs"), "*") and _contains(req.api_group, r.get("apiGroups"), "*")
                and _contains(req.resource, r.get("resources"), "*")):
            continue
        if (r.get("clusterScope", False) if not req.namespace else
                _contains(req.namespace, r.get("namespaces"), "*")):
            return True
    return False


def classify(schemas: list[dict], req: Request) -> dict | None:
    """The FlowSchema the apiserver would pick for ``req`` (``schemas`` as ``sort_schemas`` orders them)."""
    for fs in schemas:
        if any(rule_matches(req, r) for r in fs["spec"].get("rules") or []):
            return fs
    return None


def service_account(namespace: str, name: str) -> tuple[str, tuple[str, ...]]:
    """(user, groups) of a ServiceAccount token, as the apiserver authenticates it."""
    return (f"{SA_PREFIX}{namespace}:{name}",
            ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"))


def node_requests(node: str = "cp-probe-node") -> list[Request]:
    """A kubelet's heartbeats: its lease renewal and its node status (as system:node:<name>)."""
    user, groups = f"system:node:{node}", ("system:nodes", "system:authenticated")
    return [Request("node heartbeat (update its Lease in kube-node-lease)", user, groups, "update",
                    "coordination.k8s.io", "leases", "kube-node-lease"),
            Request("node heartbeat (patch nodes/status)", user, groups, "patch", "", "nodes/status")]


def controller_requests() -> list[Request]:
    auth = ("system:authenticated",)
    return [Request("kube-scheduler binding a pod", "system:kube-scheduler", auth, "create", "", "pods/binding",
                    "default"),
            Request("kube-controller-manager listing nodes", "system:kube-controller-manager", auth, "list", "",
                    "nodes")]


def load_requests(namespace: str, name: str) -> list[Request]:
    user, groups = service_account(namespace, name)
    return [Request(f"the load identity ({user}) creating a pod", user, groups, "create", "", "pods", namespace),
            Request(f"the load identity ({user}) listing pods", user, groups, "list", "", "pods", namespace)]


def _where(config: ApfConfig, req: Request) -> tuple[str, str]:
    fs = classify(config.flow_schemas, req)
    return (fs["metadata"]["name"], config.level_of(fs)) if fs else ("(none)", "(none)")


def queue_depth(level: dict) -> int:
    """Requests a level can hold in its queues (0: Reject, or exempt)."""
    q = ((level["spec"].get("limited") or {}).get("limitResponse") or {}).get("queuing") or {}
    return int(q.get("queues", 0)) * int(q.get("queueLengthLimit", 0))


def expectation_problems(config: ApfConfig, node_schema: str, controller_schemas: list[str], load_namespace: str,
                         load_name: str, max_queue_depth: int) -> list[str]:
    """What in the cluster's APF objects contradicts the profile (pure; each line names the object)."""
    out = []
    node_levels, ctl_levels = set(), set()
    for req in node_requests():
        fs, pl = _where(config, req)
        node_levels.add(pl)
        if fs != node_schema:
            out.append(f"{req.what} matches FlowSchema {fs} (PriorityLevel {pl}), not {node_schema} as the profile "
                       "expects (apf_node_flow_schema)")
    for req in controller_requests():
        fs, pl = _where(config, req)
        ctl_levels.add(pl)
        if fs not in controller_schemas:
            out.append(f"{req.what} matches FlowSchema {fs} (PriorityLevel {pl}), none of "
                       f"{', '.join(controller_schemas)} as the profile expects (apf_controller_flow_schemas)")
    for pl in sorted((node_levels | ctl_levels) & set(FALLBACK_LEVELS)):
        out.append(f"PriorityLevel {pl} serves node or controller traffic: it is the level of everything "
                   "unmatched, so system flows have no level of their own")
    for pl in sorted(node_levels & ctl_levels):
        out.append(f"PriorityLevel {pl} serves both node heartbeats and controllers: they are not isolated from "
                   "each other")
    for req in load_requests(load_namespace, load_name):
        fs, pl = _where(config, req)
        if pl == EXEMPT or pl in node_levels | ctl_levels:
            owner = "exempt: never queued or rejected" if pl == EXEMPT else "the level system flows use"
            out.append(f"{req.what} matches FlowSchema {fs} into PriorityLevel {pl} ({owner}): load from it "
                       "would not be shed apart from system traffic")
    for name, level in sorted(config.levels.items()):
        depth = queue_depth(level)
        if depth > max_queue_depth:
            q = level["spec"]["limited"]["limitResponse"]["queuing"]
            out.append(f"PriorityLevelConfiguration {name} queues up to {depth} requests ({q['queues']} queues x "
                       f"{q['queueLengthLimit']}), more than apf_max_queue_depth {max_queue_depth}: overload "
                       "waits in its queues instead of being shed with 429")
    return out


# --- what the apiserver counted -------------------------------------------------------------------

# The generic counter readers live with the other /metrics readers (clusterproof.kube.apimetrics).
counters, delta = apimetrics.counters, apimetrics.counter_delta


def scrape(api: client.ApiClient) -> str:
    """The APF and request counters of one /metrics scrape (the text, reduced)."""
    return apimetrics.scrape(api, METRICS)


def dispatched(text: str) -> dict[tuple[str, str], float]:
    return counters(text, DISPATCHED, ("flow_schema", "priority_level"))


def rejected(text: str) -> dict[tuple[str, str, str], float]:
    return counters(text, REJECTED, ("flow_schema", "priority_level", "reason"))


@dataclass
class Classification:
    """Where the embedded cluster's components' traffic went (per-flow-schema dispatch counts)."""
    counts: dict[tuple[str, str], float] = field(default_factory=dict)

    def flows(self, schemas: tuple[str, ...]) -> list[tuple[str, str, int]]:
        return [(fs, pl, int(n)) for (fs, pl), n in sorted(self.counts.items()) if fs in schemas]

    def summary(self, limit: int = 500) -> str:
        """Every flow that dispatched something, busiest first (an existing cluster's components are unknown)."""
        rows = sorted(self.counts.items(), key=lambda kv: -kv[1])
        return "; ".join(f"{fs} -> {pl}: {int(n)}" for (fs, pl), n in rows)[:limit]

    def describe(self, identities) -> dict[str, str]:
        """Report environment lines: ``apf.<component>`` -> "flow-schema -> level: N requests; ...".
        A component whose flow schemas dispatched nothing is reported as such (e.g. all exempt)."""
        out = {}
        for ident in identities:
            got = self.flows(ident.flow_schemas)
            out[f"apf.{ident.component}"] = ("; ".join(f"{fs} -> {pl}: {n} requests" for fs, pl, n in got)
                                             or f"nothing dispatched by {', '.join(ident.flow_schemas)} "
                                                f"({ident.user}: exempt?)")
        return out
