"""A training job's pods are bound all together or not at all.

MPI ranks are useless unless every one of them starts, and a half-placed job
holds GPUs that another job could use. Every check runs against each gang
scheduler (test id ``[coscheduling]`` / ``[native]``):

- coscheduling: the Coscheduling plugin (scheduler-plugins v0.34.7, PodGroup
  CRD). On the embedded cluster it runs as a second scheduler, a component
  of the cluster; on an existing cluster ``gang_scheduler_name`` names the
  one it runs.
- native: Kubernetes' own gang scheduling (KEP-4671), on profiles that ask
  for it (``gang_native``), in the API the server's discovery shows served:
  1.35's alpha (a Workload, pods' ``spec.workloadRef``), 1.36's v1alpha2 and
  1.37's v1beta1 (a Workload template, a PodGroup, pods'
  ``spec.schedulingGroup``); not served: skipped with what would enable it.

Checks 1-3 use a few scratch kwok nodes of their own (label and taint
``clusterproof.io/scratch``) so free capacity is exact (so they run only on
the embedded cluster the harness started, and are skipped elsewhere); every pod is a
whole-node GPU pod (``nvidia.com/gpu: 8``). Check 4 runs one gang over the
profile's pools; its size is profile data (``gang_scale_size``: 50 on smoke,
4,000 on nightly).
Negative control: tests/test_gang_controls.py points the suite at the stock
kube-scheduler (no gang plugin) and shows that it fails, naming the
partially bound gang.
"""
from __future__ import annotations

import json
import time

import allure
import pytest

from clusterproof.cluster.node_plan import node_plan
from clusterproof.core import kubeversions
from clusterproof.core.waiting import wait_for
from clusterproof.gang import gangs as g
from clusterproof.gang import jobs
from clusterproof.gang.gangs import LEGACY_NATIVE_API
from clusterproof.gang.schedulers import probe_once
from clusterproof.kube.apimetrics import features
from clusterproof.kube.client import check_reachable

# --- checks ---------------------------------------------------------------------

@pytest.mark.smoke
def test_gang_is_bound_all_together_or_not_at_all(cluster, backend, dedicated, namespace, run_id,
                                                  profile, figures):
    """A gang that fits is bound completely; a gang one pod larger than the free nodes binds no pod at all, and is
    bound completely once a node is freed; a native gang from 1.36 says so on its PodGroup (Scheduled, or
    Unschedulable). Red: the scheduler bound part of a gang (named, with its pods) or never bound it, or its
    PodGroup says otherwise."""
    # The PodGroup's condition is the scheduler's own word: PodGroupScheduled on 1.36 (v1alpha2),
    # PodGroupInitiallyScheduled from 1.37 (terminal once True).
    api, n, gpus = cluster.api, profile.gang_nodes, profile.node_gpus
    status = g.writes_pod_group_status(backend)
    [fits] = g.create_gangs(api, backend, namespace, run_id, {"fits": n}, dedicated, gpus)
    g.wait_gangs_settled(api, [fits], 1, profile.gang_bind_timeout_s,
                         f"gang fits ({n} pods on {n} free nodes) bound completely")
    figures.add(f"gang of {n} on {n} free nodes: last create -> bound completely",
                time.monotonic() - fits.created_last_at, "s", profile.gang_bind_timeout_s)
    if status:
        g.wait_pod_group_condition(api, backend, fits, "True", "Scheduled", profile.gang_bind_timeout_s)
    g.delete_pods(api, namespace, fits.pods)

    # One node taken by a plain pod: the next gang is one pod larger than the free nodes.
    g.create_pods(api, namespace, [g.rank("blocker", run_id, backend.scheduler_name, dedicated, gpus)])
    g.wait_pods_bound(api, namespace, ["blocker"], profile.gang_bind_timeout_s, "blocker pod bound")
    [big] = g.create_gangs(api, backend, namespace, run_id, {"one-too-many": n}, dedicated, gpus)
    bound = g.watch_nothing_binds(api, namespace, big.pods, profile.gang_observe_s)
    state = g.GangState.read(api, [big])
    figures.add(f"pods bound of a gang of {n} on {n - 1} free nodes", len(state.bound["one-too-many"]), "pods", 0)
    assert not bound and not state.bound["one-too-many"], g.partial_message(
        state, f"{n} pods on {n - 1} free nodes, watched for {profile.gang_observe_s:g} s")
    if status:
        g.wait_pod_group_condition(api, backend, big, "False", "Unschedulable", profile.gang_bind_timeout_s)

    g.delete_pods(api, namespace, ["blocker"])
    freed = time.monotonic()
    g.wait_gangs_settled(api, [big], 1, profile.gang_bind_timeout_s,
                         "gang one-too-many bound completely once a node was freed")
    figures.add("node freed -> the waiting gang bound completely", time.monotonic() - freed, "s",
                profile.gang_bind_timeout_s)
    if status:
        g.wait_pod_group_condition(api, backend, big, "True", "Scheduled", profile.gang_bind_timeout_s)


# Known limitation, measured here: native gang scheduling in Kubernetes 1.35
# (alpha, v1alpha1) has no early release, so a waiting gang keeps its reserved
# nodes until its fixed 300 s timeout and plain pods cannot use them. The check
# still runs on native and must fail there (strict xfail): the report shows the
# finding. Gone from 1.37 (v1beta1, the PodGroup scheduling cycle): the check
# passed on v1.37.2 here (2026-12-07, smoke), so the marker is 1.35's only.
NATIVE_HOLDS_NODES = pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason="native gang scheduling (1.35 alpha) holds a waiting gang's nodes until its 300 s timeout")


@pytest.mark.smoke
def test_competing_gangs_do_not_deadlock(cluster, backend, dedicated, namespace, run_id, profile,
                                         request, figures):
    """Gangs created at once, one more than fits, settle each bound completely or not at all; the waiting gang holds no
    node (plain pods take the spare ones) and is admitted once a running gang finishes. Red: a partial gang,
    capacity held by a waiting gang, or a deadlock."""
    if backend.api == LEGACY_NATIVE_API:
        request.applymarker(NATIVE_HOLDS_NODES)
    api, n, gpus = cluster.api, profile.gang_nodes, profile.node_gpus
    size = 2
    count = n // size + 1            # one gang more than fits
    fit = n // size
    names = {f"job-{chr(ord('a') + i)}": size for i in range(count)}
    gangs = g.create_gangs(api, backend, namespace, run_id, names, dedicated, gpus)
    state = g.wait_gangs_settled(
        api, gangs, fit, profile.gang_bind_timeout_s,
        f"{count} gangs of {size} created at once on {n} nodes: {fit} bound completely, the rest not at all")
    figures.add(f"{count} gangs of {size} on {n} nodes: last create -> settled",
                time.monotonic() - max(x.created_last_at for x in gangs), "s", profile.gang_bind_timeout_s)
    bound = g.watch_nothing_binds(api, namespace, [p for x in gangs if x.name in state.empty()
                                                   for p in x.pods], profile.gang_observe_s)
    after = g.GangState.read(api, gangs)
    figures.add("gangs bound partially", len(after.partial()), "gangs", 0)
    assert not bound and not after.partial(), g.partial_message(
        after, f"within {profile.gang_observe_s:g} s after the gangs settled")

    # No capacity held by the waiting gang: a plain pod takes each node left over.
    spare = [f"spare-{i}" for i in range(n - fit * size)]
    g.create_pods(api, namespace, [g.rank(s, run_id, backend.scheduler_name, dedicated, gpus)
                                  for s in spare])
    with g.explain_partial(api, gangs, "capacity held by a waiting gang", holding=True):
        g.wait_pods_bound(api, namespace, spare, profile.gang_bind_timeout_s,
                          f"plain pods on the {len(spare)} node(s) no complete gang uses "
                          "(a gang holding nodes while it waits would keep them off)")

    # A running gang finishes: the waiting one is admitted.
    finished = next(x for x in gangs if x.name in state.complete())
    g.delete_pods(api, namespace, finished.pods)
    waiting = [x for x in gangs if x.name in state.empty()]
    done = time.monotonic()
    g.wait_gangs_settled(api, waiting, 1, profile.gang_bind_timeout_s,
                         f"gang {waiting[0].name} admitted after gang {finished.name} finished")
    figures.add("a gang finished -> the waiting gang bound completely", time.monotonic() - done, "s",
                profile.gang_bind_timeout_s)


# Known limitation, measured here: neither gang scheduler keeps freed capacity for a gang that waits. Both refuse a
# gang that does not fit whole and go on to the next that does, smaller and newer or not (backfill without
# reservation): Coscheduling's PostFilter rejects the whole PodGroup and its queue sort orders pods, not gangs
# (kubernetes-sigs/scheduler-plugins#658, "make podGroup a queueing unit", open); the native PodGroup cycle
# (1.36+) rolls back its tentative placements when the group does not fit (pkg/scheduler/
# schedule_one_podgroup.go). On smoke (v1.37.2, 2026-12-07) both let 2 of 2 newcomers take the freed nodes, the
# large gang 0 of 5 bound. Kueue's StrictFIFO queueing keeps them for it: the Kueue suite's
# test_a_waiting_large_jobset_is_not_overtaken_by_smaller_ones_submitted_after_it. 1.35's alpha (v1alpha1) is not
# judged here: its waiting gangs hold nodes at Permit until their 300 s timeout (NATIVE_HOLDS_NODES below), so
# which gang holds the freed nodes is a race. On smoke, v1.35.4, 2026-12-08, one run passed and in the other
# neither the large gang nor the newcomers bound within 120 s, both holding nodes.
OVERTAKEN = pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason="no gang scheduler of kube-scheduler reserves freed nodes for a waiting gang: smaller gangs created "
           "after it take them (2 of 2 here, Coscheduling v0.34.7 and native v1.37.2); Kueue StrictFIFO does")


@pytest.mark.smoke
def test_a_waiting_gang_is_not_starved_by_smaller_gangs_created_after_it(cluster, backend, dedicated, namespace,
                                                                         run_id, profile, request, figures):
    """A whole-node gang as large as the pool waits behind running gangs of 2; each time one finishes, a new gang
    of 2 arrives. The large gang came first: the freed nodes must wait for it, not go to the newcomers, and it is
    bound completely once the gangs older than it are done. Red: a newcomer took nodes the waiting large gang
    needed (named), so under a steady stream of small jobs it never starts."""
    if backend.api == LEGACY_NATIVE_API:
        pytest.skip("1.35's native gangs hold nodes at Permit until their 300 s timeout, so which waiting gang gets "
                    "freed nodes is a race (1 of 2 runs passed on v1.35.4): judged by the competing-gangs check")
    request.applymarker(OVERTAKEN)
    api, n, gpus = cluster.api, profile.gang_nodes, profile.node_gpus
    elders = g.create_gangs(api, backend, namespace, run_id, {f"running-{i}": 2 for i in range(n // 2)},
                            dedicated, gpus)
    g.wait_gangs_settled(api, elders, len(elders), profile.gang_bind_timeout_s,
                         f"{len(elders)} running gangs of 2 bound completely")
    [large] = g.create_gangs(api, backend, namespace, run_id, {"large": n}, dedicated, gpus)
    g.wait_refused(api, large, profile.gang_bind_timeout_s)
    overtook: dict[str, dict[str, str]] = {}
    newcomers = []
    for i, elder in enumerate(elders):
        g.delete_pods(api, namespace, elder.pods)
        [new] = g.create_gangs(api, backend, namespace, run_id, {f"newcomer-{i}": 2}, dedicated, gpus)
        newcomers.append(new)
        bound = g.watch_nothing_binds(api, namespace, new.pods, profile.gang_observe_s)
        if bound:
            overtook[new.name] = bound
    freed = time.monotonic()
    figures.add("smaller gangs created later that were bound ahead of the waiting large gang", len(overtook),
                "gangs", 0)
    if not overtook:
        g.wait_gangs_settled(api, [large], 1, profile.gang_bind_timeout_s,
                             f"gang large ({n} pods) bound completely once the gangs older than it finished")
        figures.add("the older gangs finished -> the waiting large gang bound completely",
                    time.monotonic() - freed, "s", profile.gang_bind_timeout_s)
    state = g.GangState.read(api, [large, *newcomers])
    taken = "; ".join(f"{k} (a pod bound on {sorted(v.values())[0]})" for k, v in overtook.items())
    assert not overtook, (f"gang large ({n} pods, waiting before them) was overtaken by {len(overtook)} smaller "
                          f"gang(s) created after it, bound on the nodes it needed as they were freed: {taken}; "
                          f"gang large has {len(state.bound['large'])} of {n} pods bound -- under a steady stream "
                          "of small jobs it never starts")
    assert not state.partial(), g.partial_message(state, "after the older gangs finished")


# Known limitation, measured here: after its fixed 300 s timeout a native gang
# (1.35 alpha) is rejected and at once forms again on the same nodes -- its
# scheduling deadline is renewed on the next Permit and nothing backs a timed-out
# gang off -- so a gang that can never complete keeps its nodes for good. Plain
# pods created right after the timeout fired stayed Pending ("5 Insufficient
# nvidia.com/gpu") for 120 s in 3 of 3 runs (smoke, 5 scratch nodes).
NATIVE_REHOLDS = pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason="native gang scheduling (1.35 alpha) takes a timed-out gang's nodes back at once: "
           "work created after the timeout cannot get them (3 of 3 runs here)")


@pytest.mark.smoke
def test_gang_timeout_releases_held_nodes(cluster, backend, dedicated, namespace, run_id, profile, request,
                                          figures):
    """A gang that cannot be completed holds its nodes only until its schedule timeout, then gives them back
    to plain pods for good. Native gangs from Kubernetes 1.36 are placed whole in one PodGroup scheduling cycle,
    so one that cannot be completed is refused there (its PodGroup's condition False, Unschedulable) without
    reserving a node: that refusal is their timeout. Red: the timeout (or refusal) never came, or the gang kept
    (or took back) its nodes."""
    # Deterministic, not a race: the plain pods that must get the nodes are
    # created once the scheduler has said that the gang timed out (a
    # "rejected due to timeout" on a member's PodScheduled condition or event), so they
    # do not compete with pods that waited before. Bounds: the timeout plus 60 s
    # for the scheduler to fire it; then ``gang_bind_timeout_s`` for the plain
    # pods, and ``gang_observe_s`` in which the gang must not take a node back.
    if backend.api == LEGACY_NATIVE_API:
        request.applymarker(NATIVE_REHOLDS)
    api, n, gpus = cluster.api, profile.gang_nodes, profile.node_gpus
    timeout_s = backend.hold_timeout_s
    t0 = time.monotonic()
    [held] = g.create_gangs(api, backend, namespace, run_id, {"never-complete": n}, dedicated, gpus,
                            timeout_s=timeout_s, unsatisfiable=1)
    with g.explain_partial(api, [held], "the gang's schedule timeout never fired", holding=True):
        if g.writes_pod_group_status(backend):
            g.wait_pod_group_condition(api, backend, held, "False", "Unschedulable", timeout_s + 60)
        else:
            g.wait_timed_out(api, held, timeout_s + 60)
    released = time.monotonic() - t0
    figures.add("gang created -> its schedule timeout fired", released, "s", timeout_s + 60)
    plain = [f"plain-{i}" for i in range(n)]
    created = g.create_pods(api, namespace, [g.rank(p, run_id, backend.scheduler_name, dedicated, gpus,
                                                    {"clusterproof.io/plain": "true"}) for p in plain])
    try:
        nodes = g.wait_pods_bound(api, namespace, plain, profile.gang_bind_timeout_s,
                                  "plain pods created after gang never-complete timed out bound on its nodes")
    except AssertionError as e:
        said = g.pod_events(api, namespace, "FailedScheduling", created)
        figures.add("schedule timeout -> plain pods bound on the gang's nodes", None, "s",
                    profile.gang_bind_timeout_s)
        raise AssertionError(f"gang never-complete took its nodes back right after its schedule timeout fired "
                             f"({released:.0f} s after its pods were created): {str(e).splitlines()[0]}; the "
                             f"scheduler said of plain-0: {(said.get('plain-0') or ['nothing'])[-1]}") from None
    figures.add("schedule timeout -> plain pods bound on the gang's nodes", time.monotonic() - t0 - released, "s",
                profile.gang_bind_timeout_s)
    taken_back = g.watch_nothing_binds(api, namespace, held.pods, profile.gang_observe_s)
    state = g.GangState.read(api, [held])
    allure.attach(json.dumps({"schedule_timeout_s": timeout_s, "timed_out_after_s": round(released, 1),
                              "plain_pods_bound_after_s": round(time.monotonic() - t0, 1), "nodes": nodes},
                             indent=2), "timeout release", allure.attachment_type.JSON)
    assert not taken_back and not state.bound["never-complete"], g.partial_message(state, "after the schedule timeout")


# Known limitation, measured here: native gang formation (1.35 alpha) costs
# the scheduler super-quadratic CPU in the gang size -- PreEnqueue rebuilds the
# set of all the gang's pods for every gated member on every pod add, and
# Permit re-activates every unscheduled member for each pod that reaches it --
# while a gang gets a fixed 300 s from its first Permit to get every member
# through. On this 2-core machine (2,600 nodes, kube-scheduler CPU from /proc):
# 250 pods bound 3.8 s after the last create (2.9 CPU-s), 500: 11.0 s (10.7),
# 1,000: 53.1 s (54.4), 2,000: 254.3 s (313.4); 4,000 at 7,500 nodes: nothing
# bound in 1,200 s. Gangs above NATIVE_SCALE_LIMIT are expected to fail (strict):
# on a machine where they bind, the XPASS asks for this limit to be raised.
NATIVE_SCALE_LIMIT = 2000
NATIVE_SCALE = pytest.mark.xfail(
    strict=True, raises=AssertionError,
    reason=f"native gang scheduling (1.35 alpha) cannot form a gang of more than ~{NATIVE_SCALE_LIMIT} "
           "pods within its fixed 300 s: its gang bookkeeping grows super-quadratically with gang size")


@pytest.mark.smoke
@pytest.mark.destructive  # thousands of pods on a real cluster: opt-in (--cp-allow-destructive)
def test_large_gang_is_bound_completely(cluster, backend, namespace, run_id, profile, request, figures,
                                        gang_probes):
    """One gang of ``gang_scale_size`` whole-node pods is bound completely within ``gang_scale_timeout_s``;
    its admission latency (last pod created -> all bound) is the headline figure. Red: the gang did not form
    in time.

    The harness's own cluster: over every pool but preflight. Any other: over the shared pool only (a guest's
    pods never tolerate a team's taint, and the cluster's admission may refuse such pods).
    """
    api, size, gpus = cluster.api, profile.gang_scale_size, profile.node_gpus
    if backend.api == LEGACY_NATIVE_API and size > NATIVE_SCALE_LIMIT:
        request.applymarker(NATIVE_SCALE)
    if cluster.owned:
        exclude, where = ("preflight",), "shared and team pools"
        place = g.Placement({}, ({"key": profile.team_taint_key, "operator": "Exists", "effect": "NoSchedule"},))
    else:
        exclude, where = tuple(p.name for p in node_plan(profile) if p.name != "shared"), "the shared pool"
        place = g.Placement({profile.pool_label: "shared"})
    usable = g.usable_nodes(api, profile.pool_label, exclude, gpus, free_only=False)
    if size > usable:
        pytest.fail(f"clusterproof: gang_scale_size={size} is larger than the {usable} nodes "
                    f"a whole-node gang can use ({where}): lower gang_scale_size or "
                    f"raise nodes", pytrace=False)
    # Pods of earlier tests leave with their namespaces, in the background.
    wait_for(lambda: g.usable_nodes(api, profile.pool_label, exclude, gpus),
             until=lambda free: free >= size, timeout=180, interval=2,
             what=f"{size} free whole nodes for the scale gang (earlier tests' pods gone)")
    why = probe_once(cluster, namespace, run_id, backend, g.Placement({profile.pool_label: "shared"}), gang_probes)
    if why:
        pytest.fail(f"clusterproof: {why}", pytrace=False)
    [big] = g.create_gangs(api, backend, namespace, run_id, {"training-job": size}, place, gpus,
                           timeout_s=profile.gang_scale_timeout_s)
    # Native gangs above the limit cannot form within their fixed timeout: the wait ends when the
    # scheduler says the gang timed out, with the measurement, instead of sitting out the bound.
    bound_at: dict[str, float] = {}
    try:
        all_bound_at = g.watch_until_bound(api, big, profile.gang_scale_timeout_s,
                                           give_up_on_timeout=backend.name == "native", bound_at=bound_at)
    finally:
        figures.add("pods of the gang bound", len(bound_at), "pods", size, ">=")
        if bound_at:
            figures.add("last create -> first bind", min(bound_at.values()) - big.created_last_at, "s")
            figures.add("bind spread (first -> last bind)", max(bound_at.values()) - min(bound_at.values()), "s")
    latency = all_bound_at - big.created_last_at
    figures.add(f"admission latency of a gang of {size} (last create -> all bound)", latency, "s",
                profile.gang_scale_timeout_s, headline=True)
    state = g.GangState.read(api, [big])
    figure = {"backend": backend.name, "scheduler": backend.scheduler_name, "profile": profile.name,
              "nodes": profile.nodes, "gang_size": size, "usable_nodes": usable,
              "admission_latency_s": round(latency, 2),
              "note": "last pod create returned -> last bind seen on the harness' pod watch"}
    allure.attach(json.dumps(figure, indent=2), "gang admission latency", allure.attachment_type.JSON)
    assert len(state.complete()) == 1


# --- native gang features behind alpha gates (1.36+, kube_alpha_gates) ---------------------------------------

def _needs_gate(cluster, backend: g.Backend, gate: str) -> kubeversions.Minor | None:
    """Skip, in one line, unless the server runs the 1.36+ native API and reports ``gate`` on; its table row."""
    version = check_reachable(cluster.api)["gitVersion"]
    if not g.writes_pod_group_status(backend):
        pytest.skip(f"{gate} needs the native PodGroup of Kubernetes 1.36 or later; this server ({version}) declares "
                    f"native gangs in {backend.api}")
    if not features(cluster.api).get(gate):
        pytest.skip(f"{gate} is off on this API server ({version}; kubernetes_feature_enabled): turn it on in every "
                    "component (the embedded cluster: profile key kube_alpha_gates, or kube_feature_gates)")
    return kubeversions.server_minor(version)


@pytest.mark.smoke
@pytest.mark.native_gang
def test_a_gang_job_gets_its_pod_group_from_the_job_controller_and_is_bound_whole(cluster, backend, dedicated,
                                                                                  namespace, run_id, profile,
                                                                                  figures):
    """WorkloadWithJob: an Indexed Job of whole-node ranks that asks to be a gang gets its Workload and PodGroup from
    the Job controller, its pods join that PodGroup, and it is bound whole; once it is gone, one a rank larger than
    the free nodes binds no rank. Red: no Workload or PodGroup from the controller, a pod outside the PodGroup, or a
    partial bind."""
    row = _needs_gate(cluster, backend, kubeversions.JOB_GATE)
    api, n, gpus, t = cluster.api, profile.gang_nodes, profile.node_gpus, profile.gang_bind_timeout_s
    how = row.job_gang if row else "spec.scheduling"
    jobs.create_job(api, namespace, jobs.gang_job("fits", run_id, n, backend, dedicated, gpus, how))
    created = time.monotonic()
    fits = jobs.wait_job_gang(api, backend, namespace, "fits", n, t)
    g.wait_gangs_settled(api, [fits], 1, t, f"Job fits ({n} ranks on {n} free nodes) bound completely")
    figures.add(f"Job of {n} ranks created -> bound completely", time.monotonic() - created, "s", t)
    g.wait_pod_group_condition(api, backend, fits, "True", "Scheduled", t)
    jobs.delete_job(api, namespace, "fits", t)

    jobs.create_job(api, namespace, jobs.gang_job("one-too-many", run_id, n + 1, backend, dedicated, gpus, how))
    big = jobs.wait_job_gang(api, backend, namespace, "one-too-many", n + 1, t)
    bound = g.watch_nothing_binds(api, namespace, big.pods, profile.gang_observe_s)
    state = g.GangState.read(api, [big])
    figures.add(f"ranks bound of a Job of {n + 1} on {n} free nodes", len(state.bound[big.name]), "pods", 0)
    assert not bound and not state.bound[big.name], g.partial_message(
        state, f"Job one-too-many ({n + 1} ranks on {n} free nodes), watched for {profile.gang_observe_s:g} s")
    g.wait_pod_group_condition(api, backend, big, "False", "Unschedulable", t)


@pytest.mark.smoke
@pytest.mark.native_gang
def test_a_pod_group_that_requires_one_rack_lands_in_one_rack_or_not_at_all(cluster, backend, gang_racks, namespace,
                                                                            run_id, profile, figures):
    """TopologyAwareWorkloadScheduling: a gang whose PodGroup requires one rack (schedulingConstraints.topology, the
    profile's rack label) and is one pod larger than a rack binds nothing, though the two racks together have room;
    one a rack's size is bound whole inside one rack. Red: a gang spread over racks, or one that fits a rack not
    bound."""
    _needs_gate(cluster, backend, kubeversions.TOPOLOGY_GATE)
    api, gpus, t, key = cluster.api, profile.node_gpus, profile.gang_bind_timeout_s, profile.topology_rack_label
    place, per_rack = gang_racks
    [wide] = g.create_gangs(api, backend, namespace, run_id, {"wider-than-a-rack": per_rack + 1}, place, gpus,
                            topology=key)
    bound = g.watch_nothing_binds(api, namespace, wide.pods, profile.gang_observe_s)
    racks = g.node_labels(api, sorted(set(bound.values())), key)
    figures.add(f"pods bound of a one-rack gang of {per_rack + 1} (racks of {per_rack})", len(bound), "pods", 0)
    assert not bound, (f"gang wider-than-a-rack ({per_rack + 1} pods, required in one {key}, racks of {per_rack}) "
                       f"was bound across racks: {racks}")
    g.delete_pods(api, namespace, wide.pods)
    [one] = g.create_gangs(api, backend, namespace, run_id, {"one-rack": per_rack}, place, gpus, topology=key)
    g.wait_gangs_settled(api, [one], 1, t, f"gang one-rack ({per_rack} pods, racks of {per_rack}) bound completely")
    nodes = g.bindings(api, namespace, f"{g.GANG_LABEL}=one-rack")
    racks = g.node_labels(api, sorted(set(nodes.values())), key)
    figures.add("racks the one-rack gang was bound in", len(set(racks.values())), "racks", 1)
    assert len(set(racks.values())) == 1 and None not in racks.values(), (
        f"gang one-rack ({per_rack} pods, required in one {key}) was bound across racks: {racks}")
