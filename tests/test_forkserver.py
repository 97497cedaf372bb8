"""A child run forked from tests/forkserver.py is the run a new interpreter would have been: the same exit code,
output, assertion messages, environment, working directory, timeout and signals; and the server imports
nothing pytest rewrites."""
from __future__ import annotations

import importlib.metadata
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests import forkserver
from tests.harness import ROOT

pytestmark = pytest.mark.control   # child pytest runs (the venv alone, no cluster)

CHECKS = """import os, sys, signal, time


def test_passes():
    print("to stdout", os.environ["CP_FORK_PROBE"], os.getcwd())
    print("to stderr", file=sys.stderr)


def test_fails_with_introspection():
    assert [1, 2, os.environ["CP_FORK_PROBE"]] == [1, 3, "x"]


def test_sleeps():
    if os.environ.get("CP_FORK_SLEEP"):
        with open(os.environ["CP_FORK_SLEEP"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)


def test_is_killed():
    if os.environ.get("CP_FORK_KILL"):
        os.kill(os.getpid(), signal.SIGKILL)
"""


def _probe(tmp_path, *args) -> list[str]:
    """The arguments of a run of CHECKS, written into ``tmp_path``, outside the checkout."""
    (tmp_path / "test_probe.py").write_text(CHECKS)
    return ["-q", "-p", "no:randomly", "-p", "no:cacheprovider", "-o", "addopts=", str(tmp_path / "test_probe.py"),
            *args]


def _both(tmp_path, *args, **env):
    argv = _probe(tmp_path, *args)
    child_env = {**os.environ, "CP_FORK_PROBE": "probe-value", **env}
    spawned = subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=tmp_path, env=child_env,
                             capture_output=True, text=True, timeout=120)
    forked = forkserver.run(argv, tmp_path, child_env, 120)
    return spawned, forked


def _steady(text: str) -> str:
    """Without what differs between any two runs: run ids and times."""
    return re.sub(r"\d{8}-\d{6}-[0-9a-f]{4}", "RUN", re.sub(r"\d+\.\d+ ?s\b", "N s", text))


def test_a_forked_run_is_the_run_a_new_interpreter_gives(tmp_path):
    spawned, forked = _both(tmp_path, "-k", "passes or introspection", "-s")
    assert spawned.returncode == forked.returncode == 1, (spawned, forked)
    assert _steady(forked.stdout) == _steady(spawned.stdout), (spawned.stdout, forked.stdout)
    assert forked.stderr == spawned.stderr, (spawned.stderr, forked.stderr)
    # the environment and directory are the run's, and its asserts are rewritten (pytest's introspection)
    assert f"to stdout probe-value {tmp_path}" in forked.stdout, forked.stdout
    assert "At index 1 diff: 2 != 3" in forked.stdout, forked.stdout
    # a plain pytest outside the checkout (as a team runs the installed plugin) rewrites every module of the plugin
    assert "cannot be rewritten" not in spawned.stdout, spawned.stdout[-3000:]


def _alive(pid_file) -> bool:
    """Whether the sleeping probe whose pid is in ``pid_file`` still runs (a forked run's /proc environ is the
    server's, so the run is found by the pid it wrote)."""
    pid = pid_file.read_text()
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_a_forked_run_past_its_timeout_is_killed_and_raises_as_subprocess_does(tmp_path):
    pid_file = tmp_path / "sleeper.pid"
    t0 = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        forkserver.run(_probe(tmp_path, "-k", "sleeps"), tmp_path, {**os.environ, "CP_FORK_SLEEP": str(pid_file)}, 10)
    assert time.monotonic() - t0 < 60
    assert pid_file.exists(), "the probe never started sleeping: the timeout proved nothing"
    time.sleep(0.5)
    assert not _alive(pid_file), "the timed-out run is still there"


def test_an_interrupted_wait_kills_the_forked_run_as_subprocess_run_does(tmp_path):
    """Ctrl-C (or any error) in the test that waits for its run: the run is killed, not left working against a
    cluster the session then tears down (found by interrupting a control module)."""
    pid_file = tmp_path / "sleeper.pid"

    def interrupt_once_asleep():
        while not pid_file.exists():
            time.sleep(0.1)
        signal.raise_signal(signal.SIGINT)      # KeyboardInterrupt in the main thread, which waits in run()
    threading.Thread(target=interrupt_once_asleep, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        forkserver.run(_probe(tmp_path, "-k", "sleeps"), tmp_path, {**os.environ, "CP_FORK_SLEEP": str(pid_file)}, 120)
    time.sleep(0.5)
    assert not _alive(pid_file), "the interrupted run is still there"


def test_a_run_a_signal_ends_has_minus_the_signal_as_its_code(tmp_path):
    spawned, forked = _both(tmp_path, "-k", "killed", CP_FORK_KILL="1")
    assert spawned.returncode == forked.returncode == -signal.SIGKILL, (spawned, forked)


def rewritten_by_pytest(names) -> list[str]:
    """The names among ``names`` that pytest rewrites on import: first-party code and the pytest plugins'
    distributions (pytest marks every module of a plugin's distribution)."""
    plugin_tops = set()
    for ep in importlib.metadata.entry_points(group="pytest11"):
        for f in ep.dist.files or ():
            parts = f.parts
            if parts and not parts[0].endswith((".dist-info", ".pth")) and parts[0] != "..":
                plugin_tops.add(parts[0].removesuffix(".py"))
    ours = {"clusterproof", "suites", "fixtures", "load", "tests", "conftest"}
    return [n for n in names if n.split(".")[0] in plugin_tops | ours or n.startswith("__editable__")]


def test_the_server_imports_nothing_pytest_rewrites():
    assert not rewritten_by_pytest(forkserver.PRELOAD), rewritten_by_pytest(forkserver.PRELOAD)
    # negative control: a plugin and first-party code are named
    assert rewritten_by_pytest(["allure_pytest.plugin", "pytest_timeout", "clusterproof.kube", "yaml"]) == \
        ["allure_pytest.plugin", "pytest_timeout", "clusterproof.kube"]


def test_collecting_every_suite_forked_warns_of_no_module_it_could_not_rewrite(tmp_path):
    run = forkserver.run(["--co", "-q", "-p", "no:randomly", "suites", "--cp-profile", "smoke",
                          f"--cp-output-dir={tmp_path}"], ROOT, dict(os.environ), 300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "cannot be rewritten" not in run.stdout + run.stderr, run.stdout[-3000:] + run.stderr[-3000:]


def test_a_run_whose_python_settings_differ_is_spawned_not_forked(monkeypatch):
    monkeypatch.delenv(forkserver.ENV, raising=False)
    assert forkserver.wanted(dict(os.environ))
    assert not forkserver.wanted({**os.environ, "PYTHONPATH": "/elsewhere"})
    assert forkserver.wanted({**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    monkeypatch.setenv(forkserver.ENV, "0")
    assert not forkserver.wanted(dict(os.environ))
