"""Team toleration admission: the policies the harness installs, as plain dicts.

Why admission policies (CEL) and not a webhook: Kubernetes 1.35 serves
MutatingAdmissionPolicy (beta, ``admissionregistration.k8s.io/v1beta1``, off by
default; the embedded cluster turns it on with the feature gate and runtime
config in ``clusterproof/config/profiles/base.yaml``), so the apiserver itself injects the
tolerations -- no server, certificate or port for the harness to run. The
admission step the issue asks for is therefore real admission in the real
apiserver, not a simulation of it.

What the policies do, for pods created in a namespace of this run:

- a pod whose namespace carries ``<team_namespace_label>=<team>`` (a team
  named by the profile) gets exactly one toleration
  ``<team_taint_key>=<team>:NoSchedule`` (operator ``Equal``), unless it
  already has that exact one;
- a pod of ``low_priority_class`` gets one such toleration per team (never an
  ``Exists`` wildcard), so idle team nodes are borrowed;
- a *foreign* toleration -- one that would let a pod through another team's
  taint (the team key with another value or ``Exists``, or the empty-key
  ``Exists`` wildcard, which tolerates everything) -- is refused by a
  ValidatingAdmissionPolicy (``team_foreign_toleration: reject``) or dropped
  by the mutating policy (``correct``). Low-priority pods may carry team
  tolerations, never the empty-key wildcard. Adding a foreign toleration to
  a running pod (an UPDATE) is refused in both modes: an update cannot be
  corrected without looking like it was accepted.

JSONPatch mutations, not ApplyConfiguration: ``spec.tolerations`` is an
atomic list for server-side apply, so an apply configuration would replace a
pod's own tolerations instead of adding to them. The patch writes the whole
list to the pod's kept tolerations (JSON Patch ``add`` on an existing member
replaces it, so pods with and without ``spec.tolerations`` take the same
path), then appends each missing team toleration.

The bindings select namespaces by the run label, so a policy never touches
anything but this run's namespaces (plus the namespaces named in
``team_namespaces``, by name).

``team_admission: wildcard`` installs a deliberately broken mutating policy
that gives team pods an empty-key ``Exists`` toleration and no validating
policy. It exists only for the negative control
(tests/test_taint_isolation_controls.py): the suite must fail on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from kubernetes import client

from clusterproof.core import kubeversions
from clusterproof.core.errors import HarnessError
from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.kube.client import (
    api_message,
    check_reachable,
    delete_if_present,
    raw_request,
    server_url,
    serving,
)
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import try_create

CHECK_LABEL = "clusterproof.io/taint-check"    # on every pod of the taint suite: which check made it
MODES = ("reject", "correct")
ADMISSION = ("auto", "harness", "cluster", "wildcard")
# Newest first: MutatingAdmissionPolicy went beta in 1.34 (v1beta1) and GA in 1.36 (v1, on by default).
MAP_VERSIONS = ("admissionregistration.k8s.io/v1", "admissionregistration.k8s.io/v1beta1")
VAP_VERSION = "admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class TeamRules:
    """What the admission step must do, from the profile (shared by policies and checks)."""
    taint_key: str
    teams: tuple[str, ...]
    namespace_label: str
    low_priority_class: str
    foreign: str                      # "reject" | "correct"

    @classmethod
    def from_profile(cls, p) -> "TeamRules":
        return cls(p.team_taint_key, tuple(p.teams), p.team_namespace_label,
                   p.low_priority_class, p.team_foreign_toleration)

    def toleration(self, team: str) -> dict:
        """The one toleration a pod of ``team`` must get."""
        return {"key": self.taint_key, "operator": "Equal", "value": team, "effect": "NoSchedule"}

    def is_team_related(self, t: dict) -> bool:
        """A toleration that can matter for a team taint: the team key, or the empty-key wildcard."""
        return t.get("key", "") in (self.taint_key, "")

    def is_foreign(self, t: dict, team: str, low: bool) -> bool:
        """Would ``t`` let a pod of ``team`` ('' = none) through another team's taint?

        Python twin of the CEL predicate below; the checks use it to name
        what a pod should not have.
        """
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            return op == "Exists"             # the wildcard tolerates every taint
        if t["key"] != self.taint_key or low:
            return False
        return op == "Exists" or t.get("value", "") != team


def _s(value: str) -> str:
    """A CEL string literal (JSON escaping is valid CEL for these strings)."""
    return json.dumps(value)


def _list(values) -> str:
    return "[" + ", ".join(_s(v) for v in values) + "]"


def _foreign(r: TeamRules) -> str:
    """CEL predicate on toleration ``t``: the twin of ``TeamRules.is_foreign``."""
    key = _s(r.taint_key)
    return (f'((!has(t.key) || t.key == "") ? (has(t.operator) && t.operator == "Exists") : '
            f'(t.key == {key} && !variables.low && '
            f'((has(t.operator) && t.operator == "Exists") || !has(t.value) || t.value != variables.team)))')


def _variables(r: TeamRules) -> list[dict]:
    label = _s(r.namespace_label)
    return [
        {"name": "team", "expression":
            f"has(namespaceObject.metadata.labels) && {label} in namespaceObject.metadata.labels && "
            f"namespaceObject.metadata.labels[{label}] in {_list(r.teams)} ? "
            f"namespaceObject.metadata.labels[{label}] : \"\""},
        {"name": "low", "expression":
            f"has(object.spec.priorityClassName) && object.spec.priorityClassName == {_s(r.low_priority_class)}"},
        {"name": "tolerations", "expression":
            "has(object.spec.tolerations) ? object.spec.tolerations : []"},
        {"name": "foreign", "expression": f"variables.tolerations.filter(t, {_foreign(r)})"},
    ]


def _describe_tolerations(var: str) -> str:
    """CEL: a readable list of tolerations, e.g. 'clusterproof.io/team=applied, <any key> Exists'."""
    return (f'{var}.map(t, (has(t.key) && t.key != "" ? t.key : "<any key>") + '
            f'(has(t.operator) && t.operator == "Exists" ? " Exists" : "=" + (has(t.value) ? t.value : "")))'
            f'.join(", ")')


def mutating_policy(r: TeamRules, name: str, run_id: str, version: str,
                    wildcard: bool = False) -> dict:
    """The MutatingAdmissionPolicy that injects team tolerations (CREATE of pods).

    ``wildcard``: the broken policy of the negative control (team pods get
    ``operator: Exists`` with no key).
    """
    key = _s(r.taint_key)
    has_exact = (f't.key == {key} && (!has(t.operator) || t.operator == "Equal") && '
                 f'has(t.value) && t.value == tm && has(t.effect) && t.effect == "NoSchedule"')
    variables = _variables(r)
    kept = (f"variables.tolerations.filter(t, !{_foreign(r)})"
            if r.foreign == "correct" and not wildcard else "variables.tolerations")
    variables += [
        {"name": "kept", "expression": kept},
        {"name": "wanted", "expression":
            f'variables.low ? {_list(r.teams)} : (variables.team != "" ? [variables.team] : [])'},
        {"name": "missing", "expression":
            f"variables.wanted.filter(tm, !variables.kept.exists(t, has(t.key) && {has_exact}))"},
    ]
    # Two steps: set the list to the kept tolerations, then append each missing
    # one with its own op. A single op whose value is `kept + missing.map(...)`
    # crashes kube-apiserver v1.35.4 whenever `kept` is empty (cel-go
    # ConvertToNative: "*structpb.Struct is not assignable to type
    # *structpb.Value"; the request's connection is dropped) -- measured here
    # with a pod whose only toleration is a wildcard in mode `correct`.
    team_tol = (f'Object.spec.tolerations{{key: {key}, operator: "Equal", value: tm, '
                f'effect: "NoSchedule"}}')
    append = (f'variables.missing.map(tm, JSONPatch{{op: "add", path: "/spec/tolerations/-", '
              f'value: {team_tol}}})')
    if wildcard:
        variables.append({"name": "wild", "expression":
            'variables.team != "" && !variables.low && '
            '!variables.kept.exists(t, (!has(t.key) || t.key == "") && has(t.operator) && t.operator == "Exists")'})
        append = ('(variables.wild ? [JSONPatch{op: "add", path: "/spec/tolerations/-", '
                  'value: Object.spec.tolerations{operator: "Exists"}}] : ' + append + ')')
    patch = (f"size(variables.missing) == 0 && size(variables.kept) == size(variables.tolerations)"
             f"{' && !variables.wild' if wildcard else ''} ? [] : "
             f'[JSONPatch{{op: "add", path: "/spec/tolerations", value: variables.kept}}] + {append}')
    return {
        "apiVersion": version, "kind": "MutatingAdmissionPolicy",
        "metadata": metadata(name, run_id),
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                "resources": ["pods"]}]},
            "variables": variables,
            "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression": patch}}],
            # A broken policy must be loud: a pod it cannot evaluate is refused.
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
        },
    }


def validating_policy(r: TeamRules, name: str, run_id: str) -> dict:
    """The ValidatingAdmissionPolicy that refuses foreign tolerations.

    Mode ``reject``: on CREATE and UPDATE. Mode ``correct``: on UPDATE only
    (the mutating policy has already dropped them at CREATE).
    """
    ops = ["CREATE", "UPDATE"] if r.foreign == "reject" else ["UPDATE"]
    variables = _variables(r) + [
        {"name": "old", "expression":
            "oldObject != null && has(oldObject.spec.tolerations) ? oldObject.spec.tolerations : []"},
        {"name": "added", "expression":
            "variables.foreign.filter(t, !variables.old.exists(o, o == t))"},
    ]
    who = ('"pod " + object.metadata.name + " in namespace " + request.namespace + '
           '(variables.team != "" ? " (team " + variables.team + ")" : " (no team)")')
    return {
        "apiVersion": VAP_VERSION, "kind": "ValidatingAdmissionPolicy",
        "metadata": metadata(name, run_id),
        "spec": {
            "matchConstraints": {"resourceRules": [{
                "apiGroups": [""], "apiVersions": ["v1"], "operations": ops, "resources": ["pods"]}]},
            "variables": variables,
            "validations": [{
                "expression": "size(variables.added) == 0",
                "messageExpression": (who + ' + " may not tolerate another team\'s taint: " + '
                                      + _describe_tolerations("variables.added")),
                "reason": "Forbidden"}],
            "failurePolicy": "Fail",
        },
    }


def binding(kind: str, version: str, name: str, policy: str, run_id: str,
            namespaces: tuple[str, ...] = ()) -> dict:
    """A binding of ``policy`` to this run's namespaces (by run label), or to ``namespaces`` by name."""
    if namespaces:
        selector = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "In",
                                          "values": sorted(namespaces)}]}
    else:
        selector = {"matchLabels": {RUN_LABEL: run_id}}
    spec = {"policyName": policy, "matchResources": {"namespaceSelector": selector}}
    if kind == "ValidatingAdmissionPolicyBinding":
        spec["validationActions"] = ["Deny"]
    return {"apiVersion": version, "kind": kind, "metadata": metadata(name, run_id), "spec": spec}


# --- the admission step on a cluster -------------------------------------------------

def served_map_version(api: client.ApiClient) -> str | None:
    """The newest MutatingAdmissionPolicy API version the cluster serves (v1 from 1.36, v1beta1 before), or None."""
    return serving(api, MAP_VERSIONS, "mutatingadmissionpolicies")


@dataclass
class Admission:
    """The admission step under test, and what the harness installed for it."""
    kind: str                        # "harness" | "cluster" | "wildcard"
    description: str
    objects: list[str] = field(default_factory=list)      # API paths the harness created
    manifests: list[dict] = field(default_factory=list)   # for the report

    def remove(self, api: client.ApiClient) -> None:
        for path in reversed(self.objects):                # bindings before their policies
            delete_if_present(api, path)
        self.objects.clear()


def resolve_admission(setting: str, owned: bool) -> str:
    """``team_admission`` on this cluster: ``auto`` installs the harness's policies only on a cluster the harness
    owns (its embedded one) and judges the cluster's own admission anywhere else."""
    if setting == "auto":
        return "harness" if owned else "cluster"
    return setting


def not_served(api: client.ApiClient) -> str:
    """One line: the cluster serves no MutatingAdmissionPolicy, and which keys turn it on."""
    return (f"MutatingAdmissionPolicy is not served by {server_url(api)} (neither {' nor '.join(MAP_VERSIONS)}): "
            + kubeversions.enable_hint(check_reachable(api)["gitVersion"], "MutatingAdmissionPolicy"))


def absent(api: client.ApiClient, rules: TeamRules, ns: str, team: str, run_id: str) -> str | None:
    """None if some admission step acts on team pods in ``ns`` (a dry-run pod is refused, or gets a team
    toleration); else one line of what the probe saw. Whether it acts *correctly* is the checks' verdict."""
    out, err = try_create(api, ns, _probe_pod("admission-probe", run_id), dry_run=True)
    if err is not None or team_tolerations(rules, out):
        return None
    return f"a pod created in namespace {ns} (team {team}) got no team toleration"


def install_admission(api: client.ApiClient, rules: TeamRules, run_id: str, kind: str,
                      named_namespaces: tuple[str, ...] = ()) -> Admission:
    """Install the harness's policies (``harness``) or the broken one (``wildcard``).

    Bound to this run's namespaces (run label), plus ``named_namespaces`` by
    name. Raises HarnessError with one line if the API is not served.
    """
    version = served_map_version(api)
    if version is None:
        raise HarnessError(f"{not_served(api)}; on an existing cluster set team_admission=cluster to test the "
                           "admission it runs")
    wildcard = kind == "wildcard"
    out = Admission(kind, "")
    name = f"clusterproof-team-tolerations-{run_id}"
    docs = [(f"/apis/{version}/mutatingadmissionpolicies",
             mutating_policy(rules, name, run_id, version, wildcard=wildcard))]
    scopes = [("", ())] + ([("-named", named_namespaces)] if named_namespaces else [])
    docs += [(f"/apis/{version}/mutatingadmissionpolicybindings",
              binding("MutatingAdmissionPolicyBinding", version, name + sfx, name, run_id, ns))
             for sfx, ns in scopes]
    if not wildcard:
        vname = f"clusterproof-team-foreign-{run_id}"
        docs.append((f"/apis/{VAP_VERSION}/validatingadmissionpolicies",
                     validating_policy(rules, vname, run_id)))
        docs += [(f"/apis/{VAP_VERSION}/validatingadmissionpolicybindings",
                  binding("ValidatingAdmissionPolicyBinding", VAP_VERSION, vname + sfx, vname, run_id, ns))
                 for sfx, ns in scopes]
    try:
        for path, body in docs:
            raw_request(api, "POST", path, body=body).data
            out.objects.append(f"{path}/{body['metadata']['name']}")
            out.manifests.append(body)
    except client.ApiException as e:
        out.remove(api)
        raise HarnessError(f"installing the team admission policies failed: {api_message(e)}") from None
    except BaseException:
        out.remove(api)
        raise
    out.description = (
        f"harness MutatingAdmissionPolicy ({version})"
        + (" injecting an Exists wildcard (NEGATIVE CONTROL)" if wildcard else
           f" + ValidatingAdmissionPolicy ({VAP_VERSION}), foreign tolerations: {rules.foreign}")
        + ", bound to this run's namespaces")
    return out


def admission_probe(api: client.ApiClient, rules: TeamRules, ns: str, team: str, other: str | None,
                    kind: str, run_id: str) -> str | None:
    """One dry-run through admission; None when the admission step behaves as installed.

    Why: policies, bindings and a new namespace reach the apiserver's
    admission caches asynchronously; a check must not start before they act.
    """
    out, err = try_create(api, ns, _probe_pod("admission-probe", run_id), dry_run=True)
    if err is not None:
        return f"a pod in {ns} was refused by admission: {api_message(err)}"
    got = team_tolerations(rules, out)
    if kind == "wildcard":
        if not got:
            return f"a pod in {ns} got no team toleration yet"
    elif rules.toleration(team) not in got:
        return (f"a pod in {ns} (team {team}) got team tolerations "
                f"[{', '.join(map(describe_toleration, got))}], not {describe_toleration(rules.toleration(team))}")
    if kind == "harness" and other and rules.foreign == "reject":
        body = _probe_pod("admission-probe-foreign", run_id, tolerations=[rules.toleration(other)])
        _created, err = try_create(api, ns, body, dry_run=True)
        if err is None:
            return f"a pod in {ns} tolerating team {other} was not refused yet"
    return None


def admission_gone(api: client.ApiClient, rules: TeamRules, ns: str, run_id: str) -> str | None:
    """One dry-run through admission; None once deleted policies no longer act in ``ns``: a pod
    tolerating every taint is admitted, and gets no team toleration injected."""
    blanket = {"operator": "Exists"}
    out, err = try_create(api, ns, _probe_pod("admission-gone-probe", run_id, tolerations=[blanket]), dry_run=True)
    if err is not None:
        return f"a pod in {ns} tolerating every taint is still refused: {api_message(err)}"
    injected = [t for t in team_tolerations(rules, out) if t != blanket]
    if injected:
        return f"a pod in {ns} still gets [{', '.join(map(describe_toleration, injected))}] injected"
    return None


def _probe_pod(name: str, run_id: str, tolerations: list | None = None) -> dict:
    return pod_body(name, run_id, labels={CHECK_LABEL: "probe"}, tolerations=tolerations)


def team_tolerations(rules: TeamRules, pod: dict) -> list[dict]:
    """The pod's tolerations that matter for team taints (the team key, or the empty-key wildcard)."""
    return [t for t in pod["spec"].get("tolerations") or [] if rules.is_team_related(t)]


def describe_toleration(t: dict) -> str:
    op = t.get("operator") or "Equal"
    what = f"{t.get('key') or '<any key>'}" + (" Exists" if op == "Exists" else f"={t.get('value', '')}")
    return what + (f":{t['effect']}" if t.get("effect") else " (any effect)")


