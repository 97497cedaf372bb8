"""Coscheduling (sigs.k8s.io/scheduler-plugins) as part of the embedded cluster.

Why part of the cluster: the plugin's kube-scheduler (a second scheduler,
profile ``clusterproof-coscheduling``) and its PodGroup controller are
extra *components of the kwokctl cluster*, declared in the cluster's
KwokctlConfiguration. kwokctl starts them with the control plane, logs them
next to it (``logs/coscheduling-scheduler.log``), records their pids with
the others and stops them with the cluster -- so they are supervised and
cleaned up exactly like kube-scheduler itself, also after Ctrl-C or a
killed run.

The PodGroup and ElasticQuota CRDs are read at run time from the downloaded
scheduler-plugins Go module (never copied into this repository) and applied
right after the control plane is up. On an existing cluster nothing is
started: ``gang_scheduler_name`` names the scheduler it runs.
"""
from __future__ import annotations

from pathlib import Path

import yaml
from kubernetes import client

from clusterproof.core.errors import HarnessError
from clusterproof.core.run import metadata
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import create_if_absent, delete_if_present, get_if_present
from clusterproof.provision import toolchain

# The schedulerName of the Coscheduling scheduler the harness runs itself.
OWN_SCHEDULER = "clusterproof-coscheduling"
SCHEDULER_COMPONENT = "coscheduling-scheduler"
CONTROLLER_COMPONENT = "podgroup-controller"
CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PODGROUP_CRD = "podgroups.scheduling.x-k8s.io"
# CRDs the embedded cluster gets, as paths inside the scheduler-plugins
# module: PodGroup for Coscheduling; ElasticQuota because the PodGroup
# controller binary also runs the ElasticQuota reconciler and cannot start
# without its CRD.
CRD_FILES = ("manifests/coscheduling/crd.yaml", "manifests/capacityscheduling/crd.yaml")


def scheduler_plugins_module_dir() -> Path:
    """Where the scheduler-plugins module lives in the Go module cache (downloaded if needed)."""
    return toolchain.module_dir("sigs.k8s.io/scheduler-plugins", toolchain.SCHEDULER_PLUGINS_VERSION,
                                "its PodGroup CRD")


def crd_manifests(run_id: str) -> list[dict]:
    """The CRDs as the module ships them, labelled with the run (so a sweeper knows whose they are)."""
    root = scheduler_plugins_module_dir()
    out = []
    for rel in CRD_FILES:
        path = root / rel
        if not path.exists():
            raise HarnessError(f"{path} is missing from the scheduler-plugins module: "
                               f"is {toolchain.SCHEDULER_PLUGINS_VERSION} the version that ships it?")
        body = yaml.safe_load(path.read_text())
        body.pop("status", None)  # server-owned
        meta = metadata(body["metadata"]["name"], run_id, body["metadata"].get("labels"))
        body["metadata"] = {**body["metadata"], **meta,
                            "annotations": {**(body["metadata"].get("annotations") or {}), **meta["annotations"]}}
        out.append(body)
    return out


def apply_crds(api: client.ApiClient, run_id: str) -> list[str]:
    """Create the CRDs (one that exists already is someone else's: left alone); return those created."""
    created = []
    for body in crd_manifests(run_id):
        if create_if_absent(api, CRD_PATH, body):
            created.append(body["metadata"]["name"])
    for name in created:
        wait_for(lambda n=name: _established(api, n), timeout=60, interval=0.5, what=f"CRD {name} Established")
    return created


def remove_crds(api: client.ApiClient, names: list[str]) -> None:
    """Delete CRDs and wait until they are gone (the finalizer removes their objects first)."""
    for name in names:
        delete_if_present(api, f"{CRD_PATH}/{name}")
    wait_for(lambda: [n for n in names if get_if_present(api, f"{CRD_PATH}/{n}") is not None],
             until=lambda left: not left, timeout=120, interval=0.5, what=f"CRDs {', '.join(names)} removed")


def _established(api: client.ApiClient, name: str) -> bool:
    crd = get_if_present(api, f"{CRD_PATH}/{name}") or {}
    return any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def podgroup_crd_served(api: client.ApiClient) -> bool:
    found = get_if_present(api, "/apis/scheduling.x-k8s.io/v1alpha1") or {}
    return any(r.get("kind") == "PodGroup" for r in found.get("resources", []))


def scheduler_config(kubeconfig: Path, qps: int, burst: int) -> dict:
    """The second scheduler's KubeSchedulerConfiguration.

    Coscheduling as the scheduler-plugins README configures it: enabled at
    every extension point, and its own queue sort (gang members next to each
    other) instead of the default one. permitWaitingTimeSeconds is the
    default hold when a PodGroup sets no scheduleTimeoutSeconds;
    podGroupBackoffSeconds 0: a rejected gang is retried at once (no
    artificial delay in the "admitted once capacity frees up" checks).
    """
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "leaderElection": {"leaderElect": False},
        "clientConnection": {"kubeconfig": str(kubeconfig), "qps": qps, "burst": burst},
        "profiles": [{
            "schedulerName": OWN_SCHEDULER,
            "plugins": {"multiPoint": {"enabled": [{"name": "Coscheduling"}]},
                        "queueSort": {"enabled": [{"name": "Coscheduling"}],
                                      "disabled": [{"name": "*"}]}},
            "pluginConfig": [{"name": "Coscheduling",
                              "args": {"permitWaitingTimeSeconds": 60,
                                       "podGroupBackoffSeconds": 0}}],
        }],
    }


def components(cluster_dir: Path, kubeconfig: Path, qps: int, burst: int, unschedulable_flush_s: int,
               ports: tuple[int, int]) -> list[dict]:
    """The two extra components for the cluster's KwokctlConfiguration (binary runtime).

    kwokctl names a component's pid and log file after its binary, and the
    plugin build's binary is also called kube-scheduler: each is reached
    through a link in the cluster directory named after the component.
    """
    sp = toolchain.ensure(toolchain.SCHEDULER_PLUGINS)
    bindir = cluster_dir / "bin"
    bindir.mkdir(parents=True, exist_ok=True)
    links = {SCHEDULER_COMPONENT: sp.path("kube-scheduler"), CONTROLLER_COMPONENT: sp.path("controller")}
    for name, target in links.items():
        link = bindir / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(target)
    cfg = cluster_dir / "coscheduling-scheduler.yaml"
    cfg.write_text(yaml.safe_dump(scheduler_config(kubeconfig, qps, burst)))
    sched_port, probe_port = ports
    return [
        {"name": SCHEDULER_COMPONENT, "binary": str(bindir / SCHEDULER_COMPONENT), "workDir": str(cluster_dir),
         "links": ["kube-apiserver"],
         "args": [f"--config={cfg}", "--bind-address=127.0.0.1", f"--secure-port={sched_port}",
                  # Coscheduling v0.34.7 requeues a gang rejected at Permit only on
                  # Pod/Add and PodGroup events, not when capacity frees (Pod/Delete):
                  # such a gang waits for this periodic flush (default 5 min).
                  f"--pod-max-in-unschedulable-pods-duration={unschedulable_flush_s}s",
                  "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"]},
        # Writes PodGroup status (phase, scheduled/running counts); one instance, no leader election.
        {"name": CONTROLLER_COMPONENT, "binary": str(bindir / CONTROLLER_COMPONENT), "workDir": str(cluster_dir),
         "links": ["kube-apiserver"],
         "args": [f"--kubeconfig={kubeconfig}", "--metricsAddr=0", f"--probeAddr=127.0.0.1:{probe_port}",
                  f"--qps={qps}", f"--burst={burst}"]},
    ]


def health_urls(ports: tuple[int, int]) -> dict[str, str]:
    sched_port, probe_port = ports
    return {SCHEDULER_COMPONENT: f"https://127.0.0.1:{sched_port}/healthz",
            CONTROLLER_COMPONENT: f"http://127.0.0.1:{probe_port}/healthz"}
