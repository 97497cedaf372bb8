"""The harness's one list+watch: an informer-style store of a collection.

Why one: node bring-up, pod timelines and every suite's "watch until..."
need the same things done right, and a second copy would get one of them
wrong:

- list, then watch from the list's resourceVersion (nothing is missed
  between the two), and resume from the last resourceVersion seen
  (bookmarks included) when the server ends a stream;
- on ``410 Gone`` (the resourceVersion has been compacted away), relist and,
  as client-go's ``Replace`` does, emit ``DELETED`` for every object that
  vanished meanwhile and ``ADDED``/``MODIFIED`` for the rest -- a consumer
  never keeps a pod that no longer exists;
- on any other failure of the list or the watch (connection refused or
  reset, a read timeout, a 5xx or 429, an ERROR event, a malformed line)
  reconnect with bounded exponential backoff and jitter, resuming from the
  last resourceVersion (so no event is lost; a 410 then relists). Only
  answers that can never succeed (400, 401, 403, 404...) and a consumer's
  own handler raising end it at once. As client-go's reflector does, and
  for the same reason: an apiserver restarted by the supervisor, or a
  load balancer that drops a connection, must not freeze a suite's view;
- the store is honest about itself: ``connected``, ``stale_s`` and
  ``outages`` say whether and since when it has been cut off, and
  ``check(max_stale_s)`` raises one line when it has been cut off longer
  than the caller can accept -- a consumer never waits on a frozen store
  believing it current. A window (``run``/``watch_for`` with a deadline)
  that ends while the watch is cut raises instead of answering from the
  stale store;
- raw JSON lines instead of model objects: the official client's
  ``watch.Watch`` builds a model per event (~1 ms per Node in Python), too
  slow for 7,500 nodes on two cores; raw lines are also exact byte counts.

How long it keeps trying (``give_up_s``, default ``GIVE_UP_S``): 120 s of
consecutive failures. The control-plane guard grants a restarted control
plane 45 s to recover (``clusterproof.cluster.health.RECOVERY_S``); the supervisor needs
up to 2 s to notice a dead kube-apiserver and kwokctl some seconds to start
it, and a restarted apiserver rebuilds its watch caches from etcd before it
serves watches (seconds on smoke, more at 7,500 nodes). 120 s is more than
twice all of that together, so a restart is ridden out; an outage longer
than that is a control plane that is down, and saying so in one line is
more useful than letting every consumer wait out its own, much longer,
bound (a burst waits up to 600 s).

``run`` follows the collection in the calling thread until a condition or a
deadline; ``start``/``stop`` do the same in a background thread.
Handlers see ``(kind, obj)``; ``kind`` is ADDED, MODIFIED or DELETED.
"""
from __future__ import annotations

import datetime as dt
import json
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import urllib3
from kubernetes import client

from clusterproof.core import progress
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import list_raw, raw_request

Handler = Callable[[str, dict], None]

GIVE_UP_S = 120.0          # consecutive failures before the informer gives up (see the module docstring)
BACKOFF_FIRST_S = 0.25     # first reconnect delay; doubled per failure ...
BACKOFF_MAX_S = 5.0        # ... up to this (a restarted apiserver is seen within 5 s of answering again)
# Answers that a retry cannot change: the path, the query or the credentials are wrong.
FATAL_STATUS = {400, 401, 403, 404, 405, 406, 415, 422}


def _key(obj: dict) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _clock(wall: float) -> str:
    return dt.datetime.fromtimestamp(wall, dt.timezone.utc).strftime("%H:%M:%S")


def short_error(e: BaseException) -> str:
    """One line for a connection/API error: its type and the gist, never a traceback or a body."""
    if isinstance(e, client.ApiException):
        return f"HTTP {e.status} {e.reason}".strip()
    if isinstance(e, urllib3.exceptions.MaxRetryError) and e.reason is not None:
        e = e.reason
    text = " ".join(str(e).split())
    for marker in ("Failed to establish a new connection: ", "] "):
        if marker in text:
            text = text.split(marker, 1)[1]
    text = text.strip("'\" )(")
    return f"{type(e).__name__}: {text[:160]}" if text else type(e).__name__


class Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410 or an ERROR event with code 410)."""


class InformerError(RuntimeError):
    """The informer gave up, or its store is staler than its consumer accepts; str(e) is one line."""


class _HandlerFailed(Exception):
    """The consumer's own ``on_event`` raised: a bug to surface, not a connection to retry."""


@dataclass
class Outage:
    """One stretch during which the informer could not list or watch (``ended`` None: still cut off)."""
    started: float              # monotonic
    started_wall: float
    error: str                  # the first error of the stretch
    last_error: str
    attempts: int = 1
    ended: float | None = None  # monotonic, when a list or a watch succeeded again

    def seconds(self, now: float | None = None) -> float:
        return ((self.ended if self.ended is not None else (now or time.monotonic())) - self.started)

    def __str__(self) -> str:
        how = f"for {self.seconds():.1f} s" if self.ended is not None else f"for {self.seconds():.0f} s so far"
        return f"cut at {_clock(self.started_wall)} UTC {how} ({self.error})"


def watch_lines(api: client.ApiClient, path: str, resource_version: str, query: dict | None,
                timeout_s: int, on_open: Callable[[], None] | None = None) -> Iterator[tuple[dict, int]]:
    """Yield ``(event, nbytes)`` from one watch stream; the server ends it after ``timeout_s``.

    ``on_open`` is called once the apiserver has answered 200 (the stream is
    up even if nothing happens on it for a while). Not retried here: the
    informer reconnects (``retry_s=0``).
    """
    q = {"watch": "true", "resourceVersion": resource_version, "allowWatchBookmarks": "true",
         "timeoutSeconds": str(timeout_s), **(query or {})}
    try:
        resp = raw_request(api, "GET", path, q, timeout=(10, timeout_s + 30), retry_s=0)
    except client.ApiException as e:
        if e.status == 410:
            raise Gone(str(e.reason)) from None
        raise
    if on_open is not None:
        on_open()
    try:
        buf = b""
        for chunk in resp.stream(65536, decode_content=True):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line), len(line) + 1
    finally:
        resp.release_conn()


class Informer:
    """A store of the objects at ``path`` (matching ``query``), kept current by list+watch.

    ``list_fn(path, query)`` and ``watch_fn(path, rv, query, timeout_s)``
    default to the API server; unit tests of the relist and reconnect logic
    pass fakes. ``give_up_s``: see the module docstring.
    """

    def __init__(self, api: client.ApiClient | None, path: str, query: dict | None = None,
                 on_event: Handler | None = None, *, chunk_s: int = 60,
                 list_fn: Callable[[str, dict | None], dict] | None = None,
                 watch_fn: Callable[..., Iterator[tuple[dict, int]]] | None = None,
                 give_up_s: float = GIVE_UP_S, backoff_first_s: float = BACKOFF_FIRST_S,
                 backoff_max_s: float = BACKOFF_MAX_S):
        self.path, self.query, self.on_event, self.chunk_s = path, query, on_event, chunk_s
        self.give_up_s, self.backoff_first_s, self.backoff_max_s = give_up_s, backoff_first_s, backoff_max_s
        # The list retries nothing itself (retry_s=0): the informer's own backoff and bound apply.
        self._list = list_fn or (lambda p, q: list_raw(api, p, q, retry_s=0))
        self._watch = watch_fn or (lambda p, rv, q, t: watch_lines(api, p, rv, q, t, on_open=self._opened))
        self.store: dict[str, dict] = {}
        self.rv: str | None = None
        self.relists = 0              # how often 410 Gone forced a relist
        self.relisting = False        # True while a relist (not the first list) emits its events
        # (resourceVersion before, resourceVersion of the relist) per relist: what happened in between
        # reached the store as one jump, in no order (a consumer that judges order must not judge it).
        self.gaps: list[tuple[str, str]] = []
        self.reconnects = 0           # failed lists/watches that were retried
        self.events = 0
        self.bytes = 0                # watch bytes received (JSON lines, as on the wire)
        self.error: str | None = None  # set when it gave up (or hit an answer no retry can change)
        self.outages: list[Outage] = []
        self.backoffs: list[float] = []   # every reconnect delay slept (the self-tests check the bounds)
        self._connected = False
        self._need_list = False       # a 410 asked for a relist that has not succeeded yet
        self._failures = 0            # consecutive failures (the backoff's exponent)
        self._episode: float | None = None   # monotonic start of the current run of failures
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- the store -------------------------------------------------------------

    def _emit(self, kind: str, obj: dict) -> None:
        with self._lock:
            if kind == "DELETED":
                self.store.pop(_key(obj), None)
            else:
                self.store[_key(obj)] = obj
        if self.on_event is not None:
            try:
                self.on_event(kind, obj)
            except Exception as e:
                raise _HandlerFailed(f"{type(e).__name__}: {e}") from e

    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.store.values())

    def get(self, name: str, namespace: str = "") -> dict | None:
        with self._lock:
            return self.store.get(f"{namespace}/{name}")

    # --- how current the store is ------------------------------------------------------

    @property
    def connected(self) -> bool:
        """True while the last list or watch succeeded and nothing has failed since."""
        return self._connected

    @property
    def stale_s(self) -> float:
        """Seconds since the store was last known current (0 while connected)."""
        with self._lock:
            cut = self.outages[-1] if self.outages and self.outages[-1].ended is None else None
        return 0.0 if cut is None else time.monotonic() - cut.started

    def outages_since(self, t: float) -> list[Outage]:
        """Outages that overlap ``[t, now]`` (monotonic): a measurement over that window had a hole."""
        with self._lock:
            return [o for o in self.outages if o.ended is None or o.ended >= t]

    def _opened(self) -> None:
        """The list or a watch stream succeeded: the store is current again."""
        with self._lock:
            if self.outages and self.outages[-1].ended is None:
                self.outages[-1].ended = time.monotonic()
            self._connected = True

    def _healthy(self) -> None:
        """Something was delivered: the backoff and the give-up clock start over."""
        self._failures, self._episode = 0, None

    def _failed(self, e: BaseException) -> None:
        now, why = time.monotonic(), short_error(e)
        with self._lock:
            self._connected = False
            if self.outages and self.outages[-1].ended is None:
                self.outages[-1].attempts += 1
                self.outages[-1].last_error = why
            else:
                self.outages.append(Outage(now, time.time(), why, why))
        self._failures += 1
        self.reconnects += 1
        if self._episode is None:
            self._episode = now

    def _gave_up(self) -> str | None:
        if self._episode is None or time.monotonic() - self._episode < self.give_up_s:
            return None
        o = self.outages[-1]
        return (f"the watch of {self.path} failed for {time.monotonic() - self._episode:.0f} s without a break "
                f"(since {_clock(o.started_wall)} UTC, {o.attempts} attempts; first: {o.error}; last: "
                f"{o.last_error}); gave up after {self.give_up_s:g} s: is the API server down?")

    def backoff_s(self) -> float:
        """The next reconnect delay: doubling from ``backoff_first_s`` to ``backoff_max_s``, with jitter
        (between half and all of it) so that many informers cut at once do not reconnect in step."""
        d = min(self.backoff_max_s, self.backoff_first_s * 2 ** max(0, self._failures - 1))
        return d * random.uniform(0.5, 1.0)

    def check(self, max_stale_s: float | None = None) -> None:
        """Raise (one line) if the informer gave up, or if ``max_stale_s`` is given and the store has
        been cut off from the API server for longer than that."""
        if self.error:
            raise InformerError(self.error)
        if max_stale_s is not None and self.stale_s > max_stale_s:
            o = self.outages[-1]
            raise InformerError(f"the watch of {self.path} has been cut off for {self.stale_s:.0f} s (since "
                                f"{_clock(o.started_wall)} UTC, {o.attempts} attempts; last: {o.last_error}): "
                                f"its store is staler than the {max_stale_s:g} s this wait accepts")

    # --- list and watch -------------------------------------------------------------

    def list(self) -> None:
        """(Re)list: replace the store, emitting what changed since the last view."""
        listing = self._list(self.path, self.query)
        self._opened()
        items = {_key(o): o for o in listing.get("items", [])}
        with self._lock:
            old = dict(self.store)
        self.relisting = self.rv is not None
        try:
            for key, obj in old.items():
                if key not in items:
                    self._emit("DELETED", obj)
            for key, obj in items.items():
                before = old.get(key)
                if before is None:
                    self._emit("ADDED", obj)
                elif before["metadata"].get("resourceVersion") != obj["metadata"].get("resourceVersion"):
                    self._emit("MODIFIED", obj)
        finally:
            self.relisting = False
        if self.rv is not None:
            self.gaps.append((self.rv, listing["metadata"]["resourceVersion"]))
        self.rv = listing["metadata"]["resourceVersion"]
        self._healthy()

    def _watch_once(self, until: Callable[[], bool], deadline: float) -> None:
        left = deadline - time.monotonic()
        remaining = self.chunk_s if math.isinf(left) else max(1, min(self.chunk_s, math.ceil(left)))
        for event, nbytes in self._watch(self.path, self.rv, self.query, remaining):
            if not isinstance(event, dict) or "type" not in event or not isinstance(event.get("object"), dict):
                raise ValueError(f"malformed watch event: {str(event)[:120]}")
            kind, obj = event["type"], event["object"]
            self.events += 1
            self.bytes += nbytes
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone(obj.get("message", "410 Gone"))
                raise client.ApiException(status=obj.get("code") or 500,
                                          reason=f"ERROR event: {str(obj.get('message'))[:160]}")
            self._opened()   # a fake watch (or one whose open went unreported) is up once it delivers
            self.rv = obj["metadata"]["resourceVersion"]
            if kind != "BOOKMARK":
                self._emit(kind, obj)
            self._healthy()
            if until() or self._stop.is_set() or time.monotonic() >= deadline:
                return
        # The server ended the stream after its timeout: a normal end, the connection was fine.
        self._opened()
        self._healthy()

    def _fatal(self, e: BaseException) -> bool:
        return isinstance(e, _HandlerFailed) or (isinstance(e, client.ApiException) and e.status in FATAL_STATUS)

    def run(self, until: Callable[[], bool] = lambda: False, deadline: float = math.inf, what: str | None = None,
            status: Callable[[], object] | None = None) -> bool:
        """Follow the collection until ``until()`` holds or ``deadline`` (monotonic); return ``until()``.

        Reconnects on failures (see the module docstring). Raises
        ``InformerError`` when it gives up, or when the deadline comes while
        the watch is cut off and ``until()`` does not hold: the store cannot
        say that nothing happened. A window (a finite deadline) is not silent:
        a heartbeat line names ``what`` it waits for (default: the watched
        path), the time of the window gone, and ``status()`` (default: the
        store's size, events and connection).
        """
        return self._window(until, deadline, what or f"a change on {self.path}", status, progress.caller_logger(1))

    def _window(self, until, deadline: float, what: str, status, log) -> bool:
        if math.isinf(deadline):
            return self._run(until, deadline)
        with progress.heartbeat(what, timeout=max(0.0, deadline - time.monotonic()), status=status or self.describe,
                                log=log):
            return self._run(until, deadline)

    def describe(self) -> str:
        """The store in a few words (heartbeat lines)."""
        return (f"{len(self.store)} objects, {self.events} events, "
                + ("connected" if self._connected else f"cut off ({self.reconnects} reconnects)"))

    def _run(self, until: Callable[[], bool], deadline: float) -> bool:
        while not until() and not self._stop.is_set() and time.monotonic() < deadline:
            try:
                if self.rv is None or self._need_list:
                    self.list()
                    self._need_list = False
                else:
                    self._watch_once(until, deadline)
            except Gone:
                # The server answered: not an outage. Relist at once (client-go's reflector does too).
                self.relists += 1
                self._need_list = True
            except Exception as e:
                if self._fatal(e):
                    raise InformerError(f"the watch of {self.path} failed: {short_error(e)}") from None
                self._failed(e)
            if not self._connected:
                why = self._gave_up()
                if why:
                    raise InformerError(why)
                delay = self.backoff_s()
                self.backoffs.append(delay)
                # A bounded backoff inside the retry loop (not synchronisation); stop() ends it at once.
                self._stop.wait(max(0.0, min(delay, deadline - time.monotonic())))
        done = until()
        if not done and not self._connected and not self._stop.is_set():
            o = self.outages[-1]
            raise InformerError(f"the watch of {self.path} was cut off when its window ended ({o}; last: "
                                f"{o.last_error}): what happened meanwhile is unknown")
        return done

    def watch_for(self, seconds: float, until: Callable[[], bool] = lambda: False, what: str | None = None,
                  status: Callable[[], object] | None = None) -> bool:
        """``run`` for a window of ``seconds``; ``what``/``status``: its heartbeat (see ``run``)."""
        return self._window(until, time.monotonic() + seconds, what or f"the end of a {seconds:g} s watch of "
                            f"{self.path}", status, progress.caller_logger(1))

    # --- in the background ----------------------------------------------------------------

    def start(self, timeout: float = 60) -> "Informer":
        """Follow in a background thread; returns once the first list is in the store."""
        def body():
            try:
                self.run()
            except Exception as e:  # surfaced by check()/start(), never swallowed
                self.error = str(e) if isinstance(e, InformerError) else \
                    f"watch of {self.path} failed: {type(e).__name__}: {str(e)[:200]}"
        self._thread = threading.Thread(target=body, daemon=True, name=f"informer {self.path}")
        self._thread.start()
        try:
            wait_for(lambda: self.rv is not None or bool(self.error), timeout=timeout, interval=0.05,
                     what=f"first list of {self.path}")
        except AssertionError:
            self.stop()
            cut = self.outages[-1] if self.outages else None
            raise InformerError(f"the first list of {self.path} did not succeed within {timeout:g} s"
                                + (f" ({cut.attempts} attempts; last: {cut.last_error})" if cut else "")) from None
        self.check()
        return self

    def stop(self) -> None:
        """Stop the background thread (within one watch chunk) and wait for it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.chunk_s + 40)
