"""clusterproof: the command-line options, and the plugins that hold everything else.

Why so little: pytest loads the root conftest for every suite and self-test,
so the one option group lives here; fixtures live next to the code they use
in ``fixtures/`` (each module there gives the fixtures of its domain) and
are listed below. No suite imports from this file.
"""
from __future__ import annotations

import argparse

import pytest

pytest_plugins = [
    "fixtures.session",       # profile, run id, cluster, namespace, interrupts
    "fixtures.health",        # the control plane kept up and checked around every module
    "fixtures.gang_backends", # gang backends and their dedicated nodes
    "fixtures.isolation",     # team admission, team namespaces
    "fixtures.burst",         # the measured burst
    "fixtures.preflight",     # GPU preflight: contract watch, reference agent, joining nodes, faults
    "fixtures.overload",      # API overload: the flood's flow and the measured flood
    "fixtures.joinstorm",     # API overload: the node-join storm
    "fixtures.watch_bandwidth",  # the watch-bandwidth measurement
    "fixtures.prometheus",    # the run's Prometheus: embedded (backfilled) or --prometheus-url
    "reports.plugin",         # Allure environment, tags, failure attachments
    "reports.timing",         # time per suite against the profile's budgets
    "reports.summary",        # reports/summary.json, the terminal summary, --baseline
]


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("clusterproof", "clusterproof: which cluster, which profile")
    g.addoption("--profile", default="smoke",
                help="profile name under profiles/ or a YAML path (default: smoke)")
    g.addoption("--set", action="append", default=[], dest="cp_set", metavar="KEY=VALUE",
                help="override one profile key, e.g. --set nodes=500 (repeatable)")
    g.addoption("--kubeconfig", default=None,
                help="test an existing cluster with this kubeconfig instead of the embedded one")
    g.addoption("--context", default=None, help="kubeconfig context (default: current)")
    g.addoption("--allow-destructive", action="store_true",
                help="on a real cluster, also run checks that change shared state (burst load on "
                     "the API server, very large gangs, tainting nodes); they are skipped there otherwise")
    g.addoption("--as-real-cluster", action="store_true",
                help="with --kubeconfig: treat the cluster as real hardware even if every node is a kwok "
                     "node (the self-tests run the real-cluster path of every suite this way)")
    g.addoption("--api-calls", default=None, metavar="FILE",
                help="write every distinct API request of the harness's identity (verb, group, resource, "
                     "namespace, status codes) to FILE as JSON, for a security review (always in the report)")
    g.addoption("--sweep-leftovers", action="store_true",
                help="on a real cluster, remove what earlier, dead runs of the harness left (by default "
                     "they are only listed); the embedded cluster is always swept")
    g.addoption("--local-gpus", action="store_true",
                help="also run the GPU preflight checker on this machine's GPUs (its own libnvidia-ml); "
                     "without it that check runs against the project's mock NVML library")
    g.addoption("--keep-cluster", action="store_true",
                help="do not delete the embedded cluster at the end (its kubeconfig is printed)")
    g.addoption("--prometheus-url", default=None,
                help="test this existing Prometheus (read-only; its heavy queries only with "
                     "--allow-destructive) instead of starting an embedded one")
    g.addoption("--prometheus-token-file", default=None, help="bearer token for --prometheus-url")
    g.addoption("--prometheus-ca-file", default=None, help="CA bundle for --prometheus-url (https)")
    # Internal: self-tests pass their own run id to the suites they drive.
    g.addoption("--run-id", default=None, help=argparse.SUPPRESS)
