"""Gangs: how a gang is declared to each gang scheduler, created, read and waited for.

Why a module: suites/test_gang_scheduling.py runs the same checks against two
gang schedulers and must not know how either declares a gang:

- ``coscheduling``: a PodGroup (``scheduling.x-k8s.io/v1alpha1``) and pods
  labelled ``scheduling.x-k8s.io/pod-group``;
- ``native``: KEP-4671 gang scheduling, in the API version the server serves (``NATIVE_APIS``, read
  from discovery): on 1.35 a ``v1alpha1`` Workload holding its pod groups and pods' ``spec.workloadRef``;
  from 1.36 (``v1alpha2``, then ``v1alpha3``/``v1beta1`` in 1.37) a Workload that is a template, a
  PodGroup of its own made from it, and pods' immutable ``spec.schedulingGroup.podGroupName``.

Which backends exist and the pytest fixtures that provide them are in
``clusterproof.gang.schedulers``. Timing rules: every wait goes through
``waiting.wait_for`` or an informer with a deadline; a window in which
nothing may happen (a gang that must not bind) is watched, not slept through.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from kubernetes import client

from clusterproof.core import kubeversions, measurement
from clusterproof.core.errors import HarnessError
from clusterproof.core.progress import phase
from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import get_if_present, list_raw, raw_request, serving
from clusterproof.kube.informer import Informer
from clusterproof.kube.nodes import is_ready
from clusterproof.kube.placement import refusal
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import create_pods, delete_pods, explain_pods, list_pods, pod_events, terminating

POD_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"        # Coscheduling's membership label
GANG_LABEL = "clusterproof.io/gang"                      # ours, on every gang pod (both backends)
PG_PATH = "/apis/scheduling.x-k8s.io/v1alpha1/namespaces/{ns}/podgroups"
NATIVE_APIS = kubeversions.NATIVE_GANG_APIS       # newest first; the server's discovery says which it serves
LEGACY_NATIVE_API = kubeversions.LEGACY_NATIVE_GANG_API   # 1.35's: pods name a Workload, not a PodGroup
TEMPLATE = "workers"                                   # the one pod group (template) of each gang
TIMED_OUT = "rejected due to timeout"          # the scheduler framework's Permit-timeout message
# The native gang's Permit timeout is a constant, not configurable: 1.35's DefaultSchedulingTimeoutDuration
# (pkg/scheduler/backend/workloadmanager), 1.36's and 1.37's permitTimeoutDuration
# (pkg/scheduler/framework/plugins/gangscheduling/gangscheduling.go), 5 minutes in each.
NATIVE_GANG_TIMEOUT_S = 300


@dataclass
class Backend:
    """One gang scheduler the checks run against; ``skip`` says why it cannot run."""
    name: str                      # "coscheduling" | "native" (test ids)
    scheduler_name: str            # pods' spec.schedulerName
    description: str
    hold_timeout_s: float          # how long a waiting gang may hold nodes (its schedule timeout)
    skip: str | None = None        # cannot run here (e.g. API not served): the test is skipped
    error: str | None = None       # should run but cannot (user mistake): the test fails, one line
    api: str = ""                  # native: the scheduling.k8s.io version gangs are declared in (NATIVE_APIS)
    served: str = ""               # native: the newest the server's discovery lists Workloads in

    def group(self, ns: str, gang: str, min_count: int, run_id: str,
              timeout_s: float | None = None, topology: str = "") -> list[tuple[str, dict]]:
        """(collection path, body) of each object that declares the gang, in the order they are created."""
        return declaration(self.name, self.api, ns, gang, min_count, run_id, timeout_s, topology)

    def member(self, pod: dict, gang: str) -> dict:
        """Make ``pod`` a member of ``gang``."""
        return membership(self.name, self.api, pod, gang)


def declaration(backend: str, api: str, ns: str, gang: str, min_count: int, run_id: str,
                timeout_s: float | None = None, topology: str = "") -> list[tuple[str, dict]]:
    """The objects that declare a gang of ``min_count`` to ``backend`` (native: in ``api``): a Coscheduling
    PodGroup; a 1.35 Workload of one gang pod group; from 1.36 the Workload (its template) and the PodGroup
    made from it, as a workload controller would (the harness is the controller of its gangs). ``topology``:
    native from 1.36, the node label whose one domain must hold the whole group (schedulingConstraints)."""
    meta = metadata(gang, run_id, {GANG_LABEL: gang})
    if backend == "coscheduling":
        spec = {"minMember": min_count}
        if timeout_s is not None:
            spec["scheduleTimeoutSeconds"] = int(timeout_s)
        return [(PG_PATH.format(ns=ns), {"apiVersion": "scheduling.x-k8s.io/v1alpha1",
                                         "kind": "PodGroup", "metadata": meta, "spec": spec})]
    gang_policy = {"gang": {"minCount": min_count}}
    if api == LEGACY_NATIVE_API:
        return [(native_path(api, ns, "workloads"), {
            "apiVersion": api, "kind": "Workload", "metadata": meta,
            "spec": {"podGroups": [{"name": TEMPLATE, "policy": gang_policy}]}})]
    constraints = {"schedulingConstraints": {"topology": [{"key": topology}]}} if topology else {}
    workload = {"apiVersion": api, "kind": "Workload", "metadata": meta,
                "spec": {"podGroupTemplates": [{"name": TEMPLATE, "schedulingPolicy": gang_policy, **constraints}]}}
    ref = ({"podGroupTemplateRef": {"workload": {"workloadName": gang, "podGroupTemplateName": TEMPLATE}}}
           if api.endswith("/v1alpha2") else {"workloadRef": {"workloadName": gang, "templateName": TEMPLATE}})
    group = {"apiVersion": api, "kind": "PodGroup", "metadata": metadata(gang, run_id, {GANG_LABEL: gang}),
             "spec": {**ref, "schedulingPolicy": gang_policy, **constraints}}
    return [(native_path(api, ns, "workloads"), workload), (native_path(api, ns, "podgroups"), group)]


def native_path(api: str, ns: str, resource: str, name: str = "") -> str:
    """A native gang object's path in ``api``: the ``resource`` collection of ``ns``, or its object ``name``."""
    return f"/apis/{api}/namespaces/{ns}/{resource}" + (f"/{name}" if name else "")


def membership(backend: str, api: str, pod: dict, gang: str) -> dict:
    """``pod`` made a member of ``gang``: Coscheduling's label; 1.35's ``spec.workloadRef`` to the Workload's
    pod group; from 1.36 ``spec.schedulingGroup.podGroupName`` naming the PodGroup."""
    if backend == "coscheduling":
        pod["metadata"]["labels"][POD_GROUP_LABEL] = gang
    elif api == LEGACY_NATIVE_API:
        pod["spec"]["workloadRef"] = {"name": gang, "podGroup": TEMPLATE}
    else:
        pod["spec"]["schedulingGroup"] = {"podGroupName": gang}
    return pod


@dataclass(frozen=True)
class Placement:
    """Where a test's pods may go: a node selector and the tolerations that match it."""
    node_selector: dict
    tolerations: tuple = ()


def rank(name: str, run_id: str, scheduler: str, place: Placement, gpus: int, labels: dict | None = None) -> dict:
    """One whole-node GPU pod (a training rank) placed by ``place``."""
    return pod_body(name, run_id, gpus=gpus, labels=labels, scheduler=scheduler,
                    node_selector=place.node_selector, tolerations=place.tolerations)


@dataclass
class Gang:
    name: str
    namespace: str
    pods: list[str]
    created_last_at: float = 0.0     # monotonic time the last member's create returned
    decided_by: str = ""             # what decides the gang whole, named when it is found partial


def decided_by(backend: Backend) -> str:
    """What must decide a gang whole, for a failure line: the native gang's plugin and scheduler."""
    if backend.name != "native":
        return ""
    return (f"native gangs are decided whole by the GangScheduling plugin of scheduler {backend.scheduler_name!r} "
            "(kube-scheduler's default plugins include it when GenericWorkload is on): a partial gang, or a PodGroup "
            "no scheduler wrote a verdict on, means that scheduler does not run it")


def create_gangs(api: client.ApiClient, backend: Backend, ns: str, run_id: str,
                 gangs: dict[str, int], place: Placement, gpus: int,
                 timeout_s: float | None = None, unsatisfiable: int = 0, topology: str = "") -> list[Gang]:
    """Declare every gang, then create all their pods at once, interleaved (a0 b0 c0 a1 ...).

    ``unsatisfiable`` extra members per gang can never be placed (see
    ``unsatisfiable_member``); they count towards the gang's minimum.
    """
    pods = sum(gangs.values()) + unsatisfiable * len(gangs)
    what = (f"gang {next(iter(gangs))}" if len(gangs) == 1 else f"{len(gangs)} gangs ({', '.join(gangs)})")
    with phase(f"create {what}: {pods} pods"):
        return _create_gangs(api, backend, ns, run_id, gangs, place, gpus, timeout_s, unsatisfiable, topology)


def _create_gangs(api: client.ApiClient, backend: Backend, ns: str, run_id: str, gangs: dict[str, int],
                  place: Placement, gpus: int, timeout_s: float | None, unsatisfiable: int,
                  topology: str) -> list[Gang]:
    for name, size in gangs.items():
        for path, body in backend.group(ns, name, size + unsatisfiable, run_id, timeout_s, topology):
            try:
                raw_request(api, "POST", path, body=body).data
            except client.ApiException as e:
                if e.status != 404 or backend.name != "native":
                    raise
                raise AssertionError(
                    f"the server refused gang {name}'s {body['kind']} in {backend.api} (404: that version is not "
                    f"served); it serves native gangs in {backend.served or 'no version (none is served)'}: a "
                    f"manifest written for {kubeversions.written_for(backend.api)} -- declare it in the served "
                    "version (gang_native_api empty reads it from discovery)") from None
    out = {name: Gang(name, ns, [], decided_by=decided_by(backend)) for name in gangs}
    bodies = []
    for i in range(max(gangs.values()) + unsatisfiable):
        for name, size in gangs.items():
            if i >= size + unsatisfiable:
                continue
            pod = rank(f"{name}-{i}", run_id, backend.scheduler_name, place, gpus, {GANG_LABEL: name})
            if i >= size:
                pod = unsatisfiable_member(backend, pod)
            out[name].pods.append(pod["metadata"]["name"])
            bodies.append(backend.member(pod, name))
    create_pods(api, ns, bodies, workers=32)
    last = time.monotonic()
    for g in out.values():
        g.created_last_at = last
    return list(out.values())


def unsatisfiable_member(backend: Backend, pod: dict) -> dict:
    """A gang member that can never be placed, without failing in a way that releases the gang.

    Coscheduling rejects a whole gang at once when a member fails the
    scheduler's Filter (its PostFilter), so such a gang never holds nodes;
    what holds nodes until the timeout is a member the scheduler never gets
    to -- here, one addressed to a scheduler that does not exist (as a member
    stuck behind a slow job controller would be). Native 1.35 has no such
    release: a member that fits nowhere (twice a node's GPUs) makes the
    others hold their nodes until the gang timeout.
    """
    if backend.name == "coscheduling":
        pod["spec"]["schedulerName"] = "clusterproof-no-such-scheduler"
    else:
        gpus = int(pod["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]) * 2
        pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)},
                                                     "limits": {"nvidia.com/gpu": str(gpus)}}
    return pod


def bindings(api: client.ApiClient, ns: str, selector: str = GANG_LABEL) -> dict[str, str | None]:
    """pod name -> node name (None while unbound) for the live pods matching ``selector``
    (a terminating pod is no longer a gang member)."""
    return {name: p["spec"].get("nodeName") for name, p in list_pods(api, ns, selector).items()
            if not terminating(p)}


@dataclass
class GangState(measurement.Base):
    """How many members of each gang are bound, from one pod list (read at once: ``Base``'s start and dispose)."""
    bound: dict[str, list[str]]      # gang -> bound pod names
    size: dict[str, int]
    decided_by: str = ""             # named in a partial gang's failure line (``decided_by``)

    @classmethod
    def read(cls, api: client.ApiClient, gangs: list[Gang]) -> "GangState":
        nodes: dict[str, str | None] = {}
        for n in {g.namespace for g in gangs}:
            nodes.update(bindings(api, n))
        return cls({g.name: [p for p in g.pods if nodes.get(p)] for g in gangs},
                   {g.name: len(g.pods) for g in gangs}, next((g.decided_by for g in gangs if g.decided_by), ""))

    def complete(self) -> list[str]:
        return [g for g, b in self.bound.items() if len(b) == self.size[g]]

    def empty(self) -> list[str]:
        return [g for g, b in self.bound.items() if not b]

    def partial(self) -> list[str]:
        return [g for g, b in self.bound.items() if 0 < len(b) < self.size[g]]

    def __str__(self) -> str:
        return ", ".join(f"gang {g}: {len(b)}/{self.size[g]} bound" for g, b in self.bound.items())

    def gather(self) -> list[measurement.Figure]:
        f = measurement.figure
        return [f("gangs bound completely", len(self.complete()), "gangs"),
                f("gangs bound partially", len(self.partial()), "gangs"),
                f("gangs with no member bound", len(self.empty()), "gangs")]


def partial_message(state: GangState, when: str) -> str:
    """The failure line an SRE reads: which gang is partially bound, and where."""
    parts = [f"gang {g} is partially bound ({len(state.bound[g])} of {state.size[g]} pods: "
             f"{', '.join(sorted(state.bound[g])[:5])})" for g in state.partial()]
    return f"{when}: " + "; ".join(parts) + (f" ({state.decided_by})" if state.decided_by and parts else "")


def wait_gangs_settled(api: client.ApiClient, gangs: list[Gang], complete: int, timeout: float,
                       what: str) -> GangState:
    """Wait until exactly ``complete`` gangs are fully bound and all others have nothing bound.

    A gang is bound pod by pod after its quorum is reached, so a partial
    state is normal for a moment; only one that outlasts ``timeout`` fails.
    """
    def settled(s: GangState) -> bool:
        return not s.partial() and len(s.complete()) == complete
    try:
        with phase(f"wait until {what}"):
            return wait_for(lambda: GangState.read(api, gangs), until=settled, timeout=timeout,
                            interval=0.5, what=what)
    except AssertionError:
        state = GangState.read(api, gangs)
        if state.partial():
            raise AssertionError(partial_message(state, f"{what}: not reached within {timeout:g} s")) from None
        raise


class explain_partial:
    """Turn any failure inside the block into one that names the partially bound gangs.

    Why: whatever wait runs out first (a plain pod that cannot bind, a gang
    that never settles), the cause an SRE needs is the half-placed gang.
    """

    def __init__(self, api: client.ApiClient, gangs: list[Gang], when: str, holding: bool = False):
        # holding: unbound gangs are suspected of reserving nodes (pods waiting at Permit)
        self.api, self.gangs, self.when, self.holding = api, gangs, when, holding

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb):
        if kind is None or not issubclass(kind, AssertionError):
            return False
        state = GangState.read(self.api, self.gangs)
        if state.partial():
            raise AssertionError(partial_message(state, f"{self.when} ({str(exc).splitlines()[0]})")) from None
        idle = state.empty()
        if self.holding and idle:
            raise AssertionError(f"{self.when}: gang {', '.join(idle)} has no pod bound yet keeps nodes "
                                 f"from other pods (members waiting for their gang reserve nodes) "
                                 f"({str(exc).splitlines()[0]})") from None
        return False


def follow_members(api: client.ApiClient, gang: Gang, apply: Callable[[str, dict], None]) -> Informer:
    """An informer over ``gang``'s pods, started: ``apply(kind, pod)`` for each change."""
    return Informer(api, f"/api/v1/namespaces/{gang.namespace}/pods", {"labelSelector": f"{GANG_LABEL}={gang.name}"},
                    apply, chunk_s=5).start()


def watch_until_bound(api: client.ApiClient, gang: Gang, timeout: float, give_up_on_timeout: bool = False,
                      bound_at: dict[str, float] | None = None) -> float:
    """Follow the gang's pods until all are bound; return that monotonic time.

    An informer, not polling: at thousands of pods a LIST every half second
    would cost more than the scheduler's work and blur the latency.
    ``give_up_on_timeout``: end as soon as the scheduler rejects the gang for
    its schedule timeout (it cannot be bound in this attempt) instead of
    sitting out ``timeout``, and say so with what was measured. ``bound_at``: filled with the
    monotonic time each member was first seen bound (the gang's bind spread).
    """
    members, bound, done_at = set(gang.pods), set(), []
    first_bound = bound_at if bound_at is not None else {}
    timed_out: list[str] = []

    def apply(kind: str, pod: dict) -> None:
        name = pod["metadata"]["name"]
        if name not in members:
            return
        why = timeout_rejection(pod) if kind != "DELETED" else None
        if why and give_up_on_timeout and not timed_out:
            timed_out.append(f"pod {name}: {why}")
        if kind != "DELETED" and pod["spec"].get("nodeName"):
            bound.add(name)
            first_bound.setdefault(name, time.monotonic())
        else:
            bound.discard(name)
        if len(bound) == len(members) and not done_at:
            done_at.append(time.monotonic())

    inf = follow_members(api, gang, apply)

    def finished() -> bool:
        inf.check()
        if give_up_on_timeout and not done_at and not timed_out:
            timed_out.extend(timeout_events(api, gang.namespace, inf.snapshot()))
        return bool(done_at or timed_out)
    try:
        with phase(f"wait until gang {gang.name} is bound completely ({len(members)} pods)"):
            wait_for(finished, timeout=timeout, interval=5 if give_up_on_timeout else 0.5,
                     what=f"gang {gang.name} bound completely",
                     describe=lambda _: f"{len(bound)} of {len(members)} pods bound" + (
                         f"; rejected for its schedule timeout: {timed_out[0]}" if timed_out else ""))
    except AssertionError:
        pass
    finally:
        inf.stop()
    if not done_at:
        waited = time.monotonic() - gang.created_last_at
        state = GangState.read(api, [gang])
        why = (f"the scheduler rejected it for its schedule timeout ({timed_out[0][:160]}) {waited:.0f} s after its "
               f"last pod was created, {len(state.bound[gang.name])} of {len(members)} pods bound"
               if timed_out else f"not bound completely within {timeout:g} s")
        raise AssertionError(partial_message(state, f"gang {gang.name}: {why}") if state.partial() else
                             f"gang {gang.name}: none of {len(members)} pods bound; {why}; "
                             + explain_pods(api, gang.namespace, members))
    return done_at[0]


def watch_nothing_binds(api: client.ApiClient, ns: str, pods: list[str], seconds: float) -> dict[str, str]:
    """Measurement: watch ``pods`` for ``seconds``; return those that got bound (should be none).

    The window is the observation itself: it ends early only on a violation.
    """
    watched, bound = set(pods), {}

    def apply(kind: str, pod: dict) -> None:
        name = pod["metadata"]["name"]
        if kind != "DELETED" and name in watched and pod["spec"].get("nodeName"):
            bound[name] = pod["spec"]["nodeName"]
    with phase(f"watch {len(pods)} pods for {seconds:g} s: none may be bound"):
        Informer(api, f"/api/v1/namespaces/{ns}/pods", {"labelSelector": GANG_LABEL}, apply).watch_for(
            seconds, lambda: bool(bound), what=f"the end of a {seconds:g} s watch in which none of "
                                               f"{len(pods)} pods may be bound", status=lambda: f"{len(bound)} bound")
    return bound


def wait_refused(api: client.ApiClient, gang: Gang, timeout: float) -> str:
    """Until the scheduler has refused a member of ``gang`` (its PodScheduled=False condition, which both the
    plugin's and the PodGroup cycle's failure write); that refusal's message."""
    def refused() -> str:
        pods = list_pods(api, gang.namespace, f"{GANG_LABEL}={gang.name}")
        return next((f"pod {n}: {m or '(no message)'}" for n, p in sorted(pods.items())
                     if (m := refusal(p)) is not None), "")
    with phase(f"wait until the scheduler has refused gang {gang.name}"):
        return wait_for(refused, timeout=timeout, interval=0.5,
                        what=f"the scheduler's refusal of gang {gang.name} (PodScheduled=False on a member)")


def timeout_rejection(pod: dict) -> str | None:
    """The scheduler's Permit-timeout rejection of ``pod`` as written on the pod itself (the message of its
    PodScheduled=False condition, the text of the FailedScheduling event), or None.

    Why not the event alone: events are best effort. kube-scheduler's broadcaster (client-go
    ``tools/events``) drops an event when 1,000 are queued, and files one that matches an event it sent
    minutes before (same type, reason, action and object: ``getKey`` has no note) as a series of that
    event, whose note stays the earlier one. The condition is a status write with the same message
    (``handleSchedulingFailure``), and an informer sees every write, even one the member's next attempt
    overwrites a second later. Seen once (2026-11-26, the gang suite on smoke beside the self-tests):
    no timeout event within 75 s, the check red on a healthy cluster.
    """
    msg = refusal(pod)
    return msg if msg and TIMED_OUT in msg else None


def timeout_events(api: client.ApiClient, ns: str, members: list[dict]) -> list[str]:
    """The Permit-timeout rejections the scheduler's FailedScheduling events of ``members`` say."""
    by_name = {p["metadata"]["name"]: p for p in members}
    return [m for msgs in pod_events(api, ns, "FailedScheduling", by_name).values() for m in msgs if TIMED_OUT in m]


def wait_timed_out(api: client.ApiClient, gang: Gang, timeout: float) -> None:
    """Until the scheduler says a member of ``gang`` was rejected at Permit for its timeout: on the member
    itself (``timeout_rejection``, followed by an informer) or in a FailedScheduling event."""
    found: list[str] = []

    def apply(kind: str, pod: dict) -> None:
        why = timeout_rejection(pod) if kind != "DELETED" else None
        if why:
            found.append(f"pod {pod['metadata']['name']}: {why}")
    inf = follow_members(api, gang, apply)

    def seen() -> list[str]:
        inf.check()
        if not found:
            found.extend(timeout_events(api, gang.namespace, inf.snapshot()))
        return found
    try:
        with phase(f"wait until gang {gang.name} is rejected for its schedule timeout"):
            wait_for(seen, timeout=timeout, interval=1, what=f"gang {gang.name} rejected for its schedule timeout "
                                                             f"('{TIMED_OUT}' on a member or in its event)",
                     describe=lambda f: f[0] if f else "no member or event says so yet")
    finally:
        inf.stop()


# The scheduler's condition on a native PodGroup, by its API version (k8s.io/api scheduling/*/types.go):
# 1.36's v1alpha2 says PodGroupScheduled, 1.37 renamed it PodGroupInitiallyScheduled (terminal once True).
SCHEDULED_CONDITION = {"scheduling.k8s.io/v1alpha2": "PodGroupScheduled"}
INITIALLY_SCHEDULED = "PodGroupInitiallyScheduled"


def writes_pod_group_status(backend: Backend) -> bool:
    """Does the scheduler of ``backend`` write a PodGroup of its own a status (native from 1.36, v1alpha2+)?"""
    return backend.name == "native" and bool(backend.api) and backend.api != LEGACY_NATIVE_API


def pod_group_condition(api: client.ApiClient, backend: Backend, gang: Gang) -> dict | None:
    """The condition the scheduler wrote on ``gang``'s native PodGroup (``scheduled_condition``; its
    schedule_one_podgroup.go: True/Scheduled once the group's quorum is placed; False/Unschedulable when a
    PodGroup cycle could not place it); {} while none is written; None if the PodGroup is gone."""
    pg = get_if_present(api, native_path(backend.api, gang.namespace, "podgroups", gang.name))
    if pg is None:
        return None
    kind = scheduled_condition(backend)
    return next((c for c in (pg.get("status") or {}).get("conditions") or [] if c.get("type") == kind), {})


def scheduled_condition(backend: Backend) -> str:
    return SCHEDULED_CONDITION.get(backend.api, INITIALLY_SCHEDULED)


def wait_pod_group_condition(api: client.ApiClient, backend: Backend, gang: Gang, status: str, reason: str,
                             timeout: float) -> dict:
    """Until the scheduler has written ``status``/``reason`` on ``gang``'s PodGroup; the condition, or one
    failure line that says what the PodGroup holds instead."""
    what = f"PodGroup {gang.name} with {scheduled_condition(backend)}={status} ({reason}) written by the scheduler"
    try:
        with phase(f"wait until {what}"):
            return wait_for(lambda: pod_group_condition(api, backend, gang),
                            until=lambda c: bool(c) and c.get("status") == status and c.get("reason") == reason,
                            timeout=timeout, interval=0.5, what=what)
    except AssertionError:
        c = pod_group_condition(api, backend, gang)
        raise AssertionError(f"{what}: not within {timeout:g} s; the PodGroup " + (
            "is gone" if c is None else "has no such condition" if not c else
            f"says {c.get('status')}/{c.get('reason')}: {c.get('message', '')[:200]}")
            + (f" ({gang.decided_by})" if not c and gang.decided_by else "")) from None


def wait_pods_bound(api: client.ApiClient, ns: str, names: list[str], timeout: float, what: str) -> dict:
    def unbound():
        b = bindings(api, ns, RUN_LABEL)
        return {n: b.get(n) for n in names}
    with phase(f"wait until {what}"):
        return wait_for(unbound, until=lambda m: all(m.values()), timeout=timeout, interval=0.5, what=what,
                        describe=lambda m: f"{sum(1 for v in m.values() if v)} of {len(names)} bound",
                        explain=lambda m: explain_pods(api, ns, [n for n, v in m.items() if not v], len(names)))


def probe_scheduler(api: client.ApiClient, ns: str, run_id: str, scheduler: str, place: Placement,
                    timeout: float) -> None:
    """Fail with one line unless a scheduler answers to ``scheduler`` (a probe pod gets bound)."""
    name = "scheduler-probe"
    create_pods(api, ns, [pod_body(name, run_id, scheduler=scheduler, node_selector=place.node_selector,
                                   tolerations=place.tolerations)])
    try:
        wait_pods_bound(api, ns, [name], timeout, f"probe pod bound by {scheduler}")
    except AssertionError:
        raise HarnessError(f"no scheduler named {scheduler!r} is running: a probe pod was not bound "
                           f"within {timeout:g} s; start it, or set gang_scheduler_name to the "
                           "scheduler that runs Coscheduling") from None
    finally:
        delete_pods(api, ns, [name])


def node_labels(api: client.ApiClient, nodes: list[str], key: str) -> dict[str, str | None]:
    """Each node's value of label ``key``."""
    return {n: (get_if_present(api, f"/api/v1/nodes/{n}") or {}).get("metadata", {}).get("labels", {}).get(key)
            for n in nodes}


def usable_nodes(api: client.ApiClient, pool_label: str, exclude_pools: tuple[str, ...],
                 gpus: int, free_only: bool = True) -> int:
    """Ready nodes in the profile's pools (minus ``exclude_pools``), with all GPUs free if ``free_only``."""
    nodes = list_raw(api, "/api/v1/nodes", {"labelSelector": pool_label}, timeout=300)["items"]
    busy = set()
    pods = [] if not free_only else list_raw(
        api, "/api/v1/pods", {"fieldSelector": "status.phase!=Succeeded,status.phase!=Failed"}, timeout=300)["items"]
    for p in pods:
        if p["spec"].get("nodeName") and any(
                (c.get("resources", {}).get("requests") or {}).get("nvidia.com/gpu")
                for c in p["spec"].get("containers", [])):
            busy.add(p["spec"]["nodeName"])
    return sum(1 for n in nodes
               if n["metadata"]["labels"].get(pool_label) not in exclude_pools
               and is_ready(n) and n["metadata"]["name"] not in busy
               and int(n["status"].get("allocatable", {}).get("nvidia.com/gpu", "0")) >= gpus)


def leftovers(api: client.ApiClient, run_id: str) -> dict[str, int]:
    """Pods and PodGroups/Workloads of ``run_id`` still present (for cleanup checks), in every gang API served."""
    sel = {"labelSelector": f"{RUN_LABEL}={run_id}"}
    out = {"pods": len(list_raw(api, "/api/v1/pods", sel)["items"])}
    native = serving(api, NATIVE_APIS, "workloads")
    paths = [("podgroups", "/apis/scheduling.x-k8s.io/v1alpha1/podgroups")]
    if native:
        paths += [("workloads", f"/apis/{native}/workloads")]
        if native != LEGACY_NATIVE_API:
            paths += [("native podgroups", f"/apis/{native}/podgroups")]
    for kind, path in paths:
        found = get_if_present(api, path, sel)
        if found is not None:
            out[kind] = len(found["items"])
    return out
