"""Least privilege, proven by running as it.

The self-tests' cluster is set up the way an SRE sets up a real one
(``tests/guest.py``): the shipped manifests applied, team namespaces of the
cluster's own with the harness's team bindings, the cluster's own team
admission. Then every suite runs as the ``clusterproof`` ServiceAccount,
with ``--cp-as-real-cluster`` (so every suite takes its real-hardware path),
read-only and with ``--cp-allow-destructive``, side by side. Each run must:

- pass, with no request refused by RBAC (403s that admission policies give
  on purpose -- the taint suite provokes them -- are told apart);
- make no call the manifest does not allow, and leave no rule of the
  manifest unused by one run or the other;
- agree with the API server's own record of it (the audit log keeps every
  request of that ServiceAccount, each filed under its token's id): the
  harness's request record misses nothing, and nothing it did reached the
  server unrecorded.

Negative controls: the roles shipped before issue 20 are named rule by
rule; a manifest missing a rule the code needs names the call. This module
runs after the self-tests, beside only the host-state self-test (the guest
runs' time-bound checks judge whatever else the machine runs: ./proof); what the identity cannot do and
the permission preflight's one-line refusals need no guest run and run on
the workers (tests/test_permission_controls.py).
"""
from __future__ import annotations

import base64
import dataclasses
import json
import time
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
import yaml

from clusterproof.cluster.coscheduling import OWN_SCHEDULER
from clusterproof.core.timeparse import epoch
from clusterproof.kube import access
from clusterproof.kube.access import Manifest, over_broad
from clusterproof.kube.apicalls import FORBIDDEN_RBAC, REFUSED_OWN_POLICY, Call, load_dump
from clusterproof.kube.tokens import LOAD_RULES
from tests import guest
from tests.harness import ROOT, run_pytest
from tests.test_api_overload_controls import CONTROL as APF_CONTROL

pytestmark = [pytest.mark.coscheduling, pytest.mark.kueue]

OLD_ROLES = ROOT / "tests" / "data" / "rbac-over-broad.yaml"
SA_USER = f"system:serviceaccount:{access.HOME}:{access.SERVICE_ACCOUNT}"
# The one check a guest run here leaves out: checker pods on real GPU nodes read their verdict from the
# container's log, and no container runs on a kwok node. Its one rule of its own (pods/log get) is the
# only rule the runs here cannot use; issue 21 (real kubelets) removes both exceptions.
NEEDS_CONTAINERS = "not test_checker_on_every_gpu_node_agrees_with_the_clusters_decisions"
UNUSED_HERE = {(access.POOL_ROLE, "get", "", "pods/log")}
# These runs prove which calls a run makes, not what the cluster does within a window or under a load
# (the suites on smoke prove that, and each suite's controls): their "nothing may happen" windows are
# short, the flood is the API overload controls' own, and the per-node Service stops at 400 pods (a guest's
# go through the scheduler: 1,100 binds and their Events beside the self-tests' clusters drew 504s from the
# 2-core machine's API server). Every check, and so every call, still runs. For the same reason a time bound
# that the loaded machine, not the cluster, can break gets a wider slack (GUEST_BOUNDS: six concurrent Prometheus
# queries with a 0.25 s timeout answered after 1.2 s beside four workers' clusters).
GUEST_WINDOWS = ("gang_observe_s=5", "taint_observe_s=3", *APF_CONTROL)
GUEST_BOUNDS = ("prometheus_timeout_slack_s=1.5",)


def _old_manifest() -> Manifest:
    """The roles of before issue 20, bound to the ServiceAccount cluster-wide as their README said."""
    docs = [d for d in yaml.safe_load_all(OLD_ROLES.read_text()) if d]
    docs += [{"kind": "ClusterRoleBinding", "metadata": {"name": d["metadata"]["name"]},
              "roleRef": {"kind": "ClusterRole", "name": d["metadata"]["name"]},
              "subjects": [{"kind": "ServiceAccount", "name": access.SERVICE_ACCOUNT, "namespace": access.HOME}]}
             for d in list(docs)]
    return Manifest.from_docs(docs)


# --- the manifest, read --------------------------------------------------------------------------

@pytest.mark.unit
def test_the_shipped_manifests_grant_nothing_a_reviewer_forbids():
    manifest = Manifest.shipped(destructive=True, team_namespaces=("ml-research",))
    assert not over_broad(manifest), "\n".join(over_broad(manifest))


@pytest.mark.unit
def test_the_roles_shipped_before_issue_20_are_named_rule_by_rule():
    """Negative control of the check above: the old roles were close to cluster-admin."""
    found = over_broad(_old_manifest())
    for expected in ("create pods in namespace kube-system", "delete namespaces kube-system (cluster scope)",
                     "create serviceaccounts/token default in namespace kube-system",
                     "update leases n1 (coordination.k8s.io) in namespace kube-node-lease",
                     "delete flowschemas global-default", "bind clusterroles edit",
                     "create rolebindings (rbac.authorization.k8s.io) in namespace default"):
        assert any(line.startswith(expected) for line in found), (expected, found)
    assert all(" -- allowed by: " in line for line in found), found


# --- the guest runs ------------------------------------------------------------------------------

@dataclasses.dataclass
class GuestRun:
    mode: str
    run: object                      # tests.harness.SuiteRun
    calls: dict[Call, dict[str, int]]
    audited: list[dict]              # the API server's audit events of the ServiceAccount in the run's window
    manifest: Manifest
    teams: tuple[str, ...]           # the team namespaces the run was given


CREDENTIAL_ID = "authentication.kubernetes.io/credential-id"   # the API server's, for a token with a jti


def _jti(token: str) -> str:
    """The token's own id (its ``jti`` claim): the API server files each request of the token under it."""
    payload = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))["jti"]


def _audit_events(cluster, token: str, t0: float, t1: float) -> list[dict]:
    """The requests the apiserver logged of the ServiceAccount with ``token`` between t0 and t1 (epoch
    seconds), one each: the two guest runs are the same ServiceAccount, told apart by their tokens' ids."""
    out, seen, cid = [], set(), [f"JTI={_jti(token)}"]
    for line in cluster.kwok.audit_log.read_text().splitlines():
        ev = json.loads(line)
        user = ev.get("user", {})
        if user.get("username") != SA_USER or user.get("extra", {}).get(CREDENTIAL_ID) != cid \
                or ev["auditID"] in seen:
            continue
        at = epoch(ev["requestReceivedTimestamp"])
        if t0 - 1 <= at <= t1 + 1:
            seen.add(ev["auditID"])
            out.append(ev)
    return out


def _audited_call(ev: dict) -> Call:
    ref = ev.get("objectRef")
    if not ref:
        return Call(ev["verb"], path=urlsplit(ev["requestURI"]).path)
    # The audit log files a namespace under its own name; RBAC (and the recorder) see it cluster-scoped.
    ns = "" if ref.get("resource") == "namespaces" else ref.get("namespace", "")
    return Call(ev["verb"], ref.get("apiGroup", ""), ref.get("resource", ""), ref.get("subresource", ""),
                ns, ref.get("name", ""))


@pytest.fixture(scope="module")
def guest_runs(cluster, profile, tmp_path_factory, kueue_started) -> dict[str, GuestRun]:
    """Every suite as the ServiceAccount, read-only and destructive side by side, on a cluster set up by an 'SRE'.

    Side by side, as two users' runs share a real cluster: each mostly waits (its windows, its watches), and
    one after the other they took 204 s (2026-12-07). Each has a token of its own, which tells its requests
    apart in the audit log. The destructive role is bound for both: the read-only run's calls are held to
    the read-only manifest all the same (test_every_call_of_a_guest_run_is_allowed_by_the_manifest)."""
    api = cluster.api
    with guest.team_namespaces(api, profile, "sre-perm") as teams, \
            guest.applied(api, access.manifest_docs(True)[len(access.manifest_docs(False)):]), \
            guest.churned_service(api, profile, "sre-perm", pool="shared", share=0.5) as churned:
        # What an SRE sets for a cluster: its team namespaces and gang scheduler; read-only, an existing Service
        # someone else churns (on half the shared pool: the destructive run's taint checks borrow a node of it
        # that runs no one else's pod, and skipped without one -- which the rule check below then named);
        # destructive, a pool the guest's own pods may use, and native gangs too.
        settings = {"read-only": ["watch_window_s=15", f"watch_service={churned[0]}", *GUEST_BOUNDS],
                    "destructive": ["watch_pool=shared", "watch_sizes=100,400", "gang_scale_size=20",
                                    "gang_native=true", *GUEST_WINDOWS, *GUEST_BOUNDS]}

        def guest_run(mode: str) -> tuple:
            work = tmp_path_factory.mktemp(f"guest-{mode}")
            kubeconfig, token = guest.kubeconfig_for(api, work)
            t0 = time.time()
            run = run_pytest(["suites", "-k", NEEDS_CONTAINERS, "--cp-kubeconfig", str(kubeconfig),
                              "--cp-as-real-cluster", "--cp-profile", profile.name,
                              f"--cp-set={guest.team_setting(teams)}", f"--cp-set=gang_scheduler_name={OWN_SCHEDULER}",
                              *[f"--cp-set={s}" for s in settings[mode]], f"--cp-api-calls={work / 'calls.json'}",
                              *(["--cp-allow-destructive"] if mode == "destructive" else [])],
                             work, timeout=1500)
            return work, token, run, t0, time.time()

        with ThreadPoolExecutor(2) as pool:
            done = dict(zip(MODE_NAMES, pool.map(guest_run, MODE_NAMES)))
    out = {}
    for mode, (work, token, run, t0, t1) in done.items():
        assert token not in run.output
        calls = load_dump(json.loads((work / "calls.json").read_text())["calls"]) \
            if (work / "calls.json").exists() else {}
        out[mode] = GuestRun(mode, run, calls, _audit_events(cluster, token, t0, t1),
                             Manifest.shipped(mode == "destructive", tuple(teams.values()),
                                              access.pool_namespaces(api)), tuple(teams.values()))
    return out


MODE_NAMES = ("read-only", "destructive")
MODES = [pytest.param("read-only", id="read-only"), pytest.param("destructive", id="destructive")]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.cluster
def test_every_suite_passes_as_the_service_account_without_a_403(guest_runs, mode):
    g = guest_runs[mode]
    why = "\n".join(f"- {name}: {text.strip()[:1500]}" for name, text in sorted(g.run.failures.items()))
    assert g.run.returncode == 0 and not g.run.failures, \
        f"{len(g.run.failures)} check(s) failed as the ServiceAccount ({mode}): {sorted(g.run.failures)}\n" \
        f"{why}\nthe run's last output:\n{g.run.output[-3000:]}"
    refused = {c.describe(): s[FORBIDDEN_RBAC] for c, s in g.calls.items() if FORBIDDEN_RBAC in s}
    assert not refused, f"RBAC refused {len(refused)} call(s) of the {mode} run: {refused}"
    # The manifests' own policies refuse none of the harness's requests: only the permission check's probes, which
    # are server-side dry runs sent to be refused.
    own = {c.describe(): s[REFUSED_OWN_POLICY] for c, s in g.calls.items() if REFUSED_OWN_POLICY in s}
    assert not own, f"the manifests' admission policies refused {len(own)} request(s) of the {mode} run " \
                    f"(outside the allowlist of the harness's own shapes: clusterproof/kube/shapes.py): {own}"
    assert g.calls, "the run recorded no API call"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.cluster
def test_every_call_of_a_guest_run_is_allowed_by_the_manifest(guest_runs, mode):
    g = guest_runs[mode]
    bad = g.manifest.disallowed(g.calls)
    assert not bad, f"the {mode} run made {len(bad)} call(s) the manifest does not allow: " + \
        "; ".join(c.describe() for c in bad)


@pytest.mark.cluster
def test_every_rule_of_the_manifest_is_used_by_a_guest_run(guest_runs):
    """A rule no run used is a permission granted for nothing. The load's Role (clusterproof/kube/tokens.py) counts
    as a use of what it grants: RBAC lets the harness grant only what it holds itself."""
    g = guest_runs["destructive"]
    calls = set(guest_runs["read-only"].calls) | set(g.calls)
    pool = g.manifest.pool[0]
    calls |= {Call(verb, rule["apiGroups"][0], res, namespace=pool)
              for rule in LOAD_RULES for res in rule["resources"] for verb in rule["verbs"]}
    unused = [i for i in g.manifest.unused(calls) if (i.role, i.verb, i.group, i.resource) not in UNUSED_HERE]
    assert not unused, "rules no guest run used (drop them, or say in rbac.yaml which check needs them): " + \
        "; ".join(i.describe() for i in unused)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.cluster
def test_the_apiservers_audit_log_agrees_with_the_harness_record(guest_runs, mode):
    """Two instruments: the harness's request record and the apiserver's audit log of the ServiceAccount.
    Requests of the embedded Prometheus (it scrapes /metrics with the run's token) are the run's too, but
    not the harness process's: they must be allowed, and are not expected in the record."""
    g = guest_runs[mode]
    key = lambda c: (c.verb, c.group, c.resource, c.subresource, c.namespace, c.path)  # noqa: E731
    audited = {}
    for ev in g.audited:
        audited.setdefault(key(_audited_call(ev)), set()).add(ev.get("userAgent", "").split("/")[0])
    assert audited, "the audit log holds no request of the ServiceAccount in the run's window"
    not_allowed = sorted({_audited_call(ev).describe() for ev in g.audited
                          if g.manifest.allows(_audited_call(ev)) is None})
    assert not not_allowed, f"the audit log shows calls the manifest does not allow: {not_allowed}"
    own = {k for k, agents in audited.items() if agents - {"Prometheus"}}
    recorded = {key(c) for c in g.calls}
    assert own <= recorded, f"the apiserver saw calls the harness did not record: {sorted(own - recorded)[:10]}"
    assert recorded <= set(audited), f"the harness recorded calls the apiserver never saw: " \
                                     f"{sorted(recorded - set(audited))[:10]}"


@pytest.mark.cluster
def test_a_manifest_without_a_rule_the_code_needs_names_the_call(guest_runs):
    """Negative control of the check above: drop the destructive role's node patch; the recorded calls of
    the destructive run then include one the manifest does not allow, named."""
    docs = [d for d in access.manifest_docs(True)]
    for d in docs:
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "clusterproof-destructive":
            d["rules"] = [r for r in d["rules"] if r["resources"] != ["nodes"]]
    g = guest_runs["destructive"]
    smaller = Manifest.from_docs(docs, g.teams, pool=g.manifest.pool)
    bad = [c.describe() for c in smaller.disallowed(g.calls)]
    assert bad and all(d.startswith("patch nodes ") and d.endswith("(cluster scope)") for d in bad), bad
