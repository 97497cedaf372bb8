"""clusterproof: options, profile, run id, and the session-wide fixtures.

Why here: pytest loads the root conftest for every suite and self-test, so
the one option group, the profile and the cluster facade are the same
everywhere. User mistakes (bad profile, bad kubeconfig, unreachable server)
are checked in ``pytest_configure`` and end the run with one line, exit 4,
before any test; a cluster that cannot be started ends it the same way.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys

import pytest
from kubernetes import client

from fixtures import cluster as backends
from fixtures.errors import HarnessError
from fixtures.kube import check_reachable, is_simulated, load_client
from fixtures.profile import load_profile
from fixtures.run import metadata, new_run_id
from fixtures.stash import CLUSTER, PROFILE, REAL_HARDWARE, RUN_ID

pytest_plugins = ["reports.plugin"]



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
    g.addoption("--keep-cluster", action="store_true",
                help="do not delete the embedded cluster at the end (its kubeconfig is printed)")
    # Internal: self-tests pass their own run id to the suites they drive.
    g.addoption("--run-id", default=None, help=argparse.SUPPRESS)


def _interrupt(signum, _frame):
    # SIGTERM/SIGHUP (CI timeout, closed terminal) take the same path as
    # Ctrl-C, so fixtures tear down and nothing is left behind.
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    # A run started in the background by a non-interactive shell inherits
    # SIGINT ignored; an interrupt must still tear down what the run created.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        config.stash[PROFILE] = load_profile(config.option.profile, config.option.cp_set)
    except HarnessError as e:
        raise pytest.UsageError(f"clusterproof: {e}") from None
    run_id = config.option.run_id or new_run_id()
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?", run_id):
        raise pytest.UsageError(f"clusterproof: --run-id {run_id!r} must be a short DNS label")
    config.stash[RUN_ID] = run_id
    kubeconfig = config.option.kubeconfig
    if kubeconfig is None and config.option.context:
        kubeconfig = os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]
        config.option.kubeconfig = kubeconfig
    config.stash[REAL_HARDWARE] = False
    if kubeconfig is not None and not config.option.collectonly:
        try:
            api = load_client(kubeconfig, config.option.context)
            check_reachable(api)
            config.stash[REAL_HARDWARE] = not is_simulated(api)
        except HarnessError as e:
            raise pytest.UsageError(f"clusterproof: {e}") from None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On real hardware, checks marked ``destructive`` run only with --allow-destructive.

    Decided at collection, before any fixture: the burst suite's load starts
    in a module fixture, so a per-test skip would come too late.
    """
    if not config.stash.get(REAL_HARDWARE, False) or config.option.allow_destructive:
        return
    skip = pytest.mark.skip(reason="changes shared state on a real cluster (API load, thousands of "
                                   "pods, whole GPU nodes, or tainting/creating nodes): pass "
                                   "--allow-destructive to run it")
    for item in items:
        if item.get_closest_marker("destructive"):
            item.add_marker(skip)


def progress(config: pytest.Config):
    """A line-writer that shows through pytest's capture (bring-up takes minutes)."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    cap = config.pluginmanager.get_plugin("capturemanager")

    def write(msg: str) -> None:
        if tr is None or cap is None:
            print(f"[clusterproof] {msg}", file=sys.stderr, flush=True)
            return
        with cap.global_and_fixture_disabled():
            tr.write_line(f"[clusterproof] {msg}")
    return write


@pytest.fixture(scope="session")
def profile(pytestconfig):
    return pytestconfig.stash[PROFILE]


@pytest.fixture(scope="session")
def run_id(pytestconfig):
    return pytestconfig.stash[RUN_ID]


@pytest.fixture(scope="session")
def cluster(pytestconfig, profile, run_id):
    """The cluster under test, whatever the backend; torn down even after Ctrl-C."""
    opt = pytestconfig.option
    say = progress(pytestconfig)
    try:
        if opt.kubeconfig:
            c = backends.connect_existing(profile, run_id, opt.kubeconfig, opt.context, say,
                                          simulated=not pytestconfig.stash[REAL_HARDWARE])
        else:
            c = backends.start_embedded(profile, run_id, say, keep=opt.keep_cluster)
    except HarnessError as e:
        pytest.exit(f"clusterproof: {e}", returncode=4)
    pytestconfig.stash[CLUSTER] = c
    try:
        yield c
    finally:
        backends.stop(c, opt.keep_cluster, say)


def _namespace_name(run_id: str, test_name: str) -> str:
    slug = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")
    return f"cp-{run_id[-4:]}-{slug}"[:55].rstrip("-") + "-" + os.urandom(2).hex()


@pytest.fixture
def namespace(request, cluster: backends.Cluster, run_id):
    """A fresh namespace per test, labelled with the run id, deleted afterwards."""
    name = _namespace_name(run_id, request.node.name)
    cluster.core.create_namespace({"metadata": metadata(name, run_id)})
    yield name
    try:
        cluster.core.delete_namespace(name, propagation_policy="Background")
    except client.ApiException as e:
        if e.status != 404:
            raise
