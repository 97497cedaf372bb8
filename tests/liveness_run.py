"""A fake run for tests/test_liveness.py: two checks, driven through files.

Not collected on its own (no ``test_`` prefix); the self-test runs it as a user runs a suite:
``pytest tests/liveness_run.py --cp-kubeconfig ... --cp-run-id ...``. ``CP_LIVENESS_DIR`` names a
directory where each check writes ``<check>.started`` when its body begins, and where the
self-test writes ``release`` to let the first check end. The first check holds objects of the
run (its namespace, a ConfigMap) while it waits, so the self-test can see them removed.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import raw_request

DIR = Path(os.environ.get("CP_LIVENESS_DIR", "."))


@pytest.mark.cluster
def test_a_check_that_waits_for_the_self_test(cluster, namespace):
    (DIR / "waits.started").touch()
    raw_request(cluster.api, "POST", f"/api/v1/namespaces/{namespace}/configmaps",
                body={"metadata": {"name": "held"}, "data": {"held": "while the check waits"}}).data
    wait_for(lambda: (DIR / "release").exists(), timeout=120, interval=0.2,
             what=f"the self-test released this check ({DIR / 'release'})")


@pytest.mark.cluster
def test_a_later_check(cluster, namespace):
    (DIR / "later.started").touch()
