"""API server 429 behaviour: under overload only the flooding flow gets 429 with Retry-After; system flows keep working.

API Priority and Fairness (APF) is Kubernetes' answer to one client
overloading the API servers: each request is classified by a FlowSchema into
a PriorityLevel with its own seats, and overload is shed with 429 +
``Retry-After`` on that level while node heartbeats, controllers and other
tenants keep working. What must hold:

- read-only, on every cluster: the cluster's FlowSchemas and levels match the
  profile (node heartbeats in ``apf_node_flow_schema``, kube-scheduler and
  kube-controller-manager in ``apf_controller_flow_schemas``, each with a level
  of its own; the load identity neither exempt nor in a system level; no level
  queueing more than ``apf_max_queue_depth``), and the system components'
  flow schemas actually dispatch their traffic (the apiserver's own counters);
- under a flood (locust, ``load/flood.py``: pod creates, LISTs, GETs back to
  back from one identity, far past its level's seats; destructive): the flood
  gets 429s, every one with ``Retry-After`` and the APF headers of the run's
  own FlowSchema and level, rejections grow for that level only, and no
  request anywhere gets a 5xx or no answer;
- meanwhile system flows are protected: every node Lease keeps renewing and
  no node turns NotReady; kube-scheduler and kube-controller-manager keep
  working (a well-behaved identity's pods start within the pod-startup SLO);
  that identity gets no 429 and keeps mutating p99 within the SLO;
- clients that honour ``Retry-After`` lose nothing (every pod the flood meant
  to create exists exactly once); a client that retries at once is measured
  beside them;
- after the flood the level's queues drain and the well-behaved client's
  latency is back at its baseline within ``apf_recovery_s``.

Negative controls (tests/test_api_overload_controls.py): the flood's
FlowSchema pointed at the ``exempt`` level (the protection checks fail naming
the flow that was not protected); the flood's level given deep queues
instead of Reject (the shed check fails naming the level); a profile whose
expectations do not match the cluster (the read-only check names the
object); kwokctl's shared admin certificate for every component (the
classification check names the flow schemas that dispatched nothing); a
client that gives up after one 429 (objects are lost); an etcd that stalls
after the flood (latency does not recover).
"""
from __future__ import annotations

import json

import allure
import pytest

from clusterproof.apf import flood as fm
from clusterproof.apf.flood_plan import pod_names
from clusterproof.apf.joinstorm import MODES as JOIN_MODES
from clusterproof.apf.joinstorm import comparison
from clusterproof.apf.overload import plots
from clusterproof.cluster.identities import IDENTITIES
from clusterproof.core.stats import percentile
from clusterproof.kube import flowcontrol as apf

SHOW = 8


def _names(xs, n: int = SHOW) -> str:
    xs = list(xs)
    return ", ".join(map(str, xs[:n])) + (f" ... ({len(xs)} in all)" if len(xs) > n else "")


# --- read-only: the cluster's APF objects and where its system traffic goes ---------------------

@pytest.mark.smoke
def test_apf_objects_meet_the_profile_expectations(cluster, apf_config, profile, run_id, figures):
    """The cluster's FlowSchemas and PriorityLevels are what the profile expects: node heartbeats and the controllers
    each in a flow schema of their own, the load identity neither exempt nor in a system level, no level queueing
    deeper than ``apf_max_queue_depth``. Read-only. Red: the message names each object that differs."""
    problems = apf.expectation_problems(apf_config, profile.apf_node_flow_schema, profile.apf_controller_flow_schemas,
                                        f"cp-{run_id[-4:]}-flood", "clusterproof-load", profile.apf_max_queue_depth)
    allure.attach("\n".join(f"{f['spec'].get('matchingPrecedence')}: {f['metadata']['name']} -> "
                            f"{apf_config.level_of(f)}" for f in apf_config.flow_schemas),
                  "FlowSchemas by matching precedence", allure.attachment_type.TEXT)
    figures.add("expectations not met", len(problems), "", 0)
    assert not problems, ("the cluster's API Priority and Fairness objects do not match the profile: "
                          + "; ".join(problems))


@pytest.mark.smoke
def test_system_components_are_classified_into_their_own_flow_schemas(cluster, apf_config, profile, figures):
    """The apiserver's own counters (since it started) show node, scheduler and controller traffic in the
    flow schemas the profile names -- not in ``exempt``. Red: a flow schema dispatched nothing, its traffic went
    elsewhere (named)."""
    counts = apf.dispatched(apf.scrape(cluster.api))
    by_fs = {}
    for (fs, pl), n in counts.items():
        by_fs.setdefault(fs, []).append((pl, int(n)))
    allure.attach("\n".join(f"{fs} -> {pl}: {n}" for fs, rows in sorted(by_fs.items()) for pl, n in rows),
                  "requests dispatched per flow schema since the apiserver started", allure.attachment_type.TEXT)
    idle = []
    for fs in [profile.apf_node_flow_schema, *profile.apf_controller_flow_schemas]:
        n = sum(x for _, x in by_fs.get(fs, []))
        figures.add(f"requests dispatched by {fs}", n, "", 1, ">=")
        if n == 0:
            owner = next((i for i in IDENTITIES if fs in i.flow_schemas), None)
            who = f" ({owner.component}, user {owner.user})" if owner and cluster.kwok is not None else ""
            idle.append(f"FlowSchema {fs}{who} dispatched no request since the apiserver started")
    exempt = sum(n for pl, n in by_fs.get("exempt", []))
    assert not idle, ("system traffic is not classified where the profile expects it: " + "; ".join(idle)
                      + f" -- its requests went elsewhere (exempt dispatched {exempt}: a component authenticating "
                        "as system:masters is never queued or rejected)")


# --- the flood (destructive) ------------------------------------------------------------------

def _unprotected(run, flow_name: str) -> str | None:
    """Why ``flow_name`` was not protected from the flood by APF (None: the flood was in its own limited level)."""
    f = run.flow
    if f.level_type != "Limited":
        return (f"{flow_name} was not protected from the flood: the flood's FlowSchema {f.schema} sends "
                f"{f.user} to PriorityLevel {f.level}, which is {f.level_type.lower()} (never queued or rejected), "
                "so nothing stood between the flood and it")
    return None


@pytest.mark.destructive
@pytest.mark.smoke
def test_overload_is_shed_with_429_and_retry_after(flood, profile, figures):
    """A flood from one identity, far past its level's seats, is shed with 429s that carry ``Retry-After`` and the APF
    headers of its own FlowSchema and level, and no other level rejects anything. Red: the flood was queued or
    absorbed instead of rejected, a 429 lacked ``Retry-After``, or a request got a 5xx or no answer."""
    run = flood
    for plot in plots(run, profile):
        plot.attach()
    allure.attach(json.dumps(run.summary, indent=2), "flood: responses per client kind", allure.attachment_type.JSON)
    kinds = run.clients().values()
    r429 = sum(k.responses_429 for k in kinds)
    total = sum(k.responses_total for k in kinds)
    no_retry_after = sum(k.without_retry_after for k in kinds)
    elsewhere = sum(k.classified_elsewhere for k in kinds)
    unheaded = sum(k.without_apf_headers for k in kinds)
    no_answer = sum(k.no_response for k in kinds)
    rejected = run.rejected_delta()
    ours = sum(v for (fs, pl, _r), v in rejected.items() if pl == run.flow.level)
    others = {f"{fs} -> {pl} ({reason})": int(v) for (fs, pl, reason), v in rejected.items() if pl != run.flow.level}
    errors5 = run.server_errors()
    figures.add("429 responses to the flood", r429, "", 1, ">=")
    figures.add("429s without Retry-After", no_retry_after, "", 0)
    figures.add("rejections of other levels", sum(others.values()), "", 0)
    figures.add("5xx responses (apiserver, all flows)", sum(errors5.values()), "", 0)
    level = f"PriorityLevel {run.flow.level} ({run.flow.level_type}; FlowSchema {run.flow.schema})"
    assert r429 > 0 and ours > 0, (
        f"the flood was not shed: {total} requests from {profile.apf_flood_users} users over "
        f"{profile.apf_flood_s:g} s got no 429 in {level} (apiserver counted {int(ours)} rejections there); "
        "its overload was queued or absorbed instead of rejected -- check the level's limitResponse (Reject, or "
        "queues small enough to fill)")
    assert no_retry_after == 0, f"{no_retry_after} of {r429} 429 responses had no Retry-After header"
    assert elsewhere == 0 and unheaded == 0, (
        f"{elsewhere} flood responses carried another FlowSchema/level UID "
        f"(e.g. {run.other_classification}) "
        f"and {unheaded} none, instead of {run.flow.fs_uid}/{run.flow.pl_uid} ({level})")
    assert not others, f"rejections outside the flood's level: {others}"
    assert not errors5 and no_answer == 0, (
        f"requests failed during the flood: apiserver 5xx by verb/group/resource/subresource/code "
        f"{ {'/'.join(k): int(v) for k, v in errors5.items()} }, {no_answer} flood requests without an answer")


@pytest.mark.destructive
@pytest.mark.smoke
def test_node_heartbeats_keep_renewing_during_the_flood(flood, profile, figures):
    """During the flood every node Lease that falls due is renewed within its interval plus ``apf_heartbeat_slack_s``,
    and no node turns NotReady. Red: node heartbeats were not protected from the flood (the lease or the nodes are
    named)."""
    run = flood
    node = next((f for f in run.config.flow_schemas if f["metadata"]["name"] == profile.apf_node_flow_schema), None)
    flow = f"node heartbeats ({profile.apf_node_flow_schema} -> {run.config.level_of(node) if node else '?'})"
    why = _unprotected(run, flow)
    assert why is None, why
    slack = profile.apf_heartbeat_slack_s
    during = [s for s in run.leases if run.phases.flood <= s.t <= run.phases.end]
    worst = max(during, key=lambda s: s.late_s, default=None)
    renewed = sum(s.renewed for s in during)
    figures.add("most overdue node lease renewal during the flood", worst.late_s if worst else None, "s", slack)
    # Reported, not asserted: leases created together renew together, so a short flood may fall between
    # two waves of renewals; what must hold is that none that fell due was late.
    figures.add("lease renewals seen during the flood", renewed, "")
    figures.add("nodes NotReady or flapping", len(run.flapped), "", 0)
    assert not run.flapped, f"{flow}: nodes turned NotReady during the flood: {_names(run.flapped)}"
    assert during, "no lease sample was taken during the flood (the lease list failed)"
    assert worst.late_s <= slack, (
        f"{flow}: lease {worst.late} was last renewed {worst.age_s:g} s before a sample during the flood, "
        f"{worst.late_s:g} s later than its renew interval (lease duration / 4, +4 % jitter) allows; the slack "
        f"is {slack:g} s (apf_heartbeat_slack_s)")


@pytest.mark.destructive
@pytest.mark.smoke
def test_controllers_keep_scheduling_during_the_flood(flood, profile, figures):
    """Pods the well-behaved identity creates during the flood are bound by kube-scheduler and started
    within the pod-startup SLO (by the pods' own timestamps). Red: the flood starved kube-scheduler or
    kube-controller-manager."""
    run = flood
    flows = ", ".join(profile.apf_controller_flow_schemas)
    why = _unprotected(run, f"kube-scheduler and kube-controller-manager ({flows})")
    assert why is None, why
    started = [p.startup_server_s for p in run.probe_pods if p.startup_server_s is not None]
    p99 = percentile(started, 99) if started else None
    figures.add("pods started during the flood", len(started), "pods", run.probe_pods_planned, ">=")
    figures.add("pod startup p99 (timestamps)", p99, "s", profile.slo_pod_startup_p99_s)
    unstarted = [p.name for p in run.probe_pods if p.startup_server_s is None]
    assert len(started) == run.probe_pods_planned and run.probe_pods_planned > 0, (
        f"{run.probe_pods_planned} pods were created during the flood, {len(started)} started; not started: "
        f"{_names(unstarted)}")
    assert p99 <= profile.slo_pod_startup_p99_s, (
        f"pod startup SLO (p99 <= {profile.slo_pod_startup_p99_s:g} s) broken during the flood: p99 {p99:g} s "
        f"over {len(started)} pods (kube-scheduler/kube-controller-manager in {flows})")


@pytest.mark.destructive
@pytest.mark.smoke
def test_a_well_behaved_client_is_not_throttled_during_the_flood(flood, profile, figures):
    """A well-behaved identity in a level of its own gets no 429 and no 5xx during the flood, and its mutating p99
    stays within the SLO. Red: the flood spilled over onto other tenants."""
    run = flood
    fs, pl = run.probe_class
    why = _unprotected(run, f"the well-behaved client ({fs} -> {pl})")
    assert why is None, why
    during = fm.latency_figures(run.probe_in("flood"))
    base = fm.latency_figures(run.probe_in("baseline"))
    figures.add("well-behaved 429s during the flood", during.responses_429, "", 0)
    figures.add("well-behaved mutating p99 during the flood", during.mutating_p99_s, "s", profile.slo_mutating_p99_s)
    figures.add("well-behaved mutating p99 before the flood", base.mutating_p99_s, "s")
    assert pl != run.flow.level, f"the well-behaved client shares the flood's PriorityLevel {pl}"
    assert during.requests > 0, "the well-behaved client sent nothing during the flood"
    assert during.responses_429 == 0 and during.responses_5xx == 0 and during.no_response == 0, (
        f"the well-behaved client ({fs} -> {pl}) was throttled during the flood: {during.to_dict()}")
    assert during.mutating_p99_s <= profile.slo_mutating_p99_s, (
        f"mutating API call SLO (p99 <= {profile.slo_mutating_p99_s:g} s) broken for the well-behaved client "
        f"({fs} -> {pl}) during the flood: p99 {during.mutating_p99_s:g} s (before the flood "
        f"{base.mutating_p99_s} s)")


@pytest.mark.destructive
@pytest.mark.smoke
def test_clients_that_honour_retry_after_lose_nothing(flood, profile, figures):
    """Every pod the flood's clients meant to create exists exactly once: a client that honours ``Retry-After`` loses
    nothing to being shed (one that retries at once is measured beside it). Red: objects were lost, duplicated or
    given up on (named)."""
    run = flood
    kinds = run.clients()
    lines = []
    for kind, k in kinds.items():
        planned = k.planned
        exists = sorted(run.existing_pods.get(kind, []))
        figures.add(f"429s per created pod ({kind} clients)", round(k.per_created_pod_429, 2), "")
        # A locust worker lost mid-flood (reported on the flood's page) took its share's outcome with it: those
        # names are neither demanded nor unplanned. Duplicates of them are still caught.
        unjudged = set(k.lost_share)
        if unjudged:
            figures.add(f"planned pods of lost locust workers, not judged ({kind} clients)", len(unjudged), "pods")
        want = [n for n in pod_names(kind, planned) if n not in unjudged]
        missing = sorted(set(want) - set(exists))
        extra = sorted(set(exists) - set(want) - unjudged)
        dup = len(exists) - len(set(exists))
        if missing or extra or dup or not planned:
            lines.append(f"{kind} clients: {len(set(exists) & set(want))} of {planned} planned pods exist; missing "
                         f"{_names(missing)}; gave up after {profile.apf_flood_max_attempts} attempt(s): "
                         f"{_names(k.gave_up)}; unplanned {_names(extra)}; duplicates {dup}")
    h, i = kinds.values()
    allure.attach(f"clients that honour Retry-After: {h.responses or None}\nclients that retry at once: "
                  f"{i.responses or None}\n429s per created pod: {h.per_created_pod_429:.2f} vs "
                  f"{i.per_created_pod_429:.2f}",
                  "honouring vs impatient clients", allure.attachment_type.TEXT)
    assert not lines, "the flood lost objects: " + "; ".join(lines)


@pytest.mark.destructive
@pytest.mark.smoke
def test_apf_queues_drain_and_latency_recovers_after_the_flood(flood, profile, figures):
    """After the flood the level's queues drain and the well-behaved client's latency is back at its baseline within
    ``apf_recovery_s``. Red: the cluster stayed slow after the load stopped."""
    run = flood
    took = None if run.phases.recovered is None else run.phases.recovered - run.phases.flood_end
    base = fm.latency_figures(run.probe_in("baseline"))
    figures.add("flood end -> recovered", took, "s", profile.apf_recovery_s, headline=True)
    figures.add("well-behaved p99 before the flood", base.p99_s, "s")
    assert took is not None, (
        f"no recovery within {profile.apf_recovery_s:g} s after the flood: {run.recovery_note} (PriorityLevel "
        f"{run.flow.level}; the well-behaved client's baseline p99 {base.p99_s} s)")


# --- node-join storm (destructive; the embedded cluster the harness started only) -----------------

@pytest.mark.destructive
@pytest.mark.smoke
def test_joining_nodes_are_classified_like_kubelets(join_storm, apf_config, profile, figures):
    """Every registration's response headers name the FlowSchema and level of kubelets' node writes. Red:
    joining nodes were classified elsewhere (named)."""
    schema = apf_config.schema(profile.apf_node_flow_schema)
    expected = (f"flowschemas/{profile.apf_node_flow_schema} -> "
                f"prioritylevelconfigurations/{apf_config.level_of(schema)}")
    allure.attach(comparison(join_storm), "node join: paced vs storm", allure.attachment_type.JSON)
    wrong = {m: {k: n for k, n in r.classified.items() if k != expected} for m, r in join_storm.items()}
    wrong = {m: w for m, w in wrong.items() if w}
    figures.add("joins classified elsewhere", sum(sum(w.values()) for w in wrong.values()), "", 0)
    assert not wrong, (f"node registrations (as system:node:<name> in system:nodes) went elsewhere than "
                       f"{expected}: {wrong}")


@pytest.mark.destructive
@pytest.mark.smoke
@pytest.mark.parametrize("mode", [pytest.param(m, id=m) for m in JOIN_MODES])
def test_existing_nodes_stay_ready_while_nodes_join(join_storm, mode, profile, figures):
    """While a batch of nodes joins (paced, or all at once as a storm), every one registers and turns Ready within
    ``apf_join_timeout_s``, no existing node turns NotReady and the apiserver answers no 5xx. Red: the join hurt the
    nodes already there, or did not complete."""
    run = join_storm[mode]
    f = run.figures()
    allure.attach(json.dumps(f.to_dict(), indent=2), f"node join ({mode}): figures", allure.attachment_type.JSON)
    figures.add("joined nodes", f.registered, "nodes", run.nodes, ">=")
    figures.add("first registration -> all Ready", f.seconds_to_all_ready, "s", profile.apf_join_timeout_s,
                headline=True)
    figures.add("join 429s (retried)", f.join_429, "")
    figures.add("well-behaved p99 during the join", f.well_behaved_client.p99_s, "s")
    figures.add("existing nodes NotReady", len(run.flapped), "", 0)
    assert not run.flapped, (f"existing nodes turned NotReady while {run.nodes} nodes joined ({mode}): "
                             f"{_names(run.flapped)}")
    assert f.registered == run.nodes, (
        f"{f.registered} of {run.nodes} nodes registered ({mode}); 429s {f.join_429}, given up "
        f"{f.join_given_up}, 5xx {f.join_5xx}, no answer {f.join_no_response}")
    assert f.seconds_to_all_ready is not None, (
        f"not every joined node was Ready within {profile.apf_join_timeout_s} s ({mode}): {run.tracker}")
    assert not f.apiserver_5xx, f"the apiserver answered 5xx while nodes joined ({mode}): {f.apiserver_5xx}"
