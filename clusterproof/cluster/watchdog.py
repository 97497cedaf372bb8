"""A killed run's embedded cluster goes with it: one watchdog process per cluster, outside the run's tree.

Why: kwokctl starts the control plane (and a real node's root containerd and
kubelet) detached from the run, so a run killed with SIGKILL runs no teardown
and leaves etcd, kube-apiserver with ``--allow-privileged`` and the kubelet
running until a later run sweeps them -- maybe days. The watchdog is started
when the run claims the cluster's directory (``start``), in a session of its own
and double-forked: it is nobody's child the run waits for, and neither a kill of
the run's process group nor a Ctrl-C reaches it. It blocks on two file
descriptors, no polling loop and no timer:

- a pidfd of the run's process (opened while that process is provably its parent,
  so a recycled pid cannot stand in for it), readable when the run dies;
- an inotify watch on the cluster's directory, readable when the run's own
  teardown has removed it: the watchdog then just exits.

When the run dies and the directory is still there, it deletes the cluster the
way the next run's sweeper would (``python -m clusterproof.cluster.kwok --sweep
NAME``, in a child process: the heavy harness is imported only then): unless it
is kept on purpose (``--cp-keep-cluster``'s ``keep`` file), its run was recorded on
another host, or another live process has claimed it since. Each action is one
line in ``$CLUSTERPROOF_CACHE/logs/watchdog.log`` (the cluster's own directory
is what it removes).

This module imports nothing of the harness at module level, so the watchdog
process holds only the interpreter (idle cost: docs/simulation.md).
"""
from __future__ import annotations

import ctypes
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

RECORD = "clusterproof-watchdog.json"     # in the cluster's directory: the watchdog's pid and whom it watches
LOG = "watchdog.log"                      # in $CLUSTERPROOF_CACHE/logs
MODULE = "clusterproof.cluster.watchdog"
CLEAN_TIMEOUT_S = 600                     # a delete with real nodes takes seconds; kwokctl's own bound is 120 s
_IN_DELETE_SELF, _IN_MOVE_SELF = 0x400, 0x800


def _cluster_dir(cache: Path, name: str) -> Path:
    return cache / "kwok" / "clusters" / name     # clusterproof.cluster.kwok's layout (workdir() / clusters)


def start(directory: Path, cache: Path) -> int | None:
    """Start the watchdog of the cluster in ``directory`` (under ``cache``) for this process, which has just
    claimed it; keep one already watching for this process. Returns the watchdog's pid (None: it could not
    be started -- the sweeper of the next run is then the only clean-up, as before)."""
    rec = running(directory)
    if rec is not None and rec.get("owner") == os.getpid():
        return rec["pid"]
    from clusterproof import IMPORT_ROOT
    cmd = [sys.executable, "-m", MODULE, "--cache", str(cache), "--cluster", directory.name,
           "--owner", str(os.getpid())]
    # Its own session, no pipe of ours (a parent reading our output until EOF must not wait for it), and
    # a working directory outside the cluster's. The first process exits once the detached one is set up.
    proc = subprocess.run(cmd, cwd="/", stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, start_new_session=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(IMPORT_ROOT)})
    rec = running(directory)
    if proc.returncode != 0 or rec is None:
        _log(cache, directory.name, f"could not start a watchdog (exit {proc.returncode}): "
                                    f"{(proc.stderr.strip().splitlines() or ['no output'])[-1][:300]}")
        return None
    return rec["pid"]


def record(directory: Path) -> dict | None:
    try:
        return json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return None


def running(directory: Path) -> dict | None:
    """The watchdog record of ``directory`` if its process still runs and is that cluster's watchdog
    (its command line names this module and the cluster: a recycled pid is not)."""
    import psutil
    rec = record(directory)
    if not rec:
        return None
    try:
        p = psutil.Process(int(rec["pid"]))
        cmd = p.cmdline()
        if p.status() == psutil.STATUS_ZOMBIE or MODULE not in cmd or directory.name not in cmd:
            return None
    except (KeyError, ValueError, TypeError, psutil.Error):
        return None
    return rec


def stop(directory: Path, timeout: float = 10) -> int | None:
    """SIGKILL the watchdog of ``directory`` (self-tests: a watchdog killed with its run, so that the next
    run's sweeper is shown to be the clean-up of last resort). Returns its pid, None if none ran."""
    import psutil
    rec = running(directory)
    if rec is None:
        return None
    try:
        p = psutil.Process(rec["pid"])
        p.kill()
        p.wait(timeout=timeout)
    except psutil.NoSuchProcess:
        pass
    return rec["pid"]


def _log(cache: Path, cluster: str, line: str) -> None:
    """One line per action, appended (several watchdogs may write at once: one short write each)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        (cache / "logs").mkdir(parents=True, exist_ok=True)
        with open(cache / "logs" / LOG, "a") as f:
            f.write(f"{stamp} watchdog[{os.getpid()}] {cluster}: {line}\n")
    except OSError:
        pass


def _inotify(directory: Path) -> int | None:
    """An inotify descriptor readable when ``directory`` is removed; None where inotify is not available
    (then the watchdog looks every ``FALLBACK_S``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, str(directory).encode(), _IN_DELETE_SELF | _IN_MOVE_SELF) < 0:
        os.close(fd)
        return None
    return fd


FALLBACK_S = 30


def _wait(directory: Path, pidfd: int | None) -> bool:
    """Block until the run dies (True) or its directory is gone (False)."""
    if pidfd is None:
        return directory.is_dir()
    ino = _inotify(directory)
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    if ino is not None:
        poller.register(ino, select.POLLIN)
    while True:
        if not directory.is_dir():
            return False
        ready = {fd for fd, _ in poller.poll(None if ino is not None else FALLBACK_S * 1000)}
        if pidfd in ready:
            return directory.is_dir()
        if ino in ready:
            try:
                os.read(ino, 4096)
            except BlockingIOError:
                pass


def _clean(cache: Path, cluster: str) -> str:
    """The sweeper's rules and delete for this one cluster, in a child process (the harness's imports)."""
    from clusterproof import IMPORT_ROOT
    env = {**os.environ, "CLUSTERPROOF_CACHE": str(cache), "PYTHONPATH": str(IMPORT_ROOT)}
    try:
        proc = subprocess.run([sys.executable, "-m", "clusterproof.cluster.kwok", "--sweep", cluster], cwd="/",
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=CLEAN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"the sweep did not finish within {CLEAN_TIMEOUT_S} s"
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    said = lines[-1][:400] if lines else "no output"
    return said if proc.returncode == 0 else f"the sweep failed (exit {proc.returncode}): {said}"


def main(argv: list[str]) -> int:
    """``python -m clusterproof.cluster.watchdog --cache C --cluster NAME --owner PID``, started by ``start``
    from the run's process PID: detach, then watch (module doc)."""
    try:
        opts = dict(zip(argv[::2], argv[1::2], strict=True))
        cache, cluster, owner = Path(opts["--cache"]), opts["--cluster"], int(opts["--owner"])
    except (ValueError, KeyError):
        print(f"clusterproof: usage: python -m {MODULE} --cache DIR --cluster NAME --owner PID", file=sys.stderr)
        return 4   # clusterproof.core.exitcodes.USAGE (not imported: this process stays small)
    directory = _cluster_dir(cache, cluster)
    try:
        pidfd = os.pidfd_open(owner)
    except ProcessLookupError:
        pidfd = None
    except (OSError, AttributeError) as e:   # Linux before 5.3, Python before 3.9: the sweeper stays the clean-up
        print(f"clusterproof: no pidfd to watch run pid {owner} with: {e}", file=sys.stderr)
        return 1   # clusterproof.core.exitcodes.CHECK_FAILED: no watchdog
    if pidfd is not None and os.getppid() != owner:
        # Not (or no longer) started by the owner: the pidfd may name a recycled pid.
        os.close(pidfd)
        pidfd = None
    ready_r, ready_w = os.pipe()
    if os.fork():
        os.close(ready_w)
        os.read(ready_r, 1)          # EOF once the watchdog has written its record
        os._exit(0)
    os.close(ready_r)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):             # the starter reads our first process's stderr until EOF: let go of it
        os.dup2(devnull, fd)
    try:
        rec = {"pid": os.getpid(), "owner": owner, "started": time.time()}
        tmp = directory / f"{RECORD}.{os.getpid()}"
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, directory / RECORD)
    except OSError as e:
        _log(cache, cluster, f"cannot write its record: {e}")
        os._exit(1)
    os.close(ready_w)
    try:
        _watch(cache, cluster, directory, owner, pidfd)
    except Exception as e:   # nobody reads this process's stderr: the log says why it stopped
        _log(cache, cluster, f"stopped: {type(e).__name__}: {e}"[:400])
        return 1
    return 0


def _watch(cache: Path, cluster: str, directory: Path, owner: int, pidfd: int | None) -> None:
    _log(cache, cluster, f"watching run pid {owner}" if pidfd is not None else f"run pid {owner} already gone")
    if not _wait(directory, pidfd):
        _log(cache, cluster, "removed by its run: done")
        return
    if (directory / "keep").exists():
        _log(cache, cluster, f"run pid {owner} ended; kept on purpose (--cp-keep-cluster): left running")
        return
    t0 = time.monotonic()
    _log(cache, cluster, f"run pid {owner} ended without removing it: sweeping")
    said = _clean(cache, cluster)
    _log(cache, cluster, f"{said} ({time.monotonic() - t0:.1f} s)")

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
