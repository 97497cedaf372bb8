"""Child pytest runs forked from a process that has already imported what every run imports.

Why: the self-tests start some hundreds of child runs (``tests.harness.run_pytest``), and each new
interpreter spends about 1.2 CPU-s importing kubernetes, pydantic, yaml, requests and pytest before it
collects a test (``python -m pytest --co -q suites/test_cluster_scale.py``, five runs beside a self-test
run: 1.18 CPU-s each spawned, 0.63 forked from here; 5.8 s against 1.9 s of wall clock). On two cores
that are busy through the self-tests, those seconds are the gate's.

What a forked run shares with the server is only what the server imported (``PRELOAD``): third-party
libraries and pytest's own modules. Never clusterproof, the suites, a conftest or a pytest plugin: pytest
rewrites their asserts as it imports them, and a module imported before it cannot be rewritten
(tests/test_forkserver.py holds the list to that). Everything else is the run's own: its argv, working
directory, environment, standard streams, exit code, and its pid, which signals reach as before.
``random`` is reseeded in every child by CPython's own fork hook.

Protocol: the client connects to the server's UNIX socket and sends one JSON line (argv, cwd, env, the
files for stdout and stderr, and a status file); the server forks and answers the child's pid. When the
child ends, the server writes its exit code (negative: the signal that killed it) into the status file
*before* reaping it, so a pid without a status is still the child's and may be killed (a timeout).

``CLUSTERPROOF_TEST_FORKSERVER=0`` spawns every run as a new interpreter instead (``tests/cpu_per_test.py``
counts a run's CPU among the worker's reaped children, which a forked run is not).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ENV = "CLUSTERPROOF_TEST_FORKSERVER"
# Imported once by the server. Only modules pytest never rewrites: no first-party code, no pytest plugin.
PRELOAD = ("kubernetes", "kubernetes.client", "kubernetes.config", "kubernetes.watch", "yaml", "pydantic",
           "requests", "requests_oauthlib", "urllib3", "dateutil.parser", "psutil", "prometheus_client",
           "prometheus_api_client", "websocket", "allure", "allure_commons", "pygments", "pytest",
           "_pytest.assertion.rewrite", "_pytest.pytester", "_pytest.junitxml", "aiohttp", "matplotlib",
           "matplotlib.pyplot", "asyncio", "multiprocessing", "xml.etree.ElementTree", "unittest", "pdb",
           "doctest")
STARTUP_TIMEOUT_S = 120.0


# --- the server ----------------------------------------------------------------------------------

def _preload() -> None:
    import importlib

    import matplotlib
    matplotlib.use("Agg")   # as clusterproof.report.plots does before it imports pyplot
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:     # not installed here: the runs import it themselves, if they need it
            pass


def _child(req: dict) -> None:
    """In the forked child: become ``python -m pytest ARGV`` in the request's directory and environment."""
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.dont_write_bytecode = bool(req["env"].get("PYTHONDONTWRITEBYTECODE"))
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    err = os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for fd, target in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, target)
        os.close(fd)
    sys.path[0] = os.getcwd()           # what ``python -m`` puts first
    sys.argv = ["pytest", *req["argv"]]
    import runpy
    runpy.run_module("pytest", run_name="__main__", alter_sys=True)   # raises SystemExit with pytest's code


def _write_status(path: str, code: int) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        f.write(str(code))
    os.replace(tmp, path)


def _reap(pending: dict[int, str]) -> None:
    """Write the status of every child that has ended, then reap it (see the module doc for the order)."""
    while pending:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return
        if info is None:
            return
        code = info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        path = pending.pop(info.si_pid, None)
        if path is not None:
            _write_status(path, code)
        os.waitpid(info.si_pid, 0)


def serve(path: str) -> None:
    """Serve on UNIX socket ``path`` until the process that started the server is gone."""
    parent = os.getppid()
    _preload()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path + ".new")
    sock.listen(16)
    os.rename(path + ".new", path)     # the client waits for this name: the server is ready
    me, pending = os.getpid(), {}
    try:
        while os.getppid() == parent:
            ready, _, _ = select.select([sock], [], [], 0.1)
            if ready:
                conn, _ = sock.accept()
                with conn, conn.makefile("rb") as f:
                    req = json.loads(f.readline())
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        sock.close()
                        conn.close()
                        _child(req)
                        raise SystemExit(0)     # not reached: pytest's own SystemExit ends the child
                    pending[pid] = req["status"]
                    conn.sendall(f"{pid}\n".encode())
            _reap(pending)
    finally:
        if os.getpid() == me:
            sock.close()


# --- the client ----------------------------------------------------------------------------------

class _Server:
    """The server of this process, started on first use; stopped when this process exits."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="cp-forkserver-"))
        self.socket = self.dir / "s"
        root = Path(__file__).resolve().parent.parent
        with open(self.dir / "server.log", "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkserver", str(self.socket)], cwd=root,
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not self.socket.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the fork server did not start: {(self.dir / 'server.log').read_text()[-2000:]}")
            time.sleep(0.05)
        atexit.register(self.stop)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def start(self, req: dict) -> int:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(self.socket))
            s.sendall(json.dumps(req).encode() + b"\n")
            with s.makefile("rb") as f:
                line = f.readline()
        if not line.strip():
            raise RuntimeError("the fork server did not start the run")
        return int(line)


_server: _Server | None = None
_lock = threading.Lock()


def _get_server() -> _Server:
    global _server
    with _lock:
        if _server is None or not _server.alive():
            _server = _Server()
        return _server


def wanted(env: dict[str, str]) -> bool:
    """Fork the run, unless switched off or its environment changes what an interpreter reads at its start."""
    if os.environ.get(ENV, "1") == "0":
        return False
    return all(env.get(k) == os.environ.get(k) for k in set(env) | set(os.environ)
               if k.startswith("PYTHON") and k != "PYTHONDONTWRITEBYTECODE")


def run(argv: list[str], cwd: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, "-m", "pytest", *argv], cwd=cwd, env=env, capture_output=True,
    text=True, timeout=timeout)``, forked from the server: the same result, the same TimeoutExpired (the run
    killed first)."""
    work = Path(tempfile.mkdtemp(prefix="cp-forked-"))
    try:
        files = {k: str(work / k) for k in ("stdout", "stderr", "status")}
        server = _get_server()
        pid = server.start({"argv": [str(a) for a in argv], "cwd": str(cwd), "env": env, **files})
        status = Path(files["status"])
        deadline, pause, killed = time.monotonic() + timeout, 0.02, False
        try:
            while not status.exists():
                if not killed and time.monotonic() > deadline:
                    os.kill(pid, signal.SIGKILL)    # no status yet: the pid is still the run's (module doc)
                    killed = True
                if not server.alive() and not status.exists() and not Path(f"/proc/{pid}").exists():
                    raise RuntimeError(f"the fork server ended before run {pid} did: its exit code is lost "
                                       f"({server.dir / 'server.log'})")
                time.sleep(pause)
                pause = min(pause * 1.5, 0.2)
        except BaseException:
            # as subprocess.run does: an interrupt (or any error) of this wait kills the run, never leaves it
            if not status.exists():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            raise
        code = int(status.read_text())
        out, err = (Path(files[k]).read_text(errors="replace") for k in ("stdout", "stderr"))
        cmd = [sys.executable, "-m", "pytest", *argv]
        if killed:
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(cmd, code, out, err)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    serve(sys.argv[1])
