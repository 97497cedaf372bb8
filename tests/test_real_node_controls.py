"""The real-node checks can fail, and a real node never outlives its run.

Each test runs ``suites/test_real_nodes.py`` as a user types it, on an
embedded cluster of its own with one real node (smoke profile; the
self-tests' session cluster has none, tests/conftest.py):

- negative controls: a node whose GPU runtime hands in no NVML library
  (``real_node_nvml: false``) and kubelets running as the admin
  (``real_node_identity: false``), one cluster for both -- each check fails
  with the line an SRE would read; a kubelet SIGKILLed mid-suite is named by
  the control-plane guard, and no check blames the cluster for it;
- clean-up: after a run that ends normally, one SIGKILLed while its real node
  runs containers (then swept as the next run sweeps) and one interrupted
  with Ctrl-C, nothing of the real node is left on the host: no kubelet,
  containerd, relay, shim or container process, no process in the node's
  namespaces, no mount under the cluster's directory (the namespaces'
  bindings among them), no cgroup ``/clusterproof/<cluster>`` in any
  hierarchy, no veth, no shim socket;
- the node's own host (``clusterproof.cluster.nodehost``): while the run that
  ends normally has containers running, what the node makes -- its pods'
  veths, its bridge, the shims' sockets, the container log links -- is found
  in the node's namespaces and directory, and none of it on the host, whose
  kernel tunables and IP forwarding read as before the run.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from clusterproof.cluster import nodehost, realnodes
from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster, sweep_clusters
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import WaitTimeout, wait_for
from clusterproof.kube.client import list_raw, load_client
from tests.harness import (
    allure_results,
    background_pytest,
    ended_early,
    interrupt,
    junit_verdicts,
    kept_from_other_sweeps,
    run_pytest,
)

pytestmark = pytest.mark.host
SUITE = "suites/test_real_nodes.py"
NODE = f"{realnodes.NODE_PREFIX}0"
KUBELET = realnodes.kubelet_component(NODE)
CHECKER = "test_the_checker_pod_on_each_real_node_finds_the_injected_fault_and_the_node_is_held_back"
CLASSIFIED = "test_the_real_kubelets_requests_are_classified_as_a_nodes_and_its_lease_never_lapses"
TAINTS = "test_a_noexecute_taint_kills_the_running_container_and_the_kubelet_refuses_an_untolerating_pod"
# A check's SLO verdict reads "... SLO (p99 <= 5 s) broken ..." (the burst suite's, where real-node pods are
# timed). Not just "SLO": the guard's line quotes the kubelet's last log line, which may well be its own
# "podStartSLOduration" figure.
SLO_VERDICT = "SLO (p99"


def _args(run_id: str, *extra: str) -> list[str]:
    # One real node, said explicitly: the self-tests' runs have none unless asked (tests/harness.py).
    return [SUITE, "--cp-profile", "smoke", "--cp-run-id", run_id, "--cp-set", "real_nodes=1", *extra]


def _cluster(prefix: str) -> tuple[str, KwokCluster]:
    run_id = f"{prefix}-{os.urandom(2).hex()}"
    return run_id, KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40)


# --- what a real node leaves on the host ------------------------------------------------------------------

HOST_LOG_LINKS = Path("/var/log/containers")      # the kubelet's, fixed; in the node's mount namespace its own
KERNEL = (*nodehost.KUBELET_TUNABLES, "net/ipv4/ip_forward")


def kernel() -> dict[str, str]:
    """The host's kernel tunables a kubelet would set and the forwarding a gateway bridge would turn on."""
    return {k: Path(f"/proc/sys/{k}").read_text().strip() for k in KERNEL}


@dataclass
class Seen:
    """What a running real node had (read while its run is alive): what must go with it."""
    states: list[dict]
    shim_sockets: set[str] = field(default_factory=set)  # under the node's own /run (its directory)
    veths: set[str] = field(default_factory=set)        # the pods' node-side veths on the node's bridge (inside)
    log_links: set[str] = field(default_factory=set)    # the node's own /var/log/containers links
    pids: set[int] = field(default_factory=set)         # kubelet, containerd, relay, shims, containers

    def add(self, kc: KwokCluster) -> None:
        for st in self.states:
            d = Path(st["socket"]).parent
            shims = realnodes.shims_of(st["socket"])
            self.pids |= {p.pid for p in shims} | realnodes.cgroup_pids(st["cgroup_root"])
            self.pids |= {p.pid for p in nodehost.inside(d)}
            self.shim_sockets |= {str(s) for s in map(realnodes.shim_socket, shims) if s is not None}
            self.veths |= _link_names(["nsenter", f"--net={d / nodehost.NS / 'net'}", "ip", "-o", "link", "show",
                                       "master", st["bridge"]])
            self.log_links |= set(_log_links(nodehost.own_path(d, str(HOST_LOG_LINKS)), kc.directory))
        self.pids |= set(kc.pids().values())


def _link_names(cmd: list[str]) -> set[str]:
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    return {m.group(1) for m in re.finditer(r"^\d+: ([^:@]+)", out, re.M)}


def on_the_host(kc: KwokCluster, seen: Seen) -> list[str]:
    """What the node made that is found in the host's own namespaces: its bridge or pods' veths among the
    host's links, container log links into the cluster in the host's /var/log/containers, shim sockets in
    the host's /run/containerd/s."""
    host_links = _link_names(["ip", "-o", "link", "show"])
    out = [f"link {n} on the host" for n in sorted((seen.veths | {st["bridge"] for st in seen.states}) & host_links)]
    out += [f"container log link {f} on the host" for f in _log_links(HOST_LOG_LINKS, kc.directory)]
    out += [f"shim socket {Path(realnodes.SHIM_SOCKETS) / Path(s).name} on the host" for s in sorted(seen.shim_sockets)
            if (Path(realnodes.SHIM_SOCKETS) / Path(s).name).exists()]
    return out


def _states(kc: KwokCluster) -> list[dict]:
    out = []
    for f in sorted((kc.directory / realnodes.DIR).glob(f"*/{realnodes.STATE_FILE}")):
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return out


def _log_links(where: Path, cluster_dir: Path) -> list[str]:
    out = []
    if where.exists():
        for f in where.iterdir():
            try:
                if f.is_symlink() and os.readlink(f).startswith(str(cluster_dir) + "/"):
                    out.append(str(f))
            except OSError:
                continue
    return out


def _in_cluster_cgroups(cluster: str) -> list[str]:
    """Processes whatever cgroup of ``/clusterproof/<cluster>`` holds them (/proc/<pid>/cgroup)."""
    out = []
    mark = f"/clusterproof/{cluster}/"
    for p in psutil.process_iter(["name"]):
        try:
            if mark in Path(f"/proc/{p.pid}/cgroup").read_text():
                out.append(f"process {p.pid} ({p.info['name']}) in a cgroup of {mark}")
        except OSError:
            continue
    return out


def left_behind(kc: KwokCluster, seen: Seen) -> list[str]:
    """Everything of the cluster's real nodes still on the host: ``realnodes.leftovers`` and what it does
    not look at (a cgroup of the cluster in any /sys/fs/cgroup hierarchy, named ones too; the node's traces
    in the host's own namespaces; the shims' sockets; each process seen while the run was alive)."""
    out = realnodes.leftovers(kc.directory, seen.states)
    for h in sorted(Path("/sys/fs/cgroup").iterdir()) if Path("/sys/fs/cgroup").exists() else []:
        if (h / "clusterproof" / kc.name).exists():
            out.append(f"cgroup {h / 'clusterproof' / kc.name}")
    out += _in_cluster_cgroups(kc.name)
    out += on_the_host(kc, seen)
    names = _link_names(["ip", "-o", "link", "show"])
    out += [f"link {st['veth']}" for st in seen.states if st["veth"] in names]
    out += [f"container log link {f}" for f in sorted(seen.log_links) if os.path.lexists(f)]
    out += [f"shim socket {s}" for s in sorted(seen.shim_sockets) if os.path.exists(s)]
    for pid in sorted(seen.pids):
        try:
            p = psutil.Process(pid)
            if p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"process {pid} ({p.name()}) seen while the run was alive")
        except psutil.NoSuchProcess:
            continue
    if kc.directory.exists():
        out.append(f"directory {kc.directory}")
    return sorted(set(out))


def _api(kc: KwokCluster, cache: dict):
    if "api" not in cache:
        if not kc.kubeconfig.exists() or "kube-apiserver" not in kc.pids():
            return None
        cache["api"] = load_client(kc.kubeconfig)
    return cache["api"]


def _real_pods(kc: KwokCluster, run_id: str, cache: dict, proc, running: bool = True) -> list[str]:
    """The run's pods on the real node (``running``: only those whose containers started; else every pod
    of the run, bound or not), by name."""
    ended_early(proc)
    api = _api(kc, cache)
    if api is None:
        return []
    try:
        pods = list_raw(api, "/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={run_id}",
                                              **({"fieldSelector": f"spec.nodeName={NODE}"} if running else {})},
                        retry_s=0)["items"]
    except Exception:   # the cluster is still coming up
        return []
    return [p["metadata"]["name"] for p in pods if not running or (p.get("status") or {}).get("phase") == "Running"
            and any((c.get("state") or {}).get("running") for c in p["status"].get("containerStatuses") or [])]


def _wait_containers(kc: KwokCluster, run_id: str, proc, prefix: str = "", timeout: float = 300) -> Seen:
    """Wait until the real node runs a container of the run (a pod named ``prefix``...), then what it has."""
    cache: dict = {}

    def explain(_names) -> str:
        """Where the run's pods were, and what the run printed: the wait alone cannot tell a slow node from a
        run that never got to its check."""
        try:
            api = _api(kc, cache)
            pods = [] if api is None else list_raw(api, "/api/v1/pods", {"labelSelector": f"{RUN_LABEL}={run_id}"},
                                                   retry_s=0)["items"]
            where = "; ".join(f"{p['metadata']['name']} on {p['spec'].get('nodeName') or '(unbound)'} "
                              f"{(p.get('status') or {}).get('phase')}" for p in pods) or "none"
        except Exception as e:   # the cluster itself is the question then
            where = f"could not list them ({type(e).__name__}: {e})"
        return f"the run's pods: {where}\n{proc.tail()}"
    wait_for(lambda: _real_pods(kc, run_id, cache, proc),
             until=lambda names: any(n.startswith(prefix) for n in names), timeout=timeout, interval=0.3,
             what=f"a pod {prefix}* of run {run_id} running on real node {NODE}", explain=explain)
    seen = Seen(_states(kc))
    assert seen.states, f"no real node state under {kc.directory / realnodes.DIR}"
    seen.add(kc)
    assert any(realnodes.shims_of(st["socket"]) for st in seen.states), "the real node runs no shim"
    return seen


def _message(failure: str) -> str:
    """A check's whole assertion message (junit's message attribute is cut at a few hundred characters)."""
    for line in failure.splitlines():
        if line.startswith("E ") and "AssertionError: " in line:
            return line.split("AssertionError: ", 1)[1]
    return failure.split("\n", 1)[0]


# --- negative controls -----------------------------------------------------------------------------------

def test_a_node_without_nvml_and_kubelets_running_as_the_admin_fail_their_checks(tmp_path):
    """``real_node_nvml: false`` and ``real_node_identity: false`` on one cluster: the checker check names
    the node, the missing library and the node's state (held back: failed, never released, both rounds);
    the classification check names the exempt flow and the admin identity of the heartbeats."""
    run_id, kc = _cluster("rn-ctl")
    try:
        run = run_pytest(_args(run_id, "-k", "checker_pod or classified", "--cp-set", "real_node_nvml=false",
                               "--cp-set", "real_node_identity=false"), tmp_path, timeout=600)
    finally:
        kc.delete()
    assert run.returncode == 1, run.output[-3000:]
    assert sorted(run.failures) == sorted([CHECKER, CLASSIFIED]), (
        f"failed: {sorted(run.failures)}\n{run.output[-3000:]}")
    checker = _message(run.failures[CHECKER])
    # Both rounds (fault injected, then healthy) find no library, and the node stays held back.
    nvml = re.findall(rf"node {NODE}: the checker pod could not use NVML \(preflight: no NVML library: "
                      r"libnvidia-ml\.so\.1 was not found \(NVMLError_LibraryNotFound\).*? -- the node is ([\w-]+)",
                      checker)
    assert nvml == ["failed", "failed"], (
        "the preflight check must say, for each of its two rounds, that the checker pod on "
        f"{NODE} found no libnvidia-ml.so.1 and that the node is failed (held back); it said: "
        f"{checker}")
    assert "the node is failed (held back, not released)" in checker and "RELEASED" not in checker, (
        f"the node without NVML must be held back, never released: {checker}")
    assert f"node {NODE} has reason label clusterproof.io/preflight-reason=nvml-unavailable, expected " \
           "ecc-uncorrectable" in checker, f"the quarantine reason should be nvml-unavailable: {checker}"
    rounds = [a for a in allure_results(tmp_path)[CHECKER]["attachments"]
              if a["name"].startswith("rounds (node, injected fault")]
    assert rounds, "the checker test attached no rounds"
    said = (tmp_path / "allure" / rounds[0]["source"]).read_text().splitlines()
    assert said == [f"{NODE}: injected ecc-uncorrectable -> checker pod answered nvml-unavailable -> quarantined",
                    f"{NODE}: injected nothing -> checker pod answered nvml-unavailable -> quarantined"], \
        f"each round must end with the node quarantined (never released): {said}"
    classified = _message(run.failures[CLASSIFIED])
    expected = [rf"node {NODE}: none of its kubelet's \d+ responses was classified system-node-high "
                r"\(its flows: exempt \d+",
                rf"node {NODE}: \d+ of its kubelet's requests were classified outside the node flows: exempt \d+(;|$)",
                rf"node {NODE}: \d+ heartbeats came from kwok-admin, not system:node:{NODE}"]
    for pattern in expected:
        assert re.search(pattern, classified), (f"the classification check must say /{pattern}/ (the kubelet runs "
                                                f"as kwok-admin, APF-exempt); it said: {classified}")
    flows = re.search(r"\(its flows: (.*?)\); ", classified).group(1)
    assert {f.rsplit(" ", 1)[0] for f in flows.split(", ")} <= {"exempt", realnodes.UNCLASSIFIED}, \
        f"an admin kubelet's requests must all be exempt (or unclassified at the start): {flows}"


def test_a_kubelet_killed_mid_suite_is_named_by_the_guard_and_never_blamed_on_the_cluster(tmp_path):
    """SIGKILL the real node's kubelet while its eviction victim runs (the node has run the checker pods
    already): the supervisor restarts it, the control-plane guard fails the module naming
    ``kubelet-cp-real-0``, and no check turns the restart into a verdict on the cluster (a pod startup SLO
    or any other): the taint check still sees its container evicted and its pod refused by the restarted
    kubelet."""
    run_id, kc = _cluster("rn-kill")
    try:
        with background_pytest(_args(run_id, f"--junitxml={tmp_path / 'junit.xml'}"), tmp_path) as proc:
            _wait_containers(kc, run_id, proc, prefix="evict-victim")
            pid = kc.pids()[KUBELET]
            os.kill(pid, signal.SIGKILL)
            killed_at = time.strftime("%H:%M:%S", time.gmtime())
            out, _ = proc.communicate(timeout=600)
    finally:
        kc.delete()
    failures, passed = junit_verdicts(tmp_path / "junit.xml")
    assert proc.returncode == 1, out[-3000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    lines = {t: m.split("\n", 1)[0] for t, m in failures.items()}
    guard = {t: m for t, m in lines.items() if "this module broke the control plane" in m}
    assert guard, f"no guard failure after killing {KUBELET} (pid {pid}) at {killed_at} UTC:\n{out[-3000:]}"
    [line] = guard.values()
    assert re.search(rf"this module broke the control plane: {KUBELET} exited at \d\d:\d\d:\d\d UTC, restarted; "
                     r"its last log line: ", line), f"the guard must name {KUBELET} as exited and restarted: {line}"
    verdicts = {t: m for t, m in lines.items() if SLO_VERDICT in m}
    assert not verdicts, f"the kubelet's restart was blamed on the cluster as an SLO verdict: {verdicts}"
    others = {t: m for t, m in lines.items() if t not in guard}
    assert not others, f"the kubelet's restart was blamed on the cluster by other checks: {others}"
    assert TAINTS in passed, f"the check the kill landed in did not pass: passed {passed}"


# --- nothing left behind ------------------------------------------------------------------------------------

def test_a_run_that_ends_leaves_nothing_of_its_real_node_which_kept_to_its_own_host(tmp_path):
    run_id, kc = _cluster("rn-end")
    before = kernel()
    try:
        with background_pytest(_args(run_id), tmp_path) as proc:
            seen = _wait_containers(kc, run_id, proc)
            during, outside = kernel(), on_the_host(kc, seen)
            out, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, out[-3000:]
        left = left_behind(kc, seen)
    finally:
        kc.delete()
    assert not left, f"run {run_id} ended and left on this host: {'; '.join(left)}"
    # What the node made was there, in its own host (so the checks above and below could fail)...
    assert seen.veths and seen.shim_sockets and seen.log_links, (
        f"the node ran a container but its namespaces and directory showed no pod veth ({seen.veths}), shim "
        f"socket ({seen.shim_sockets}) or container log link ({seen.log_links})")
    # ... and none of it on the host's own, whose kernel read as before the run while the node ran.
    assert not outside, f"real node of run {run_id} made on the host itself: {'; '.join(outside)}"
    changed = {k: f"{before[k]} -> {during[k]}" for k in KERNEL if during[k] != before[k]}
    assert not changed, f"while its real node ran, run {run_id} changed the host's kernel: {changed}"


def test_a_run_killed_while_its_real_node_runs_containers_is_swept_without_a_trace(tmp_path):
    run_id, kc = _cluster("rn-sigkill")
    try:
        with background_pytest(_args(run_id), tmp_path) as proc:
            seen = _wait_containers(kc, run_id, proc)
            with kept_from_other_sweeps(kc.directory):
                proc.kill()   # SIGKILL: no teardown runs
                proc.wait(timeout=60)
                # Before the sweep every kind of trace is there (so the check after it can fail). The node runs
                # on without its run: a shim it had just started serves its socket a moment later (seen in a
                # fresh-clone run on the loaded machine: the shim alive, its socket not yet there), so what it
                # has is read until every kind shows, for a bounded while.
                kinds = {"process", "in the node's namespaces", "mount", "cgroup", f"link {seen.states[0]['veth']}",
                         "container log link", "shim socket", "directory"}

                def traces() -> list[str]:
                    seen.add(kc)
                    return left_behind(kc, seen)

                def missing(alive: list[str]) -> list[str]:
                    return [k for k in sorted(kinds) if not any(k in s for s in alive)] + \
                        ([] if any(KUBELET in s for s in alive) else [KUBELET])
                try:
                    wait_for(traces, until=lambda alive: not missing(alive), timeout=30, interval=1,
                             what="every kind of trace of the killed run's real node")
                except WaitTimeout:
                    alive = traces()
                    raise AssertionError(f"SIGKILL should have left the real node running, with {missing(alive)} "
                                         f"too: {alive}") from None
        assert kc.name in sweep_clusters(), f"the sweep did not delete {kc.name}"
        left = left_behind(kc, seen)
    finally:
        kc.delete()
    assert not left, f"the sweep of killed run {run_id} left on this host: {'; '.join(left)}"


def test_a_run_interrupted_while_its_real_node_runs_containers_leaves_nothing(tmp_path):
    run_id, kc = _cluster("rn-int")
    try:
        with background_pytest(_args(run_id), tmp_path) as proc:
            seen = _wait_containers(kc, run_id, proc)
            seen.add(kc)
            out = interrupt(proc, None)  # its own cluster: no guard watches it
        left = left_behind(kc, seen)
    finally:
        kc.delete()
    assert not left, f"run {run_id} interrupted with Ctrl-C left on this host: {'; '.join(left)}\n{out[-2000:]}"
