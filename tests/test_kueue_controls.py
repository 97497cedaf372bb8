"""Negative controls for suites/test_kueue_admission.py.

The suite runs as a user would run it (a subprocess, ``--cp-kubeconfig`` on this session's embedded
cluster, which runs Kueue and JobSet), and once with its JobSets submitted past Kueue (no queue name:
straight to the JobSet controller): the all-or-nothing check must then fail, naming the partial start.
"""
from __future__ import annotations

import os

import pytest

from tests.harness import run_pytest

pytestmark = [pytest.mark.selftest, pytest.mark.kueue]
SUITE = "suites/test_kueue_admission.py"


def _run(cluster, profile, tmp_path, *sets, select="whole", timeout=600):
    run_id = f"kqctl-{os.urandom(2).hex()}"
    args = [SUITE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name,
            "--cp-run-id", run_id, "-k", select, *[f"--cp-set={s}" for s in sets]]
    return run_id, run_pytest(args, tmp_path, timeout=timeout)


def test_the_suite_passes_on_a_healthy_cluster(cluster, profile, tmp_path):
    _, run = _run(cluster, profile, tmp_path)
    assert run.returncode == 0 and not run.failures, run.output[-3000:]


def test_jobsets_submitted_past_kueue_start_partly_and_the_check_says_so(cluster, profile, tmp_path):
    _, run = _run(cluster, profile, tmp_path, "kueue_admission=false")
    assert run.returncode == 1, run.output[-3000:]
    msg = run.failures.get("test_a_jobset_is_admitted_whole_or_not_at_all_under_its_quota", "")
    assert f"JobSet waits ({profile.gang_nodes} pods against a quota of" in msg and "started partly" in msg, msg[:3000]
