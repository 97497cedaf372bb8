"""Teams share the cluster through taints, and no team's pods reach another team's nodes.

A team's nodes carry ``<team_taint_key>=<team>:NoSchedule``; an admission step
gives pods of the team (namespace label ``<team_namespace_label>=<team>``)
exactly the matching toleration, and pods of ``low_priority_class`` one per
team so idle capacity is borrowed. What is checked, on placement and on the
scheduler's own verdicts (a toleration permits, it does not attract: pods are
steered with node selectors and the outcome is read from the API):

1. a pod without a team toleration lands only on untainted nodes, or stays
   Pending with an untolerated-taint FailedScheduling event (at scale:
   ``taint_untolerated_pods`` whole-node pods, more than the shared pool);
2. a team pod gets exactly its team's toleration (key, ``Equal``, value,
   effect; never a wildcard) and lands only on its team's or shared nodes;
3. a pod that tolerates another team's taint by itself is refused or
   corrected, as ``team_foreign_toleration`` declares;
4. low-priority pods borrow idle nodes of every team and are preempted when
   the team needs them;
5. a NoExecute team taint evicts running pods that do not tolerate it
   (TaintManagerEviction); NoSchedule leaves them running;
6. nodes with the preflight taint get no work, and a new node gets work only
   once its preflight taint is removed.

The admission step is the harness's own (fixtures/admission.py: a
MutatingAdmissionPolicy and a ValidatingAdmissionPolicy bound to this run's
namespaces) on a simulated cluster, or the cluster's own
(``team_admission``). Checks that taint nodes or take whole GPU nodes are
``destructive``: on real hardware they need --allow-destructive.
Every test attaches a placement table (pods per team per node pool).
Negative control: tests/test_taint_isolation_controls.py strips one team
node's taint and installs a wildcard-injecting policy; the suite must fail
naming the node and the pod.
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

import allure
import pytest
import yaml
from kubernetes import client

from fixtures import taints as t
from fixtures.admission import TeamRules
from fixtures.errors import HarnessError
from fixtures.kube import raw_request
from fixtures.podtimeline import PodTimeline
from fixtures.profile import node_plan
from fixtures.run import RUN_LABEL, delete_run_pods
from fixtures.stash import PROFILE
from fixtures.waiting import wait_for
from fixtures.watch import list_raw

SHOW = 10  # offenders named in one failure message; the rest are counted


def pytest_generate_tests(metafunc):
    if "foreign_mode" in metafunc.fixturenames:
        mode = metafunc.config.stash[PROFILE].team_foreign_toleration
        metafunc.parametrize("foreign_mode", [pytest.param(mode, id=mode)])


# --- fixtures: lifecycle only -------------------------------------------------------

@dataclass
class Isolation:
    """What the checks run against: rules, admission step, team pools, low-priority class."""
    rules: TeamRules
    admission: t.Admission | None = None
    named: dict[str, str] = field(default_factory=dict)        # team -> existing namespace (profile)
    pool_of: dict[str, str] = field(default_factory=dict)      # node -> pool
    pools: list[str] = field(default_factory=list)             # column order of the placement table
    low_value: int | None = None
    error: str | None = None
    placement: dict[str, Counter] = field(default_factory=dict)  # every check's pods, for the summary


@pytest.fixture(scope="module")
def _isolation(cluster, profile, run_id, pytestconfig):
    """The admission step, the low-priority PriorityClass and the team pools; undone at the end.

    ``team_admission`` decides: the harness's policies (installed here,
    removed at the end, also after Ctrl-C), the deliberately broken
    wildcard policy (negative control only), or the cluster's own admission
    (nothing installed; the PriorityClass must then exist). Mistakes (a team
    without nodes, a named namespace without the team label, the policy API
    not served) are kept as one line that every check fails with.
    """
    from conftest import progress
    say = progress(pytestconfig)
    api = cluster.api
    iso = Isolation(TeamRules.from_profile(profile), named=t.parse_team_namespaces(profile.team_namespaces))
    kind = t.resolve_admission(profile.team_admission, cluster.simulated)
    created_pc = False
    try:
        nodes = t.read_nodes(api, profile.pool_label)
        iso.pool_of = {n: info.pool for n, info in nodes.items()}
        iso.pools = [p.name for p in node_plan(profile)] + ["scratch"]
        have = Counter(iso.pool_of.values())
        empty = [team for team in profile.teams if not have.get(f"team-{team}")]
        if empty:
            raise HarnessError(f"team {', '.join(empty)} has no nodes: no node on {api.configuration.host} is "
                               f"labelled {profile.pool_label}=team-<team>; fix teams in the profile or label "
                               "the team's nodes")
        for team, ns in iso.named.items():
            t.check_named_namespace(api, iso.rules, team, ns)
        if kind == "cluster":
            iso.admission = t.Admission("cluster", f"the cluster's own admission at {api.configuration.host} "
                                                   "(the harness installs nothing)")
        else:
            iso.admission = t.install_admission(api, iso.rules, run_id, kind, tuple(iso.named.values()))
            allure.attach(yaml.safe_dump_all(iso.admission.manifests, sort_keys=False),
                          "admission policies installed", allure.attachment_type.YAML)
        iso.low_value, created_pc = t.ensure_priority_class(api, profile.low_priority_class,
                                                            profile.low_priority_value, run_id,
                                                            create=kind != "cluster")
        say(f"taint isolation: {iso.admission.description}; low-priority class "
            f"{profile.low_priority_class} (value {iso.low_value})")
    except HarnessError as e:
        iso.error = str(e)
    except BaseException:
        _undo(api, iso, created_pc, profile)
        raise
    try:
        yield iso
    finally:
        if iso.placement:
            allure.attach(t.render_placement(iso.placement, iso.pools, list(profile.teams)),
                          "placement of every check's pods (pods per team per node pool)",
                          allure.attachment_type.TEXT)
        _undo(api, iso, created_pc, profile)


def _undo(api, iso: Isolation, created_pc: bool, profile) -> None:
    if iso.admission is not None:
        iso.admission.remove(api)
    if created_pc:
        t.delete_priority_class(api, profile.low_priority_class)


@pytest.fixture
def isolation(_isolation, cluster):
    allure.dynamic.tag(f"team-admission:{_isolation.admission.kind if _isolation.admission else 'none'}")
    if _isolation.admission is not None:
        allure.dynamic.parameter("admission step", _isolation.admission.description)
    if _isolation.error:
        pytest.fail(f"clusterproof: {_isolation.error}", pytrace=False)
    return _isolation


@pytest.fixture
def team_ns(cluster, isolation, run_id, request, profile):
    """{team: namespace} for this test: created and labelled (deleted afterwards), or the profile's.

    Waits until the admission step acts on each one (a dry-run pod gets the
    team's toleration): policies and new namespaces reach the apiserver's
    admission caches asynchronously.
    """
    api, rules = cluster.api, isolation.rules
    created, out = [], {}
    suffix = os.urandom(2).hex()
    try:
        for team in profile.teams:
            if team in isolation.named:
                out[team] = isolation.named[team]
                continue
            ns = f"cp-{run_id[-4:]}-{team[:30]}-{suffix}".lower()
            t.create_namespace(api, ns, run_id, {rules.namespace_label: team})
            created.append(ns)
            out[team] = ns
        kind = isolation.admission.kind
        for i, team in enumerate(profile.teams):
            other = profile.teams[(i + 1) % len(profile.teams)] if len(profile.teams) > 1 else None
            try:
                wait_for(lambda: t.admission_probe(api, rules, out[team], team, other, kind, run_id),
                         until=lambda why: why is None, timeout=30, interval=0.5,
                         what=f"admission acting on namespace {out[team]} (team {team})")
            except AssertionError as e:
                if kind != "cluster":
                    raise HarnessError(f"the harness's admission policies did not take effect: {e}") from None
        yield out
    finally:
        for ns in created:
            t.delete_namespace(api, ns)
        for team, ns in out.items():
            if ns not in created:
                delete_run_pods(api, ns, run_id)


def _placement(cluster, isolation, namespaces: list[str], team_of: dict[str, str], title: str) -> None:
    """Attach the per-team placement table of this check's pods (also kept for the module summary)."""
    pod_list = [p for ns in namespaces for p in t.pods(cluster.api, ns).values()]
    unknown = {p["spec"].get("nodeName") for p in pod_list} - set(isolation.pool_of) - {None}
    if unknown:
        isolation.pool_of.update({n: i.pool for n, i in t.read_nodes(cluster.api, cluster.profile.pool_label).items()})
    counts = t.placement_counts(pod_list, isolation.pool_of, team_of, isolation.rules.low_priority_class)
    for row, c in counts.items():
        isolation.placement.setdefault(row, Counter()).update(c)
    teams = list(isolation.rules.teams)
    allure.attach(t.render_placement(counts, isolation.pools, teams),
                  f"placement: {title} (pods per team per node pool)", allure.attachment_type.TEXT)
    allure.attach(t.placement_csv(counts, isolation.pools, teams), f"placement: {title} (csv)",
                  allure.attachment_type.CSV)


def _names(items: list[str]) -> str:
    more = f"; and {len(items) - SHOW} more" if len(items) > SHOW else ""
    return "; ".join(items[:SHOW]) + more


def _team_of(team_ns: dict[str, str]) -> dict[str, str]:
    return {ns: team for team, ns in team_ns.items()}


def _exact(rules: TeamRules, pod: dict, want: list[dict]) -> str | None:
    """None if the pod's team-related tolerations are exactly ``want``; else what is wrong."""
    got = t.team_tolerations(rules, pod)
    norm = lambda x: (x.get("key", ""), x.get("operator") or "Equal", x.get("value", ""),  # noqa: E731
                      x.get("effect", ""), x.get("tolerationSeconds"))
    if sorted(map(norm, got)) == sorted(map(norm, want)):
        return None
    wild = [x for x in got if (x.get("operator") == "Exists")]
    where = f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}"
    if wild:
        return (f"{where} got a wildcard toleration ({', '.join(map(t.describe_toleration, wild))}), "
                f"not exactly {', '.join(map(t.describe_toleration, want)) or 'none'}")
    return (f"{where} has team tolerations [{', '.join(map(t.describe_toleration, got)) or 'none'}], "
            f"not exactly [{', '.join(map(t.describe_toleration, want)) or 'none'}]")


# --- checks ------------------------------------------------------------------------------

@pytest.mark.smoke
@pytest.mark.destructive  # whole-node pods on every free node of the shared pool
def test_pod_without_team_toleration_never_lands_on_a_team_node(cluster, isolation, namespace, run_id,
                                                                 profile):
    api, n = cluster.api, profile.taint_untolerated_pods
    names = [f"untolerated-{i:05d}" for i in range(n)]
    timeline = PodTimeline(api, namespace, f"{t.CHECK_LABEL}=untolerated").start()
    try:
        t.create_pods(api, namespace, [t.pod_body(x, run_id, "untolerated", gpus=profile.node_gpus)
                                       for x in names])
        placed, events = t.wait_settled(
            api, namespace, names, profile.taint_timeout_s,
            f"{n} whole-node pods without team toleration bound or refused by the scheduler",
            nodes_of=lambda: {p.name: p.node for p in timeline.snapshot()})
    finally:
        timeline.stop()
    nodes = t.read_nodes(api, profile.pool_label)
    _placement(cluster, isolation, [namespace], {}, "pods without team toleration")
    guarded = sum(1 for i in nodes.values() if i.pool.startswith("team-") and i.has_taint(profile.team_taint_key)
                  and not i.unschedulable)
    bad, pending = [], 0
    for name in names:
        node = placed.get(name)
        if node:
            info = nodes.get(node)
            if info and info.pool.startswith("team-"):
                taint = ("carries no " + profile.team_taint_key + " taint"
                         if not info.has_taint(profile.team_taint_key) else f"taints: {info.taint_text()}")
                bad.append(f"pod {namespace}/{name} landed on team node {node} (pool {info.pool}; {taint})")
            elif info and (info.has_taint(profile.team_taint_key) or info.has_taint(profile.preflight_taint_key)):
                bad.append(f"pod {namespace}/{name} landed on tainted node {node} ({info.taint_text()})")
            continue
        pending += 1
        msgs = events.get(name, [])
        count = t.untolerated_count(msgs)
        if count is None:
            bad.append(f"pod {namespace}/{name} is Pending without an untolerated-taint FailedScheduling "
                       f"event (last: {msgs[-1] if msgs else 'none'})")
        elif count < guarded:
            bad.append(f"pod {namespace}/{name}: the scheduler refused only {count} node(s) for untolerated "
                       f"taints, but {guarded} schedulable team nodes carry their taint ({msgs[-1]})")
    allure.attach(f"pods: {n}, bound: {n - pending}, Pending with untolerated-taint event: {pending}, "
                  f"team nodes carrying their taint: {guarded}", "summary", allure.attachment_type.TEXT)
    assert not bad, f"{len(bad)} pod(s) without team toleration misplaced: " + _names(bad)


@pytest.mark.smoke
def test_team_pod_gets_exactly_its_toleration_and_stays_off_other_teams(cluster, isolation, team_ns,
                                                                        run_id, profile):
    api, rules, teams = cluster.api, isolation.rules, list(profile.teams)
    has_shared = "shared" in isolation.pool_of.values()
    unrelated = {"key": "example.com/maintenance", "operator": "Exists", "effect": "NoSchedule"}
    wrong_tols, admitted, required, off_limits = [], {}, {}, {}
    for i, team in enumerate(teams):
        ns, other = team_ns[team], (teams[(i + 1) % len(teams)] if len(teams) > 1 else None)
        sel = lambda pool: {profile.pool_label: pool}  # noqa: E731
        bodies = [t.pod_body(f"{team}-own-pool", run_id, "exact", node_selector=sel(f"team-{team}")),
                  t.pod_body(f"{team}-pretolerated", run_id, "exact",
                             tolerations=[rules.toleration(team), unrelated]),
                  *[t.pod_body(f"{team}-anywhere-{k}", run_id, "exact") for k in range(3)]]
        if has_shared:
            bodies.append(t.pod_body(f"{team}-shared-pool", run_id, "exact", node_selector=sel("shared"),
                                     tolerations=[]))
        if other:
            bodies.append(t.pod_body(f"{team}-into-{other}", run_id, "exact",
                                     node_selector=sel(f"team-{other}")))
            off_limits[(ns, f"{team}-into-{other}")] = other
        admitted[ns] = t.create_pods(api, ns, bodies)
        required[ns] = {b["metadata"]["name"] for b in bodies} - {f"{team}-into-{other}"}
        for pod in admitted[ns].values():
            why = _exact(rules, pod, [rules.toleration(team)])
            if why:
                wrong_tols.append(why)
        if unrelated not in admitted[ns][f"{team}-pretolerated"]["spec"]["tolerations"]:
            wrong_tols.append(f"pod {ns}/{team}-pretolerated lost its own toleration "
                              f"{t.describe_toleration(unrelated)} in admission")
    settled = {ns: t.wait_settled(api, ns, sorted(admitted[ns]), profile.taint_timeout_s,
                                  f"team pods in {ns} bound (or, if sent to another team's pool, refused)",
                                  bound=required[ns]) for ns in admitted}
    _placement(cluster, isolation, list(admitted), _team_of(team_ns), "team pods")
    bad = []  # placement breaches; each kind is listed (and cut at SHOW) on its own
    for ns, (now, ev) in settled.items():
        team = _team_of(team_ns)[ns]
        for name, node in now.items():
            pool = isolation.pool_of.get(node)
            if (ns, name) in off_limits:
                if node:
                    bad.append(f"pod {ns}/{name} of team {team} landed on node {node} of pool {pool}")
                elif t.untolerated_count(ev.get(name, [])) is None:
                    bad.append(f"pod {ns}/{name} is Pending without an untolerated-taint event "
                               f"(last: {(ev.get(name) or ['none'])[-1]})")
            elif node and pool not in (f"team-{team}", "shared"):
                bad.append(f"pod {ns}/{name} of team {team} landed on node {node} of pool {pool}")
    parts = ([f"{len(bad)} on nodes they may not use: " + _names(bad)] if bad else []) + (
        [f"{len(wrong_tols)} with wrong tolerations: " + _names(wrong_tols)] if wrong_tols else [])
    assert not parts, "team pods: " + " | ".join(parts)


@pytest.mark.smoke
def test_foreign_team_toleration_is_refused_as_declared(cluster, isolation, team_ns, namespace, run_id,
                                                        profile, foreign_mode):
    """``reject``: the create is refused. ``correct``: the pod is created without the toleration
    (and so stays off the other team's nodes). Adding one to a running pod is refused either way
    (``correct`` also accepts an update that admission strips)."""
    api, rules, teams = cluster.api, isolation.rules, list(profile.teams)
    team, other = teams[0], (teams[1] if len(teams) > 1 else None)
    sel = lambda pool: {profile.pool_label: pool}  # noqa: E731
    target = f"team-{other}" if other else "shared"
    key_exists = {"key": rules.taint_key, "operator": "Exists", "effect": "NoSchedule"}
    attempts = [(team_ns[team], f"{team}-claims-every-team", [key_exists], target),
                (team_ns[team], f"{team}-claims-any-taint", [{"operator": "Exists"}], target),
                (namespace, f"no-team-claims-{team}", [rules.toleration(team)], f"team-{team}")]
    if other:
        attempts.insert(0, (team_ns[team], f"{team}-claims-{other}", [rules.toleration(other)], target))
    bad, outcome, created = [], [], {}
    for ns, name, tols, pool in attempts:
        pod, err = t.try_create(api, ns, t.pod_body(name, run_id, "foreign", node_selector=sel(pool),
                                                    tolerations=tols))
        claim = ", ".join(map(t.describe_toleration, tols))
        outcome.append(f"{ns}/{name} ({claim}): " + (f"refused: {t.api_message(err)}" if err else "created"))
        if foreign_mode == "reject" and pod is not None:
            bad.append(f"pod {ns}/{name} tolerating {claim} was admitted (team_foreign_toleration: reject)")
        elif foreign_mode == "correct":
            if err is not None:
                bad.append(f"pod {ns}/{name} tolerating {claim} was refused ({t.api_message(err)}), but "
                           "team_foreign_toleration is correct")
                continue
            created.setdefault(ns, []).append(name)
            own = _team_of(team_ns).get(ns, "")
            kept = [x for x in t.team_tolerations(rules, pod) if rules.is_foreign(x, own, False)]
            if kept:
                bad.append(f"pod {ns}/{name} kept foreign toleration(s) "
                           f"{', '.join(map(t.describe_toleration, kept))} (team_foreign_toleration: correct)")
    # A running pod that adds another team's toleration later.
    ns = team_ns[team]
    t.create_pods(api, ns, [t.pod_body(f"{team}-later", run_id, "foreign-update", node_selector=sel(f"team-{team}"))])
    t.wait_settled(api, ns, [f"{team}-later"], profile.taint_timeout_s, f"pod {ns}/{team}-later bound",
                   bound={f"{team}-later"})
    sneak = rules.toleration(other) if other else key_exists
    try:
        raw_request(api, "PATCH", f"/api/v1/namespaces/{ns}/pods/{team}-later",
                    headers={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
                    body=[{"op": "add", "path": "/spec/tolerations/-", "value": sneak}]).data
        after = t.pods(api, ns, "foreign-update")[f"{team}-later"]
        if any(rules.is_foreign(x, team, False) for x in t.team_tolerations(rules, after)):
            bad.append(f"pod {ns}/{team}-later was allowed to add {t.describe_toleration(sneak)} while running")
        outcome.append(f"{ns}/{team}-later: update adding {t.describe_toleration(sneak)} accepted")
    except client.ApiException as e:
        if e.status >= 500:
            raise
        outcome.append(f"{ns}/{team}-later: update adding {t.describe_toleration(sneak)} refused: {t.api_message(e)}")
    # Corrected pods were sent to a pool they may not use: they must stay off it.
    for ns, names in created.items():
        now, ev = t.wait_settled(api, ns, names, profile.taint_timeout_s,
                                 f"corrected pods in {ns} refused by the scheduler")
        for name in names:
            node = now[name]
            if node:
                bad.append(f"pod {ns}/{name} landed on node {node} of pool {isolation.pool_of.get(node)} "
                           "after admission corrected it")
    allure.attach("\n".join(outcome), "admission outcome per attempt", allure.attachment_type.TEXT)
    _placement(cluster, isolation, [*team_ns.values(), namespace], _team_of(team_ns), "foreign-toleration attempts")
    assert not bad, f"{len(bad)} foreign toleration(s) not {foreign_mode}ed: " + _names(bad)


@pytest.mark.smoke
@pytest.mark.destructive  # takes idle team GPU nodes and preempts on them
def test_low_priority_pods_borrow_idle_team_nodes_and_are_preempted(cluster, isolation, team_ns, namespace,
                                                                    run_id, profile):
    api, rules, teams, k = cluster.api, isolation.rules, list(profile.teams), profile.taint_borrow_nodes
    low = profile.low_priority_class

    def idle():
        nodes, busy = t.read_nodes(api, profile.pool_label), t.busy_nodes(api)
        return {team: sorted(n for n, i in nodes.items() if i.pool == f"team-{team}" and i.ready
                             and not i.unschedulable and not busy[n])[:k] for team in teams}
    chosen = wait_for(idle, until=lambda c: all(len(v) == k for v in c.values()), timeout=profile.taint_timeout_s,
                      interval=2, what=f"{k} idle node(s) in every team pool (earlier pods gone)")
    lows = {f"low-{team}-{i}": team for team in teams for i in range(k)}
    admitted = t.create_pods(api, namespace, [
        t.pod_body(name, run_id, "borrow", gpus=profile.node_gpus, priority_class=low, hostnames=chosen[team])
        for name, team in lows.items()])
    bad = [why for pod in admitted.values()
           if (why := _exact(rules, pod, [rules.toleration(x) for x in teams]))]
    now, _ = t.wait_settled(api, namespace, sorted(lows), profile.taint_timeout_s,
                            f"{len(lows)} low-priority pods bound on idle team nodes", bound=set(lows))
    for name, team in lows.items():
        node = now[name]
        if node not in chosen[team]:
            bad.append(f"pod {namespace}/{name} borrowed node {node}, not one of team {team}'s idle nodes")
    holders = {now[name]: name for name in lows}
    _placement(cluster, isolation, [namespace], {}, "low-priority pods borrowing idle team nodes")

    # The teams want their nodes back: one whole-node pod per borrowed node.
    wanted = {}
    for team in teams:
        names = [f"{team}-reclaim-{i}" for i in range(k)]
        t.create_pods(api, team_ns[team], [t.pod_body(x, run_id, "reclaim", gpus=profile.node_gpus,
                                                      hostnames=chosen[team]) for x in names])
        wanted[team_ns[team]] = names
    for ns, names in wanted.items():
        try:
            t.wait_settled(api, ns, names, profile.taint_timeout_s, f"team pods in {ns} bound on their nodes",
                           bound=set(names))
        except AssertionError as e:
            left = t.pods(api, namespace, "borrow")
            still = [f"{n} on {p['spec'].get('nodeName')}" for n, p in left.items() if not t.gone_or_going(p)]
            bad.append(f"{str(e).splitlines()[0]}; low-priority pods not preempted: {', '.join(still) or 'none'}")
    _placement(cluster, isolation, list(team_ns.values()), _team_of(team_ns), "teams reclaiming their nodes")
    left = t.pods(api, namespace, "borrow")
    for name, pod in left.items():
        if not t.gone_or_going(pod) and pod["spec"].get("nodeName") in holders:
            bad.append(f"low-priority pod {namespace}/{name} still runs on {pod['spec']['nodeName']} "
                       "after its team reclaimed the node")
    try:
        wait_for(lambda: t.events(api, namespace, t.PREEMPTED_REASON), until=lambda ev: set(lows) <= set(ev),
                 timeout=30, interval=1, what="a Preempted event for every low-priority pod")
    except AssertionError as e:
        bad.append(str(e))
    assert not bad, f"{len(bad)} borrowing/preemption problem(s): " + _names(bad)


def _scratch(cluster, profile, run_id, tag, taints=()):
    if cluster.simulated:
        return t.create_scratch_node(cluster.api, profile, run_id, tag, list(taints))
    return t.borrow_idle_node(cluster.api, profile, run_id, list(taints))


@pytest.mark.smoke
@pytest.mark.destructive  # taints a node
def test_noexecute_team_taint_evicts_running_pods_but_noschedule_does_not(cluster, isolation, team_ns,
                                                                          namespace, run_id, profile):
    api, rules, teams = cluster.api, isolation.rules, list(profile.teams)
    team = teams[0]
    node = _scratch(cluster, profile, run_id, f"evict-{run_id[-4:]}-{namespace[-4:]}")
    noschedule = {"key": rules.taint_key, "value": team, "effect": "NoSchedule"}
    noexecute = {"key": rules.taint_key, "value": team, "effect": "NoExecute"}
    try:
        here = dict(node_selector=node.selector)
        plan = [(namespace, "no-team", [node.toleration])]
        if len(teams) > 1:
            plan.append((team_ns[teams[1]], f"team-{teams[1]}", [node.toleration]))
        tolerant = (team_ns[team], f"team-{team}-tolerates-noexecute",
                    [node.toleration, {"key": rules.taint_key, "operator": "Equal", "value": team,
                                       "effect": "NoExecute"}])
        for ns, name, tols in [*plan, tolerant]:
            t.create_pods(api, ns, [t.pod_body(name, run_id, "evict", tolerations=tols, **here)])
        sel = f"{t.CHECK_LABEL}=evict,{RUN_LABEL}={run_id}"
        wait_for(lambda: {p["metadata"]["name"]: p["status"].get("phase")
                          for p in list_raw(api, "/api/v1/pods", {"labelSelector": sel})["items"]},
                 until=lambda s: len(s) == len(plan) + 1 and all(v == "Running" for v in s.values()),
                 timeout=profile.taint_timeout_s, interval=0.5, what=f"pods Running on {node.name}")

        node.taint(noschedule)
        disturbed = t.watch_for_changes(api, sel, profile.taint_observe_s, _left_running)
        bad = [f"pod {p} {why} after {node.name} got {noschedule['key']}={team}:NoSchedule"
               for p, why in disturbed.items()]

        node.taint(noexecute)
        victims = {(ns, name) for ns, name, _ in plan}
        try:
            wait_for(lambda: {(ns, n) for ns, n in victims if t.gone_or_going(t.pods(api, ns, "evict").get(n))},
                     until=lambda gone: gone == victims, timeout=profile.taint_timeout_s, interval=0.5,
                     what=f"pods without a NoExecute toleration evicted from {node.name}")
        except AssertionError as e:
            bad.append(f"{e} (node {node.name} has {rules.taint_key}={team}:NoExecute)")
        for ns, name in sorted(victims):
            try:
                wait_for(lambda: t.events(api, ns, t.EVICTION_REASON).get(name), timeout=30, interval=1,
                         what=f"a {t.EVICTION_REASON} event for pod {ns}/{name}")
            except AssertionError as e:
                bad.append(str(e))
        survived = t.watch_for_changes(api, f"{t.CHECK_LABEL}=evict,{RUN_LABEL}={run_id}",
                                       profile.taint_observe_s,
                                       lambda kind, p: _left_running(kind, p)
                                       if p["metadata"]["name"] == tolerant[1] else None)
        bad += [f"pod {p} {why} although it tolerates {rules.taint_key}={team}:NoExecute"
                for p, why in survived.items()]
        _placement(cluster, isolation, [namespace, *team_ns.values()], _team_of(team_ns), "NoExecute eviction")
    finally:
        node.release()
    assert not bad, f"taint eviction on node {node.name}: " + _names(bad)


def _left_running(kind: str, pod: dict) -> str | None:
    if kind == "DELETED":
        return "was deleted"
    if pod["metadata"].get("deletionTimestamp"):
        return "is being deleted"
    if pod["status"].get("phase") not in (None, "Pending", "Running"):
        return f"went {pod['status'].get('phase')}"
    return None


@pytest.mark.smoke
def test_preflight_nodes_receive_no_work(cluster, isolation, team_ns, namespace, run_id, profile):
    """Observational (safe on any cluster): pods that may go only to nodes carrying the preflight
    taint -- a plain pod, a team pod, a low-priority borrower -- all stay Pending."""
    api, rules = cluster.api, isolation.rules
    nodes = t.read_nodes(api, profile.pool_label)
    pre = sorted(n for n, i in nodes.items() if i.has_taint(profile.preflight_taint_key))
    if not pre:
        pytest.skip(f"no node carries the preflight taint {profile.preflight_taint_key}: nothing to observe")
    team = profile.teams[0]
    hosts = pre[:50]
    plan = {namespace: [t.pod_body("no-team", run_id, "preflight", hostnames=hosts),
                        t.pod_body("low-priority", run_id, "preflight", hostnames=hosts,
                                   priority_class=profile.low_priority_class)],
            team_ns[team]: [t.pod_body(f"team-{team}", run_id, "preflight", hostnames=hosts)]}
    bad = []
    for ns, bodies in plan.items():
        t.create_pods(api, ns, bodies)
        now, ev = t.wait_settled(api, ns, [b["metadata"]["name"] for b in bodies], profile.taint_timeout_s,
                                 f"pods aimed at the {len(pre)} preflight node(s) refused by the scheduler")
        for name, node in now.items():
            if node:
                bad.append(f"pod {ns}/{name} landed on {node}, which carries "
                           f"{profile.preflight_taint_key}")
            elif t.untolerated_count(ev.get(name, [])) is None:
                bad.append(f"pod {ns}/{name} is Pending without an untolerated-taint event")
    # And no pod of this run, anywhere, sits on a node carrying the preflight taint.
    for p in list_raw(api, "/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]:
        node = p["spec"].get("nodeName")
        if node in pre:
            bad.append(f"pod {p['metadata']['namespace']}/{p['metadata']['name']} runs on preflight node {node}")
    _placement(cluster, isolation, list(plan), _team_of(team_ns), "pods aimed at preflight nodes")
    assert not bad, f"{len(bad)} pod(s) got work on preflight nodes: " + _names(bad)


@pytest.mark.smoke
@pytest.mark.destructive  # creates (simulated) or taints (real hardware) a node
def test_new_node_gets_work_only_once_its_preflight_taint_is_removed(cluster, isolation, team_ns, namespace,
                                                                      run_id, profile):
    api = cluster.api
    preflight = {"key": profile.preflight_taint_key, "value": "pending", "effect": "NoSchedule"}
    node = _scratch(cluster, profile, run_id, f"preflight-{run_id[-4:]}-{namespace[-4:]}", [preflight])
    team = profile.teams[0]
    try:
        here = dict(node_selector=node.selector, tolerations=[node.toleration])
        plan = {namespace: [t.pod_body("no-team", run_id, "new-node", **here),
                            t.pod_body("low-priority", run_id, "new-node",
                                       priority_class=profile.low_priority_class, **here)],
                team_ns[team]: [t.pod_body(f"team-{team}", run_id, "new-node", **here)]}
        bad = []
        for ns, bodies in plan.items():
            t.create_pods(api, ns, bodies)
            now, ev = t.wait_settled(api, ns, [b["metadata"]["name"] for b in bodies], profile.taint_timeout_s,
                                     f"pods aimed at new node {node.name} refused while it carries the preflight taint")
            bad += [f"pod {ns}/{n} landed on {where} while {node.name} carries {profile.preflight_taint_key}"
                    for n, where in now.items() if where]
            bad += [f"pod {ns}/{n} is Pending without an untolerated-taint event" for n, where in now.items()
                    if not where and t.untolerated_count(ev.get(n, [])) is None]
        sel = f"{t.CHECK_LABEL}=new-node,{RUN_LABEL}={run_id}"
        early = t.watch_for_changes(api, sel, profile.taint_observe_s,
                                    lambda kind, p: p["spec"].get("nodeName") and f"bound to {p['spec']['nodeName']}")
        bad += [f"pod {p} was {why} while the preflight taint was on" for p, why in early.items()]

        node.untaint(preflight)
        for ns, bodies in plan.items():
            names = [b["metadata"]["name"] for b in bodies]
            now, _ = t.wait_settled(api, ns, names, profile.taint_timeout_s,
                                    f"pods bound once {node.name} lost its preflight taint", bound=set(names))
            bad += [f"pod {ns}/{n} went to {where}, not the new node {node.name}"
                    for n, where in now.items() if where != node.name]
        _placement(cluster, isolation, list(plan), _team_of(team_ns), "new node behind the preflight taint")
    finally:
        node.release()
    assert not bad, f"preflight taint on new node {node.name}: " + _names(bad)
