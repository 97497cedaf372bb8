"""The session: profile, run id, the cluster, a namespace per test, and interrupts.

Why here (a pytest plugin listed by conftest): every suite and self-test
gets the same profile, run id and cluster facade. User mistakes (bad
profile, bad kubeconfig, unreachable server, missing permissions) are found
in ``pytest_configure`` and end the run with one line, exit 4, before any
test; a cluster that cannot be started ends it the same way.

Interrupts: SIGINT, SIGTERM (CI timeouts) and SIGHUP all raise
KeyboardInterrupt once, so fixtures tear down; a further signal while that
teardown runs is reported and ignored -- an impatient second Ctrl-C must not
leave a half-deleted cluster behind (kill -9 still ends the run; the next
run sweeps what it left).

Liveness (``LivenessGuard``, at the end): a run that loses its Lease
(``clusterproof.kube.liveness``) stops at once -- the check under way fails with the
one line, nothing else runs, everything is torn down, exit 7.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

from pathlib import Path

import allure
import pytest
from kubernetes import client

from clusterproof.kube import access
from clusterproof.cluster import backends
from clusterproof.core.errors import HarnessError
from clusterproof.config.keys import parse_team_namespaces
from clusterproof.kube.apicalls import Recorder, refused_by_rbac
from clusterproof.kube.client import api_message, check_reachable, is_simulated, load_client, server_url
from clusterproof.kube.liveness import LIVENESS_EXIT
from clusterproof.config.profile import flatten_groups, load_profile
from clusterproof.core.run import RUN_ID, new_run_id
from clusterproof.fixtures import BRINGUP_S, CALLS, CLUSTER, MANIFEST, PROFILE, REAL_HARDWARE, RUN_ID as RUN_ID_KEY

_interrupted = False


def _interrupt(signum, _frame):
    global _interrupted
    if _interrupted:
        print(f"\n[clusterproof] signal {signum} ignored: still removing what this run created "
              "(kill -9 abandons that; the next run sweeps it)", file=sys.stderr, flush=True)
        return
    _interrupted = True
    raise KeyboardInterrupt(f"signal {signum}")


def tearing_down() -> None:
    """From here on, interrupts no longer raise (the run is removing what it created)."""
    global _interrupted
    _interrupted = True


def pytest_configure(config: pytest.Config) -> None:
    # A run started in the background by a non-interactive shell inherits
    # SIGINT ignored; an interrupt must still tear down what the run created.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    install_liveness_guard(config)
    try:
        team_keys = flatten_groups(config.hook.pytest_clusterproof_profile_keys(config=config))
        config.stash[PROFILE] = load_profile(config.option.profile, config.option.cp_set, team_keys)
    except HarnessError as e:
        raise pytest.UsageError(f"clusterproof: {e}") from None
    run_id = config.option.run_id or new_run_id()
    if not RUN_ID.fullmatch(run_id):
        raise pytest.UsageError(f"clusterproof: --run-id {run_id!r} must be a short DNS label")
    config.stash[RUN_ID_KEY] = run_id
    kubeconfig = config.option.kubeconfig
    if kubeconfig is None and config.option.context:
        kubeconfig = os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]
        config.option.kubeconfig = kubeconfig
    config.stash[REAL_HARDWARE] = False
    if config.option.as_real_cluster and kubeconfig is None:
        raise pytest.UsageError("clusterproof: --as-real-cluster needs --kubeconfig (the embedded cluster is "
                                "the harness's own)")
    config.stash[CALLS] = Recorder()
    if kubeconfig is not None and not config.option.collectonly:
        try:
            api = load_client(kubeconfig, config.option.context)
            config.stash[CALLS].install(api)    # the permission preflight's requests are the run's too
            check_reachable(api)
            profile = config.stash[PROFILE]
            team_namespaces = tuple(parse_team_namespaces(profile.team_namespaces).values())
            config.stash[MANIFEST] = access.check(
                api, destructive=config.option.allow_destructive or config.option.sweep_leftovers,
                team_namespaces=team_namespaces)
            config.stash[REAL_HARDWARE] = config.option.as_real_cluster or not is_simulated(api)
            if config.stash[REAL_HARDWARE] and profile.team_admission in ("harness", "wildcard"):
                raise HarnessError(f"team_admission={profile.team_admission} installs admission policies, which act "
                                   "on every matching pod of the cluster: a guest never does that on a cluster it "
                                   "does not own; test the cluster's own admission (team_admission: cluster)")
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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A HarnessError raised inside a check or its fixtures is one line ("clusterproof: ..."), not a
    traceback: its message is the whole story (what went wrong, how to fix it), and the report files it
    under "Harness or environment error"."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed:
        return
    if call.excinfo.errisinstance(HarnessError):
        report.longrepr = f"clusterproof: {call.excinfo.value}"
    elif call.excinfo.errisinstance(client.ApiException) and refused_by_rbac(call.excinfo.value):
        # Not a cluster verdict: the harness's identity lacks a permission this check needs, which the
        # permission preflight should have named (clusterproof/kube/rbac.yaml is missing a rule).
        report.longrepr = (f"clusterproof: the API server refused the harness: {api_message(call.excinfo.value)} "
                           "(a permission this check needs that clusterproof/kube/rbac.yaml does not grant)")


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
def say(pytestconfig):
    return progress(pytestconfig)


@pytest.fixture(scope="session")
def profile(pytestconfig):
    return pytestconfig.stash[PROFILE]


@pytest.fixture(scope="session")
def run_id(pytestconfig):
    return pytestconfig.stash[RUN_ID_KEY]


@pytest.fixture(scope="session")
def cluster(pytestconfig, profile, run_id, say):
    """The cluster under test, whatever the backend; torn down even after Ctrl-C."""
    opt = pytestconfig.option
    t0 = time.monotonic()
    try:
        if opt.kubeconfig:
            c = backends.connect_existing(profile, run_id, opt.kubeconfig, opt.context, say,
                                          simulated=not pytestconfig.stash[REAL_HARDWARE],
                                          manifest=pytestconfig.stash[MANIFEST], calls=pytestconfig.stash[CALLS],
                                          sweep_leftovers=opt.sweep_leftovers,
                                          on_lease_lost=liveness_guard(pytestconfig).lost)
        else:
            c = backends.start_embedded(profile, run_id, say, keep=opt.keep_cluster,
                                        coscheduling_components=_schedules_gangs(pytestconfig),
                                        on_lease_lost=liveness_guard(pytestconfig).lost)
    except HarnessError as e:
        pytest.exit(f"clusterproof: {e}", returncode=4)
    pytestconfig.stash[CLUSTER] = c
    if c.kwok is not None:
        pytestconfig.stash[BRINGUP_S] = time.monotonic() - t0
    allure.attach("\n".join(c.sweep.lines()), "leftovers of earlier runs (sweep)", allure.attachment_type.TEXT)
    try:
        yield c
    finally:
        tearing_down()
        try:
            backends.stop(c, opt.keep_cluster, say)
        finally:
            report_calls(c, opt.api_calls, say)


def report_calls(c: backends.Cluster, path: str | None, say) -> None:
    """What the harness's identity asked of the API server in this run: said in one line, attached to the
    report (with the rule of the manifest that allowed each call, on a cluster it does not own), and
    written to ``--api-calls FILE``."""
    rows, refused = c.calls.dump(), c.calls.refused()
    if path:
        Path(path).write_text(json.dumps({"server": server_url(c.api), "calls": rows}, indent=1))
    lines = []
    for call in sorted({call for call, _ in c.calls.calls}):
        rule = c.manifest.allows(call) if c.manifest else None
        lines.append(f"{call.describe()}" + (f"  <- {rule.describe()}" if rule else
                                             ("  <- NOT IN THE MANIFEST" if c.manifest else "")))
    allure.attach("\n".join(lines), "API calls of the harness's identity (verb, resource, scope)",
                  allure.attachment_type.TEXT)
    say(f"API calls of the harness's identity: {len(rows)} distinct, "
        f"{sum(refused.values())} answered 403 Forbidden" + (f" ({', '.join(c.describe() for c in list(refused)[:3])})"
                                                            if refused else ""))


def _schedules_gangs(config) -> bool:
    """Does any collected check need the Coscheduling scheduler (gang backends) or its CRD (marker)?"""
    session = getattr(config, "_clusterproof_session", None)
    items = session.items if session is not None else []
    return any({"backend", "backends", "dedicated"} & set(getattr(i, "fixturenames", ()))
               or i.get_closest_marker("coscheduling") for i in items)


def pytest_collection_finish(session: pytest.Session) -> None:
    session.config._clusterproof_session = session


@pytest.fixture
def namespace(request, cluster: backends.Cluster):
    """A fresh namespace per test (created, or claimed from the pool), emptied and given back afterwards.

    Its pods are deleted first and waited for: a namespace deleted with
    thousands of pods in it keeps the control plane busy in the background
    while the next suite runs -- its time, and its load, belong to this test.
    """
    name = cluster.namespaces.take(request.node.name)
    yield name
    cluster.namespaces.give_back(name, timeout=600)


# --- liveness: a run that lost its Lease stops at once --------------------------------------------

# The signal that carries a loss from the Lease's threads to the main thread. pthread_kill makes
# a blocking call there (a socket read, a sleep, a lock) return at once; _thread.interrupt_main
# would wait for it to return by itself. SIGUSR1 from anyone else, without a loss, is ignored.
LIVENESS_SIGNAL = signal.SIGUSR1
GUARD = "clusterproof-liveness"


class LivenessLost(BaseException):
    """The run's Lease is lost; its message is the one line.

    A BaseException, like KeyboardInterrupt: a check's ``except Exception`` must not swallow it.
    pytest still reports it as the failure of the check under way (it lets only Exit and
    KeyboardInterrupt through), and allure-pytest files it as broken, i.e. under "Harness or
    environment error", as the ``clusterproof: `` prefix does for junit and the summary.
    """


class LivenessGuard:
    """Stops the run when the Lease is lost (``RunLease.on_lost`` is ``lost``).

    - during a check's set-up or call: the signal raises ``LivenessLost`` there, so that check
      fails with the line (no traceback), at once, also from inside a blocking call;
    - before every check: ``RunLease.check`` reads the Lease on the server's clock, so a run
      resumed after SIGSTOP past its duration starts no further check (that check fails with
      the line before its fixtures run); and again when a check's call ends, so no check passes
      if the run lost its Lease while it ran;
    - after the check: ``session.shouldfail`` ends the loop; its teardown and every remaining
      fixture's still run (pytest tears down at session end); exit ``LIVENESS_EXIT``, the line
      printed once, by pytest's stop banner.
    Teardowns are never interrupted: outside set-up and call the signal only records the loss.
    """

    def __init__(self, config: pytest.Config):
        self.config = config
        self.line: str | None = None
        self.armed = False
        self._main = threading.main_thread().ident
        self._said = 0

    def lost(self, line: str) -> None:
        if self.line is None:
            self.line = line
        if threading.get_ident() != self._main:
            signal.pthread_kill(self._main, LIVENESS_SIGNAL)

    def _on_signal(self, _signum, _frame) -> None:
        if self.line is not None and self.armed:
            self.armed = False     # once: the teardown that follows must run undisturbed
            raise LivenessLost(self.line)

    def _lease(self):
        c = self.config.stash.get(CLUSTER, None)
        return c.lease if c is not None else None

    def _say_notes(self) -> None:
        """What happened to the Lease short of a loss (a recreation, failures that recovered)."""
        lease = self._lease()
        if lease is None:
            return
        for note in lease.notes[self._said:]:
            progress(self.config)(f"liveness: {note}")
        self._said = len(lease.notes)

    def _judge(self) -> None:
        """Read the Lease (server's clock); raise the line if liveness is lost."""
        lease = self._lease()
        if self.line is None and lease is not None:
            lease.check()
        if self.line is not None:
            raise LivenessLost(self.line)

    @contextlib.contextmanager
    def _armed(self):
        """While a check's set-up or call runs, a loss interrupts it (the signal raises there)."""
        self.armed = True
        try:
            yield
        finally:
            self.armed = False

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item):
        self._say_notes()
        self._judge()
        with self._armed():
            return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_call(self, item):
        if self.line is not None:
            raise LivenessLost(self.line)
        try:
            with self._armed():
                return (yield)
        finally:
            # A verdict counts only if the run was still alive when the check ended: a check that
            # ran on while the process was stopped past its Lease fails with the line, pass or fail.
            self._judge()

    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_makereport(self, item, call):
        # trylast: the innermost wrapper, so the report plugins (allure-pytest) read the line.
        rep = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, LivenessLost):
            rep.longrepr = str(call.excinfo.value)
        return rep

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_protocol(self, item, nextitem):
        try:
            return (yield)
        finally:
            if self.line is not None:
                item.session.shouldfail = self.line

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # trylast: after pytest's own teardown of the session's fixtures (a loss may come then too).
        self._say_notes()
        if self.line is None:
            return
        if not session.shouldfail:
            session.shouldfail = self.line   # pytest's stop banner prints it
        session.exitstatus = LIVENESS_EXIT


def install_liveness_guard(config: pytest.Config) -> None:
    if config.pluginmanager.get_plugin(GUARD) is None:
        guard = LivenessGuard(config)
        signal.signal(LIVENESS_SIGNAL, guard._on_signal)
        config.pluginmanager.register(guard, GUARD)


def liveness_guard(config: pytest.Config) -> LivenessGuard:
    return config.pluginmanager.get_plugin(GUARD)
