"""The self-tests' own session cluster has no real node (profile key real_nodes).

Why: many self-tests point a pytest run at the session cluster with
``--kubeconfig``; a cluster with a node that is not a kwok node is real
hardware to the harness (``clusterproof.kube.client.is_simulated``: a forgeable label
must never make a real cluster look simulated), so those runs would take the
real-cluster path. The real-node self-tests start clusters of their own
(tests/test_real_node_controls.py); ``pytest suites`` (the second half of
``make test``) runs the real-node checks on the smoke profile's real node.
An explicit ``--set real_nodes=N`` still wins (it comes later).
"""
from __future__ import annotations

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    sets = getattr(config.option, "cp_set", None)
    if sets is not None:
        config.option.cp_set = ["real_nodes=0", *sets]
