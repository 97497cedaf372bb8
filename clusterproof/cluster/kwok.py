"""The embedded cluster: real etcd, kube-apiserver, kube-controller-manager and
kube-scheduler started by kwokctl's binary runtime, nodes and pods faked by
the kwok controller.

Why kwokctl: it wires certificates, ports and the kwok controller exactly as
kwok's own CI does; we only hand it the locally built binaries, so nothing is
downloaded. APF keeps its real defaults: ``--disable-qps-limits`` would turn
it off, so it is never passed.

Clusters live under ``$CLUSTERPROOF_CACHE/kwok`` (KWOK_WORKDIR) and are named
``cp-<run id>``; an owner file (host, pid *and* start time of the run's
process) lets a later run on this machine sweep clusters whose run died (a
cluster recorded on another host is left alone, and said so). The cluster's
watchdog (``clusterproof.cluster.watchdog``) applies the same rules within
seconds of its run's death, so a killed run's control plane and real nodes do
not wait for that later run. Every component listens on loopback only
(``BIND_ADDRESS``). Extra
components (the Coscheduling scheduler and controller) are declared in the
cluster's KwokctlConfiguration, so kwokctl starts, logs and stops them with
the control plane.

Deleting never lets kwokctl signal a process the run did not start: kwokctl
v0.8.0's ``delete cluster`` SIGKILLs whatever pid each ``pids/*.pid`` holds,
unchecked, and a cluster swept days after its run was killed has pid files
naming pids that are long recycled. ``KwokCluster.delete`` kills the
cluster's own processes itself (``processes.kill_owned``: command line and
start time checked) and removes every pid file before kwokctl runs.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import urllib3
import yaml

from clusterproof.cluster import identities, realnode_config, realnodes, stages, watchdog
from clusterproof.core import exitcodes, progress
from clusterproof.core.errors import HarnessError
from clusterproof.core.ports import free_ports
from clusterproof.core.processes import (
    OWNER_FILE,
    claim_directory,
    clear_pid_files,
    elsewhere_note,
    kill_owned,
    kill_started_from,
    last_words,
    owned_process,
    owner_alive,
    owner_elsewhere,
)
from clusterproof.core.waiting import wait_for
from clusterproof.kube import access
from clusterproof.provision import toolchain

NAME_PREFIX = "cp-"
KWOK_MODULE = "sigs.k8s.io/kwok"
# Where every component listens (KwokctlConfiguration ``options.bindAddress``, which kwokctl v0.8.0 gives etcd's
# --listen-client-urls and every component's --bind-address; its default is 0.0.0.0). etcd serves plain HTTP
# with no client certificate: on any other interface, anyone who reaches this machine could write to it.
BIND_ADDRESS = "127.0.0.1"
# The cluster's ports (KwokctlConfiguration options), each taken from the OS's free ports.
PORTS = ("kubeApiserverPort", "etcdPort", "etcdPeerPort", "kwokControllerPort", "kubeControllerManagerPort",
         "kubeSchedulerPort")


def workdir() -> Path:
    return toolchain.cache_root() / "kwok"


def _env(kubernetes_version: str = toolchain.KUBERNETES_VERSION) -> dict[str, str]:
    env = dict(os.environ)
    env["KWOK_WORKDIR"] = str(workdir())
    env["KWOK_KUBE_VERSION"] = kubernetes_version
    env["KWOK_KUBECTL_BINARY"] = str(toolchain.kubernetes(kubernetes_version).path("kubectl"))
    # kwokctl must never fetch anything: every binary is given as a local path.
    env.pop("KWOK_KUBE_IMAGE_PREFIX", None)
    return env


def known_feature_gates(apiserver: Path) -> set[str]:
    """The feature gates a kube-apiserver binary knows, from its own ``--help`` (one
    ``kube:Name=true|false (STAGE - default=...)`` line each; 1.34 and 1.35 prefix the component)."""
    proc = subprocess.run([str(apiserver), "--help"], capture_output=True, text=True, timeout=60)
    return set(re.findall(r"^\s+(?:kube:)?([A-Z]\w*)=true\|false \(", proc.stdout + proc.stderr, flags=re.M))


def split_feature_gates(gates: str, known: set[str]) -> tuple[str, list[str]]:
    """``gates`` (``A=true,B=false``) without the gates ``known`` does not hold, and the names dropped:
    a profile's gates for 1.35 alpha features must not stop a 1.34 apiserver from starting
    ("unrecognized feature gate")."""
    kept, dropped = [], []
    for g in filter(None, (x.strip() for x in gates.split(","))):
        (kept if g.split("=", 1)[0] in known else dropped).append(g)
    return ",".join(kept), [g.split("=", 1)[0] for g in dropped]


def kwokctl(*args: str, timeout: float, check: bool = True,
            kubernetes_version: str = toolchain.KUBERNETES_VERSION) -> subprocess.CompletedProcess:
    cmd = [str(toolchain.KWOK.path("kwokctl")), *args]
    try:
        proc = subprocess.run(cmd, env=_env(kubernetes_version), capture_output=True, text=True, timeout=timeout,
                              start_new_session=True)
    except subprocess.TimeoutExpired:
        raise HarnessError(f"kwokctl {args[0]} {args[1] if len(args) > 1 else ''} did not finish "
                           f"within {timeout:g} s") from None
    if check and proc.returncode != 0:
        lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        errors = [ln for ln in lines if "ERROR" in ln or "error" in ln.lower()] or lines
        raise HarnessError(f"kwokctl {' '.join(args[:2])} failed: "
                           f"{_strip_ansi(errors[-1] if errors else 'no output')[:300]}")
    return proc


def _strip_ansi(s: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", s).strip()


def component_http(timeout: float) -> urllib3.PoolManager:
    """HTTP to the cluster's own components on loopback (their /healthz, /metrics). Each serves a
    self-signed certificate of its own, so it is not verified."""
    urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return urllib3.PoolManager(cert_reqs="CERT_NONE", timeout=timeout, retries=False)


@dataclass
class KwokCluster:
    """One kwokctl cluster; ``start`` and ``delete`` are its whole lifecycle."""
    name: str
    heartbeat_factor: float
    node_lease_duration_s: int
    kwok_parallelism: int = 4
    # The control plane's version (profile key kubernetes_version): its binaries, built once each.
    kubernetes_version: str = toolchain.KUBERNETES_VERSION
    extra_args: tuple[str, ...] = ()
    # kube-scheduler's client rate (0: its defaults, 50 QPS/burst 100). Every
    # bind is an API call, so this caps scheduling throughput; merged into
    # the kube-scheduler configuration kwokctl is given.
    scheduler_api_qps: float = 0
    scheduler_api_burst: int = 0
    # Alpha APIs some suites probe for (e.g. native gang scheduling); passed to
    # every control-plane component by kwokctl. Empty: Kubernetes' defaults.
    feature_gates: str = ""
    runtime_config: str = ""
    # Gates of ``feature_gates`` this Kubernetes version does not know (left out; see start).
    dropped_feature_gates: list[str] = field(default_factory=list)
    # Extra kwokctl components (KwokctlConfiguration ``components``), e.g. the
    # Coscheduling scheduler: started, logged and stopped with the cluster.
    components: list[dict] = field(default_factory=list)
    # Each component its own client certificate (clusterproof.cluster.identities), classified by APF as on a
    # real cluster; False: kwokctl's one admin certificate for all (every component APF-exempt).
    component_identities: bool = True
    # Each Go component's runtime settings (profile key component_go_env): {component: {GOGC|GOMEMLIMIT: value}},
    # put in its environment by kwokctl. {}: Go's defaults.
    go_env: dict[str, dict[str, str]] = field(default_factory=dict)
    # Real nodes (clusterproof.cluster.realnodes) join this cluster: kwok is told to manage only the nodes the harness
    # created as kwok nodes, and kube-apiserver gets a kubelet client certificate (logs, exec).
    real_nodes: list = field(default_factory=list)            # clusterproof.cluster.realnode_config.RealNode, planned
    real_node_sandbox_image: str = ""
    real_node_nvml: str | None = None        # the NVML library real nodes hand to GPU containers (None: none)
    real_node_identity: bool = True          # False: the kubelets run as the admin (a negative control)
    # Where the cluster lives, fixed when it is made: a test that points CLUSTERPROOF_CACHE elsewhere
    # in-process must not make the supervisor think every component of this cluster is gone.
    root: Path = field(default_factory=lambda: workdir())

    @property
    def directory(self) -> Path:
        return self.root / "clusters" / self.name

    @property
    def kubeconfig(self) -> Path:
        return self.directory / "kubeconfig.yaml"

    @property
    def user_kubeconfig(self) -> Path:
        # kwokctl merges a context into --kubeconfig (default ~/.kube/config) on
        # create and removes it on delete: point it at a private file instead.
        return self.directory / "user.kubeconfig"

    def start(self, timeout: float) -> None:
        k8s = toolchain.kubernetes(self.kubernetes_version)
        for c in (toolchain.KWOK, toolchain.ETCD, k8s):
            toolchain.ensure(c)
        args = [
            "create", "cluster", "--name", self.name, "--runtime", "binary",
            "--kube-apiserver-binary", str(k8s.path("kube-apiserver")),
            "--kube-controller-manager-binary", str(k8s.path("kube-controller-manager")),
            "--kube-scheduler-binary", str(k8s.path("kube-scheduler")),
            "--kwok-controller-binary", str(toolchain.KWOK.path("kwok")),
            "--etcd-binary", str(toolchain.ETCD.path("etcd")),
            # Do not touch the user's ~/.kube/config: the cluster's own kubeconfig is enough.
            "--kubeconfig", str(self.user_kubeconfig),
            "--heartbeat-factor", f"{self.heartbeat_factor:g}",
            "--node-lease-duration-seconds", str(self.node_lease_duration_s),
            "--timeout", f"{int(timeout)}s", "--wait", f"{int(timeout)}s",
            "--quiet-pull",
        ]
        self.prepare()
        # Every port from the OS's free ephemeral ports: kwokctl's own allocator counts down from 32765
        # and checks only what is bound now, so clusters created at the same moment on this machine
        # (other runs) were handed the same port and one component died binding it.
        ports = dict(zip(PORTS, free_ports(len(PORTS))))
        patches = [NO_PRIVILEGED_PODS]
        scheduler_config = self._write_scheduler_config()
        server = f"https://127.0.0.1:{ports['kubeApiserverPort']}"
        if self.component_identities or self.real_nodes:
            # kwokctl keeps a PKI it finds; the components' kubeconfigs need the server's port up front.
            identities.write_pki(self.directory / "pki")
        if self.component_identities:
            patches += identities.components_patches(self.directory, server, scheduler_config)
        if self.real_nodes:
            patches = [*patches, *real_node_patches(self.directory / "pki")]
            self.components = [*self.components, *realnodes.components(
                self.directory, server, self.real_nodes, self.real_node_sandbox_image, self.real_node_nvml,
                self.real_node_identity, self.kubernetes_version)]
        patches += go_env_patches(self.go_env)
        if scheduler_config:
            args += ["--kube-scheduler-config", str(scheduler_config)]
        args += ["--kube-audit-policy", str(self._write_audit_policy())]
        gates, self.dropped_feature_gates = split_feature_gates(
            self.feature_gates, known_feature_gates(k8s.path("kube-apiserver")) if self.feature_gates else set())
        if gates:
            args += ["--kube-feature-gates", gates]
        if self.runtime_config:
            args += ["--kube-runtime-config", self.runtime_config]
        for extra in self.extra_args:
            args += ["--extra-args", extra]
        args += ["--config", str(self._write_kwok_config(patches, ports))]
        with progress.heartbeat(f"kwokctl to create cluster {self.name}", timeout=timeout + 30,
                                status=lambda: f"logs so far: {', '.join(self.started_logs()) or 'none'}"):
            kwokctl(*args, timeout=timeout + 30, kubernetes_version=self.kubernetes_version)

    def started_logs(self) -> list[str]:
        """The components that have written a log so far (kwokctl starts them one after the other)."""
        logs = self.directory / "logs"
        return sorted(p.stem for p in logs.glob("*.log")) if logs.is_dir() else []

    def last_words(self, name: str) -> str:
        """The last non-empty line of a component's log (its own words about why it stopped)."""
        return last_words(self.directory / "logs" / f"{name}.log")

    def start_stopped(self, keep: set[str] = frozenset()) -> subprocess.CompletedProcess:
        """``kwokctl start cluster``: starts exactly the components that are not running. It skips one whose
        pid file names any live pid (signal 0) -- a zombie, or by now an unrelated process -- so every pid file
        that is not provably the cluster's own process goes first (``keep``: components down on purpose)."""
        clear_pid_files(self.directory, keep_owned=True, keep=keep)
        return kwokctl("start", "cluster", "--name", self.name, timeout=180, check=False,
                       kubernetes_version=self.kubernetes_version)

    def wait_healthy(self, urls: dict[str, str], timeout: float = 90) -> None:
        """Every extra component answers its health URL (its log is named if it does not)."""
        http = component_http(timeout=2.0)

        def healthy(url: str) -> bool:
            try:
                return http.request("GET", url).status == 200
            except urllib3.exceptions.HTTPError:
                return False
        for name, url in urls.items():
            wait_for(lambda u=url: healthy(u), timeout=timeout, interval=0.5,
                     what=f"{name} healthy at {url} (log: {self.directory / 'logs' / (name + '.log')})")

    def component_state(self, name: str) -> str:
        """A component as a failure message names it: running or not, and its last words."""
        pid = self.pids().get(name)
        return (f"{name} is {'running (pid ' + str(pid) + ')' if pid else 'not running'}, "
                f"its last log line: {self.last_words(name)}")

    def keep_logs(self, dest: Path) -> Path | None:
        """Copy the components' logs (not the audit log) to ``dest``/<cluster name>/ before the cluster goes:
        what a failed bring-up leaves to read. None if there were none."""
        logs = [p for p in (self.directory / "logs").glob("*.log") if p.name != "audit.log"]
        if not logs:
            return None
        out = dest / self.name
        out.mkdir(parents=True, exist_ok=True)
        for p in logs:
            shutil.copyfile(p, out / p.name)
        return out

    @property
    def audit_log(self) -> Path:
        return self.directory / "logs" / "audit.log"

    def _write_audit_policy(self) -> Path:
        """The apiserver's audit log keeps the requests of the harness's guest identity only (the
        ServiceAccount of clusterproof/kube/rbac.yaml), at Metadata level: the second instrument the permission
        self-test holds the harness's own request record against. Nothing else is logged (no cost at
        7,500 nodes). Real nodes' heartbeats are logged too (clusterproof.cluster.realnode_config.audit_rules)."""
        path = self.directory / "clusterproof-audit-policy.yaml"
        path.write_text(yaml.safe_dump({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "users": [f"system:serviceaccount:{access.HOME}:{access.SERVICE_ACCOUNT}"]},
                      *realnode_config.audit_rules([n.name for n in self.real_nodes]),
                      {"level": "None"}]}))
        return path

    def _write_scheduler_config(self) -> Path | None:
        """A kube-scheduler configuration with the client rate set (kubescheduler.config.k8s.io/v1)."""
        if not self.scheduler_api_qps and not self.component_identities:
            return None
        doc = {"apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
               "clientConnection": {}}
        if self.scheduler_api_qps:
            doc["clientConnection"] = {"qps": float(self.scheduler_api_qps), "burst": int(self.scheduler_api_burst)}
        path = self.directory / "clusterproof-scheduler.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    def _write_kwok_config(self, patches: list[dict] = (), ports: dict | None = None) -> Path:
        """The extra components, ports and loopback bind address (KwokctlConfiguration) and the kwok
        controller's worker counts (a KwokConfiguration kwokctl passes on).

        Each real kubelet works for its own node; kwok simulates all of them
        with a few workers (default 4), which alone caps bring-up at ~45
        nodes/s on this machine. The Stages are kwokctl's defaults but for a
        pod annotated to run until deleted (``clusterproof.cluster.stages``).
        """
        path = self.directory / "clusterproof-kwokctl.yaml"
        n = self.kwok_parallelism
        docs = [{"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokConfiguration",
                 "options": {"nodePlayStageParallelism": n, "nodeLeaseParallelism": n,
                             "podPlayStageParallelism": n}}]
        docs += stages.stages(toolchain.module_dir(KWOK_MODULE, toolchain.KWOK_VERSION, "its stage presets"),
                              self.heartbeat_factor, self.node_lease_duration_s)
        docs.insert(0, {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration",
                        "options": {"bindAddress": BIND_ADDRESS, **(ports or {})},
                        **({"components": self.components} if self.components else {}),
                        **({"componentsPatches": list(patches)} if patches else {})})
        path.write_text(yaml.safe_dump_all(docs))
        return path

    def prepare(self) -> None:
        """Create the cluster's directory and claim it for this process (before anything runs in it;
        ``claim_directory``: a concurrent sweep never finds it unclaimed), and start its watchdog, which
        deletes it within seconds if this process dies without doing so (``clusterproof.cluster.watchdog``)."""
        claim_directory(self.directory)
        watchdog.start(self.directory, self.root.parent)

    def delete(self) -> None:
        """Stop every component and remove the cluster's files; safe to call twice.

        The cluster's own processes are killed here, identity checked, and every pid file is
        removed before kwokctl runs (module doc): kwokctl then only drops the context from the
        private kubeconfig and removes the directory, and signals nothing.

        One delete at a time (an exclusive ``flock`` on the directory itself): a killed run's watchdog
        and the sweep of a run starting that moment must not tear down the same real node together.
        """
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if self.directory.exists():   # not deleted by whoever held the lock
                self._delete()
        finally:
            os.close(fd)

    def _delete(self) -> None:
        host = owner_elsewhere(_owner(self.directory))
        if host:
            # Its pid files name processes of that host: nothing here may act on them.
            raise HarnessError(f"cluster {self.name}: {elsewhere_note('it', host)}")
        kill_started_from(self.directory, tools=("kwokctl",))   # kwokctl first: it may be starting components
        kill_owned(self.directory)
        left = realnodes.teardown(self.directory)
        if left:   # never rmtree a directory that may still hold a mount of something else
            raise HarnessError(f"cluster {self.name}: its real nodes left {', '.join(left[:5])} on this host "
                               "(remove them by hand; `python -m clusterproof.cluster.kwok --sweep-all` retries)")
        clear_pid_files(self.directory)
        if toolchain.KWOK.is_built():
            kwokctl("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.user_kubeconfig),
                    timeout=120, check=False, kubernetes_version=self.kubernetes_version)
        shutil.rmtree(self.directory, ignore_errors=True)

    def configured_ports(self) -> dict[str, int]:
        """The ports ``start`` gave the components (``PORTS``; empty before it wrote them)."""
        try:
            docs = yaml.safe_load_all((self.directory / "clusterproof-kwokctl.yaml").read_text())
            options = next((d.get("options") or {} for d in docs if d.get("kind") == "KwokctlConfiguration"), {})
            return {k: v for k, v in options.items() if k in PORTS}
        except (OSError, yaml.YAMLError):
            return {}

    def controller_manager_metrics(self) -> str | None:
        """kube-controller-manager's own ``/metrics`` (its work queues, its client's request latencies), or
        None while it does not answer (kwokctl serves the path without credentials)."""
        port = self.configured_ports().get("kubeControllerManagerPort")
        if not port:
            return None
        try:
            r = component_http(timeout=5.0).request("GET", f"https://127.0.0.1:{port}/metrics")
        except urllib3.exceptions.HTTPError:
            return None
        return r.data.decode() if r.status == 200 else None

    def pids(self) -> dict[str, int]:
        """Running components of this cluster, by name (pid files checked with ``owned_process``)."""
        out = {}
        for f in (self.directory / "pids").glob("*.pid"):
            proc = owned_process(f, self.directory)
            if proc is not None:
                out[f.stem] = proc.pid
        return out


def go_env_patches(go_env: dict[str, dict[str, str]]) -> list[dict]:
    """kwokctl componentsPatches putting each component's Go runtime settings in its environment (pure)."""
    return [{"name": name, "extraEnvs": [{"name": k, "value": v} for k, v in sorted(env.items())]}
            for name, env in sorted(go_env.items()) if env]


def describe_go_env(go_env: dict[str, dict[str, str]]) -> str:
    """The settings in one line, for the report's environment (pure)."""
    return "; ".join(f"{name} {' '.join(f'{k}={v}' for k, v in sorted(env.items()))}"
                     for name, env in sorted(go_env.items()) if env) or "Go's defaults (GOGC=100, no GOMEMLIMIT)"


# kwokctl starts kube-apiserver with --allow-privileged=true. The embedded cluster's real nodes run on this
# machine, so a privileged pod there would be root on it; no pod of the harness needs privilege (kube.pod_spec).
NO_PRIVILEGED_PODS = {"name": "kube-apiserver", "extraArgs": [
    {"key": "allow-privileged", "value": "false", "override": True}]}


def real_node_patches(pki: Path) -> list[dict]:
    """componentsPatches for a cluster with real nodes: kwok manages only annotated (kwok) nodes; kube-apiserver
    talks to real kubelets with a client certificate (the admin's, which kwokctl also serves with)."""
    from clusterproof.kube.client import KWOK_ANNOTATION

    def arg(key, value, override=True):
        return {"key": key, "value": value, "override": override}
    return [{"name": "kwok-controller", "extraArgs": [
                arg("manage-all-nodes", "false"),
                arg("manage-nodes-with-annotation-selector", f"{KWOK_ANNOTATION}=fake", override=False)]},
            {"name": "kube-apiserver", "extraArgs": [
                arg("kubelet-client-certificate", str(pki / "admin.crt"), override=False),
                arg("kubelet-client-key", str(pki / "admin.key"), override=False),
                # a real node's name resolves nowhere: reach its kubelet at its own address
                arg("kubelet-preferred-address-types", "InternalIP", override=False)]}]


def embedded_here(api) -> str | None:
    """The name of the embedded cluster on this machine that ``api`` reaches as its admin, else None.

    Why: a run pointed at a kept or shared embedded cluster with ``--cp-kubeconfig`` (the self-tests' child runs,
    ``--cp-keep-cluster`` then a second run) is on a cluster the harness made and may treat as its own; the same
    server as another identity (the guest ServiceAccount) is not. Judged on what cannot be forged from outside:
    the server URL and the CA of a cluster directory here, and an identity in system:masters (kwokctl's admin)."""
    root = workdir() / "clusters"
    host = (api.configuration.host or "").rstrip("/")
    try:
        ca = Path(api.configuration.ssl_ca_cert or "").read_bytes() if api.configuration.ssl_ca_cert else b""
    except OSError:
        return None
    name = None
    for d in sorted(root.glob(f"{NAME_PREFIX}*")) if root.is_dir() else []:
        try:
            cfg = yaml.safe_load((d / "kubeconfig.yaml").read_text())
            server = cfg["clusters"][0]["cluster"]["server"].rstrip("/")
            if server == host and ca and (d / "pki" / "ca.crt").read_bytes() == ca:
                name = d.name
                break
        except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
            continue
    if name is None:
        return None
    from clusterproof.kube.client import raw_request
    try:
        review = json.loads(raw_request(api, "POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews", body={
            "apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}).data)
    except Exception:   # noqa: BLE001 -- any failure to ask means: not provably the admin
        return None
    return name if "system:masters" in (review.get("status", {}).get("userInfo", {}).get("groups") or []) else None


def _owner(d: Path) -> dict:
    try:
        return json.loads((d / OWNER_FILE).read_text())
    except (OSError, ValueError):
        return {}


def sweep_clusters(keep: str | None = None, say: Callable[[str], None] | None = None) -> list[str]:
    """Delete embedded clusters on this machine whose run is gone (its process, by pid and
    start time, no longer runs), except clusters kept on purpose with --cp-keep-cluster and
    clusters whose run was recorded on another host (``say`` is told about each of those)."""
    swept = []
    root = workdir() / "clusters"
    if not root.exists():
        return swept
    for d in sorted(root.iterdir()):
        if not d.is_dir() or not d.name.startswith(NAME_PREFIX) or d.name == keep:
            continue
        why = still_wanted(d)
        if why is None:
            KwokCluster(d.name, 1, 40).delete()
            swept.append(d.name)
        elif owner_elsewhere(_owner(d)):
            (say or progress.say)(f"sweep: {why}")
    return swept


def still_wanted(d: Path) -> str | None:
    """Why the sweeper leaves the cluster in ``d`` alone (one sentence), or None: its run is gone, delete it."""
    owner = _owner(d)
    host = owner_elsewhere(owner)
    if host:
        return elsewhere_note(f"embedded cluster {d.name}", host)
    if (d / "keep").exists():
        return f"kept {d.name}: kept on purpose (--cp-keep-cluster)"
    if owner_alive(owner):
        return f"kept {d.name}: its run (pid {owner.get('pid')}) is still going"
    return None


def sweep_one(name: str) -> str:
    """``--sweep NAME`` (what a cluster's watchdog runs when its run has died): the sweeper's rules and delete
    for that one cluster; one line saying what was done."""
    d = workdir() / "clusters" / name
    if not name.startswith(NAME_PREFIX) or not d.is_dir():
        return f"no embedded cluster {name}: nothing to do"
    why = still_wanted(d)
    if why is not None:
        return why
    KwokCluster(name, 1, 40).delete()
    return f"deleted {name}"


def main(argv: list[str]) -> int:
    """``python -m clusterproof.cluster.kwok --sweep-all``: delete every clusterproof embedded
    cluster on this machine, including ones kept with --cp-keep-cluster, except
    those whose run is still going (its process alive on this host) and those
    whose run was recorded on another host (said so, one line each).

    ``--sweep NAME``: only that cluster, and only if the sweeper would delete it (``sweep_one``)."""
    if len(argv) == 2 and argv[0] == "--sweep":
        try:
            print(sweep_one(argv[1]))
        except HarnessError as e:
            print(f"clusterproof: {e}", file=sys.stderr)
            return exitcodes.CHECK_FAILED
        return exitcodes.OK
    if argv != ["--sweep-all"]:
        print("clusterproof: usage: python -m clusterproof.cluster.kwok --sweep-all | --sweep NAME", file=sys.stderr)
        return exitcodes.USAGE
    root = workdir() / "clusters"
    names = [d.name for d in root.iterdir() if d.name.startswith(NAME_PREFIX)] if root.exists() else []
    deleted = 0
    for name in names:
        owner = _owner(root / name)
        host = owner_elsewhere(owner)
        if host:   # even a kept one: its processes are that host's
            print(elsewhere_note(f"embedded cluster {name}", host))
            continue
        # A kept cluster outlives its run on purpose; any other with a live owner is in use.
        if not (root / name / "keep").exists() and owner_alive(owner):
            print(f"kept {name}: its run (pid {owner.get('pid')}) is still going")
            continue
        KwokCluster(name, 1, 40).delete()
        deleted += 1
        print(f"deleted {name}")
    print(f"{deleted} embedded cluster(s) deleted")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
