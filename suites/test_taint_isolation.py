"""Teams share the cluster through taints, and no team's pods reach another team's nodes.

A team's nodes carry ``<team_taint_key>=<team>:NoSchedule``; an admission step
gives pods of the team (namespace label ``<team_namespace_label>=<team>``)
exactly the matching toleration, and pods of ``low_priority_class`` one per
team so idle capacity is borrowed. What is checked, on placement and on the
scheduler's own verdicts (a toleration permits, it does not attract: pods are
steered with node selectors and the outcome is read from the API):

1. a pod without a team toleration lands only on untainted nodes, or stays
   Pending refused for untolerated taints (the scheduler's FailedScheduling
   event, or its PodScheduled condition when the event was dropped; at scale:
   ``taint_untolerated_pods`` whole-node pods, more than the shared pool);
2. a team pod gets exactly its team's toleration (key, ``Equal``, value,
   effect; never a wildcard) and lands only on its team's or shared nodes;
3. a pod that tolerates another team's taint by itself is refused or
   corrected, as ``team_foreign_toleration`` declares;
4. low-priority pods borrow idle nodes of every team and are preempted when
   the team needs them (a team pod whose preemption finished but which
   kube-scheduler parked until its 5-min flush is the known upstream defect
   kubernetes/kubernetes#141694: an xfail with the measured delay, once the
   flush bound it; clusterproof/kube/preemption.py);
5. a NoExecute team taint evicts running pods that do not tolerate it
   (TaintManagerEviction); NoSchedule leaves them running;
6. nodes with the preflight taint get no work, and a new node gets work only
   once its preflight taint is removed.

The admission step is the harness's own (clusterproof/taints/admission.py: a
MutatingAdmissionPolicy and a ValidatingAdmissionPolicy bound to this run's
namespaces) on the embedded cluster the harness started, or the cluster's own
(``team_admission``). Checks that taint nodes or take whole GPU nodes are
``destructive``: on any other cluster they need --cp-allow-destructive. A check
needing what the cluster lacks (team namespaces a guest may use, an admission
step acting on team pods, the low-priority class) is skipped saying which.
Every test attaches a placement table (pods per team per node pool).
Negative control: tests/test_taint_isolation_controls.py strips one team
node's taint, installs a wildcard-injecting policy, and gives the borrowers
a class as high as the teams'; the suite must fail naming the node, the pod
and the borrowers still running.
"""
from __future__ import annotations

import allure
import pytest
from kubernetes import client

from clusterproof.cluster.scratch_nodes import NotIdle, borrow_idle_node, create_scratch_nodes
from clusterproof.core.errors import HarnessError
from clusterproof.core.measurement import measuring
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.fixtures import PROFILE
from clusterproof.kube import placement as pl
from clusterproof.kube import preemption
from clusterproof.kube.apicalls import refused_by_own_policy, refused_by_rbac
from clusterproof.kube.client import api_message, list_raw, raw_request
from clusterproof.kube.node_taints import CHECK_TAINTS
from clusterproof.kube.pods import create_pods, explain_pods, pod_events, terminating, try_create
from clusterproof.report import allure as allure_page
from clusterproof.taints.admission import TeamRules, describe_toleration, team_tolerations
from clusterproof.taints.isolation import ADMISSION, CHECK_LABEL, LOW_PRIORITY, TEAM_NAMESPACES, check_pod, check_pods
from clusterproof.taints.measure import (
    Borrowing,
    Eviction,
    ForeignAttempts,
    Judged,
    NewNode,
    TeamPods,
    UntoleratedRun,
    stopwatch,
)

SHOW = 10  # offenders named in one failure message; the rest are counted
EVICTION_REASON = "TaintManagerEviction"       # kube-controller-manager's taint-eviction-controller
PREEMPTED_REASON = "Preempted"                 # kube-scheduler, on the victim


def pytest_generate_tests(metafunc):
    if "foreign_mode" in metafunc.fixturenames:
        mode = metafunc.config.stash[PROFILE].team_foreign_toleration
        metafunc.parametrize("foreign_mode", [pytest.param(mode, id=mode)])


def _names(items: list[str]) -> str:
    more = f"; and {len(items) - SHOW} more" if len(items) > SHOW else ""
    return "; ".join(items[:SHOW]) + more


def _team_of(team_ns: dict[str, str]) -> dict[str, str]:
    return {ns: team for team, ns in team_ns.items()}


def _need(isolation, *mechanisms: str) -> None:
    """Skip the check, with the one line ``Isolation.missing`` holds, if the cluster lacks one of ``mechanisms``."""
    why = isolation.lacking(*mechanisms)
    if why:
        pytest.skip(why)


def _optional_team_ns(request, isolation) -> dict[str, str]:
    """The team namespaces of ``team_ns`` where the cluster has them; {} where it has none the run may use (an
    observational check judges its other pods then, and says what it left out)."""
    why = isolation.lacking(TEAM_NAMESPACES)
    if why:
        allure.attach(why, "team pods left out", allure.attachment_type.TEXT)
        return {}
    return request.getfixturevalue("team_ns")


def _low_priority(isolation) -> bool:
    """Can this check's low-priority pod be made (the class exists)? Says so in the report where it cannot."""
    why = isolation.lacking(LOW_PRIORITY)
    if why:
        allure.attach(why, "low-priority pod left out", allure.attachment_type.TEXT)
    return why is None


def _placement(cluster, isolation, namespaces: list[str], team_of: dict[str, str], title: str) -> None:
    allure_page.attach(*isolation.record_placement(cluster.api, cluster.profile.pool_label, namespaces, team_of,
                                                   title))


def _exact(rules: TeamRules, pod: dict, want: list[dict]) -> str | None:
    """None if the pod's team-related tolerations are exactly ``want``; else what is wrong."""
    got = team_tolerations(rules, pod)
    norm = lambda x: (x.get("key", ""), x.get("operator") or "Equal", x.get("value", ""),  # noqa: E731
                      x.get("effect", ""), x.get("tolerationSeconds"))
    if sorted(map(norm, got)) == sorted(map(norm, want)):
        return None
    wild = [x for x in got if (x.get("operator") == "Exists")]
    where = f"pod {pod['metadata']['namespace']}/{pod['metadata']['name']}"
    if wild:
        return (f"{where} got a wildcard toleration ({', '.join(map(describe_toleration, wild))}), "
                f"not exactly {', '.join(map(describe_toleration, want)) or 'none'}")
    return (f"{where} has team tolerations [{', '.join(map(describe_toleration, got)) or 'none'}], "
            f"not exactly [{', '.join(map(describe_toleration, want)) or 'none'}]")


# --- checks ------------------------------------------------------------------------------

@pytest.mark.smoke
@pytest.mark.destructive  # whole-node pods on every free node of the shared pool
def test_pod_without_team_toleration_never_lands_on_a_team_node(cluster, isolation, namespace, run_id,
                                                                 profile, figures):
    """``taint_untolerated_pods`` whole-node pods without a team toleration (more than the shared pool holds) land only
    on untainted nodes, or stay Pending refused for untolerated taints (FailedScheduling event or PodScheduled
    condition). Red: a pod landed on a team or preflight node (named, with the node's taints)."""
    api, n = cluster.api, profile.taint_untolerated_pods
    names = [f"untolerated-{i:05d}" for i in range(n)]
    run = UntoleratedRun(api, namespace, f"{CHECK_LABEL}=untolerated", n)
    with measuring(run):
        created = create_pods(api, namespace, [check_pod(x, run_id, "untolerated", gpus=profile.node_gpus)
                                               for x in names])
        run.settle(created, profile.taint_timeout_s,
                   f"{n} whole-node pods without team toleration bound or refused by the scheduler")
    r = run.result
    figures.add(f"{n} pods created -> each bound or refused by the scheduler", r.settle_s, "s",
                profile.taint_timeout_s, headline=True)
    # Events are best effort: how many refusals were read from the pods' condition alone (the scheduler
    # dropped their FailedScheduling event, or it had not arrived yet).
    run.count_silent_refusals(names, pod_events(api, namespace, "FailedScheduling", created))
    figures.add("refused pods without a FailedScheduling event (verdict read from the PodScheduled condition)",
                r.refused_without_event, "pods")
    nodes = pl.read_nodes(api, profile.pool_label)
    _placement(cluster, isolation, [namespace], {}, "pods without team toleration")
    run.judge(names, nodes, profile.team_taint_key, profile.preflight_taint_key)
    allure.attach(f"pods: {n}, bound: {r.bound}, Pending, refused for untolerated taints: {r.pending}, "
                  f"team nodes carrying their taint: {r.guarded}", "summary", allure.attachment_type.TEXT)
    figures.add("pods bound (untainted nodes)", r.bound, "pods")
    figures.add("pods Pending (refused for untolerated taints)", r.pending, "pods")
    figures.add("pods misplaced", r.misplaced, "pods", 0)
    assert not r.problems, f"{r.misplaced} pod(s) without team toleration misplaced: " + _names(r.problems)


@pytest.mark.smoke
def test_team_pod_gets_exactly_its_toleration_and_stays_off_other_teams(cluster, isolation, team_ns,
                                                                        run_id, profile, figures):
    """Admission gives each team's pods exactly their team's toleration (never a wildcard), and they land only on their
    team's or shared nodes; a pod sent to another team's pool stays Pending. Red: a wrong toleration, or a pod on
    another team's node (named)."""
    _need(isolation, ADMISSION)
    api, rules, teams = cluster.api, isolation.rules, list(profile.teams)
    has_shared = "shared" in isolation.pool_of.values()
    unrelated = {"key": "example.com/maintenance", "operator": "Equal", "value": "planned", "effect": "NoSchedule"}
    run, admitted, required, off_limits = TeamPods(), {}, {}, {}
    for i, team in enumerate(teams):
        ns, other = team_ns[team], (teams[(i + 1) % len(teams)] if len(teams) > 1 else None)
        sel = lambda pool: {profile.pool_label: pool}  # noqa: E731
        bodies = [check_pod(f"{team}-own-pool", run_id, "exact", node_selector=sel(f"team-{team}")),
                  check_pod(f"{team}-pretolerated", run_id, "exact",
                             tolerations=[rules.toleration(team), unrelated]),
                  *[check_pod(f"{team}-anywhere-{k}", run_id, "exact") for k in range(3)]]
        if has_shared:
            bodies.append(check_pod(f"{team}-shared-pool", run_id, "exact", node_selector=sel("shared"),
                                     tolerations=[]))
        if other:
            bodies.append(check_pod(f"{team}-into-{other}", run_id, "exact",
                                     node_selector=sel(f"team-{other}")))
            off_limits[(ns, f"{team}-into-{other}")] = other
        admitted[ns] = create_pods(api, ns, bodies)
        required[ns] = {b["metadata"]["name"] for b in bodies} - {f"{team}-into-{other}"}
        for pod in admitted[ns].values():
            why = _exact(rules, pod, [rules.toleration(team)])
            if why:
                run.wrong_tolerations.append(why)
        if unrelated not in admitted[ns][f"{team}-pretolerated"]["spec"]["tolerations"]:
            run.wrong_tolerations.append(f"pod {ns}/{team}-pretolerated lost its own toleration "
                                         f"{describe_toleration(unrelated)} in admission")
    took = stopwatch()
    settled = {ns: pl.wait_settled(api, ns, admitted[ns], profile.taint_timeout_s,
                                  f"team pods in {ns} bound (or, if sent to another team's pool, refused)",
                                  bound=required[ns]) for ns in admitted}
    run.settle_s = took()
    figures.add("team pods created -> each bound or refused (all teams)", run.settle_s, "s")
    _placement(cluster, isolation, list(admitted), _team_of(team_ns), "team pods")
    run.judge_placement(settled, _team_of(team_ns), off_limits, isolation.pool_of)
    figures.add("team pods on nodes they may not use", run.misplaced_count, "pods", 0)
    figures.add("team pods with wrong tolerations", run.wrong_toleration_count, "pods", 0)
    # Each kind of breach is listed (and cut at SHOW) on its own.
    parts = ([f"{run.misplaced_count} on nodes they may not use: " + _names(run.misplaced)]
             if run.misplaced else []) + (
        [f"{run.wrong_toleration_count} with wrong tolerations: " + _names(run.wrong_tolerations)]
        if run.wrong_tolerations else [])
    assert not parts, "team pods: " + " | ".join(parts)


@pytest.mark.smoke
def test_foreign_team_toleration_is_refused_as_declared(cluster, isolation, team_ns, namespace, run_id,
                                                        profile, foreign_mode, figures):
    """``reject``: the create is refused. ``correct``: the pod is created without the toleration
    (and so stays off the other team's nodes). Adding one to a running pod is refused either way
    (``correct`` also accepts an update that admission strips). Red: a foreign toleration got through."""
    _need(isolation, ADMISSION)
    api, rules, teams = cluster.api, isolation.rules, list(profile.teams)
    team, other = teams[0], (teams[1] if len(teams) > 1 else None)
    sel = lambda pool: {profile.pool_label: pool}  # noqa: E731
    target = f"team-{other}" if other else "shared"
    key_exists = {"key": rules.taint_key, "operator": "Exists", "effect": "NoSchedule"}
    # (namespace, pod, tolerations, pool it is sent to, whether it is gated). A pod asking for a wildcard toleration is
    # held by the harness's gate clusterproof.io/never-scheduled, so it never runs wherever admission lets it through
    # (the harness's own policies admit a wildcard toleration on no other pod: docs/rbac.md).
    attempts = [(team_ns[team], f"{team}-claims-every-team", [key_exists], target, True),
                (team_ns[team], f"{team}-claims-any-taint", [{"operator": "Exists"}], target, True),
                (namespace, f"no-team-claims-{team}", [rules.toleration(team)], f"team-{team}", False)]
    if other:
        attempts.insert(0, (team_ns[team], f"{team}-claims-{other}", [rules.toleration(other)], target, False))
    run, created = ForeignAttempts(), {}
    for ns, name, tols, pool, gated in attempts:
        pod, err = try_create(api, ns, check_pod(name, run_id, "foreign", node_selector=sel(pool),
                                                    tolerations=tols, never_scheduled=gated))
        claim = ", ".join(map(describe_toleration, tols))
        run.outcome.append(f"{ns}/{name} ({claim}{', gated' if gated else ''}): "
                           + (f"refused: {api_message(err)}" if err else "created"))
        if foreign_mode == "reject" and pod is not None:
            run.problems.append(f"pod {ns}/{name} tolerating {claim} was admitted (team_foreign_toleration: reject)")
        elif foreign_mode == "correct":
            if err is not None:
                run.problems.append(f"pod {ns}/{name} tolerating {claim} was refused ({api_message(err)}), but "
                                    "team_foreign_toleration is correct")
                continue
            if not gated:     # a gated pod never runs: where it would land is not asked
                created.setdefault(ns, {})[name] = pod
            own = _team_of(team_ns).get(ns, "")
            kept = [x for x in team_tolerations(rules, pod) if rules.is_foreign(x, own, False)]
            if kept:
                run.problems.append(f"pod {ns}/{name} kept foreign toleration(s) "
                                    f"{', '.join(map(describe_toleration, kept))} (team_foreign_toleration: correct)")
    # A running pod that adds another team's toleration later. With a single team there is none: the wildcard is
    # added instead, on a cluster the harness owns only (on any other its own policies refuse that update first,
    # and the cluster's answer could not be told).
    ns = team_ns[team]
    sneak = rules.toleration(other) if other else (key_exists if cluster.owned else None)
    if sneak is None:
        run.outcome.append(f"{ns}/{team}-later: not tried (one team, and the wildcard toleration is refused by the "
                           "harness's own policies on a cluster it does not own)")
    else:
        later = create_pods(api, ns, [check_pod(f"{team}-later", run_id, "foreign-update",
                                                node_selector=sel(f"team-{team}"))])
        pl.wait_settled(api, ns, later, profile.taint_timeout_s, f"pod {ns}/{team}-later bound", bound=set(later))
        _sneak_in(api, ns, f"{team}-later", sneak, rules, team, run)
    # Corrected pods were sent to a pool they may not use: they must stay off it.
    for ns, pods in created.items():
        now, ev = pl.wait_settled(api, ns, pods, profile.taint_timeout_s,
                                  f"corrected pods in {ns} refused by the scheduler")
        for name in pods:
            node = now[name]
            if node:
                run.problems.append(f"pod {ns}/{name} landed on node {node} of pool {isolation.pool_of.get(node)} "
                                    "after admission corrected it")
    allure.attach("\n".join(run.outcome), "admission outcome per attempt", allure.attachment_type.TEXT)
    _placement(cluster, isolation, [*team_ns.values(), namespace], _team_of(team_ns), "foreign-toleration attempts")
    figures.add(f"foreign tolerations not {foreign_mode}ed", run.problem_count, "", 0)
    assert not run.problems, f"{run.problem_count} foreign toleration(s) not {foreign_mode}ed: " + _names(run.problems)


def _sneak_in(api, ns: str, name: str, sneak: dict, rules, team: str, run) -> None:
    """Add ``sneak`` to the running pod ``ns/name`` (a JSON patch): a refusal is the cluster's verdict, unless RBAC
    or the harness's own policies gave it (then the check cannot tell: one line)."""
    try:
        raw_request(api, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
                    headers={"Content-Type": "application/json-patch+json", "Accept": "application/json"},
                    body=[{"op": "add", "path": "/spec/tolerations/-", "value": sneak}]).data
        after = check_pods(api, ns, "foreign-update")[name]
        if any(rules.is_foreign(x, team, False) for x in team_tolerations(rules, after)):
            run.problems.append(f"pod {ns}/{name} was allowed to add {describe_toleration(sneak)} while running")
        run.outcome.append(f"{ns}/{name}: update adding {describe_toleration(sneak)} accepted")
    except client.ApiException as e:
        if e.status >= 500:
            raise
        if refused_by_rbac(e):   # not admission's verdict: the harness may not ask
            raise HarnessError(f"the harness may not patch its own pod in namespace {ns} ({api_message(e)}), so it "
                               "cannot tell whether admission refuses the update: grant it "
                               "(clusterproof/kube/rbac.yaml clusterproof-team)") from None
        if refused_by_own_policy(e):
            raise HarnessError(f"the harness's own admission policy refused its update of pod {ns}/{name} "
                               f"({api_message(e)}), so the cluster's verdict on it cannot be told") from None
        run.outcome.append(f"{ns}/{name}: update adding {describe_toleration(sneak)} refused: {api_message(e)}")


@pytest.mark.smoke
@pytest.mark.destructive  # takes idle team GPU nodes and preempts on them
def test_low_priority_pods_borrow_idle_team_nodes_and_are_preempted(cluster, isolation, team_ns, namespace,
                                                                    run_id, profile, figures):
    """Low-priority pods borrow idle nodes of every team and are preempted (with a Preempted event) when the team's own
    whole-node pods want those nodes back. Red: borrowing did not happen, or a team could not reclaim its nodes."""
    _need(isolation, ADMISSION, LOW_PRIORITY)
    api, rules, teams, k = cluster.api, isolation.rules, list(profile.teams), profile.taint_borrow_nodes
    low = profile.low_priority_class

    def idle():
        nodes, busy = pl.read_nodes(api, profile.pool_label), pl.busy_nodes(api)
        return {team: sorted(n for n, i in nodes.items() if i.pool == f"team-{team}" and i.ready
                             and not i.unschedulable and not busy[n])[:k] for team in teams}
    chosen = wait_for(idle, until=lambda c: all(len(v) == k for v in c.values()), timeout=profile.taint_timeout_s,
                      interval=2, what=f"{k} idle node(s) in every team pool (earlier pods gone)")
    lows = {f"low-{team}-{i}": team for team in teams for i in range(k)}
    admitted = create_pods(api, namespace, [
        check_pod(name, run_id, "borrow", gpus=profile.node_gpus, priority_class=low, hostnames=chosen[team])
        for name, team in lows.items()])
    run = Borrowing(problems=[why for pod in admitted.values()
                              if (why := _exact(rules, pod, [rules.toleration(x) for x in teams]))])
    took = stopwatch()
    now, _ = pl.wait_settled(api, namespace, admitted, profile.taint_timeout_s,
                             f"{len(lows)} low-priority pods bound on idle team nodes", bound=set(lows))
    run.borrow_s = took()
    figures.add("low-priority pods created -> bound on idle team nodes", run.borrow_s, "s",
                profile.taint_timeout_s)
    for name, team in lows.items():
        node = now[name]
        if node not in chosen[team]:
            run.problems.append(f"pod {namespace}/{name} borrowed node {node}, not one of team {team}'s idle nodes")
    holders = {now[name]: name for name in lows}
    _placement(cluster, isolation, [namespace], {}, "low-priority pods borrowing idle team nodes")

    # The teams want their nodes back: one whole-node pod per borrowed node.
    wanted, took = {}, stopwatch()
    for team in teams:
        wanted[team_ns[team]] = create_pods(api, team_ns[team], [
            check_pod(f"{team}-reclaim-{i}", run_id, "reclaim", gpus=profile.node_gpus, hostnames=chosen[team])
            for i in range(k)])
    for ns, pods in wanted.items():    # all created at once: one bound for all, not one per team
        try:
            pl.wait_settled(api, ns, pods, max(1.0, profile.taint_timeout_s - took()),
                            f"team pods in {ns} bound on their nodes", bound=set(pods))
        except AssertionError as e:
            if not _retried_at_flush(api, namespace, ns, pods, run):   # borrowers still running are named below
                unsettled = str(e).splitlines()[0].partition("; unsettled: ")[2]
                run.problems.append(f"team pods in {ns} not bound on their nodes {profile.taint_timeout_s:g} s after "
                                    f"the teams asked for them back: {unsettled}")
    run.reclaim_s = took()
    figures.add("team pods created -> bound on their reclaimed nodes (preemption, all teams)", run.reclaim_s, "s")
    _placement(cluster, isolation, list(team_ns.values()), _team_of(team_ns), "teams reclaiming their nodes")
    left = check_pods(api, namespace, "borrow")
    kept = {name for name, pod in left.items() if not terminating(pod) and pod["spec"].get("nodeName") in holders}
    for name in sorted(kept):
        run.problems.append(f"low-priority pod {namespace}/{name} still runs on {left[name]['spec']['nodeName']} "
                            "after its team asked for the node back")
    gone = set(lows) - kept     # a pod still running is a problem already: no event to wait for
    try:
        wait_for(lambda: pod_events(api, namespace, PREEMPTED_REASON, admitted), until=lambda ev: gone <= set(ev),
                 timeout=30, interval=1, what="a Preempted event for every low-priority pod gone")
    except AssertionError as e:
        run.problems.append(str(e))
    figures.add("borrowing/preemption problems", run.problem_count, "", 0)
    assert not run.problems, f"{run.problem_count} borrowing/preemption problem(s): " + _names(run.problems)
    if run.parked:
        pytest.xfail(f"known upstream defect {preemption.UPSTREAM}: " + "; ".join(run.parked))


def _retried_at_flush(api, victims_ns: str, ns: str, pods: dict[str, dict], run: Borrowing) -> bool:
    """True if every team pod of ``ns`` still unbound had finished its preemption and kube-scheduler parked it
    (``preemption.parked``: the known upstream defect), and each was then bound within the scheduler's own
    flush bound; its delay is kept in ``run.parked``. Parked but not bound by then is a problem of its own.
    False (nothing recorded) when any unbound pod is not in that case: the caller reports the timeout."""
    now = check_pods(api, ns, "reclaim")
    waiting = {n: pods[n]["metadata"]["uid"] for n in pods if not now.get(n, {}).get("spec", {}).get("nodeName")}
    stuck = preemption.parked(waiting, preemption.read_preempted(api, victims_ns), pl.busy_nodes(api))
    if not waiting or set(stuck) != set(waiting):
        return False
    allure.attach("\n".join(f"{p.pod}: preempted on node {p.node} at {p.preempted_at:%H:%M:%S}, victim gone, "
                            "not retried" for p in stuck.values()),
                  f"team pods parked by kube-scheduler after their preemption ({preemption.UPSTREAM})",
                  allure.attachment_type.TEXT)
    limit = preemption.flush_deadline_s(stuck)
    try:
        got = wait_for(lambda: check_pods(api, ns, "reclaim"), timeout=limit, interval=2,
                       until=lambda pods_now: all(pods_now.get(n, {}).get("spec", {}).get("nodeName") for n in stuck),
                       what=f"parked team pods in {ns} retried by kube-scheduler's unschedulable-pool flush")
    except AssertionError:
        run.problems.append(f"team pod(s) {', '.join(f'{ns}/{n}' for n in sorted(stuck))} not bound "
                            f"{preemption.FLUSH_S + preemption.SLACK_S} s after their preemption finished (victims "
                            "gone, nodes free): kube-scheduler retries a parked pod within "
                            f"{preemption.FLUSH_S} s (its unschedulable pool's flush), so it never retried them")
        return True
    for name, p in sorted(stuck.items()):
        at = preemption.bound_at(got[name])
        late = f"{(at - p.preempted_at).total_seconds():.0f} s" if at else "(no PodScheduled time)"
        run.parked.append(f"{ns}/{name} preempted on {p.node} at {p.preempted_at:%H:%M:%S}, parked with its victim "
                          f"gone, bound {late} later by the scheduler's unschedulable-pool flush")
    return True


def _own_taint_key(cluster, key: str, name: str) -> str:
    """``key`` on the run's own scratch nodes; on a borrowed node of a cluster the harness does not own, a check
    taint of its own (``check.clusterproof.io/<name>``): the run may add no taint of a key a site may use for its
    teams or preflight (clusterproof/kube/rbac-destructive.yaml), and scheduling and eviction by taint do not
    depend on the key."""
    if cluster.owned:
        return key
    own = CHECK_TAINTS + name
    allure.dynamic.parameter(f"taint key on the borrowed node instead of {key}",
                             f"{own} (the harness adds only taints of its own to a node it does not own)",
                             excluded=True)
    return own


def _scratch(cluster, profile, run_id, tag, taints=()):
    """A node for one check: a fresh kwok node (the harness's own cluster), or an idle borrowed one (skipped,
    saying why, when no node runs nothing but this run's pods)."""
    if cluster.owned:
        return create_scratch_nodes(cluster.api, profile, run_id, tag, taints=list(taints))[0]
    try:
        return borrow_idle_node(cluster.api, profile, run_id, list(taints), record=cluster.record)
    except NotIdle as e:
        pytest.skip(str(e))


@pytest.mark.smoke
@pytest.mark.destructive  # taints a node
def test_noexecute_team_taint_evicts_running_pods_but_noschedule_does_not(cluster, isolation, team_ns,
                                                                          namespace, run_id, profile, figures):
    """A NoExecute team taint evicts the running pods that do not tolerate it (TaintManagerEviction) and keeps the one
    that does; the NoSchedule taint before it disturbs nobody. Red: a pod evicted that should stay, or left running
    that should have gone."""
    api, rules, teams = cluster.api, isolation.rules, list(profile.teams)
    team = teams[0]
    key = _own_taint_key(cluster, rules.taint_key, "team")
    node = _scratch(cluster, profile, run_id, f"evict-{run_id[-4:]}-{namespace[-4:]}")
    noschedule = {"key": key, "value": team, "effect": "NoSchedule"}
    noexecute = {"key": key, "value": team, "effect": "NoExecute"}
    try:
        here = dict(node_selector=node.selector)
        plan = [(namespace, "no-team", [node.toleration])]
        if len(teams) > 1:
            plan.append((team_ns[teams[1]], f"team-{teams[1]}", [node.toleration]))
        tolerant = (team_ns[team], f"team-{team}-tolerates-noexecute",
                    [node.toleration, {"key": key, "operator": "Equal", "value": team,
                                       "effect": "NoExecute"}])
        created = {(ns, name): create_pods(api, ns, [check_pod(name, run_id, "evict", tolerations=tols, **here)])
                   for ns, name, tols in [*plan, tolerant]}
        sel = f"{CHECK_LABEL}=evict,{RUN_LABEL}={run_id}"
        wait_for(lambda: {p["metadata"]["name"]: p["status"].get("phase")
                          for p in list_raw(api, "/api/v1/pods", {"labelSelector": sel})["items"]},
                 until=lambda s: len(s) == len(plan) + 1 and all(v == "Running" for v in s.values()),
                 timeout=profile.taint_timeout_s, interval=0.5, what=f"pods Running on {node.name}",
                 explain=lambda s: explain_pods(api, None, [f"{ns}/{n}" for ns, n in created
                                                            if s.get(n) != "Running"], len(created)))

        node.taint(noschedule)
        disturbed = pl.watch_for_changes(api, sel, profile.taint_observe_s, _left_running)
        run = Eviction(problems=[f"pod {p} {why} after {node.name} got {noschedule['key']}={team}:NoSchedule"
                                 for p, why in disturbed.items()])

        try:
            node.taint(noexecute)
        except NotIdle as e:   # someone else's pod arrived on the borrowed node: never evict it
            if run.problems:
                pytest.fail(f"taint eviction on node {node.name}: " + _names(run.problems) + f" (then: {e})",
                            pytrace=False)
            pytest.skip(str(e))
        victims, took = {(ns, name) for ns, name, _ in plan}, stopwatch()
        try:
            wait_for(lambda: {(ns, n) for ns, n in victims if terminating(check_pods(api, ns, "evict").get(n))},
                     until=lambda gone: gone == victims, timeout=profile.taint_timeout_s, interval=0.5,
                     what=f"pods without a NoExecute toleration evicted from {node.name}",
                     explain=lambda gone: explain_pods(api, None, [f"{ns}/{n}" for ns, n in victims - gone],
                                                       len(victims)))
            run.evict_s = took()
        except AssertionError as e:
            run.problems.append(f"{e} (node {node.name} has {key}={team}:NoExecute)")
        # A headline only when measured: a timeout is the problem above, not a figure to compare.
        figures.add("NoExecute taint -> pods without its toleration evicted", run.evict_s, "s",
                    profile.taint_timeout_s, headline=run.evict_s is not None)
        for ns, name in sorted(victims):
            try:
                wait_for(lambda ns=ns, name=name: pod_events(api, ns, EVICTION_REASON, created[(ns, name)]).get(name),
                         timeout=30, interval=1,
                         what=f"a {EVICTION_REASON} event for pod {ns}/{name}")
            except AssertionError as e:
                run.problems.append(str(e))
        survived = pl.watch_for_changes(api, f"{CHECK_LABEL}=evict,{RUN_LABEL}={run_id}",
                                       profile.taint_observe_s,
                                       lambda kind, p: _left_running(kind, p)
                                       if p["metadata"]["name"] == tolerant[1] else None)
        run.problems += [f"pod {p} {why} although it tolerates {key}={team}:NoExecute"
                         for p, why in survived.items()]
        _placement(cluster, isolation, [namespace, *team_ns.values()], _team_of(team_ns), "NoExecute eviction")
    finally:
        node.release()
    figures.add("taint eviction problems", run.problem_count, "", 0)
    assert not run.problems, f"taint eviction on node {node.name}: " + _names(run.problems)


def _left_running(kind: str, pod: dict) -> str | None:
    if kind == "DELETED":
        return "was deleted"
    if pod["metadata"].get("deletionTimestamp"):
        return "is being deleted"
    if pod["status"].get("phase") not in (None, "Pending", "Running"):
        return f"went {pod['status'].get('phase')}"
    return None


@pytest.mark.smoke
def test_preflight_nodes_receive_no_work(cluster, isolation, request, namespace, run_id, profile, figures):
    """Observational (safe on any cluster): pods that may go only to nodes carrying the preflight
    taint -- a plain pod, a team pod, a low-priority borrower -- all stay Pending (the team pod and the borrower
    where the cluster has team namespaces and the class). Red: a pod got work on a preflight node (named)."""
    api = cluster.api
    nodes = pl.read_nodes(api, profile.pool_label)
    pre = sorted(n for n, i in nodes.items() if i.has_taint(profile.preflight_taint_key))
    if not pre:
        pytest.skip(f"no node carries the preflight taint {profile.preflight_taint_key}: nothing to observe")
    team, team_ns = profile.teams[0], _optional_team_ns(request, isolation)
    hosts = pre[:50]
    plan = {namespace: [check_pod("no-team", run_id, "preflight", hostnames=hosts)]}
    if _low_priority(isolation):
        plan[namespace].append(check_pod("low-priority", run_id, "preflight", hostnames=hosts,
                                         priority_class=profile.low_priority_class))
    if team_ns:
        plan[team_ns[team]] = [check_pod(f"team-{team}", run_id, "preflight", hostnames=hosts)]
    run = Judged()
    for ns, bodies in plan.items():
        now, ev = pl.wait_settled(api, ns, create_pods(api, ns, bodies), profile.taint_timeout_s,
                                  f"pods aimed at the {len(pre)} preflight node(s) refused by the scheduler")
        for name, node in now.items():
            if node:
                run.problems.append(f"pod {ns}/{name} landed on {node}, which carries "
                                    f"{profile.preflight_taint_key}")
            elif pl.untolerated_count(ev.get(name, [])) is None:
                run.problems.append(f"pod {ns}/{name} is Pending without an untolerated-taint refusal from the "
                                    "scheduler")
    # And no pod of this run, anywhere, sits on a node carrying the preflight taint.
    for p in list_raw(api, "/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]:
        node = p["spec"].get("nodeName")
        if node in pre:
            run.problems.append(f"pod {p['metadata']['namespace']}/{p['metadata']['name']} runs on preflight "
                                f"node {node}")
    _placement(cluster, isolation, list(plan), _team_of(team_ns), "pods aimed at preflight nodes")
    figures.add("pods with work on preflight nodes", run.problem_count, "pods", 0)
    assert not run.problems, f"{run.problem_count} pod(s) got work on preflight nodes: " + _names(run.problems)


@pytest.mark.smoke
@pytest.mark.destructive  # creates (simulated) or taints (real hardware) a node
def test_new_node_gets_work_only_once_its_preflight_taint_is_removed(cluster, isolation, request, namespace,
                                                                      run_id, profile, figures):
    """A new node behind the preflight taint gets no pod, whoever asks for it (plain, team or low-priority pods, the
    latter two where the cluster has team namespaces and the class), and gets them all once the taint is removed.
    Red: a pod bound early, or elsewhere after the taint went."""
    api = cluster.api
    team, team_ns, low = profile.teams[0], _optional_team_ns(request, isolation), _low_priority(isolation)
    preflight = {"key": _own_taint_key(cluster, profile.preflight_taint_key, "preflight"),
                 "value": "pending", "effect": "NoSchedule"}
    node = _scratch(cluster, profile, run_id, f"preflight-{run_id[-4:]}-{namespace[-4:]}", [preflight])
    try:
        here = dict(node_selector=node.selector, tolerations=[node.toleration])
        plan = {namespace: [check_pod("no-team", run_id, "new-node", **here)]}
        if low:
            plan[namespace].append(check_pod("low-priority", run_id, "new-node",
                                             priority_class=profile.low_priority_class, **here))
        if team_ns:
            plan[team_ns[team]] = [check_pod(f"team-{team}", run_id, "new-node", **here)]
        run, created = NewNode(), {}
        for ns, bodies in plan.items():
            created[ns] = create_pods(api, ns, bodies)
            now, ev = pl.wait_settled(api, ns, created[ns], profile.taint_timeout_s,
                                      f"pods aimed at new node {node.name} refused while it carries "
                                      "the preflight taint")
            run.problems += [f"pod {ns}/{n} landed on {where} while {node.name} carries {profile.preflight_taint_key}"
                             for n, where in now.items() if where]
            run.problems += [f"pod {ns}/{n} is Pending without an untolerated-taint refusal from the scheduler"
                             for n, where in now.items()
                             if not where and pl.untolerated_count(ev.get(n, [])) is None]
        sel = f"{CHECK_LABEL}=new-node,{RUN_LABEL}={run_id}"
        early = pl.watch_for_changes(api, sel, profile.taint_observe_s,
                                    lambda kind, p: p["spec"].get("nodeName") and f"bound to {p['spec']['nodeName']}")
        run.problems += [f"pod {p} was {why} while the preflight taint was on" for p, why in early.items()]

        node.untaint(preflight)
        took = stopwatch()
        for ns, pods in created.items():
            now, _ = pl.wait_settled(api, ns, pods, profile.taint_timeout_s,
                                     f"pods bound once {node.name} lost its preflight taint", bound=set(pods))
            run.problems += [f"pod {ns}/{n} went to {where}, not the new node {node.name}"
                             for n, where in now.items() if where != node.name]
        run.bind_s = took()
        figures.add("preflight taint removed -> pods bound on the new node", run.bind_s, "s")
        _placement(cluster, isolation, list(plan), _team_of(team_ns), "new node behind the preflight taint")
    finally:
        node.release()
    figures.add("preflight taint problems", run.problem_count, "", 0)
    assert not run.problems, f"preflight taint on new node {node.name}: " + _names(run.problems)
