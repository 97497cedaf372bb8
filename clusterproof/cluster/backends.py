"""One facade, two backends: the embedded KWOK cluster or an existing cluster.

Why: suites read the same ``Cluster`` whatever is behind it (pytest-testinfra
style); only this module knows how a cluster comes to exist and goes away.

- embedded (default): kwokctl starts a real control plane (plus the
  Coscheduling scheduler and controller as extra components), then the
  profile's node plan is created as simulated nodes and followed to Ready;
  apiserver metrics are snapshotted around that bring-up.
- existing (``--cp-kubeconfig``/``--cp-context``): nothing is created at session
  level but the run's Lease; the harness is a guest and only sweeps what its
  own earlier, dead runs left (asking first on a cluster it does not own).

Two questions, answered apart (``Standing``): what the nodes are (``simulated``:
every node a kwok node -- report tags, mock GPUs) and what the harness may do
(``owned``: the cluster is an embedded one the harness started on this
machine, reached as its admin -- it may then create namespaces and nodes,
inject GPU faults and install admission policies). A cluster of kwok nodes
someone else built is a guest's cluster like any other.

Either way the run holds a Lease (``clusterproof.kube.liveness``) while it is alive.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from kubernetes import client

from clusterproof.cluster import coscheduling, identities, kueue, realnodes
from clusterproof.cluster.kwok import (
    NAME_PREFIX,
    KwokCluster,
    describe_go_env,
    embedded_here,
    sweep_clusters,
)
from clusterproof.cluster.nodes import create_nodes, wait_ready
from clusterproof.config.profile import Profile
from clusterproof.core import kubeversions, measurement
from clusterproof.core.attachment import Attach, Attachment
from clusterproof.core.errors import HarnessError
from clusterproof.core.keygroup import parse_team_namespaces
from clusterproof.core.ports import free_ports
from clusterproof.core.progress import phase
from clusterproof.core.run import metadata
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube import access, apimetrics
from clusterproof.kube import flowcontrol as apf
from clusterproof.kube.apicalls import CallRecorder
from clusterproof.kube.client import check_reachable, get_if_present, is_simulated, load_client, raw_request, server_url
from clusterproof.kube.liveness import RunLease
from clusterproof.kube.namespaces import Created, NamespacePool
from clusterproof.kube.ownership import OwnerRecord
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.sweep import Sweep, sweep
from clusterproof.provision import hostpkgs, toolchain


@dataclass
class BringUp(measurement.Base):
    """What happened while the embedded cluster's nodes came up: a measurement taken while the session's cluster
    was built (started and ended by the bring-up itself, so ``Base``'s start and dispose)."""
    nodes: int
    seconds_cluster_start: float
    seconds_create: float
    seconds_to_all_ready_condition: float   # every node reports Ready=True
    seconds_to_all_ready: float             # ... and has no not-ready taint (schedulable)
    metrics_before: str
    metrics_after: str
    first_create_at: float = 0.0            # time.monotonic() of the first create: the moments above count from it

    def gather(self) -> list[measurement.Figure]:
        """The bring-up as figures (a measurement taken while the session's cluster was built)."""
        f, n = measurement.figure, self.nodes
        rate = lambda s: n / s if s else None  # noqa: E731
        return [f("nodes brought up", n, "nodes"),
                f("control plane start", self.seconds_cluster_start, "s"),
                f("node objects created", self.seconds_create, "s"),
                f("first node create -> all Ready=True", self.seconds_to_all_ready_condition, "s"),
                f("first node create -> all schedulable", self.seconds_to_all_ready, "s", headline=True),
                f("nodes Ready per second", rate(self.seconds_to_all_ready_condition), "nodes/s"),
                f("nodes schedulable per second", rate(self.seconds_to_all_ready), "nodes/s")]


@dataclass
class Cluster:
    backend: str                 # "kwok" or "existing"
    simulated: bool              # nodes faked by kwok (True) or real hardware
    api: client.ApiClient
    kubeconfig: Path
    context: str | None
    server_version: str
    run_id: str
    profile: Profile
    lease: RunLease | None = None
    bringup: BringUp | None = None
    kwok: KwokCluster | None = None
    sweep: Sweep = field(default_factory=Sweep)
    # apiserver latency histograms when the harness connected (existing backend):
    # an SLO window must not include the apiserver's own start-up.
    metrics_at_connect: str | None = None
    # Per-flow-schema dispatch counts after bring-up (embedded) or at connect: where the
    # components' traffic is classified by API Priority and Fairness (report environment).
    apf: apf.Classification | None = None
    # Where the run's objects live: namespaces it creates (embedded) or claims from the pool.
    namespaces: Created | NamespacePool | None = None
    # Every request of the harness's identity (clusterproof.kube.apicalls), for the permission self-test and report.
    calls: CallRecorder = field(default_factory=CallRecorder)
    # The uids of what the run created outside its namespaces (a cluster it does not own).
    record: OwnerRecord | None = None
    # The shipped RBAC manifest the run was checked against (a cluster it does not own).
    manifest: access.Manifest | None = None
    # Real kubelets on containerd beside the kwok nodes (embedded, profile key real_nodes).
    real: realnodes.Joined | None = None
    # The harness started this cluster (``Standing.owned``): it may create namespaces and nodes, inject GPU
    # faults and install admission policies. False: a guest, whatever its nodes are.
    owned: bool = False

    def probe_api_calls(self, n: int = 20) -> None:
        """A tiny, safe load: n PodTemplate creates and a LIST in a namespace of the run's, then removed.

        PodTemplates: stored, never run, and written by no controller (the window counts only these)."""
        ns = self.namespaces.take("probe")
        try:
            for i in range(n):
                raw_request(self.api, "POST", f"/api/v1/namespaces/{ns}/podtemplates", body={
                    "metadata": metadata(f"probe-{i}", self.run_id),
                    "template": {"spec": pod_body(f"probe-{i}", self.run_id)["spec"]}}).data
            raw_request(self.api, "GET", f"/api/v1/namespaces/{ns}/podtemplates").data
        finally:
            self.namespaces.give_back(ns)

    def describe(self) -> dict[str, str]:
        """The run environment, for the report (no credentials, only the server URL)."""
        env = {
            "backend": self.backend,
            "ownership": "the harness's own (embedded, started on this machine)" if self.owned else
                         "a guest (not an embedded cluster the harness started, or not reached as its admin)",
            "hardware": ("simulated (kwok nodes)" if self.simulated else "real cluster")
                        + (f" + {len(self.real.nodes)} real node(s): real kubelet, containerd and containers, "
                           "simulated GPUs" if self.real else ""),
            "kubernetes.server": self.server_version,
            "api.server": server_url(self.api),
            "profile": self.profile.name,
            "profile.nodes": str(self.profile.nodes),
            "run.id": self.run_id,
            "run.lease": f"{self.lease.namespace}/{self.lease.name}" if self.lease else "none",
            "sweep": ("; ".join(self.sweep.lines()))[:500],
        }
        if self.apf is not None and self.kwok is not None and self.kwok.component_identities:
            env.update(self.apf.describe(identities.IDENTITIES))
        elif self.apf is not None:
            env["apf.dispatched"] = self.apf.summary()
        if self.real is not None:
            kubelet = kubeversions.kubelet_version(self.kwok.kubernetes_version)
            env["nodes.real"] = (f"{', '.join(self.real.names)}: REAL kubelet {kubelet} "
                                 f"on containerd "
                                 f"{hostpkgs.PACKAGES['containerd']} and runc {hostpkgs.PACKAGES['runc']}, real "
                                 "containers; GPUs SIMULATED (mock NVML handed in by the node's GPU runtime)")
        if self.kwok:
            env.update({"kwok": toolchain.KWOK_VERSION, "etcd": toolchain.ETCD_VERSION,
                        "kubernetes.toolchain": self.kwok.kubernetes_version,
                        "kubernetes.feature.gates": self.kwok.feature_gates or "none",
                        "kubernetes.runtime.config": self.kwok.runtime_config or "none",
                        "feature.gates.unknown.to.this.version": ", ".join(self.kwok.dropped_feature_gates) or "none",
                        "heartbeat.factor": f"{self.kwok.heartbeat_factor:g}",
                        "go.runtime": describe_go_env(self.kwok.go_env),
                        "node.lease.duration.s":
                            f"{self.kwok.node_lease_duration_s * self.kwok.heartbeat_factor:g}"})
        return env


def start_embedded(profile: Profile, run_id: str, progress: Callable[[str], None],
                   keep: bool = False, coscheduling_components: bool = True, kueue_components: bool = False,
                   on_lease_lost: Callable[[str], None] | None = None,
                   local_sweeps: Sequence[LocalSweep] = (), logs_to: Path | None = None) -> Cluster:
    """An embedded cluster for this run; ``coscheduling_components``: with the Coscheduling scheduler
    and controller (only runs that schedule gangs need them; they cost the apiserver a watcher each);
    ``kueue_components``: with Kueue and JobSet (``clusterproof.cluster.kueue``; only runs that admit through
    Kueue need them), declared here and idle until the first check that admits through Kueue starts them
    (``kueue.start``): the bring-up is measured without them.
    ``on_lease_lost``: called with one line if the run's Lease is lost (``clusterproof.kube.liveness``).
    ``local_sweeps``: what else dead runs left on this machine (``sweep_local``). ``logs_to``: where the
    control plane's logs are kept if the bring-up fails (the cluster, and its logs with it, is deleted)."""
    sweep_local(progress, clusters=True, others=local_sweeps)
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", profile.heartbeat_factor, profile.node_lease_duration_s,
                     kwok_parallelism=profile.kwok_parallelism,
                     kubernetes_version=profile.kubernetes_version,
                     scheduler_api_qps=profile.scheduler_api_qps,
                     scheduler_api_burst=profile.scheduler_api_burst,
                     feature_gates=kubeversions.gates(profile.kubernetes_version, profile.kube_feature_gates,
                                                     profile.kube_alpha_gates),
                     runtime_config=kubeversions.runtime_config(profile.kubernetes_version,
                                                            profile.kube_runtime_config),
                     component_identities=profile.component_identities,
                     go_env={k: dict(v) for k, v in profile.component_go_env.items()},
                     extra_args=(f"kube-controller-manager=kube-api-qps={profile.kcm_api_qps}",
                                 f"kube-controller-manager=kube-api-burst={profile.kcm_api_burst}",
                                 *kcm_endpoint_args(profile)))
    # every binary the start runs first: a build that fails ends the run before anything runs (what a check
    # uses later, Prometheus, is built by ./proof run's prepare step, or on first use)
    toolchain.ensure_many(toolchain.bringup([u for u, used in (("real_nodes", profile.real_nodes > 0),
                                                               ("gangs", coscheduling_components),
                                                               ("kueue", kueue_components)) if used],
                                            profile.kubernetes_version), progress)
    built = real_node_images(profile, progress)
    lease = None
    try:
        t0 = time.monotonic()
        kc.prepare()
        if profile.real_nodes:
            kc.real_nodes = realnodes.plan(kc.directory, kc.name, profile.real_nodes,
                                           free_ports(2 * profile.real_nodes))
            kc.real_node_sandbox_image = built["pause"].ref
            kc.real_node_nvml = (str(toolchain.MOCKNVML.path("libnvidia-ml.so.1")) if profile.real_node_nvml
                                 else None)
            kc.real_node_identity = profile.real_node_identity
        ports = tuple(free_ports(2))
        if coscheduling_components:
            kc.components = coscheduling.components(kc.directory, kc.kubeconfig, profile.gang_scheduler_qps,
                                                    profile.gang_scheduler_burst,
                                                    profile.gang_unschedulable_flush_s, ports)
        if kueue_components:
            kc.components = [*kc.components, *kueue.components(
                kc.directory, kc.kubeconfig, dict(zip(kueue.PORTS, free_ports(len(kueue.PORTS)))),
                profile.kueue_api_qps, profile.kueue_api_burst,
                profile.kueue_pods_ready_timeout_s if profile.kueue_wait_for_pods_ready else None,
                profile.kueue_backoff_base_s,
                profile.kueue_backoff_max_s)]
        progress(f"starting embedded cluster {kc.name} (kwokctl, binary runtime, "
                 f"Kubernetes {profile.kubernetes_version}"
                 + (f", Coscheduling {toolchain.SCHEDULER_PLUGINS_VERSION} as {coscheduling.OWN_SCHEDULER!r})"
                    if coscheduling_components else ")"))
        with phase("start the control plane (kwokctl create cluster)"):
            kc.start(timeout=profile.cluster_start_timeout_s)
        if keep:
            (kc.directory / "keep").touch()
        t_started = time.monotonic()
        api = load_client(kc.kubeconfig, pool_size=max(16, profile.node_create_concurrency))
        calls = CallRecorder().install(api)
        version = check_reachable(api)["gitVersion"]
        if kc.component_identities:
            identities.grant_simulated_kubelets(api)
        access.provision(api)      # as an SRE would: home, pool and roles, for runs pointed at this cluster
        lease = run_lease(api, run_id, access.HOME, profile, on_lease_lost).acquire()
        wait_controllers_started(api, kc)
        wait_kwok_watching(kc, progress)
        if coscheduling_components:
            coscheduling.apply_crds(api, run_id)
            kc.wait_healthy(coscheduling.health_urls(ports))
        real = None
        if kc.real_nodes:
            with phase(f"join {len(kc.real_nodes)} real node(s)"):
                real = realnodes.join(api, kc.directory, kc.real_nodes, built, profile.node_gpus, kc.real_node_nvml,
                                      t0, profile.cluster_start_timeout_s, progress)
        before = apimetrics.scrape(api)
        t1 = time.monotonic()
        with phase(f"create {profile.nodes:,} simulated nodes"):
            n = create_nodes(api, profile, run_id, progress)
        t_created = time.monotonic()
        with phase(f"wait until {n:,} nodes are Ready and schedulable"):
            tracker = wait_ready(api, run_id, n, profile.bringup_timeout_s, progress)
        t_ready = time.monotonic()
        after = apimetrics.scrape(api)
        flows = apf.Classification(apf.dispatched(apf.scrape(api)))
        t_condition = (tracker.all_condition_at or t_ready) - t1
        progress(f"{n} nodes Ready=True {t_condition:.1f} s and schedulable {t_ready - t1:.1f} s "
                 f"after the first create (control plane up in {t_started - t0:.1f} s)")
        return Cluster("kwok", True, api, kc.kubeconfig, None, version, run_id, profile, lease,
                       BringUp(n, t_started - t0, t_created - t1, t_condition, t_ready - t1,
                               before, after, t1), kc, apf=flows, namespaces=Created(api, run_id), calls=calls,
                       real=real, owned=True)
    except BaseException:
        if lease is not None:
            lease.abandon()
        if not keep:
            kept = kc.keep_logs(logs_to) if logs_to is not None else None
            if kept is not None:
                progress(f"bring-up failed: the control plane's logs are kept in {kept}")
            kc.delete()
        raise


def real_node_images(profile: Profile, progress: Callable[[str], None]) -> dict:
    """The images real nodes run (built here, cached; clusterproof.provision.images), after the host is checked."""
    if not profile.real_nodes:
        return {}
    from clusterproof.provision import images
    realnodes.require_host()
    toolchain.ensure(toolchain.kubelet(profile.kubernetes_version), progress)
    return {"pause": images.build(images.PAUSE, progress), "checker": images.build(images.CHECKER, progress)}


LocalSweep = Callable[[Callable[[str], None]], None]


def sweep_local(progress: Callable[[str], None], clusters: bool, others: Sequence[LocalSweep] = ()) -> None:
    """What runs on this machine left that were killed before their teardown: embedded clusters
    (``clusters``: only a run that starts its own sweeps them) and what the domains name in ``others``
    (the harness passes the Prometheus directories, which hold a copy of an existing cluster's API
    token -- swept by every run, whatever suites it runs)."""
    if clusters:
        swept = sweep_clusters(say=progress)
        if swept:
            progress(f"swept {len(swept)} abandoned embedded cluster(s): {', '.join(swept)}")
    for sweep_other in others:
        sweep_other(progress)


def run_lease(api: client.ApiClient, run_id: str, home: str, profile: Profile,
              on_lost: Callable[[str], None] | None) -> RunLease:
    """The run's Lease, in the harness's home namespace; ``on_lost`` stops the run (clusterproof.kube.liveness)."""
    return RunLease(api, run_id, home, profile.run_lease_duration_s, on_lost=on_lost)


def kcm_endpoint_args(profile: Profile) -> tuple[str, ...]:
    """kube-controller-manager's slice size, if the profile sets one (the watch suite's negative control)."""
    n = profile.watch_kcm_max_endpoints_per_slice
    return (f"kube-controller-manager=max-endpoints-per-slice={n}",) if n else ()


def wait_controllers_started(api: client.ApiClient, kc: KwokCluster, timeout: float = 120) -> None:
    """kube-controller-manager is working once it has created the default ServiceAccount.

    Why wait: its start-up burst (service accounts, endpoint slices, RBAC
    aggregation) is not node bring-up and must not land in the SLO window;
    pods also need that ServiceAccount in their namespace. If it does not,
    the failure names the component's state: running or not, its last words.
    """
    what = "kube-controller-manager created the default ServiceAccount"
    try:
        wait_for(lambda: get_if_present(api, "/api/v1/namespaces/default/serviceaccounts/default"),
                 timeout=timeout, interval=0.5, what=what)
    except WaitTimeout:
        raise WaitTimeout(f"{what}: not reached within {timeout:g} s; "
                          f"{kc.component_state('kube-controller-manager')}") from None


KWOK = "kwok-controller"
KWOK_WATCHING = '"msg":"Watch '        # kwok v0.8.0 logs "Watch nodes" (or "Watch all nodes") once it got a node list
KWOK_RESTARTS = 2


def wait_kwok_watching(kc: KwokCluster, progress: Callable[[str], None], timeout: float = 120) -> None:
    """kwok-controller is past its start-up wait, or started again if it gave up.

    Why: kwok v0.8.0 waits for the API server with five node lists 1-8 s apart (about 15 s;
    pkg/kwok/cmd/root.go, waitForReady), counting a refused connection and a forbidden list (its
    identity's RBAC is granted only once the API server answers, identities.grant_simulated_kubelets)
    alike, then exits -- and kwokctl does not start it again. On a loaded machine the API server can
    take longer than that: the nodes were then created for no one, and the bring-up waited out its
    whole timeout with 0 Ready (seen in a CI run with four clusters starting beside each other).
    """
    restarts: list[str] = []

    def watching() -> bool:
        log = kc.directory / "logs" / f"{KWOK}.log"
        if log.exists() and KWOK_WATCHING in log.read_text(errors="replace"):
            return True
        if KWOK not in kc.pids() and len(restarts) < KWOK_RESTARTS:
            restarts.append(kc.last_words(KWOK))
            kc.start_stopped()
            progress(f"{KWOK} exited before it could list nodes (it waits about 15 s for the API server and "
                     f"its RBAC; its last log line: {restarts[-1][:300]}); started again")
        return False
    try:
        wait_for(watching, timeout=timeout, interval=0.5, what=f"{KWOK} watching nodes")
    except WaitTimeout:
        raise WaitTimeout(f"{KWOK} watching nodes: not reached within {timeout:g} s "
                          f"({len(restarts)} restarts); {kc.component_state(KWOK)}") from None


@dataclass(frozen=True)
class Standing:
    """What the harness is on a cluster a kubeconfig names, decided once before any test."""
    manifest: access.Manifest      # what it was granted there (checked against the API server)
    simulated: bool                # what the nodes are: every one a kwok node (and not --cp-as-real-cluster)
    owned: bool                    # what it may do: an embedded cluster it started here, reached as its admin
    why: str                       # one line: why it is (or is not) the harness's own


def ownership(api: client.ApiClient, as_real_cluster: bool) -> tuple[bool, str]:
    """(owned, one line saying why) for the cluster ``api`` reaches.

    Owned is ``kwok.embedded_here``: an embedded cluster the harness started on this machine (kept or not),
    reached as its admin. Not "every node is a kwok node": anyone can build a cluster of kwok nodes (kwokctl by
    hand), and a guest must not create namespaces or nodes, or install admission policies there. The embedded
    cluster reached with the ServiceAccount's token is a guest's too (tests/test_permissions.py runs that way)."""
    if as_real_cluster:
        return False, "a guest (--cp-as-real-cluster)"
    name = embedded_here(api)
    if name is not None:
        return True, f"the harness's own embedded cluster {name}, reached as its admin"
    return False, "a guest: not an embedded cluster the harness started on this machine, reached as its admin"


def check_existing(profile: Profile, kubeconfig: str, context: str | None, calls: CallRecorder, destructive: bool,
                   as_real_cluster: bool) -> Standing:
    """Before any test, on a cluster named by a kubeconfig: reachable, the identity holds what the shipped
    manifest grants (``destructive``: its destructive part too), and the profile asks nothing a guest may not
    do. Returns the harness's ``Standing`` there; raises ``HarnessError`` (one line) otherwise. ``calls``
    records the permission preflight's requests too."""
    api = load_client(kubeconfig, context)
    calls.install(api)    # the permission preflight's requests are the run's too
    check_reachable(api)
    team_namespaces = tuple(parse_team_namespaces(profile.team_namespaces).values())
    manifest = access.check(api, destructive=destructive, team_namespaces=team_namespaces,
                            needs=access.pool_needs(profile) if destructive else None, pool_label=profile.pool_label)
    simulated = not as_real_cluster and is_simulated(api)
    owned, why = ownership(api, as_real_cluster)
    if not owned and profile.team_admission in ("harness", "wildcard"):
        raise HarnessError(f"team_admission={profile.team_admission} installs admission policies, which act "
                           "on every matching pod of the cluster: a guest never does that on a cluster it "
                           "does not own; test the cluster's own admission (team_admission: cluster)")
    return Standing(manifest, simulated, owned, why)


def connect_existing(profile: Profile, run_id: str, kubeconfig: str, context: str | None,
                     progress: Callable[[str], None], simulated: bool, manifest: access.Manifest,
                     sweep_leftovers: bool = False,
                     on_lease_lost: Callable[[str], None] | None = None,
                     calls: CallRecorder | None = None, local_sweeps: Sequence[LocalSweep] = (),
                     owned: bool | None = None, why: str = "") -> Cluster:
    """A cluster named by a kubeconfig (``manifest``: what the harness was granted there, checked at configure).

    ``simulated``: decided at configure time (every node a kwok node, unless the run was told to treat it
    as real). ``owned`` and ``why``: likewise (``ownership``; None: decided here). On a cluster the
    harness owns, the run creates its namespaces; on any other it works in namespaces claimed from the
    pool. The sweeper removes leftovers on the harness's own cluster of kwok nodes, and elsewhere lists them
    unless ``sweep_leftovers`` or the profile's ``sweep_real_clusters`` says remove. What the run creates
    outside its namespaces goes into its owner record.
    """
    sweep_local(progress, clusters=False, others=local_sweeps)
    api = load_client(kubeconfig, context)
    calls = (calls or CallRecorder()).install(api)
    version = check_reachable(api)["gitVersion"]
    if owned is None:     # a caller that did not ask before (the benches)
        owned, why = ownership(api, as_real_cluster=False)
    lease = run_lease(api, run_id, manifest.home, profile, on_lease_lost).acquire()
    record = None
    try:
        # Leftovers are removed without asking only on the harness's own cluster of kwok nodes: a real node, or
        # a cluster it does not own, is someone's, so the sweeper lists them there unless told to remove.
        remove = (owned and simulated) or sweep_leftovers or profile.sweep_real_clusters
        result = sweep(api, run_id, manifest.home, remove, progress)
        # A guest works only in the provisioned pool, whatever the nodes are; on its own embedded cluster the
        # harness creates namespaces (and labels them for team checks).
        spaces = (Created(api, run_id) if owned else
                  NamespacePool(api, run_id, manifest.home, manifest.pool, profile.claim_wait_s, progress))
        record = OwnerRecord(api, manifest.home, run_id, lambda: spaces.held).create().attach(calls)
        progress(f"using existing cluster at {server_url(api)} (Kubernetes {version}; {why}; "
                 f"{'every node a kwok node' if simulated else 'real nodes'}); "
                 + ("namespaces created by the run" if owned else
                    f"namespace pool: {len(manifest.pool)} ({manifest.pool[0]} ..)"))
        return Cluster("existing", simulated, api, Path(kubeconfig), context, version, run_id,
                       profile, lease, sweep=result, metrics_at_connect=apimetrics.scrape(api),
                       apf=apf.Classification(apf.dispatched(apf.scrape(api))),
                       namespaces=spaces, calls=calls, record=record, manifest=manifest, owned=owned)
    except BaseException:
        if record is not None:
            record.delete()
        lease.release()
        raise


def release_owned(cluster: Cluster, progress: Callable[[str], None]) -> None:
    """At the end of a run on a cluster it does not own: every pool namespace still held is emptied, and
    everything the owner record names is removed (what a check's own clean-up missed), then the record.

    Why here too: a check's teardown that failed half-way must not leave objects behind; the run holds
    its Lease until this is done, so no other run's sweeper races it."""
    if cluster.namespaces is not None:
        cluster.namespaces.release_all()
    if cluster.record is None:
        return
    from clusterproof.kube.node_taints import release_run_taints
    from clusterproof.kube.ownership import Record, delete_owned, owned_objects, read_records
    rec = read_records(cluster.api, cluster.record.namespace).get(cluster.run_id, Record())
    left = owned_objects(cluster.api, cluster.run_id, rec)
    removed = []
    for path, (uid, how) in sorted(left.items()):
        if how == "borrowed":
            if release_run_taints(cluster.api, path.rsplit("/", 1)[1], cluster.run_id):
                removed.append(f"taints on {path}")
        elif delete_owned(cluster.api, path, uid) == "deleted":
            removed.append(path)
    if removed:
        progress(f"removed at the end what the run's checks had left: {', '.join(removed)}")
    cluster.record.delete()


def stop(cluster: Cluster, keep: bool, progress: Callable[[str], None]) -> None:
    """End the run's hold on the cluster: its Lease goes, and an embedded cluster with it."""
    gone = cluster.kwok is not None and not keep
    try:
        if not gone:
            release_owned(cluster, progress)
        if cluster.lease is not None:
            # An embedded cluster that is about to be deleted takes its Lease along.
            cluster.lease.abandon() if gone else cluster.lease.release()
    except Exception as e:  # an unreachable API server must not keep the cluster alive
        if cluster.lease is not None:
            cluster.lease.abandon()
        progress(f"could not remove everything the run created ({type(e).__name__}: {str(e)[:160]}); its Lease "
                 f"expires in {cluster.lease.duration_s if cluster.lease else 0} s and the next run sweeps "
                 "what its owner record names")
    finally:
        if cluster.kwok is not None:
            if keep:
                progress(f"kept embedded cluster {cluster.kwok.name}; kubeconfig: {cluster.kubeconfig}")
            else:
                cluster.kwok.delete()


def report_calls(c: Cluster, path: str | None, say: Callable[[str], None], attach: Attach) -> None:
    """What the harness's identity asked of the API server in this run: said in one line, attached to the
    report (with the rule of the manifest that allowed each call, on a cluster it does not own), and
    written to ``--cp-api-calls FILE``."""
    rows, refused = c.calls.dump(), c.calls.refused()
    if path:
        Path(path).write_text(json.dumps({"server": server_url(c.api), "calls": rows}, indent=1))
    lines = []
    for call in sorted({call for call, _ in c.calls.calls}):
        rule = c.manifest.allows(call) if c.manifest else None
        lines.append(f"{call.describe()}" + (f"  <- {rule.describe()}" if rule else
                                             ("  <- NOT IN THE MANIFEST" if c.manifest else "")))
    attach(Attachment("API calls of the harness's identity (verb, resource, scope)", "\n".join(lines)))
    say(f"API calls of the harness's identity: {len(rows)} distinct, "
        f"{sum(refused.values())} answered 403 Forbidden" + (f" ({', '.join(c.describe() for c in list(refused)[:3])})"
                                                            if refused else ""))
