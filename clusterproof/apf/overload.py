"""API overload: the flood's own flow, its identities, and the measured flood (what the fixtures of
suites/test_api_overload.py, ``clusterproof.fixtures.apf``, and clusterproof/bench/apf.py run).

Why a module: the suite asserts what held during a flood; how the flood's
flow came to exist and how it was measured belongs here, undone at the end
(also after Ctrl-C; a killed run's objects carry the run label and are swept,
``clusterproof.kube.sweep.CLUSTER_SCOPED``):

- a ``PriorityLevelConfiguration`` of type Limited with ``apf_flood_shares``
  nominal shares, nothing lent or borrowed, and ``Reject`` (or, for the
  negative control, ``Queue``) as its limit response -- or, with
  ``apf_flood_priority_level``, an existing level the run's FlowSchema points
  at (the exempt control);
- a ``FlowSchema`` that matches the flood identity only (the run's
  ServiceAccount, or ``apf_flood_user`` impersonated), at precedence 1000;
- for an impersonated identity: a ClusterRole/Binding that lets the run's
  ServiceAccount impersonate exactly that user (and group).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from kubernetes import client

from clusterproof.apf import flood as fm
from clusterproof.apf.flood_plan import KIND_LABEL, KINDS
from clusterproof.cluster.apiguard import server_errors
from clusterproof.core import measurement, progress
from clusterproof.core.attachment import Attach, Attachment
from clusterproof.core.errors import HarnessError
from clusterproof.core.locust import LocustResult, Master, run_locust
from clusterproof.core.measurement import measured
from clusterproof.core.run import RUN_LABEL, metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube import flowcontrol as apf
from clusterproof.kube.access import HOME
from clusterproof.kube.claims import TURN, Claims
from clusterproof.kube.client import api_message as apf_message
from clusterproof.kube.client import raw_request
from clusterproof.kube.ownership import REPLACED, delete_owned, owned_objects, read_records
from clusterproof.kube.podtimeline import PodTimeline
from clusterproof.kube.tokens import SERVICE_ACCOUNT, create_load_identity
from clusterproof.report.plots import Plot, Series

# One fixed name for the flood's FlowSchema and level (and, for apf_flood_user, its impersonation
# ClusterRole/Binding): clusterproof/kube/rbac-destructive.yaml can grant get/delete on exactly this name, and its
# admission policy allows creating nothing else. Runs take turns on it (clusterproof.kube.claims).
FLOW_NAME = "clusterproof-flood"
PRECEDENCE = 1000          # after exempt/probes/system schemas' own subjects; before service-accounts (9000)
RBAC = "/apis/rbac.authorization.k8s.io/v1"


def level_body(name: str, run_id: str, shares: int, queues: int, hand_size: int, queue_length: int) -> dict:
    """A Limited level with exactly its nominal seats (nothing lent or borrowed); Reject, or Queue."""
    response = ({"type": "Reject"} if queues == 0 else
                {"type": "Queue", "queuing": {"queues": queues, "handSize": hand_size,
                                              "queueLengthLimit": queue_length}})
    return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "PriorityLevelConfiguration",
            "metadata": metadata(name, run_id),
            "spec": {"type": "Limited", "limited": {"nominalConcurrencyShares": shares, "lendablePercent": 0,
                                                     "borrowingLimitPercent": 0, "limitResponse": response}}}


def schema_body(name: str, run_id: str, level: str, subject: dict) -> dict:
    return {"apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema", "metadata": metadata(name, run_id),
            "spec": {"priorityLevelConfiguration": {"name": level}, "matchingPrecedence": PRECEDENCE,
                     "distinguisherMethod": {"type": "ByUser"},
                     "rules": [{"subjects": [subject],
                                "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                                   "namespaces": ["*"], "clusterScope": True}],
                                "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]}}


def flood_subject(profile, namespace: str) -> tuple[dict, str]:
    """(FlowSchema subject, user name) of the flood identity."""
    if profile.apf_flood_user:
        return {"kind": "User", "user": {"name": profile.apf_flood_user}}, profile.apf_flood_user
    return ({"kind": "ServiceAccount", "serviceAccount": {"namespace": namespace, "name": SERVICE_ACCOUNT}},
            f"system:serviceaccount:{namespace}:{SERVICE_ACCOUNT}")


@dataclass
class FloodFlow:
    schema: str
    level: str
    level_type: str                       # Limited / Exempt
    user: str
    fs_uid: str = ""
    pl_uid: str = ""
    created: list[tuple[str, str]] = field(default_factory=list)    # (path, uid), removed in reverse

    def remove(self, api: client.ApiClient, lost: Callable[[], str | None] = lambda: None,
               say: Callable[[str], None] = progress.say) -> None:
        """Remove what the run created, each only if it is still the object the run made.

        ``lost``: why the run no longer holds its turn on the fixed names (``Claims.lost``), None while
        it does. A run that lost it (its Lease expired: exit 7, a ``finally`` after the loss) removes
        nothing, with a line: a sweeper may have removed its flow and a live run made the same names
        again. What is still its own, the owner record names (uid for uid) for the sweeper.

        Each DELETE carries the uid the create answered -- the uid alone, not the resourceVersion: the
        apiserver's APF configuration controller writes the FlowSchema's status (its Dangling
        condition) after the create, so the resourceVersion the run saw changes with no other run
        writing; and no run takes over a flow in place (each creates its own, 409 if the names are
        taken), so another run's flow always has another uid. 409: another run's, left in place."""
        why = lost() if self.created else None
        if why:
            say(f"the flood's flow is left in place ({', '.join(p.rsplit('/', 2)[1] for p, _ in self.created)} "
                f"{FLOW_NAME}): {why}; this run removes nothing that a live run may hold now")
            self.created.clear()
            return
        for path, uid in reversed(self.created):
            if delete_owned(api, path, uid) == REPLACED:
                say(f"{path} is another object now (not uid {uid}, which this run made): another run's, "
                    "left in place")
        self.created.clear()


def _create(api, path: str, body: dict, flow: FloodFlow) -> dict:
    obj = json.loads(raw_request(api, "POST", path, body=body).data)
    flow.created.append((f"{path}/{body['metadata']['name']}", obj["metadata"]["uid"]))
    return obj


def install_flow(api: client.ApiClient, profile, run_id: str, config: apf.ApfConfig, namespace: str) -> FloodFlow:
    subject, user = flood_subject(profile, namespace)
    name = FLOW_NAME
    level = profile.apf_flood_priority_level or name
    flow = FloodFlow(name, level, "", user)
    try:
        if profile.apf_flood_user:
            rules = [{"apiGroups": [""], "resources": ["users"], "verbs": ["impersonate"],
                      "resourceNames": [profile.apf_flood_user]}]
            if profile.apf_flood_group:
                rules.append({"apiGroups": [""], "resources": ["groups"], "verbs": ["impersonate"],
                              "resourceNames": [profile.apf_flood_group]})
            _create(api, f"{RBAC}/clusterroles", {"metadata": metadata(name, run_id), "rules": rules}, flow)
            _create(api, f"{RBAC}/clusterrolebindings", {
                "metadata": metadata(name, run_id),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": namespace}]}, flow)
            raw_request(api, "POST", f"{RBAC}/namespaces/{namespace}/rolebindings", body={
                "metadata": metadata(f"{name}-user", run_id),
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SERVICE_ACCOUNT},
                "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io",
                              "name": profile.apf_flood_user}]}).data
        if not profile.apf_flood_priority_level:
            pl = _create(api, apf.PRIORITY_LEVELS, level_body(name, run_id, profile.apf_flood_shares,
                                                               profile.apf_flood_queues, profile.apf_flood_hand_size,
                                                               profile.apf_flood_queue_length), flow)
        else:
            pl = config.levels[level]
        fs = _create(api, apf.FLOW_SCHEMAS, schema_body(name, run_id, level, subject), flow)
        flow.fs_uid, flow.pl_uid, flow.level_type = fs["metadata"]["uid"], pl["metadata"]["uid"], pl["spec"]["type"]
        return flow
    except client.ApiException as e:
        flow.remove(api)
        if e.status == 409:
            raise HarnessError(f"a {FLOW_NAME} FlowSchema or priority level already exists, made by no live run "
                               "and named in no dead run's owner record: the harness does not remove what it "
                               f"cannot prove it made; delete it by hand (kubectl delete flowschema,"
                               f"prioritylevelconfiguration {FLOW_NAME}) if it is a leftover") from None
        if e.status == 403:
            raise HarnessError(f"may not install the flood's flow ({apf_message(e)}): the run needs ClusterRole "
                               "clusterproof-destructive from clusterproof/kube/rbac.yaml (and, for apf_flood_user, "
                               "clusterroles/clusterrolebindings create and impersonate on that user)") from None
        raise
    except BaseException:
        flow.remove(api)
        raise


def check_names(config: apf.ApfConfig, profile) -> None:
    """Flow schemas and levels the profile names must exist on the cluster (bad input otherwise)."""
    for key, names in (("apf_node_flow_schema", [profile.apf_node_flow_schema]),
                       ("apf_controller_flow_schemas", profile.apf_controller_flow_schemas)):
        for n in names:
            if config.schema(n) is None:
                raise HarnessError(f"{key} names FlowSchema {n!r}, which the cluster does not have; it has "
                                   f"{', '.join(f['metadata']['name'] for f in config.flow_schemas)} "
                                   "(kubectl get flowschemas)")
    if profile.apf_flood_priority_level and profile.apf_flood_priority_level not in config.levels:
        raise HarnessError(f"apf_flood_priority_level names PriorityLevelConfiguration "
                           f"{profile.apf_flood_priority_level!r}, which the cluster does not have; it has "
                           f"{', '.join(sorted(config.levels))} (kubectl get prioritylevelconfigurations), "
                           "or leave it empty for the run's own level")


def classified_as(api: client.ApiClient, path: str) -> tuple[str, str]:
    """(FlowSchema UID, PriorityLevel UID) the apiserver put one GET of ``path`` in (response headers)."""
    try:
        resp = raw_request(api, "GET", path, timeout=30)
        resp.data
        h = resp.headers
    except client.ApiException as e:
        h = e.headers or {}
    return h.get(apf.FS_UID_HEADER, ""), h.get(apf.PL_UID_HEADER, "")


def locust_args(profile, namespace: str, run_id: str, identity, flow: FloodFlow) -> list[str]:
    """Arguments of load/flood.py (and load/kube_user.py); no secret, only the token's path."""
    args = ["--kube-token-file", str(identity.token_file), "--flood-namespace", namespace, "--flood-run-id", run_id,
            "--flood-pods", str(profile.apf_flood_pods), "--flood-seconds", f"{profile.apf_flood_s:g}",
            "--flood-impatient-fraction", f"{profile.apf_flood_impatient_fraction:g}",
            "--flood-max-attempts", str(profile.apf_flood_max_attempts),
            "--flood-fs-uid", flow.fs_uid, "--flood-pl-uid", flow.pl_uid]
    if identity.ca_file:
        args += ["--kube-ca-file", identity.ca_file]
    if profile.apf_flood_user:
        args += ["--kube-impersonate-user", profile.apf_flood_user]
        if profile.apf_flood_group:
            args += ["--kube-impersonate-group", profile.apf_flood_group]
    return args


@dataclass
class FloodClients(measurement.Typed):
    """One kind of the flood's clients, as load/flood.py counted them (its ``<csv>_flood.json``): the pods they
    planned and created, and how their requests were answered."""
    kind: str
    planned: int = measured("pods", default=0)
    created: int = measured("pods", default=0)
    responses_total: int = measured("responses", default=0)
    responses_429: int = measured("responses", default=0)
    without_retry_after: int = measured("responses", default=0)    # 429s without a Retry-After header
    classified_elsewhere: int = measured("responses", default=0)   # another FlowSchema/level UID than the flood's
    without_apf_headers: int = measured("responses", default=0)
    no_response: int = measured("requests", default=0)
    responses: dict[str, int] = field(default_factory=dict)        # load/flood.py's own labels -> count
    gave_up: list[str] = field(default_factory=list)               # pods given up after apf_flood_max_attempts
    lost_share: list[str] = field(default_factory=list)            # planned pods of lost locust workers

    @classmethod
    def of(cls, kind: str, summary: dict) -> "FloodClients":
        k = summary.get(kind, {})
        responses = k.get("responses", {})
        return cls(kind, k.get("planned", 0), k.get("created", 0), sum(responses.values()),
                   responses.get("status 429", 0), k.get("retry_after_s", {}).get("none", 0),
                   responses.get("classified elsewhere", 0), responses.get("without APF headers", 0),
                   responses.get("no response", 0), responses, k.get("gave_up", []), k.get("lost_share", []))

    @property
    def per_created_pod_429(self) -> float:
        """429s per created pod (a client that honours Retry-After should need fewer)."""
        return self.responses_429 / max(1, self.created)


@dataclass
class FloodRun(measurement.Base):
    """One measured flood: what the checks read (``measure_flood`` starts and ends its observers around the
    flood: ``Base``'s start and dispose; ``gather()`` is each client kind's figures, named ``<kind> <field>``)."""
    flow: FloodFlow
    config: apf.ApfConfig
    flood_ns: str
    probe_ns: str
    phases: fm.Phases
    probe: list[fm.Sample]
    probe_pods: list                       # clusterproof.kube.podtimeline.PodTimes
    probe_pods_planned: int
    flows: list[fm.FlowSample]
    leases: list[fm.LeaseSample]
    locust: LocustResult
    summary: dict                          # <csv>_flood.json
    existing_pods: dict[str, list[str]]    # kind -> names of the flood's pods at the end
    flapped: list[str]                     # nodes NotReady, or Ready again, since the flood started
    metrics_before: str
    metrics_after: str
    recovery_note: str = ""
    probe_class: tuple[str, str] = ("", "")   # (flow schema, level) the well-behaved client's requests got

    def probe_in(self, phase: str) -> list[fm.Sample]:
        p = self.phases
        bounds = {"baseline": (p.baseline, p.flood), "flood": (p.flood, p.flood_end),
                  "recovery": (p.flood_end, p.end)}[phase]
        return fm.window(self.probe, *bounds)

    def clients(self) -> dict[str, FloodClients]:
        """Each kind of flood client (``KINDS``), honouring Retry-After first."""
        return {k: FloodClients.of(k, self.summary) for k in KINDS}

    @property
    def other_classification(self) -> dict[str, int]:
        """The FlowSchema/level pairs flood responses named other than the flood's own (the five most frequent)."""
        return self.summary.get("other_classification") or {}

    def gather(self) -> list[measurement.Figure]:
        return [dataclasses.replace(f, name=f"{kind} {f.name}")
                for kind, c in self.clients().items() for f in c.gather()]

    def rejected_delta(self) -> dict[tuple[str, str, str], float]:
        return apf.delta(apf.rejected(self.metrics_after), apf.rejected(self.metrics_before))

    def server_errors(self) -> dict[tuple, float]:
        """5xx answers during the whole measurement, by verb/group/resource/subresource/code."""
        return server_errors(self.metrics_before, self.metrics_after)


def measure_flood(api: client.ApiClient, profile, run_id: str, flow: FloodFlow, config: apf.ApfConfig,
                  flood_ns: str, probe_ns: str, flood_ident, probe_ident, workdir: Path, say) -> FloodRun:
    """Baseline, flood, recovery: the observers run throughout, locust floods in the middle."""
    phases = fm.Phases()
    prober = fm.WellBehaved(fm.token_client(api, probe_ident.token_file), probe_ns, run_id, profile.apf_probe_rate)
    sampler, hearts = fm.FlowSampler(api), fm.HeartbeatWatch(api)
    timeline = PodTimeline(api, probe_ns, f"{RUN_LABEL}={run_id},{fm.PROBE_LABEL}=true").start()
    before = apf.scrape(api)
    phases.baseline = time.monotonic()
    for t in (prober, sampler, hearts):
        t.start()
    try:
        with progress.phase(f"api overload: baseline, {profile.apf_baseline_s:g} s before the flood"):
            # The baseline window itself: the well-behaved client's latency before any flood (a measurement).
            time.sleep(profile.apf_baseline_s)
        phases.flood_wall = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
        prober.pod_every = max(1, int(profile.apf_flood_s * profile.apf_probe_rate / max(1, profile.apf_probe_pods)))
        prober.pod_budget = profile.apf_probe_pods
        phases.flood = time.monotonic()
        say(f"api overload: flood of {profile.apf_flood_users} users for {profile.apf_flood_s:g} s as {flow.user} "
            f"(FlowSchema {flow.schema} -> PriorityLevel {flow.level})")
        with progress.phase(f"api overload: flood, {profile.apf_flood_users} users for {profile.apf_flood_s:g} s"):
            result = run_locust("load/flood.py", api.configuration.host, profile.apf_flood_users,
                                locust_args(profile, flood_ns, run_id, flood_ident, flow), workdir / "locust-flood",
                                timeout_s=profile.apf_flood_timeout_s,
                                status=lambda: f"the well-behaved client sent {len(prober.snapshot())} requests",
                                master=Master.of(profile, profile.apf_flood_locust_workers,
                                                 profile.apf_flood_locust_worker_names))
        phases.flood_end = time.monotonic()
        prober.pod_budget = 0
        with progress.phase("api overload: recovery after the flood"):
            note = wait_recovered(profile, flow, prober, sampler, phases)
        phases.end = time.monotonic()
    finally:
        for t in (prober, sampler, hearts):
            t.stop()
    after = apf.scrape(api)
    try:
        timeline.wait_running(len(prober.pods), timeout=120, stall_timeout=60)
    except WaitTimeout:
        pass                                  # the check reports the pods that were not started
    finally:
        timeline.stop()
    summary_file = Path(f"{result.csv_prefix}_flood.json")
    summary = json.loads(summary_file.read_text()) if summary_file.exists() else {}
    pods = json.loads(raw_request(api, "GET", f"/api/v1/namespaces/{flood_ns}/pods").data)["items"]
    existing: dict[str, list[str]] = {}
    for p in pods:
        kind = (p["metadata"].get("labels") or {}).get(KIND_LABEL, "?")
        existing.setdefault(kind, []).append(p["metadata"]["name"])
    probe_class = next(((s.fs_uid, s.pl_uid) for s in prober.snapshot() if s.fs_uid), ("", ""))
    uids = {u: name.split("/", 1)[1] for u, name in config.by_uid().items()}
    return FloodRun(flow, config, flood_ns, probe_ns, phases, prober.snapshot(), timeline.snapshot(),
                    len(prober.pods), sampler.samples, hearts.samples, result, summary, existing,
                    fm.not_ready_since(api, phases.flood_wall), before, after, note,
                    (uids.get(probe_class[0], "?"), uids.get(probe_class[1], "?")))


RECOVERY_WINDOW_S = 5.0     # longer than an etcd stall cycle (3 s): one slow request in it is seen


def recovery_state(samples: list, now: float, inflight: float | None, flood_end: float, bound: float) -> dict:
    """The well-behaved client's last ``RECOVERY_WINDOW_S`` after the flood (pure): its slowest request,
    and how long the request still in flight has been waiting."""
    window = [x for x in samples if x.t >= max(flood_end, now - RECOVERY_WINDOW_S)]
    slowest = max((x.latency_s for x in window), default=None)
    waiting = round(now - inflight, 3) if inflight is not None else 0.0
    full = now - flood_end >= RECOVERY_WINDOW_S and len(window) >= 5
    ok = full and slowest is not None and slowest <= bound and waiting <= bound and all(x.status for x in window)
    return {"ok": ok, "slowest_s": None if slowest is None else round(slowest, 4), "bound_s": round(bound, 4),
            "in_flight_s": waiting, "requests": len(window)}


def wait_recovered(profile, flow: FloodFlow, prober: fm.WellBehaved, sampler: fm.FlowSampler,
                   phases: fm.Phases) -> str:
    """After the flood: wait (bounded by ``apf_recovery_s``) until the flood's level has nothing queued
    (nor executing, for a Limited level) and every request the well-behaved client sent in the last
    ``RECOVERY_WINDOW_S`` (and the one in flight) took at most ``apf_recovery_factor`` x its baseline p99
    + 50 ms. Sets ``phases.recovered``; returns the last state seen."""
    base = fm.latency_figures(fm.window(prober.snapshot(), phases.baseline, phases.flood)).p99_s or 0.0
    bound = base * profile.apf_recovery_factor + 0.05

    def state():
        s = sampler.sample()
        st = recovery_state(prober.snapshot(), time.monotonic(), prober.inflight, phases.flood_end, bound)
        st["queued"], st["executing"] = (s.in_queue.get(flow.level, 0.0), s.executing.get(flow.level, 0.0)) \
            if s else (None, None)
        return st

    def done(st):
        # An exempt level has no queue, and its gauge counts the harness's own scrape.
        drained = st["queued"] == 0 and (st["executing"] == 0 or flow.level_type != "Limited")
        return st["ok"] and drained
    try:
        st = wait_for(state, until=done, timeout=profile.apf_recovery_s, interval=1,
                      what="the flood's level drained and the well-behaved client's latency back to baseline")
        phases.recovered = time.monotonic()
        return f"recovered: {st}"
    except WaitTimeout as e:
        return str(e)


def verify_classification(api: client.ApiClient, token_file: Path, namespace: str, flow: FloodFlow,
                          headers: dict | None = None) -> None:
    """Wait until the flood identity's requests carry the run's FlowSchema and level UIDs (APF picks up a
    new FlowSchema asynchronously); fail naming where they went instead."""
    probe = fm.token_client(api, token_file)
    if headers:
        probe.default_headers.update(headers)
    uids = {flow.fs_uid, flow.pl_uid}
    try:
        wait_for(lambda: classified_as(probe, f"/api/v1/namespaces/{namespace}/pods?limit=1"),
                 until=lambda got: set(got) == uids, timeout=60, interval=0.5,
                 what=f"requests of {flow.user} classified by FlowSchema {flow.schema} (uid {flow.fs_uid}) into "
                      f"PriorityLevel {flow.level} (uid {flow.pl_uid}) -- (FlowSchema uid, level uid) seen")
    finally:
        probe.close()


@contextmanager
def flooded(api: client.ApiClient, profile, run_id: str, config: apf.ApfConfig, work: Path, say, namespaces,
            attach: Attach):
    """The turn on the flood's named flow, namespaces, identities and the flow; a measured flood;
    everything removed afterwards (the suite's fixture and clusterproof/bench/apf.py). ``namespaces``: the cluster's
    namespace source; ``attach`` gets the flow's description once it is installed. Raises ``Busy`` when another
    live run holds the turn past ``claim_wait_s``."""
    turn = Claims(api, HOME, run_id, TURN)
    holder = turn.wait_take(FLOW_NAME, profile.claim_wait_s, lambda dead: remove_dead_flow(api, dead))
    if holder:
        raise Busy(f"the API flood's FlowSchema {FLOW_NAME} is another run's turn (run {holder}, alive) and stayed "
                   f"so for {profile.claim_wait_s} s (claim_wait_s): runs against one cluster flood one at a time")
    try:
        with _flooded(api, profile, run_id, config, work, say, namespaces, lambda: turn.lost(FLOW_NAME),
                      attach) as run:
            yield run
    finally:
        turn.release(FLOW_NAME)


class Busy(Exception):
    """A named object this check needs is held by another live run (the check is skipped, saying which)."""


def remove_dead_flow(api: client.ApiClient, run: str) -> None:
    """A dead run's flow objects, if its owner record proves they are its own (uid for uid)."""
    rec = read_records(api, HOME).get(run)
    for path, (uid, _how) in (owned_objects(api, run, rec) if rec else {}).items():
        if path.endswith(f"/{FLOW_NAME}") or path.endswith(f"/{FLOW_NAME}-user"):
            delete_owned(api, path, uid)


@contextmanager
def _flooded(api: client.ApiClient, profile, run_id: str, config: apf.ApfConfig, work: Path, say, namespaces,
             lost: Callable[[], str | None], attach: Attach):
    flood_ns = namespaces.take("flood")
    try:
        probe_ns = namespaces.take("probe")
    except BaseException:
        namespaces.give_back(flood_ns)
        raise
    flow = None
    try:
        flood_ident = create_load_identity(api, flood_ns, run_id, work / "flood-identity")
        probe_ident = create_load_identity(api, probe_ns, run_id, work / "probe-identity")
        flow = install_flow(api, profile, run_id, config, flood_ns)
        attach(Attachment("the flood's flow",
                          f"FlowSchema {flow.schema} (uid {flow.fs_uid}) -> PriorityLevel {flow.level} "
                          f"(uid {flow.pl_uid}, {flow.level_type}); subject {flow.user}"))
        imp = ({"Impersonate-User": profile.apf_flood_user,
                **({"Impersonate-Group": profile.apf_flood_group} if profile.apf_flood_group else {})}
               if profile.apf_flood_user else None)
        verify_classification(api, flood_ident.token_file, flood_ns, flow, imp)
        yield measure_flood(api, profile, run_id, flow, apf.read_config(api), flood_ns, probe_ns, flood_ident,
                            probe_ident, work, say)
    finally:
        if flow is not None:
            flow.remove(api, lost, say)
        try:
            namespaces.give_back(flood_ns)
        finally:
            namespaces.give_back(probe_ns)


def plots(run: FloodRun, profile) -> list[Plot]:
    """429s per second by flow schema, and the well-behaved client's latency, over the measurement."""
    t0 = run.phases.flood
    rej = fm.rejections_per_second(run.flows, t0)
    end = round(run.phases.flood_end - t0, 1)
    f429 = Plot(title=f"429 responses per second by flow schema (flood from 0 s to {end:g} s)",
                xlabel="seconds since the flood started (s)", ylabel="429 responses per second (1/s)",
                series=[Series(fs, pts, style="line") for fs, pts in sorted(rej.items())] or
                [Series("no flow schema rejected anything", [(0.0, 0.0)], style="line")])
    series = []
    for phase in ("baseline", "flood", "recovery"):
        pts = [(round(s.t - t0, 3), round(s.latency_s, 4)) for s in run.probe_in(phase) if s.status]
        series.append(Series(f"{phase} ({run.probe_class[0]} -> {run.probe_class[1]})", pts))
    lat = Plot(title="well-behaved client: latency of each request (its own ServiceAccount, another flow)",
               xlabel="seconds since the flood started (s)", ylabel="request latency (s)", series=series,
               thresholds={f"mutating SLO (p99 <= {profile.slo_mutating_p99_s:g} s)": profile.slo_mutating_p99_s})
    return [f429, lat]
