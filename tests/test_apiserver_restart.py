"""Watches survive the control plane: kube-apiserver restarted in the middle of a suite.

A run as a user types it (its own embedded cluster, smoke profile) executes
the burst suite, whose every check stands on a pod watch (bind and start
times) and on the apiserver's own histograms. When the steady phase's first
pods appear, this test kills that cluster's kube-apiserver (SIGKILL, the pid
in its pid file); the run's supervisor restarts it, as a kubelet restarts a
static pod. Locust's creates are refused meanwhile, the pod watch is cut and
must relist, the histograms start from zero.

What must come out: every check's right verdict (passed), or one line that
names the restart -- a harness error (``clusterproof: the API server
restarted ...``) for checks whose figures the restart voided, and the
control-plane guard's ``this module broke the control plane: kube-apiserver
exited at ...`` in the module's teardown. Never a verdict about the cluster
(no result in the report's Cluster defect, SLO broken or Regression
categories), never a traceback, and nothing left behind.
"""
from __future__ import annotations

import json
import os
import signal
import time
import xml.etree.ElementTree as ET

import pytest

from clusterproof.burst.plan import PHASE_LABEL
from clusterproof.cluster.kwok import NAME_PREFIX, KwokCluster
from clusterproof.core.run import RUN_LABEL
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_raw, load_client
from clusterproof.report.allure import categories
from tests.harness import background_pytest, ended_early

pytestmark = pytest.mark.cluster
SUITE = "suites/test_burst_pod_creation.py"
CLUSTER_VERDICTS = {"Cluster defect", "SLO broken",
                    "Regression against the baseline (--cp-baseline: a figure or a check got worse)"}


def _failures(junit) -> dict[str, list[str]]:
    """Every failure and error of every test case (set-up, call and teardown), by test name."""
    out: dict[str, list[str]] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        for bad in [*case.findall("failure"), *case.findall("error")]:
            out.setdefault(case.get("name"), []).append((bad.text or bad.get("message", "")).strip())
    return out


def _report_categories(allure_dir) -> dict[str, list[str]]:
    """Each result that did not pass, with the categories the report gives it."""
    out = {}
    for f in allure_dir.glob("*-result.json"):
        r = json.loads(f.read_text())
        if r.get("status") in ("failed", "broken"):
            out[r["name"]] = categories(r["status"], (r.get("statusDetails") or {}).get("message"))
    return out


def test_a_suite_whose_apiserver_restarts_gives_its_verdict_or_names_the_restart(tmp_path):
    run_id = f"restart-{os.urandom(2).hex()}"
    kc = KwokCluster(f"{NAME_PREFIX}{run_id}", 1, 40)
    junit = tmp_path / "junit.xml"
    # 5 pods/s instead of 10: the steady phase's creates last 6 s, so the kill lands among them.
    args = [SUITE, "--cp-profile", "smoke", "--cp-run-id", run_id, "--cp-set=burst_steady_rate=5",
            f"--junitxml={junit}"]
    try:
        with background_pytest(args, tmp_path) as proc:
            api = {}

            def steady_pods() -> int:
                ended_early(proc)
                if "api" not in api:
                    if not kc.kubeconfig.exists() or "kube-apiserver" not in kc.pids():
                        return 0
                    api["api"] = load_client(kc.kubeconfig)
                try:
                    return len(list_raw(api["api"], "/api/v1/pods", {
                        "labelSelector": f"{RUN_LABEL}={run_id},{PHASE_LABEL}=steady"}, retry_s=0)["items"])
                except Exception:   # the cluster is still coming up
                    return 0
            wait_for(steady_pods, until=lambda n: n >= 3, timeout=420, interval=0.2,
                     what=f"the steady phase of run {run_id} under way")
            pid = kc.pids()["kube-apiserver"]
            os.kill(pid, signal.SIGKILL)
            killed_at = time.time()
            out, _ = proc.communicate(timeout=900)
    finally:
        kc.delete()   # normally gone already (the run deletes its cluster); never left behind
    assert proc.returncode in (0, 1), out[-3000:]
    assert "Traceback" not in out and "INTERNALERROR" not in out, out[-3000:]
    failures = _failures(junit)
    named = []
    for test, messages in failures.items():
        for msg in messages:
            assert "\n" not in msg, f"{test}: not one line:\n{msg[:2000]}"
            restart = "the API server restarted" in msg or "the pod watch was cut" in msg
            guard = "this module broke the control plane" in msg and "kube-apiserver exited at" in msg
            assert (msg.removeprefix("Failed: ").startswith("clusterproof: ") and restart) or guard, \
                f"{test}: a verdict, not the restart:\n{msg[:2000]}"
            named.append(msg)
    # The guard names the restart whatever happened to the checks (the kill was inside the module).
    assert any("kube-apiserver exited at" in m for m in named), f"killed pid {pid} at {killed_at:.0f}:\n{out[-3000:]}"
    for name, cats in _report_categories(tmp_path / "allure").items():
        assert len(cats) == 1 and not CLUSTER_VERDICTS & set(cats), f"{name}: reported as {cats}"
