"""Run a suite as a separate pytest process, as a user would, and read its verdicts.

Why a subprocess: a negative control must show what an SRE would see -- the
exit code, the one-line errors and each test's failure message -- from the
same command line a user types, against a real (deliberately broken) cluster.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import xml.etree.ElementTree as ET
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

from tests import forkserver

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class SuiteRun:
    returncode: int
    output: str
    failures: dict[str, str]   # test id -> failure message
    passed: list[str]

    def failed(self, test_prefix: str) -> dict[str, str]:
        return {k: v for k, v in self.failures.items() if k.startswith(test_prefix)}


# The self-tests load the machine on purpose (``./proof test``: 5 workers on 2 cores), so a child run's
# latency SLO checks would judge that load, not the mechanism its self-test proves (seen in CI: a lease
# PUT p99 of 1.5 s over 3 calls failed the baseline self-test's first run against the session cluster).
# A child run gets SLO bounds nothing breaks unless its arguments name the key: a control proving that an
# SLO check catches a slow cluster passes the shipped bound itself (``shipped_slo``), and ``./proof test``
# runs the suites that judge them alone afterwards, on the shipped bounds (./proof: SLO_SUITES).
LATENCY_SLOS = ("slo_mutating_p99_s", "slo_list_p99_s", "slo_pod_startup_p99_s")
NOT_JUDGED_SLO_S = 600.0


def shipped_slo(profile, key: str) -> str:
    """``--cp-set=<key>=<the profile's bound>``: a control that must be judged on the shipped SLO."""
    return f"--cp-set={key}={getattr(profile, key):g}"


def child_args(args: list[str]) -> list[str]:
    """A self-test's child run: without real nodes unless its arguments ask for them (``--cp-set real_nodes=N``;
    the controls of the kwok suites stay what they were, and only the real-node self-tests pay for a
    kubelet -- tests/conftest.py does the same for the session cluster), and with the latency SLOs
    ``LATENCY_SLOS`` not judged unless its arguments name them. Its own ``--cp-set`` come later and win."""
    named = lambda key: any(f"{key}=" in a for a in args)   # noqa: E731
    sets = [] if named("real_nodes") else ["--cp-set", "real_nodes=0"]
    sets += [f"--cp-set={key}={NOT_JUDGED_SLO_S:g}" for key in LATENCY_SLOS if not named(key)]
    return [*sets, *args]


def run_pytest(args: list[str], tmp_path: Path, timeout: float = 900, env: dict | None = None) -> SuiteRun:
    """Run pytest in a child process; ``env`` overrides variables for the child only (never this
    process's os.environ: the session's embedded cluster and its supervisor live here)."""
    junit = tmp_path / "junit.xml"
    argv = ["-p", "no:randomly", f"--junitxml={junit}", f"--alluredir={tmp_path / 'allure'}",
            f"--cp-summary={tmp_path / 'summary.json'}", "-q", f"--cp-output-dir={tmp_path / 'out'}",
            *child_args(args)]
    child_env = {**os.environ, **(env or {})}
    if forkserver.wanted(child_env):     # the same run, forked from a process that has its imports done
        proc = forkserver.run(argv, ROOT, child_env, timeout)
    else:
        proc = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, env=child_env)
    return SuiteRun(proc.returncode, proc.stdout + proc.stderr, *junit_verdicts(junit))


def junit_verdicts(junit: Path) -> tuple[dict[str, str], list[str]]:
    """From a run's junit XML: {test: failure message} and the tests that passed."""
    failures, passed = {}, []
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            name = case.get("name")
            bad = case.find("failure") if case.find("failure") is not None else case.find("error")
            if bad is not None:
                failures[name] = bad.get("message", "") + "\n" + (bad.text or "")
            elif case.find("skipped") is None:
                passed.append(name)
    return failures, passed


class BackgroundRun(subprocess.Popen):
    """A child pytest whose output goes to a file, never a pipe: a run the test does not read while it waits
    (minutes, for a real node's container) would otherwise stop at its first write once the pipe's 64 KiB
    are full, and the wait would blame the run. ``output()`` is everything it printed so far;
    ``communicate`` waits for it to end and returns ``(output, None)``, as with a pipe."""

    def __init__(self, cmd: list[str], log: Path, **kwargs):
        self.log = log
        with open(log, "w") as f:
            super().__init__(cmd, stdout=f, stderr=subprocess.STDOUT, text=True, **kwargs)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def communicate(self, input=None, timeout=None):
        self.wait(timeout)
        return self.output(), None

    def tail(self, n: int = 3000) -> str:
        """The last ``n`` characters it printed, for a failure message."""
        return f"the run's last output ({self.log}):\n{self.output()[-n:]}"


@contextmanager
def background_pytest(args: list[str], tmp_path: Path, new_session: bool = False, env: dict | None = None):
    """A pytest run in the background (to be interrupted or killed): a ``BackgroundRun``, its output in
    ``tmp_path/background.log``. Killed on leaving the block if still running (its process group when
    ``new_session``). ``env`` overrides variables for the child only, as in ``run_pytest``.

    SIGINT goes back to its default in the child: a parent started in the
    background without job control (nohup ... &, some CI runners) passes it
    on as ignored, and then Python never raises KeyboardInterrupt.
    """
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", f"--alluredir={tmp_path / 'allure'}",
           f"--cp-summary={tmp_path / 'summary.json'}", f"--cp-output-dir={tmp_path / 'out'}", *child_args(args)]
    tmp_path.mkdir(parents=True, exist_ok=True)
    proc = BackgroundRun(cmd, tmp_path / "background.log", cwd=ROOT, start_new_session=new_session,
                         env={**os.environ, **(env or {})},
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        yield proc
    finally:
        if proc.poll() is None:
            if new_session:
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
            proc.wait(timeout=60)


# A request whose client goes away mid-flight is counted by kube-apiserver as a server error: a 504 when its
# timeout filter answers the abandoned request ("Timeout or abort while handling"), a 500 "context canceled"
# when the handler itself sees the cancellation (a LIST read from etcd; kubernetes/kubernetes#139256, open).
# A run killed or interrupted on purpose would read as a server error to the module's API health guard, so
# each such end is excused, and said.
KILL_EXCUSE = ("a harness run SIGKILLed on purpose by this self-test: kube-apiserver counts the requests it "
               "had in flight as 504 (client abort) or 500 (context canceled, kubernetes/kubernetes#139256)")
INTERRUPT_EXCUSE = ("a harness run interrupted (Ctrl-C) on purpose by this self-test: kube-apiserver counts a "
                    "request the exiting run abandoned as 504 (client abort) or 500 (context canceled, "
                    "kubernetes/kubernetes#139256)")


# The run Lease of a background run this self-test kills or stops on purpose: short, so that the next run's
# sweeper may take its objects soon after; not so short that the run loses liveness on its own first. At 10 s
# (a 1.25 s request bound, 5 s of failing allowed) a renewal slowed by a loaded CI machine stopped such a run
# before the kill (etcd p99 0.98 s, one GET of the Lease answered 500): the test then read "the run ended
# early". 20 s allows a 2.5 s request and 10 s of failing.
KILLED_RUN_LEASE = "run_lease_duration_s=20"


def kill_run(proc: subprocess.Popen, api_guard, new_session: bool = False, gone=None) -> None:
    """SIGKILL a background run (its process group with ``new_session``) and wait for it -- and for ``gone()``
    (e.g. its children that die with it) -- inside the guard's excuse for exactly that."""
    with api_guard.excuse(KILL_EXCUSE):
        if new_session:
            os.killpg(proc.pid, signal.SIGKILL)
        else:
            proc.kill()
        proc.wait(timeout=60)
        if gone is not None:
            from clusterproof.core.waiting import wait_for
            wait_for(gone, timeout=30, interval=0.2, what="the killed run's processes gone")


@contextmanager
def kept_from_other_sweeps(directory: Path):
    """Claim a run's directory (its embedded cluster's or its Prometheus') for this process while the block
    runs, then give it back to the run's own record. Why: every run that starts on this machine sweeps what
    dead runs left -- the self-tests' other parallel workers start runs all the time -- so a run this test
    kills on purpose would be swept by whichever starts next, before the test's own sweep could show that
    it is a sweep that removes it. Enter it while the run is alive; leave it right before that sweep.

    An embedded cluster's watchdog (clusterproof.cluster.watchdog) would delete it the moment its run dies:
    it is stopped here, as if killed with the run, so the sweep is the one that removes it."""
    from clusterproof.cluster import watchdog
    from clusterproof.core.processes import OWNER_FILE, claim_directory
    owner = directory / OWNER_FILE
    record = owner.read_text()
    claim_directory(directory)       # an existing directory is claimed in place, its record replaced whole
    watchdog.stop(directory)
    try:
        yield
    finally:
        owner.write_text(record)


def private_cache(tmp_path: Path) -> Path:
    """A cache root of its own (``CLUSTERPROOF_CACHE``) for child runs that must be the only runs to see each
    other's leftovers: the builds, images, Prometheus histories and the real nodes' address lock are this
    machine's (linked), the embedded clusters' and Prometheus run directories are its own. A run killed in it
    is swept by the next run in it, never by a run of another parallel worker."""
    from clusterproof.provision import toolchain
    shared, root = toolchain.cache_root(), tmp_path / "cache"
    (root / "prometheus").mkdir(parents=True, exist_ok=True)
    for name in ("bin", "images", "logs", "real-nodes.lock", "prometheus/history"):
        if (shared / name).exists():
            (root / name).symlink_to(shared / name)
    return root


def ended_early(proc: BackgroundRun) -> None:
    """Raise (with its output) if a background run ended before it was interrupted."""
    if proc.poll() is not None:
        raise AssertionError(f"the run ended early (exit {proc.returncode}):\n{proc.output()[-2000:]}")


def interrupt(proc: subprocess.Popen, api_guard, timeout: float = 300) -> str:
    """Ctrl-C a background run and wait for it to end, inside the guard's excuse for exactly that; its
    output. Asserts the run saw the interrupt. ``api_guard`` is None only for a run against a cluster of
    its own, which no guard watches."""
    with api_guard.excuse(INTERRUPT_EXCUSE) if api_guard is not None else nullcontext():
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=timeout)
    assert "KeyboardInterrupt" in out or "Interrupted" in out or "!!!" in out, out[-2000:]
    return out


def assert_one_line(run: SuiteRun, *expected: str) -> None:
    """The run ended with one readable line (exit 4) naming each of ``expected``; no traceback."""
    assert run.returncode == 4, run.output[-2000:]
    for e in expected:
        assert e in run.output, run.output[-2000:]
    assert "Traceback" not in run.output and "INTERNALERROR" not in run.output, run.output[-2000:]


def allure_results(tmp_path: Path) -> dict[str, dict]:
    """Allure result files of a run_pytest() call, by pytest test name (with parameters; the
    report's own name is the sentence title, so the plugin's ``pytest.id`` label is the key)."""
    out = {}
    for f in (tmp_path / "allure").glob("*-result.json"):
        r = json.loads(f.read_text())
        ids = [lb["value"] for lb in r.get("labels", []) if lb["name"] == "pytest.id"]
        out[ids[0] if ids else r["name"]] = r
    return out


def allure_figures(tmp_path: Path, result: dict) -> dict[str, dict]:
    """A result's figures by name (as summary.json has them), from the "figures (data)" attachment beside
    the check's figures table (``clusterproof.report.allure.attach_figures``)."""
    found = [a for a in result.get("attachments", []) if a["name"] == "figures (data)"]
    if not found:
        return {}
    return {f["name"]: f for f in json.loads((tmp_path / "allure" / found[0]["source"]).read_text())}


# Cluster-scoped kinds a run may create (and events about nodes, which live in "default"), looked at by
# run label; an API the cluster does not serve is skipped.
RUN_KINDS = (
    "/apis/admissionregistration.k8s.io/v1beta1/mutatingadmissionpolicybindings",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
    "/apis/admissionregistration.k8s.io/v1beta1/mutatingadmissionpolicies",
    "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "/apis/scheduling.k8s.io/v1/priorityclasses",
    "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
    "/api/v1/namespaces/default/events",
    "/apis/flowcontrol.apiserver.k8s.io/v1/flowschemas",
    "/apis/flowcontrol.apiserver.k8s.io/v1/prioritylevelconfigurations",
    "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "/apis/rbac.authorization.k8s.io/v1/clusterroles",
)


def run_leftovers(api, run_id: str) -> list[str]:
    """Everything the run ``run_id`` has on the cluster: namespaces and pods with its label (a pool
    namespace's contents too), the cluster-scoped kinds a run creates, scratch nodes, taint records on
    nodes it borrowed, and its Lease, owner record and claims in the home namespace."""
    from clusterproof.core.run import RUN_LABEL, SCRATCH_LABEL
    from clusterproof.kube.access import HOME
    from clusterproof.kube.client import get_if_present, list_raw
    from clusterproof.kube.node_taints import added_taints_key
    sel = {"labelSelector": f"{RUN_LABEL}={run_id}"}
    left = [f"namespace {n['metadata']['name']}" for n in list_raw(api, "/api/v1/namespaces", sel)["items"]]
    left += [f"pod {p['metadata']['namespace']}/{p['metadata']['name']}"
             for p in list_raw(api, "/api/v1/pods", sel)["items"]]
    for path in RUN_KINDS + (f"/apis/coordination.k8s.io/v1/namespaces/{HOME}/leases",
                             f"/api/v1/namespaces/{HOME}/configmaps"):
        left += [f"{path.rsplit('/', 1)[1]}/{o['metadata']['name']}"
                 for o in (get_if_present(api, path, sel) or {}).get("items", [])]
    for n in list_raw(api, "/api/v1/nodes")["items"]:
        meta = n["metadata"]
        if SCRATCH_LABEL in (meta.get("labels") or {}) and meta["labels"].get(RUN_LABEL) == run_id:
            left.append(f"scratch node {meta['name']}")
        if added_taints_key(run_id) in (meta.get("annotations") or {}):
            left.append(f"added-taints record of {run_id} on node {meta['name']}")
    return left
