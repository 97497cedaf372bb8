"""One process at a time on this machine: an exclusive ``flock`` on a file beside what it guards.

Runs side by side on one machine (the self-tests' parallel workers, two CI jobs on one runner)
share the caches: a Go build, an image build, a Prometheus history, the real nodes' address plan.
Whoever comes second waits, is told so, and finds the work done. The lock goes with the process
(the kernel drops it on exit, a kill included): nothing to clean up.
"""
from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def held(path: Path, waiting: str | None = None, say: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the lock on ``path`` (created, with its directory) for the block. If another process holds
    it, ``say(waiting)`` first, then wait for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting and say:
                say(waiting)
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
