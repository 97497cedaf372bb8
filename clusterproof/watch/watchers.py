"""Hundreds of watch streams from one process: one asyncio loop (aiohttp), bytes counted per event and on the socket.

Why asyncio and not one thread per watcher: kube-proxy on every node of a
7,500-node cluster is 7,500 watch streams; a Python thread each would spend
the two cores on context switches and the GIL. Here every stream is a
coroutine of one event loop, which runs in one background thread so the
test (the churn, the scrapes) goes on in the main thread.

What is counted, per watcher:

- every event as the apiserver framed it (``clusterproof.watch.wire``): its size
  on the stream (JSON line with newline; protobuf frame with its 4-byte
  length) and the size ``apiserver_watch_events_sizes`` records for it;
- the bytes the kernel received on the watch's TCP connection
  (``TCP_INFO.tcpi_bytes_received``: TLS records, HTTP chunk framing and all),
  from the moment the response headers arrived -- the wire cost of the stream.

Frames are decoded once per distinct content (all watchers of one encoding
receive the same bytes for the same event) into ``watchwire.Event``.
The TLS client certificate / token come from the kubeconfig the harness was
given (the kubernetes client's configuration); nothing is printed.
"""
from __future__ import annotations

import asyncio
import socket
import ssl
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from kubernetes import client

from clusterproof.core.waiting import wait_for
from clusterproof.kube.apicalls import FORBIDDEN_RBAC, recorder_of
from clusterproof.watch import wire

# struct tcp_info (linux/tcp.h): __u64 tcpi_bytes_received sits at byte 128 (Linux >= 4.1).
_TCP_BYTES_RECEIVED = 128


def tcp_bytes_received(sock) -> int | None:
    """Bytes the kernel received on this TCP socket so far (None where TCP_INFO does not say)."""
    try:
        info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
        return struct.unpack_from("<Q", info, _TCP_BYTES_RECEIVED)[0] if len(info) >= 136 else None
    except (OSError, AttributeError):
        return None


@dataclass(frozen=True)
class Spec:
    """One watch: which API (``endpointslices``/``endpoints``), which encoding, where and from which version."""
    api: str
    encoding: str
    path: str
    query: dict

    @property
    def group(self) -> str:
        return f"{self.api}/{self.encoding}"


@dataclass
class Watcher:
    spec: Spec
    index: int
    status: int | None = None
    warnings: list[str] = field(default_factory=list)
    events: list[tuple[float, wire.Event]] = field(default_factory=list)   # (monotonic time, event)
    ended: str | None = None          # why the stream ended early (the apiserver closed it, an error)
    wire_at_headers: int | None = None
    view: dict[str, str] = field(default_factory=dict)    # object key -> last resourceVersion seen
    _sock: object = None

    def wire_bytes(self) -> int | None:
        """Bytes received on the socket since the response headers (TLS and HTTP framing included)."""
        now = tcp_bytes_received(self._sock) if self._sock is not None else None
        return None if now is None or self.wire_at_headers is None else now - self.wire_at_headers


@dataclass(frozen=True)
class Mark:
    """Where every watcher stood at one moment: events received and socket bytes."""
    at: float
    events: dict[int, int]
    wire: dict[int, int | None]


def older(a: str, b: str) -> bool:
    """Is resourceVersion ``a`` older than ``b``?

    Kubernetes calls resourceVersions opaque; every etcd-backed apiserver
    makes them etcd revisions (integers), which is what this compares.
    Anything else is only "the same or not".
    """
    try:
        return int(a) < int(b)
    except ValueError:
        return a != b


def ssl_context(cfg: client.Configuration) -> ssl.SSLContext | bool:
    """TLS as the kubeconfig says: its CA, its client certificate, or no verification if it says so."""
    if not cfg.host.startswith("https"):
        return False
    ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if cfg.ssl_ca_cert else ssl.create_default_context()
    if not cfg.verify_ssl:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    elif cfg.assert_hostname is False:
        ctx.check_hostname = False
    if cfg.cert_file:
        ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
    return ctx


def auth_headers(cfg: client.Configuration) -> dict[str, str]:
    """The kubeconfig's token (if any), refreshed by the client's own hook; never logged."""
    out = {}
    for setting in cfg.auth_settings().values():
        if setting.get("in") == "header" and setting.get("value"):
            out[setting["key"]] = setting["value"]
    return out


class WatchPool:
    """Watchers in one event loop (one thread); ``start`` opens them, ``mark``/``stop`` read and end them."""

    def __init__(self, api: client.ApiClient, timeout_s: int):
        self.cfg = api.configuration
        # The harness's identity opens these streams: they go into its request record like every other call.
        self.recorder = recorder_of(api)
        self.timeout_s = timeout_s
        self.watchers: list[Watcher] = []
        self.decoded: dict[bytes, wire.Event] = {}
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True, name="watch pool")
        self._thread.start()
        self._tasks: list[asyncio.Task] = []
        self._session = None                      # an aiohttp.ClientSession, once open
        self._call(self._open())

    def _call(self, coro, timeout: float = 120):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _open(self) -> None:
        import aiohttp  # here, not with the module: a tenth of a second of every run's start, for one suite
        # limit=0: one connection per watch, as every kube-proxy has its own.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=ssl_context(self.cfg), limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=None))

    # --- reading one stream -----------------------------------------------------------------

    async def _run(self, w: Watcher) -> None:
        q = {"watch": "true", "allowWatchBookmarks": "true", "timeoutSeconds": str(self.timeout_s), **w.spec.query}
        headers = {"Accept": wire.ACCEPT[w.spec.encoding], **auth_headers(self.cfg)}
        try:
            async with self._session.get(self.cfg.host + w.spec.path, params=q, headers=headers) as resp:
                w.status = resp.status
                if self.recorder is not None:
                    # A watch is only ever refused by the authorizer (admission never sees a GET).
                    self.recorder.record("GET", f"{w.spec.path}?watch=true",
                                         FORBIDDEN_RBAC if resp.status == 403 else resp.status)
                w.warnings = resp.headers.getall("Warning", [])
                if resp.status != 200:
                    w.ended = f"HTTP {resp.status}: {(await resp.text())[:200]}"
                    return
                w._sock = resp.connection.transport.get_extra_info("socket") if resp.connection else None
                w.wire_at_headers = tcp_bytes_received(w._sock) if w._sock is not None else None
                buf = bytearray()
                async for chunk in resp.content.iter_any():
                    buf += chunk
                    now = time.monotonic()
                    for frame in wire.take_frames(buf, w.spec.encoding):
                        ev = self.decoded.get(frame)
                        if ev is None:
                            ev = self.decoded[frame] = wire.decode(frame, w.spec.encoding)
                        w.events.append((now, ev))
                        if ev.type == "DELETED":
                            w.view.pop(ev.key, None)
                        elif ev.type in ("ADDED", "MODIFIED"):
                            w.view[ev.key] = ev.resource_version
                        elif ev.type == "ERROR":
                            w.ended = f"ERROR event: {ev.message}"
                w.ended = w.ended or "the apiserver ended the stream"
        except asyncio.CancelledError:
            raise
        except Exception as e:  # reported per watcher; one broken stream must not hide the others
            w.ended = f"{type(e).__name__}: {str(e)[:200]}"

    # --- the harness's side -----------------------------------------------------------------

    def start(self, specs: list[Spec], view: Callable[[Spec], dict[str, str]], timeout: float = 120) -> list[Watcher]:
        """Open one watcher per spec; return once every one has its response headers (or has failed).

        ``view(spec)``: the objects (key -> resourceVersion) of the LIST the
        watch starts from, so each watcher knows when it has caught up.
        """
        new = [Watcher(s, len(self.watchers) + i, view=dict(view(s))) for i, s in enumerate(specs)]
        self.watchers += new

        async def spawn():
            self._tasks += [asyncio.ensure_future(self._run(w)) for w in new]
        self._call(spawn())
        wait_for(lambda: [w.index for w in new if w.status is None and w.ended is None], until=lambda left: not left,
                 timeout=timeout, interval=0.2, what=f"{len(new)} watch streams answered by the apiserver")
        return new

    def mark(self) -> Mark:
        """Events and socket bytes of every watcher, read inside the loop (consistent with its counting)."""
        async def read():
            return Mark(time.monotonic(), {w.index: len(w.events) for w in self.watchers},
                        {w.index: w.wire_bytes() for w in self.watchers})
        return self._call(read())

    def caught_up(self, state: dict[str, str], list_rv: str, watchers: list[Watcher]) -> list[str]:
        """Watchers that have not yet seen ``state`` (key -> resourceVersion of a LIST at ``list_rv``).

        Seen means: every listed object at that version or later, and nothing
        the LIST no longer had unless it came later -- so a watcher that has
        moved on (something else changed the Service meanwhile: read-only
        mode on a live cluster) counts as caught up.
        """
        async def check():
            out = []
            for w in watchers:
                missing = sorted(k for k, rv in state.items() if k not in w.view or older(w.view[k], rv))
                stale = sorted(k for k, rv in w.view.items() if k not in state and not older(list_rv, rv))
                if missing or stale:
                    out.append(f"{w.spec.group}#{w.index} (behind on {missing[:3]}"
                               f"{', still has ' + str(stale[:3]) if stale else ''}"
                               f"{'; ended: ' + w.ended if w.ended else ''})")
            return out
        return self._call(check())

    def stop(self) -> None:
        """Close every stream and the loop; safe to call twice."""
        if self.loop.is_closed():
            return

        async def close():
            for t in self._tasks:
                t.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            if self._session is not None:
                await self._session.close()
        try:
            self._call(close(), timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=30)
            self.loop.close()
