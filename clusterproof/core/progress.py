"""Progress lines with their time, through ``logging``: said lines, phases and heartbeats (pure).

Why: a nightly run is read the next morning, from the CI log and from the
report. A progress line must carry its time, land in the log of the check it
belongs to (pytest captures logging per test; allure-pytest attaches that as
the check's "log"), and a long wait must not be silent: it says what it waits
for and how far along it is at least every ``HEARTBEAT_S`` seconds.

- ``say(msg)``: one INFO line on the logger of the calling module's domain
  (``clusterproof.gang`` for a line said in ``clusterproof.gang.gangs``; a
  module outside the package logs under ``clusterproof.<its top package>``).
  It is the ``say``/``progress`` callable the domains take as a parameter (the
  plugin's ``say`` fixture, the benches' ``common.say``); a self-test may
  still pass its own.
- ``phase(name)``: a step an SRE wants to see (bring-up, create the gang's
  pods, the burst, the flood): its start, and its end with its duration; the
  registered listeners are told (the plugin opens an ``allure.step`` per
  phase, so the report shows it with its duration).
- ``heartbeat(what, timeout=...)``: while the block runs, a line every
  ``HEARTBEAT_S`` seconds -- by the clock, not per poll: one ticker thread
  serves them all -- with the time waited, the bound, and the last state seen
  (``seen``) or a ``status()`` read at that moment. ``waiting.wait_for``, the
  informer's windows, locust runs and builds use it.
- ``to_terminal()``: for the commands (benches, ``clusterproof prepare``):
  timestamped lines on stderr. Under pytest, ``pytest.ini``'s ``log_cli``
  lines do that, through ``OwnLines`` (the harness's lines; a library's
  only from ERROR up -- the rest stays in the check's log in the report).

No pytest here; nothing is logged that ``core.redact`` would not let through
(states and messages are redacted before they are shown).
"""
from __future__ import annotations

import inspect
import logging
import os
import sys
import threading
import time
from contextlib import AbstractContextManager, ExitStack
from typing import Any, Callable

from clusterproof.core import processes, redact

ROOT = "clusterproof"            # the logger hierarchy: clusterproof.<domain>
HEARTBEAT_S = 30.0               # a long wait says how far along it is at least this often (lowered by self-tests)
WIDTH = 200                      # a state shown in a heartbeat line is cut to this many characters
# A line: the commands', pytest's live log and each check's log in the report (pytest.ini's log_cli_format and
# log_format say the same; the plugin sets them where no pytest.ini does). The report's log carries the date.
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
DATE_FORMAT = "%H:%M:%S"
REPORT_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"

logging.getLogger(ROOT).setLevel(logging.INFO)   # our lines reach the handlers whatever the root level

PhaseListener = Callable[[str], AbstractContextManager]
_listeners: list[PhaseListener] = []


def logger(module: str) -> logging.Logger:
    """The logger of ``module``'s domain: ``clusterproof.gang`` for ``clusterproof.gang.gangs``,
    ``clusterproof.suites`` for ``clusterproof.suites.test_x``, ``clusterproof``
    for ``__main__``."""
    parts = [p for p in module.split(".") if p]
    if parts[:1] == [ROOT]:
        parts = parts[1:]
    if parts[:1] == ["__main__"]:
        parts = []
    return logging.getLogger(".".join([ROOT, *parts[:1]]))


def caller_logger(depth: int = 1) -> logging.Logger:
    """The domain logger of the module ``depth`` frames above the caller (1: the caller's caller); a module
    run with ``python -m`` by its own name (``clusterproof.bench.knee``, not ``__main__``)."""
    frame = inspect.currentframe()
    for _ in range(depth + 1):
        frame = frame.f_back if frame is not None else None
    if frame is None:
        return logging.getLogger(ROOT)
    name, spec = frame.f_globals.get("__name__", ROOT), frame.f_globals.get("__spec__")
    return logger(spec.name if name == "__main__" and getattr(spec, "name", None) else name)


def say(msg: str) -> None:
    """One progress line (INFO) on the domain logger of the module that says it."""
    caller_logger(1).info(msg)


class OwnLines(logging.Filter):
    """The live log's filter: the harness's own lines, and a library's only from ERROR up. A library's
    warnings (urllib3's "Connection pool is full" 30 times in a second of a node-join storm) stay in each
    check's captured log in the report, not in the terminal."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.name == ROOT or record.name.startswith(ROOT + ".") or record.levelno >= logging.ERROR


def abbreviate(state: Any, width: int = WIDTH) -> str:
    """``state`` as one line of at most ``width`` characters, credentials in URLs masked."""
    s = " ".join(redact.text(str(state)).split())
    return s if len(s) <= width else s[:width - 1] + "…"


def last_line(path: os.PathLike | str) -> str:
    """What a running process wrote last to its log (a heartbeat's status): "last output: ...", or
    "no output yet"."""
    line = processes.last_log_line(path)
    return f"last output: {line}" if line else "no output yet"


# --- phases ---------------------------------------------------------------------------------------

def add_phase_listener(listener: PhaseListener) -> None:
    """``listener(name)`` returns a context manager entered around every phase (e.g. ``allure.step``)."""
    _listeners.append(listener)


def remove_phase_listener(listener: PhaseListener) -> None:
    if listener in _listeners:
        _listeners.remove(listener)


class Phase:
    """See ``phase``. ``seconds``: its duration once it has ended."""

    def __init__(self, name: str, log: logging.Logger):
        self.name, self.log = name, log
        self.started: float | None = None
        self.seconds: float | None = None
        self._stack = ExitStack()

    def __enter__(self) -> "Phase":
        self.log.info(f"[{self.name}] started")
        for listener in list(_listeners):
            try:
                self._stack.enter_context(listener(self.name))
            except Exception as e:   # the report's step must never break the measurement
                self.log.warning(f"[{self.name}] phase listener failed: {type(e).__name__}: {abbreviate(e)}")
        self.started = time.monotonic()
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        self.seconds = time.monotonic() - (self.started or time.monotonic())
        if kind is None:
            self.log.info(f"[{self.name}] done in {self.seconds:.1f} s")
        else:
            first = str(exc).splitlines()[0] if str(exc) else ""
            self.log.info(f"[{self.name}] ended after {self.seconds:.1f} s: {kind.__name__}"
                          + (f": {abbreviate(first)}" if first else ""))
        return bool(self._stack.__exit__(kind, exc, tb))


def phase(name: str, log: logging.Logger | None = None) -> Phase:
    """A phase of a check (a context manager): start and end logged with its duration, listeners told."""
    return Phase(name, log or caller_logger(1))


# --- heartbeats -----------------------------------------------------------------------------------

_UNSEEN = object()


class Heartbeat:
    """See ``heartbeat``. ``seen(state)``: the state a line shows; ``lines``: how many were logged."""

    def __init__(self, what: str, timeout: float | None, period: float, log: logging.Logger,
                 status: Callable[[], Any] | None = None, describe: Callable[[Any], Any] | None = None):
        self.what, self.timeout, self.period, self.log = what, timeout, period, log
        self.status, self.describe = status, describe
        self.started = time.monotonic()
        self.next_at = self.started + period
        self.state: Any = _UNSEEN
        self.lines = 0
        self.active = False
        # Held while a line is written and while the block ends: no line after its block (a line the ticker
        # had picked as due used to be written just after __exit__, under load).
        self._writing = threading.Lock()

    def seen(self, state: Any) -> None:
        self.state = state

    def line(self, now: float | None = None) -> str:
        """What the wait says now: what it waits for, time waited (of its bound), the last state."""
        elapsed = (time.monotonic() if now is None else now) - self.started
        far = f"{elapsed:.0f} s of {self.timeout:g} s" if self.timeout else f"{elapsed:.0f} s so far"
        try:
            if self.status is not None:
                detail = f"; {abbreviate(self.status())}"
            elif self.state is not _UNSEEN:
                state = self.describe(self.state) if self.describe is not None else self.state
                detail = f"; last seen: {abbreviate(state)}"
            else:
                detail = ""
        except Exception as e:   # a state changing under our feet: say so, never stop the heartbeat
            detail = f"; state unreadable ({type(e).__name__})"
        return f"waiting for {self.what}: {far}{detail}"

    def beat(self, now: float | None = None) -> None:
        with self._writing:
            if not self.active:
                return
            try:
                self.log.info(self.line(now))
                self.lines += 1
            except Exception:   # a heartbeat that cannot be written is not worth a failure
                pass

    def __enter__(self) -> "Heartbeat":
        if self.period > 0:
            self.active = True
            _ticker().add(self)
        return self

    def __exit__(self, *exc) -> bool:
        with self._writing:
            self.active = False
        _ticker().discard(self)
        return False


def heartbeat(what: str, *, timeout: float | None = None, period: float | None = None,
              status: Callable[[], Any] | None = None, describe: Callable[[Any], Any] | None = None,
              log: logging.Logger | None = None) -> Heartbeat:
    """A context manager: while its block runs, "waiting for <what>: <elapsed> s of <timeout> s; ..." every
    ``period`` seconds (default ``HEARTBEAT_S``, read now; 0 disables it). The line ends with ``status()``
    if given, else the last state passed to ``seen`` (through ``describe``, if given: a state in a few
    words). Logged on the caller's domain logger unless ``log``. ``status``/``describe`` run in the
    ticker thread: no API calls there, only what is already known."""
    return Heartbeat(what, timeout, HEARTBEAT_S if period is None else period, log or caller_logger(1), status,
                     describe)


class _Ticker:
    """One daemon thread for every live heartbeat: it sleeps until the next one is due."""

    def __init__(self):
        self.cond = threading.Condition()
        self.beats: set[Heartbeat] = set()
        self.thread: threading.Thread | None = None

    def add(self, hb: Heartbeat) -> None:
        with self.cond:
            self.beats.add(hb)
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self.run, name="clusterproof heartbeat", daemon=True)
                self.thread.start()
            self.cond.notify()

    def discard(self, hb: Heartbeat) -> None:
        with self.cond:
            self.beats.discard(hb)

    def run(self) -> None:
        while True:
            with self.cond:
                now = time.monotonic()
                due = [b for b in self.beats if b.next_at <= now]
                for b in due:
                    b.next_at = now + b.period
                if not due:
                    nxt = min((b.next_at for b in self.beats), default=None)
                    self.cond.wait(None if nxt is None else max(0.0, nxt - now))
                    continue
            for b in due:   # outside the lock: a handler may block
                b.beat(now)


_TICKER: list[_Ticker] = [_Ticker()]


def _ticker() -> _Ticker:
    return _TICKER[0]


def _forked() -> None:   # a forked child has no ticker thread, and maybe a held lock: a new one
    _TICKER[0] = _Ticker()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)


# --- commands -------------------------------------------------------------------------------------

def to_terminal(stream=None, level: int = logging.INFO) -> logging.Handler:
    """The commands' progress: the ``clusterproof`` loggers' lines, timestamped, on ``stream`` (stderr).
    Once per process (a second call returns the first handler)."""
    root = logging.getLogger(ROOT)
    for h in root.handlers:
        if getattr(h, "clusterproof_terminal", False):
            return h
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(logging.Formatter(FORMAT, DATE_FORMAT))
    handler.setLevel(level)
    handler.clusterproof_terminal = True
    root.addHandler(handler)
    return handler
