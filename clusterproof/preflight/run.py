"""GPU preflight: what suites/test_gpu_preflight.py runs against, set up and undone here (its fixtures,
``clusterproof.fixtures.preflight``, only call these).

Why a module: the suite checks the contract (``clusterproof.preflight.contract``)
and must not know who runs preflight or how simulated GPUs come to be
faulty. Here live, each undone at the end (also after Ctrl-C):

- the contract watch (``clusterproof.preflight.watch``): every node and pod,
  for the whole module;
- on the embedded cluster the harness started (``owned``: it may add nodes and
  break their simulated GPUs there): the run's fault file (``clusterproof.preflight.mock_nvml``), the
  harness's reference agent as a process of its own (``--mode`` from
  ``preflight_agent``; nothing is started for ``cluster``), the joining
  nodes (scratch nodes of the run, labelled and tainted ``pending``; the
  profile's preflight pool is never touched, another suite relies on it),
  and whole-node workloads waiting for them (plain pods, a Job, a
  Coscheduling gang) -- created before the nodes join;
- the Events the agent wrote (namespace ``default``, labelled with the run).

Mistakes (``preflight_agent=harness`` on a cluster the harness does not own,
an agent that dies) are one line that every check fails with.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from clusterproof import IMPORT_ROOT as ROOT
from clusterproof.cluster.scratch_nodes import ScratchNode, create_scratch_nodes
from clusterproof.core import measurement, progress
from clusterproof.core.attachment import JSON, Attach, Attachment
from clusterproof.core.errors import HarnessError
from clusterproof.core.measurement import measured
from clusterproof.core.processes import (
    elsewhere_note,
    last_words,
    own_session_dying_with_parent,
    owner_alive,
    owner_elsewhere,
    owner_record,
    stop_group,
)
from clusterproof.core.run import RUN_LABEL, SCRATCH_LABEL, metadata
from clusterproof.gang.gangs import GANG_LABEL, Placement, rank
from clusterproof.kube.client import delete_each, delete_if_present, list_raw, raw_request
from clusterproof.kube.pod_spec import pod_body
from clusterproof.kube.pods import create_pods, delete_run_pods
from clusterproof.preflight.contract import PENDING, Marks
from clusterproof.preflight.mock_nvml import FAULTS, FaultFile, checker_env, library_dir, plan_faults, run_checker
from clusterproof.preflight.watch import ContractWatch

EVENTS_NAMESPACE = "default"         # where Events about (cluster-scoped) nodes live
WAIT_LABEL = "clusterproof.io/preflight-waiting"
WORKDIR_PREFIX = "cp-preflight-"     # local work directories (fault file, agent log and status)


def local_gpus_problem() -> str | None:
    """``--cp-local-gpus``: why this machine's NVML cannot start (the checker's own line), or None."""
    run = run_checker(None, checker_env(None, None), "--xid-window-ms", "0")
    return run.stderr if run.returncode == 4 else None


def resolve_agent(setting: str, owned: bool) -> str:
    """'harness' | 'cluster' | a negative-control mode, from ``preflight_agent``: the harness's agent only where
    the harness owns the cluster (it joins nodes and breaks their simulated GPUs)."""
    if setting == "auto":
        return "harness" if owned else "cluster"
    if setting != "cluster" and not owned:
        raise HarnessError(f"preflight_agent={setting} runs the harness's agent, which checks simulated GPUs on "
                           "nodes the harness joins itself -- only on the embedded cluster it started; on any other "
                           "cluster use auto or cluster (the cluster's own preflight machinery)")
    return setting


def describe_agent(kind: str) -> str:
    if kind == "cluster":
        return "the cluster's own preflight machinery (the harness starts nothing)"
    what = "the harness's reference agent (clusterproof/preflight/agent.py) on simulated GPUs (mock NVML)"
    return what if kind == "harness" else f"{what}, mode {kind} (NEGATIVE CONTROL)"


@dataclass
class AgentStatus(measurement.Typed):
    """What the reference agent reports of its own work (its status file): the checks it ran and their time, and
    what its drains' evictions were answered."""
    checks: int = measured("checks", default=0)
    check_seconds: float = measured("s", default=0.0)
    evictions_refused_429: int = measured("evictions", default=0)     # by a PodDisruptionBudget (retried)
    evictions_conflict_504: int = measured("evictions", default=0)    # PDB update conflicts (retried)

    @classmethod
    def of(cls, status: dict) -> "AgentStatus | None":
        """From the agent's status file (None: not written yet, or unreadable)."""
        if not status:
            return None
        drains = (status.get("drains") or {}).values()
        return cls(status.get("checks", 0), status.get("check_seconds", 0.0),
                   sum(d["refused_429"] for d in drains), sum(d.get("conflicts_504", 0) for d in drains))

    @property
    def check_ms_per_node(self) -> float | None:
        return 1000 * self.check_seconds / self.checks if self.checks else None


@dataclass
class AgentProcess:
    """The reference agent, a process of its own (its own process group; dies with the harness)."""
    proc: subprocess.Popen
    log: Path
    status_path: Path

    def status(self) -> dict:
        try:
            return json.loads(self.status_path.read_text())
        except (OSError, ValueError):
            return {}

    def counts(self) -> AgentStatus | None:
        """Its status as figures (None: no status yet)."""
        return AgentStatus.of(self.status())

    def alive(self) -> None:
        """Raise (one line, with its last log line) if the agent is gone."""
        if self.proc.poll() is not None:
            raise HarnessError(f"the preflight agent exited with code {self.proc.returncode}; its last log "
                               f"line: {last_words(self.log)}")

    def stop(self) -> None:
        stop_group(self.proc, grace_s=15)


def start_agent(cluster, profile, run_id: str, marks: Marks, scope: str, mode: str, faults: Path,
                workdir: Path) -> AgentProcess:
    log, status = workdir / "agent.log", workdir / "agent-status.json"
    cmd = [sys.executable, "-m", "clusterproof.preflight.agent", "--kubeconfig", str(cluster.kubeconfig),
           "--scope", scope, "--run-id", run_id, "--status", str(status),
           "--mode", "healthy" if mode == "harness" else mode,
           "--label-key", marks.label_key, "--taint-key", marks.taint_key, "--reason-key", marks.reason_key,
           "--condition-type", marks.condition_type, "--event-reason", marks.event_reason,
           "--events-namespace", EVENTS_NAMESPACE, "--expect-gpus", str(profile.node_gpus),
           "--xid-window-ms", str(profile.preflight_xid_window_ms),
           "--active-period-s", str(profile.preflight_active_period_s),
           "--max-unavailable", str(profile.preflight_max_unavailable),
           "--drain-timeout-s", str(profile.preflight_drain_timeout_s)]
    if cluster.record is not None:   # its Events are the run's objects outside its namespaces: recorded too
        cmd += ["--owner-record", cluster.record.namespace]
    env = checker_env(faults, library_dir())
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=own_session_dying_with_parent)
    return AgentProcess(proc, log, status)


@dataclass
class PreflightRun:
    """What the checks run against (see the module docstring)."""
    marks: Marks
    owned: bool                         # the harness's own cluster: it joins nodes and injects GPU faults there
    agent_kind: str = "cluster"
    description: str = ""
    watch: ContractWatch | None = None
    agent: AgentProcess | None = None
    faults: FaultFile | None = None
    tag: str = ""
    nodes: list[ScratchNode] = field(default_factory=list)
    plan: dict[str, str | None] = field(default_factory=dict)
    namespace: str | None = None
    namespaces: object = None           # the cluster's namespace source that gave ``namespace``
    waiting: dict[str, int] = field(default_factory=dict)     # kind -> pods waiting for the new nodes
    gang_note: str = ""
    workdir: Path | None = None
    error: str | None = None

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    @property
    def selector(self) -> dict:
        return {SCRATCH_LABEL: self.tag}

    @property
    def toleration(self) -> dict:
        """What the run's workloads carry to use the joining nodes (their scratch taint keeps others off)."""
        return {"key": SCRATCH_LABEL, "operator": "Equal", "value": self.tag, "effect": "NoSchedule"}

    def healthy(self) -> list[str]:
        return [n for n in self.names if n in self.plan and self.faults.expected_code(n) == ""]

    def alive(self) -> None:
        if self.agent is not None:
            self.agent.alive()
        if self.watch is not None:
            self.watch.check()


def _waiting_workloads(api, run: PreflightRun, profile, run_id: str, backends) -> None:
    """Whole-node pods aimed at the joining nodes, created before they join: plain pods, a Job, a gang."""
    n = profile.preflight_waiting_pods
    sizes = {"plain": n // 3, "job": n // 3, "gang": n - 2 * (n // 3)}
    ns = run.namespace
    place = dict(node_selector=run.selector, tolerations=[run.toleration])
    create_pods(api, ns, [pod_body(f"plain-{i}", run_id, gpus=profile.node_gpus, labels={WAIT_LABEL: "plain"},
                                   **place) for i in range(sizes["plain"])])
    template = pod_body("job", run_id, gpus=profile.node_gpus, labels={WAIT_LABEL: "job"}, restart_policy="Never",
                        **place)
    raw_request(api, "POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body={
        "apiVersion": "batch/v1", "kind": "Job", "metadata": metadata("waiting-job", run_id),
        "spec": {"parallelism": sizes["job"], "completions": sizes["job"], "backoffLimit": 0,
                 "template": {"metadata": {"labels": template["metadata"]["labels"]}, "spec": template["spec"]}}}).data
    run.waiting = {"plain": sizes["plain"], "job": sizes["job"]}
    gang = backends["coscheduling"] if backends else None
    if gang is None or gang.error or gang.skip:
        run.gang_note = f"no gang: {(gang.error or gang.skip) if gang else 'no gang backend'}"
        return
    for path, body in gang.group(ns, "waiting-gang", sizes["gang"], run_id):
        raw_request(api, "POST", path, body=body).data
    placement = Placement(run.selector, (run.toleration,))
    create_pods(api, ns, [gang.member(rank(f"gang-{i}", run_id, gang.scheduler_name, placement, profile.node_gpus,
                                           {WAIT_LABEL: "gang", GANG_LABEL: "waiting-gang"}), "waiting-gang")
                          for i in range(sizes["gang"])])
    run.waiting["gang"] = sizes["gang"]
    run.gang_note = f"gang of {sizes['gang']} ({gang.description})"


def remove_waiting_workloads(api, run: PreflightRun, run_id: str) -> None:
    """The Job first (else its controller recreates the pods), then the pods, gone for good."""
    if run.namespace is None:
        return
    delete_if_present(api, f"/apis/batch/v1/namespaces/{run.namespace}/jobs/waiting-job",
                      {"propagationPolicy": "Background"})
    delete_run_pods(api, run.namespace, run_id, timeout=300)


def sweep_workdirs(say=None) -> list[str]:
    """Remove the local work directories (fault file, agent log) of runs whose process is gone (a
    SIGKILLed run cannot remove its own); the cluster side is the sweeper's (clusterproof.kube.sweep). One
    whose run was recorded on another host is left alone (``say`` is told)."""
    gone = []
    for d in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            owner = json.loads((d / "owner.json").read_text())
        except (OSError, ValueError):
            continue   # not ours, or being created right now
        host = owner_elsewhere(owner)
        if host:
            (say or progress.say)(f"gpu preflight: {elsewhere_note(f'work directory {d}', host)}")
        elif not owner_alive(owner):
            shutil.rmtree(d, ignore_errors=True)
            gone.append(d.name)
    return gone


def setup_simulated(api, cluster, run: PreflightRun, profile, run_id: str, backends, say) -> None:
    run.tag = f"pf-{run_id[-4:]}-{os.urandom(2).hex()}"
    swept = sweep_workdirs(say)
    if swept:
        say(f"gpu preflight: removed the work directories of dead runs: {', '.join(swept)}")
    run.workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{run_id}-"))
    (run.workdir / "owner.json").write_text(json.dumps(owner_record()))
    count = profile.preflight_join_nodes
    names = [f"{profile.node_name_prefix}-scratch-{run.tag}" + (f"-{i}" if count > 1 else "") for i in range(count)]
    run.plan = plan_faults(names, profile.preflight_fault_fraction)
    path = Path(profile.preflight_fault_file) if profile.preflight_fault_file else run.workdir / "faults.json"
    run.faults = FaultFile(path)
    run.faults.set({n: k for n, k in run.plan.items() if k})
    scope = f"{SCRATCH_LABEL}={run.tag}"
    run.watch = ContractWatch(api, run.marks, (SCRATCH_LABEL, run.tag)).start()
    if run.agent_kind != "cluster":
        run.agent = start_agent(cluster, profile, run_id, run.marks, scope, run.agent_kind, path, run.workdir)
    run.namespace, run.namespaces = cluster.namespaces.take("preflight"), cluster.namespaces
    _waiting_workloads(api, run, profile, run_id, backends)
    faulty = sum(1 for k in run.plan.values() if k in FAULTS)
    say(f"gpu preflight: {count} nodes join under preflight ({faulty} with GPU faults, fault file {path}); "
        f"{describe_agent(run.agent_kind)}; waiting: {run.waiting} ({run.gang_note})")
    with progress.phase(f"gpu preflight: create {count} joining nodes, wait until they are Ready"):
        run.nodes = create_scratch_nodes(api, profile, run_id, run.tag, count=count, taints=[run.marks.taint],
                                         labels={run.marks.label_key: PENDING},
                                         workers=16, timeout=profile.bringup_timeout_s)
    if run.agent is not None:
        run.agent.alive()


def teardown(api, run: PreflightRun, run_id: str, attach: Attach) -> None:
    """Undo everything, in the order that cannot leave a half: agent, watch, workloads, nodes, Events. The
    stopped agent's status and log go to ``attach`` before its work directory is removed."""
    try:
        if run.agent is not None:
            run.agent.stop()
            attach(Attachment("preflight agent: status", json.dumps(run.agent.status(), indent=1, sort_keys=True),
                              JSON))
            attach(Attachment.file(run.agent.log, "preflight agent: log"))
        if run.watch is not None:
            run.watch.stop()
    finally:
        try:
            remove_waiting_workloads(api, run, run_id)
            if run.namespace:
                run.namespaces.give_back(run.namespace)
        finally:
            with ThreadPoolExecutor(max_workers=16) as pool:   # hundreds of joining nodes
                list(pool.map(ScratchNode.release, run.nodes))
            if run.owned:   # only the harness's agent writes Events (never on a cluster it does not own)
                events = f"/api/v1/namespaces/{EVENTS_NAMESPACE}/events"   # one request each (kube.delete_each)
                delete_each(api, [f"{events}/{e['metadata']['name']}" for e in
                                  list_raw(api, events, {"labelSelector": f"{RUN_LABEL}={run_id}"})["items"]])
            if run.faults is not None and run.faults.path.exists():
                run.faults.path.unlink()
            if run.workdir is not None:
                shutil.rmtree(run.workdir, ignore_errors=True)


def environment_note(cluster, profile) -> str:
    """What the report's environment says about the GPUs this run's preflight checks."""
    if cluster.owned:
        return "SIMULATED GPUs: go-nvml mock DGX machines through the project's libnvidia-ml.so.1 (no GPU used)"
    if cluster.simulated:
        return ("SIMULATED nodes (kwok) of a cluster the harness did not start: its own preflight machinery is "
                "observed; no GPU is checked (no container runs on a kwok node)")
    return (f"REAL GPUs: the cluster's own preflight machinery; checker pods "
            f"({profile.preflight_image or 'no preflight_image'}) only with --cp-allow-destructive")


def set_up(cluster, profile, run_id: str, say, backends, attach: Attach) -> PreflightRun:
    """The module's preflight run (see the module docstring). A mistake is kept as one line (``error``)
    that every check fails with; interrupted, it undoes what it made (the agent's status and log to
    ``attach``, as ``teardown``)."""
    api = cluster.api
    run = PreflightRun(Marks.from_profile(profile), cluster.owned)
    try:
        run.agent_kind = resolve_agent(profile.preflight_agent, cluster.owned)
        run.description = describe_agent(run.agent_kind)
        if cluster.owned:
            setup_simulated(api, cluster, run, profile, run_id, backends, say)
        else:
            run.watch = ContractWatch(api, run.marks).start()
            say(f"gpu preflight: {run.description}")
    except HarnessError as e:
        run.error = str(e)
    except BaseException:
        teardown(api, run, run_id, attach)
        raise
    return run


def node_events(api, reason: str) -> dict[str, list[str]]:
    """Messages of Events with ``reason`` about nodes, by node name (every namespace)."""
    items = list_raw(api, "/api/v1/events", {"fieldSelector": f"involvedObject.kind=Node,reason={reason}"})["items"]
    out: dict[str, list[str]] = {}
    for e in items:
        out.setdefault(e["involvedObject"].get("name", ""), []).append(e.get("message") or "")
    return out
