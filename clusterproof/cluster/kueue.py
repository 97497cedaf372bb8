"""Kueue and JobSet as part of the embedded cluster: admission against quota, and the training-job object.

Why part of the cluster: as the Coscheduling scheduler (``clusterproof.cluster.coscheduling``), Kueue's
manager and JobSet's controller are extra *components of the kwokctl cluster*: kwokctl starts them with
the control plane, logs them beside it, records their pids and stops them with the cluster, and the
supervisor restarts them like kube-scheduler. Built from their Go modules at pinned versions
(``toolchain.KUEUE``, ``toolchain.JOBSET``); their CRDs and webhook configurations are read at run time
from those modules (never copied here) and changed only where a host process needs it:

- **CRDs**: each Kueue CRD keeps only its storage version (v1beta2); the other (v1beta1) would need
  Kueue's conversion webhook, and nothing here speaks it. Created (not applied: the Workload and JobSet
  CRDs are larger than the 256 KiB an applied object's annotation may hold).
- **Webhooks**: the shipped configurations name a Service in the cluster; here the API server calls each
  process on 127.0.0.1 (``clientConfig.url``) and trusts it through the cluster's CA (``caBundle``), which
  signs each process's serving certificate (``sign_serving``). Only the webhooks of what this cluster
  runs are registered -- Kueue's for its own kinds, batch/v1 Jobs and JobSets, JobSet's for JobSets --
  and those of namespaced kinds only in namespaces labelled ``MANAGED_LABEL``: Kueue's webhooks have
  ``failurePolicy: Fail``, and a webhook in front of every namespace would sit in front of every suite.
  Kueue's pod, Deployment and StatefulSet integrations are off (a Job or JobSet needs none of them).
- **Kueue's fixed paths**: with its own certificate management off, Kueue v0.17.0 reads a metrics
  certificate from ``/etc/kueue/metrics/certs`` whatever its configuration says (cmd/kueue/main.go), and
  exits without it. The host's /etc is left as found: Kueue runs in a mount namespace of its own
  (``unshare``) in which /etc is an overlay whose upper layer, holding that certificate, is in the
  cluster's directory (``launcher``). Its VisibilityOnDemand API server (another fixed path) is off.
- **Start order**: the managers' informers need their CRDs, which exist only once the API server is up;
  each launcher waits for ``READY_MARK`` (``start`` writes it once the CRDs are Established), so neither
  process starts into missing kinds. ``start`` runs at the first check that admits through Kueue, not in the
  bring-up: until then both processes are an idle launcher, and the bring-up is measured without them.
"""
from __future__ import annotations

import base64
import os
import shlex
import signal
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml
from kubernetes import client

from clusterproof.cluster import identities
from clusterproof.cluster.identities import sans
from clusterproof.core.errors import HarnessError
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import create_if_absent, get_if_present
from clusterproof.provision import toolchain

KUEUE, JOBSET = "kueue", "jobset"
KUEUE_MODULE, JOBSET_MODULE = "sigs.k8s.io/kueue", "sigs.k8s.io/jobset"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
CRD_DIR = "config/components/crd/bases"
WEBHOOKS = "config/components/webhook/manifests.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
# The namespaces whose Jobs and JobSets Kueue manages here (its managedJobsNamespaceSelector and the
# namespaceSelector of every webhook of a namespaced kind).
MANAGED_LABEL = "clusterproof.io/kueue"
READY_MARK = "kueue-crds-established"
OWNED = {"app.kubernetes.io/managed-by": "clusterproof"}   # part of the cluster (no run label: no sweeper takes it)
# The webhooks each process serves that this cluster registers (by the shipped entry's name).
KUEUE_WEBHOOKS = ("mclusterqueue.kb.io", "mresourceflavor.kb.io", "mworkload.kb.io", "mjob.kb.io", "mjobset.kb.io",
                  "vclusterqueue.kb.io", "vcohort.kb.io", "vresourceflavor.kb.io", "vworkload.kb.io", "vjob.kb.io",
                  "vjobset.kb.io")
JOBSET_WEBHOOKS = ("mjobset.kb.io", "vjobset.kb.io")
# As Kueue's Helm chart labels its objects: how a run reaching this cluster by its kubeconfig alone tells which
# Kueue it judges.
VERSION_LABEL = "app.kubernetes.io/version"
VERSIONS = {KUEUE: toolchain.KUEUE_VERSION, JOBSET: toolchain.JOBSET_VERSION}
CLUSTER_SCOPED = {"clusterqueues", "resourceflavors", "cohorts", "topologies", "workloadpriorityclasses"}


def crds(module_dir: Path) -> list[dict]:
    """A module's CRDs as this cluster serves them: the storage version only, no status (pure but for reading)."""
    files = sorted((module_dir / CRD_DIR).glob("*.yaml"))
    if not files:
        raise HarnessError(f"no CRDs in {module_dir / CRD_DIR}: is this the module version that ships them?")
    out = []
    for f in files:
        body = yaml.safe_load(f.read_text())
        body.pop("status", None)
        body["spec"]["versions"] = [v for v in body["spec"]["versions"] if v.get("storage")]
        body["spec"].pop("conversion", None)
        body["metadata"] = {**body["metadata"], "labels": {**(body["metadata"].get("labels") or {}), **OWNED}}
        out.append(body)
    return out


def webhook_configurations(module_dir: Path, component: str, wanted: tuple[str, ...], port: int,
                           ca_pem: bytes, failure_policy: str = "Fail") -> list[tuple[str, dict]]:
    """(collection path, object) of the shipped webhook configurations, pointed at ``port`` on 127.0.0.1 and
    reduced to ``wanted``; namespaced kinds only in namespaces labelled ``MANAGED_LABEL`` (pure but for reading).
    ``failure_policy``: as shipped (Fail) unless a negative control asks for Ignore."""
    out = []
    for doc in yaml.safe_load_all((module_dir / WEBHOOKS).read_text()):
        if not doc:
            continue
        hooks = []
        for hook in doc.get("webhooks") or []:
            if hook["name"] not in wanted:
                continue
            path = hook["clientConfig"]["service"]["path"]
            hook = {**hook, "clientConfig": {"url": f"https://127.0.0.1:{port}{path}",
                                             "caBundle": base64.b64encode(ca_pem).decode()},
                    "failurePolicy": failure_policy}
            resources = {r for rule in hook.get("rules") or [] for r in rule.get("resources") or []}
            if resources - CLUSTER_SCOPED - {f"{r}/status" for r in CLUSTER_SCOPED}:
                hook["namespaceSelector"] = {"matchLabels": {MANAGED_LABEL: "true"}}
            hooks.append(hook)
        if hooks:
            kind = doc["kind"]
            which = "mutating" if kind.startswith("Mutating") else "validating"
            out.append((f"{ADMISSION}/{which}webhookconfigurations", {
                "apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                "metadata": {"name": f"clusterproof-{component}-{which}",
                             "labels": {**OWNED, VERSION_LABEL: VERSIONS[component]}},
                "webhooks": hooks}))
    missing = set(wanted) - {h["name"] for _, c in out for h in c["webhooks"]}
    if missing:
        raise HarnessError(f"{component}: webhooks {sorted(missing)} are not in {module_dir / WEBHOOKS}")
    return out


def kueue_config(cert_dir: Path, ports: dict[str, int], qps: int, burst: int, pods_ready_timeout_s: int | None,
                 backoff_base_s: int, backoff_max_s: int) -> dict:
    """Kueue's Configuration (config.kueue.x-k8s.io/v1beta2) for a host process. ``pods_ready_timeout_s``:
    waitForPodsReady (None: off) -- a gang whose pods are not all Ready in time is evicted and requeued with
    a backoff of ``backoff_base_s`` doubling up to ``backoff_max_s``."""
    cfg = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": "kueue-system",                         # not created: nothing here runs in it
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports["kueue_webhook"], "certDir": str(cert_dir)},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['kueue_health']}"},
        "metrics": {"bindAddress": f"127.0.0.1:{ports['kueue_metrics']}"},
        "clientConnection": {"qps": qps, "burst": burst},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": {MANAGED_LABEL: "true"}},
        "integrations": {"frameworks": ["batch/job", "jobset.x-k8s.io/jobset"]},
        # VisibilityOnDemand serves an aggregated API with its certificate at a fixed path (/visibility);
        # MultiKueue dispatches to other clusters: neither is checked here.
        "featureGates": {"VisibilityOnDemand": False, "MultiKueue": False},
    }
    if pods_ready_timeout_s is not None:
        timeout = f"{pods_ready_timeout_s}s"
        cfg["waitForPodsReady"] = {
            "timeout": timeout, "blockAdmission": False, "recoveryTimeout": timeout,
            "requeuingStrategy": {"timestamp": "Eviction", "backoffBaseSeconds": backoff_base_s,
                                  "backoffMaxSeconds": backoff_max_s}}
    return cfg


def jobset_config(cert_dir: Path, ports: dict[str, int], qps: int, burst: int) -> dict:
    """JobSet's Configuration (config.jobset.x-k8s.io/v1alpha1) for a host process."""
    return {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1", "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports["jobset_webhook"], "certDir": str(cert_dir)},
        "metrics": {"bindAddress": "0"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports['jobset_health']}"},
        "clientConnection": {"qps": qps, "burst": burst},
    }


PORTS = ("kueue_webhook", "kueue_health", "kueue_metrics", "jobset_webhook", "jobset_health")


def launcher(binary: Path, cluster_dir: Path, private_etc: bool, as_root: bool) -> str:
    """The shell script kwokctl starts for a component (pure): it waits for ``READY_MARK``, then runs
    ``binary`` with the component's arguments -- with ``private_etc``, in a mount namespace of its own where
    /etc is an overlay whose upper layer is ``<cluster_dir>/etc/<name>/upper`` (kwokctl records the script's
    pid, which stays the binary's: each step execs the next). ``as_root``: else a user namespace maps the
    user to root in it, which is what mounting there needs."""
    mark = shlex.quote(str(cluster_dir / READY_MARK))
    lines = ["#!/bin/sh", f"# clusterproof: {binary.name} of the embedded cluster (clusterproof/cluster/kueue.py)",
             f"while [ ! -e {mark} ]; do sleep 0.5; done"]
    if not private_etc:
        return "\n".join([*lines, f'exec {shlex.quote(str(binary))} "$@"', ""])
    layer = cluster_dir / "etc" / binary.name
    # -n: util-linux mount records a mount in /run/mount/utab, and /run is the host's (a try without it left
    # /run/mount behind, which the host-state self-test found); with -n, /run is left as found (tried here).
    mount = (f"mount -n -t overlay overlay -o lowerdir=/etc,upperdir={layer / 'upper'},workdir={layer / 'work'} "
             '/etc && exec "$0" "$@"')
    unshare = "unshare --mount --propagation private" if as_root else "unshare --user --map-root-user --mount"
    return "\n".join([*lines, f"exec {unshare} /bin/sh -c {shlex.quote(mount)} {shlex.quote(str(binary))} \"$@\"",
                      ""])


def sign_serving(pki: Path, name: str) -> Path:
    """``<pki>/<name>/tls.{crt,key}``: a serving certificate for 127.0.0.1 signed by the cluster's CA."""
    out = pki / name
    out.mkdir(parents=True, exist_ok=True)
    identities.sign(pki, f"{name}-serving", name, (), [
        "basicConstraints=CA:FALSE", "keyUsage=critical,digitalSignature,keyEncipherment",
        "extendedKeyUsage=serverAuth", f"subjectAltName={sans(('localhost', '127.0.0.1'))}"], rsa=False)
    (pki / f"{name}-serving.crt").rename(out / "tls.crt")
    (pki / f"{name}-serving.key").rename(out / "tls.key")
    return out


def _established(api: client.ApiClient, name: str) -> bool:
    crd = get_if_present(api, f"{CRD_PATH}/{name}") or {}
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def served(api: client.ApiClient) -> str | None:
    """The API version of Kueue a cluster serves (``kueue.x-k8s.io/v1beta2``; None: no Kueue)."""
    found = get_if_present(api, "/apis/kueue.x-k8s.io") or {}
    return (found.get("preferredVersion") or {}).get("groupVersion")


def module_dirs() -> dict[str, Path]:
    return {KUEUE: toolchain.module_dir(KUEUE_MODULE, toolchain.KUEUE_VERSION, "its CRDs and webhooks"),
            JOBSET: toolchain.module_dir(JOBSET_MODULE, toolchain.JOBSET_VERSION, "its CRD and webhooks")}


def components(cluster_dir: Path, kubeconfig: Path, ports: dict[str, int], qps: int, burst: int,
               pods_ready_timeout_s: int | None, backoff_base_s: int, backoff_max_s: int) -> list[dict]:
    """Kueue's manager and JobSet's controller for the cluster's KwokctlConfiguration (binary runtime), each
    through its ``launcher`` in ``<cluster_dir>/bin`` (kwokctl names a component's pid and log after it)."""
    bindir = cluster_dir / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    built = {KUEUE: toolchain.ensure(toolchain.KUEUE).path("kueue"),
             JOBSET: toolchain.ensure(toolchain.JOBSET).path("jobset")}
    configs = {KUEUE: kueue_config(cluster_dir / "pki" / KUEUE, ports, qps, burst, pods_ready_timeout_s,
                                   backoff_base_s, backoff_max_s),
               JOBSET: jobset_config(cluster_dir / "pki" / JOBSET, ports, qps, burst)}
    out = []
    for name, binary in built.items():
        script = bindir / name
        script.write_text(launcher(binary, cluster_dir, private_etc=name == KUEUE, as_root=os.geteuid() == 0))
        script.chmod(0o755)
        for d in ("upper", "work"):
            (cluster_dir / "etc" / name / d).mkdir(parents=True, exist_ok=True)
        cfg = cluster_dir / f"{name}-config.yaml"
        cfg.write_text(yaml.safe_dump(configs[name]))
        out.append({"name": name, "binary": str(script), "workDir": str(cluster_dir), "links": ["kube-apiserver"],
                    "args": [f"--config={cfg}", f"--kubeconfig={kubeconfig}", "--zap-log-level=info"]})
    return out


def start(api: client.ApiClient, kc, failure_policy: str) -> None:
    """Kueue and JobSet of the embedded cluster ``kc`` (a ``KwokCluster`` whose ``components`` were declared
    idle), started: serving certificates, the CRDs (Established), then ``READY_MARK`` lets both launchers go on;
    once both are ready, their webhooks are registered (``failurePolicy: Fail``: registered before, every create
    of their kinds would be refused). ``failure_policy``: Kueue's webhooks' (Ignore: a negative control)."""
    pki = kc.directory / "pki"
    for name in (KUEUE, JOBSET):
        sign_serving(pki, name)
    metrics = kc.directory / "etc" / KUEUE / "upper" / "kueue" / "metrics" / "certs"   # /etc/kueue/... for Kueue
    metrics.mkdir(parents=True, exist_ok=True)
    for f in ("tls.crt", "tls.key"):
        (metrics / f).write_bytes((pki / KUEUE / f).read_bytes())
    dirs = module_dirs()
    names = []
    for d in dirs.values():
        for body in crds(d):
            create_if_absent(api, CRD_PATH, body)
            names.append(body["metadata"]["name"])
    for n in names:
        wait_for(lambda n=n: _established(api, n), timeout=60, interval=0.5, what=f"CRD {n} Established")
    (kc.directory / READY_MARK).touch()
    kc.wait_healthy({name: health_url(kc.directory, name) for name in (KUEUE, JOBSET)})
    ca = (pki / "ca.crt").read_bytes()
    for name, wanted in ((KUEUE, KUEUE_WEBHOOKS), (JOBSET, JOBSET_WEBHOOKS)):
        policy = failure_policy if name == KUEUE else "Fail"
        port = _config(kc.directory, name)["webhook"]["port"]
        for path, body in webhook_configurations(dirs[name], name, wanted, port, ca, policy):
            create_if_absent(api, path, body)


def started(kc) -> bool:
    """Has ``start`` let the cluster's Kueue and JobSet go on?"""
    return (kc.directory / READY_MARK).exists()


def _config(cluster_dir: Path, name: str) -> dict:
    """The Configuration ``components`` wrote for ``name`` (KUEUE or JOBSET)."""
    return yaml.safe_load((cluster_dir / f"{name}-config.yaml").read_text())


def health_url(cluster_dir: Path, name: str) -> str:
    """``name``'s readiness URL, as its configuration in ``cluster_dir`` binds it."""
    return f"http://{_config(cluster_dir, name)['health']['healthProbeBindAddress']}/readyz"


@contextmanager
def manager_stopped(kc, supervisor) -> Iterator[None]:
    """Kueue's manager stopped -- its webhooks and reconcilers with it -- while the block runs, then started
    again and ready: a check's fault on the embedded cluster (``kc``, a ``KwokCluster``). The supervisor
    (``clusterproof.cluster.health.Supervisor``) leaves it down meanwhile."""
    supervisor.pause(KUEUE)
    try:
        pid = kc.pids().get(KUEUE)
        if pid is None:
            raise HarnessError(f"Kueue is not running before the check stops it: {kc.component_state(KUEUE)}")
        os.kill(pid, signal.SIGTERM)
        wait_for(lambda: KUEUE not in kc.pids(), timeout=30, interval=0.2, what="Kueue's manager stopped")
        yield
    finally:
        try:
            kc.start_stopped()
            kc.wait_healthy({KUEUE: health_url(kc.directory, KUEUE)})
        finally:
            supervisor.resume(KUEUE)     # started or not, the supervisor looks after it again
