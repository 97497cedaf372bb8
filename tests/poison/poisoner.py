"""A module that breaks the control plane (for tests/test_supervision.py; not collected by itself).

It kills kube-scheduler, as a scheduler that lost its leader lease exits.
"""
import os
import signal

import pytest


@pytest.mark.cluster
def test_kills_the_scheduler(cluster):
    os.kill(cluster.kwok.pids()["kube-scheduler"], signal.SIGKILL)
