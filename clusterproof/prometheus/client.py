"""The harness's Prometheus client: never retries, and always shows what Prometheus said.

Why: prometheus-api-client 0.7.2 mounts ``Retry(total=3, backoff_factor=1,
status_forcelist=[408, 429, 500, 502, 503, 504])`` on every session it
makes. A query cut by ``--query.timeout`` answers 503; the library sends it
four times (each waiting out the timeout again: a Prometheus under the seed's
load got 4x the pathological queries) and then raises ``RetryError`` with
the body, and with it Prometheus' ``errorType``, lost. The harness builds
the ``PrometheusConnect`` with a retry of ``total=0`` and its own
``requests.Session`` (bearer token, CA), and reads every answer itself:
status, ``errorType``, ``error``, warnings, stats, elapsed time.

The library's ``timeout=`` is the HTTP client's; Prometheus' own per-query
timeout is the ``timeout`` *parameter* (``params={"timeout": ...}``),
capped by ``--query.timeout``. Both are explicit here (``wait_s`` and
``timeout``).

Bad input (``--cp-prometheus-url``): a URL that does not parse, an unreachable
URL, an endpoint that is not a Prometheus, or refused credentials become one
line (``HarnessError``), never a traceback; the token is never printed.
Basic-auth credentials in the URL (``http://user:pass@host``) are taken out
of it at once: the client sends them as a header and its ``url`` -- the one
every message and report shows -- never holds them (``clusterproof.core.redact``).
"""
from __future__ import annotations

import ast
import json
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from clusterproof.core import redact
from clusterproof.core.errors import HarnessError
from clusterproof.core.waiting import wait_for
from clusterproof.kube.client import short_reason

# No retry of any kind: connection errors raise at once, 5xx answers are returned as they are.
NO_RETRY = Retry(total=0, connect=0, read=0, redirect=0, status=0, other=0, raise_on_status=False,
                 status_forcelist=())
# Deadline errors as Prometheus words them: 503 "query timed out in <stage>", or (a deadline
# hit while the storage expands series, or while the query is parsed) "context deadline exceeded".
DEADLINE = re.compile(r"timed out|deadline exceeded")
TOO_MANY_SAMPLES = "would load too many samples"
# Series answers up to this size are parsed; larger ones are counted as they stream.
PARSE_BYTES = 8 << 20


@dataclass
class Answer:
    """One answer of the Prometheus HTTP API, as it came."""
    status: int
    elapsed_s: float
    error_type: str = ""
    error: str = ""
    data: object = None
    warnings: list[str] = field(default_factory=list)
    nbytes: int = 0

    @property
    def ok(self) -> bool:
        return self.status == 200 and not self.error_type

    @property
    def deadline(self) -> bool:
        """Cut by a deadline: 503 ``timeout``, or 422 ``execution`` with a deadline message."""
        return ((self.status == 503 and self.error_type == "timeout")
                or (self.status == 422 and self.error_type == "execution" and bool(DEADLINE.search(self.error))))

    @property
    def too_many_samples(self) -> bool:
        return self.status == 422 and self.error_type == "execution" and TOO_MANY_SAMPLES in self.error

    @property
    def in_queue(self) -> bool:
        return self.deadline and "query queue" in self.error

    @property
    def stats(self) -> dict:
        return (self.data or {}).get("stats", {}) if isinstance(self.data, dict) else {}

    def samples(self) -> tuple[int | None, int | None]:
        """(totalQueryableSamples, peakSamples) from ``stats=all`` (None without stats)."""
        s = self.stats.get("samples", {})
        return s.get("totalQueryableSamples"), s.get("peakSamples")

    def __str__(self) -> str:
        if self.ok:
            total, peak = self.samples()
            extra = f", {total:,} samples read, peak {peak:,}" if total is not None else ""
            return f"200 success after {self.elapsed_s:.2f} s ({self.nbytes:,} bytes{extra})"
        return f"{self.status} {self.error_type or '?'} after {self.elapsed_s:.2f} s: {self.error or '(no error text)'}"


def answer_from(status: int, body: bytes, elapsed_s: float) -> Answer:
    """An ``Answer`` from a status and a body (JSON or not; a proxy's HTML is shown, shortened)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        text = body[:200].decode(errors="replace").strip()
        return Answer(status, elapsed_s, "" if status == 200 else "not-json", text, nbytes=len(body))
    if not isinstance(doc, dict):
        return Answer(status, elapsed_s, "not-prometheus", str(doc)[:200], nbytes=len(body))
    return Answer(status, elapsed_s, doc.get("errorType", ""), doc.get("error", ""), doc.get("data"),
                  list(doc.get("warnings") or []), len(body))


_LIBRARY_ERROR = re.compile(r"^HTTP Status Code (\d+) \((b'.*'|b\".*\")\)$", re.S)


def from_library_error(e: PrometheusApiClientException, elapsed_s: float) -> Answer:
    """prometheus-api-client's exception ("HTTP Status Code 503 (b'{...}')") made readable again."""
    m = _LIBRARY_ERROR.match(str(e))
    if not m:
        return Answer(0, elapsed_s, "client", str(e)[:300])
    return answer_from(int(m[1]), ast.literal_eval(m[2]), elapsed_s)


def session(token_file: str | None = None, ca_file: str | None = None) -> requests.Session:
    """A requests session with the bearer token and CA (read once; the token is never shown)."""
    s = requests.Session()
    if token_file:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as e:
            raise HarnessError(f"--cp-prometheus-token-file {token_file}: {e.strerror}; give a readable file "
                               "holding the bearer token") from None
        s.headers["Authorization"] = f"Bearer {token}"
    if ca_file:
        if not Path(ca_file).expanduser().is_file():
            raise HarnessError(f"--cp-prometheus-ca-file {ca_file} does not exist: give the CA bundle that "
                               "signed the Prometheus server's certificate")
        s.verify = str(Path(ca_file).expanduser())
    return s


def checked_url(url: str) -> str:
    """``url`` if it is an http(s) URL with a host (and a valid port), else one line saying what is wrong
    and how to fix it -- naming the URL without its credentials."""
    shown = redact.url(url)
    fix = "--cp-prometheus-url must be the Prometheus server's base URL, e.g. http://prometheus:9090"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number in 0..65535
    except ValueError as e:
        raise HarnessError(f"--cp-prometheus-url {shown!r} does not parse as a URL ({redact.text(str(e))}): "
                           f"{fix}") from None
    if parts.scheme not in ("http", "https"):
        got = f"scheme {parts.scheme!r}" if parts.scheme else "no scheme"
        raise HarnessError(f"--cp-prometheus-url {shown!r} has {got}, not http or https: {fix}")
    if not parts.hostname:
        raise HarnessError(f"--cp-prometheus-url {shown!r} names no host: {fix}")
    return url


class Prom:
    """A Prometheus HTTP API, through prometheus-api-client with retries off."""

    def __init__(self, url: str, token_file: str | None = None, ca_file: str | None = None):
        # Credentials in the URL become the session's basic auth: self.url is safe to show anywhere.
        self.url, self._basic_auth = redact.split_userinfo(checked_url(url).rstrip("/"))
        self.token_file, self.ca_file = token_file, ca_file
        self.session = session(token_file, ca_file)
        self.session.auth = self._basic_auth
        # The library mounts its retry adapter on this session for self.url: ours does nothing.
        self.api = PrometheusConnect(self.url, session=self.session, retry=NO_RETRY)

    def clone(self) -> "Prom":
        """Another client of the same server (a session per thread)."""
        other = Prom(self.url, self.token_file, self.ca_file)
        other.session.auth = other._basic_auth = self._basic_auth
        return other

    def get(self, path: str, params: dict | list | None = None, wait_s: float = 30.0) -> Answer:
        """GET an API path; ``wait_s`` bounds the HTTP wait (a ``requests`` timeout raises)."""
        t0 = time.monotonic()
        r = self.session.get(f"{self.url}{path}", params=params, timeout=wait_s)
        return answer_from(r.status_code, r.content, time.monotonic() - t0)

    def query(self, expr: str, at: float | None = None, timeout: str | None = None, wait_s: float = 30.0,
              stats: bool = False) -> Answer:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        if timeout:
            params["timeout"] = timeout
        if stats:
            params["stats"] = "all"
        return self.get("/api/v1/query", params, wait_s)

    def query_range(self, expr: str, start: float, end: float, step_s: float, timeout: str | None = None,
                    wait_s: float = 30.0, stats: bool = False) -> Answer:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        if timeout:
            params["timeout"] = timeout
        if stats:
            params["stats"] = "all"
        return self.get("/api/v1/query_range", params, wait_s)

    def series_count(self, match: str, limit: int | None = None, wait_s: float = 120.0) -> tuple[Answer, int]:
        """/api/v1/series, read as a stream: (answer, series in it); ``answer.data`` is dropped.

        Why a stream: the seed's ``{le!=""}`` answers every bucket series of
        the cluster (~200 MB at 7,500 nodes); above ``PARSE_BYTES`` the harness
        counts them (one JSON object each) instead of building them in memory.
        """
        params = [("match[]", match)] + ([("limit", str(limit))] if limit else [])
        t0 = time.monotonic()
        with self.session.get(f"{self.url}/api/v1/series", params=params, timeout=wait_s, stream=True) as r:
            count, nbytes, kept, prev = 0, 0, [], b""
            for chunk in r.iter_content(1 << 20):
                nbytes += len(chunk)
                if nbytes <= PARSE_BYTES:
                    kept.append(chunk)
                # '{"' opens every series object (and the envelope); the two bytes of the previous
                # chunk's end are only there to catch one split across chunks.
                count += (prev[-1:] + chunk).count(b'{"')
                prev = chunk
            last = prev[-4096:]
            elapsed = time.monotonic() - t0
        if nbytes <= PARSE_BYTES:
            a = answer_from(r.status_code, b"".join(kept), elapsed)
            n = len(a.data) if a.ok and isinstance(a.data, list) else 0
        else:
            a = Answer(r.status_code, elapsed, nbytes=nbytes)
            # warnings (e.g. "results truncated due to limit") follow the data
            a.warnings = re.findall(r'"([^"]*truncated[^"]*)"', last.decode(errors="replace"))
            n = count - 1
        a.data = None
        return a, n

    def flags(self) -> dict[str, str]:
        a = self.get("/api/v1/status/flags", wait_s=10)
        if not a.ok:
            raise HarnessError(f"{self.url}/api/v1/status/flags answered {a}")
        return a.data

    def buildinfo(self) -> dict:
        a = self.get("/api/v1/status/buildinfo", wait_s=10)
        return a.data if a.ok and isinstance(a.data, dict) else {}

    def own_metric(self, name: str, wait_s: float = 10.0) -> float | None:
        """A figure from the server's own /metrics: ``name`` is a series as the text format writes it
        (``process_resident_memory_bytes``, ``x_sum{slice="queue_time"}``)."""
        r = self.session.get(f"{self.url}/metrics", timeout=wait_s)
        if r.status_code != 200:
            return None
        for line in r.text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def settled(self, expr: str, at: float | None = None, within_s: float = 30.0) -> Answer:
        """A measurement read (``up`` over a window, a scrape time): asked again, in the open, while
        Prometheus cuts it at its deadline (a small ``--query.timeout`` on a busy machine), for at most
        ``within_s``; the last answer otherwise (the caller shows it)."""
        try:
            return wait_for(lambda: self.query(expr, at=at, wait_s=within_s), until=lambda a: not a.deadline,
                            timeout=within_s, interval=0.2, what=f"Prometheus answering {expr}")
        except AssertionError:
            return self.query(expr, at=at, wait_s=within_s)

    def custom_query(self, expr: str, wait_s: float = 30.0) -> list:
        """The library's own ``custom_query`` (no retries), its error made readable (``PromQueryError``)."""
        t0 = time.monotonic()
        try:
            return self.api.custom_query(expr, timeout=wait_s)
        except PrometheusApiClientException as e:
            raise PromQueryError(from_library_error(e, time.monotonic() - t0), expr) from None


class PromQueryError(Exception):
    def __init__(self, answer: Answer, expr: str):
        super().__init__(f"Prometheus refused {expr!r}: {answer}")
        self.answer = answer


def check_reachable(prom: Prom) -> dict:
    """The endpoint is a Prometheus that accepts our credentials: its build info, or one line."""
    where = prom.url
    try:
        a = prom.get("/api/v1/status/buildinfo", wait_s=10)
    except requests.exceptions.SSLError as e:
        raise HarnessError(f"cannot talk to Prometheus at {where} (TLS: {short_reason(e)}): pass "
                           "--cp-prometheus-ca-file with the CA that signed its certificate") from None
    except requests.exceptions.RequestException as e:
        raise HarnessError(f"cannot reach Prometheus at {where} ({short_reason(e)}): check --cp-prometheus-url and "
                           "that Prometheus is up") from None
    if a.status in (401, 403):
        raise HarnessError(f"Prometheus at {where} answered {a.status} "
                           f"({'unauthorized' if a.status == 401 else 'forbidden'}) "
                           "to GET /api/v1/status/buildinfo: pass --cp-prometheus-token-file with a token it accepts")
    if not a.ok or not isinstance(a.data, dict) or "version" not in a.data:
        got = f"{a.status} {a.error_type}".strip() if a.status != 200 else "200 without a Prometheus build info"
        raise HarnessError(f"{where} is not a Prometheus API (GET /api/v1/status/buildinfo answered {got}): "
                           "--cp-prometheus-url must be the server's base URL, e.g. http://prometheus:9090")
    return a.data
