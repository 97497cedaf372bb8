"""A locust User for the Kubernetes API.

Why its own User: locust's statistics (percentiles, failures, CSV/JSON,
distributed aggregation) are what the suites read, so every API call must be
one locust request event with a few fixed names ("create pod", "list pods",
"create podgroup") -- never one name per object, or the stats table would
have a row per pod.

Identity: a bearer token of a ServiceAccount (``clusterproof.kube.tokens``), read from a
file so it never appears on a command line or in a log. In locust's distributed mode a worker on
another host uses its own ``--kube-*`` values if given, else the token and CA the master forwards
(``load/workers.py``). The admin
certificate is in ``system:masters``, which API Priority and Fairness
exempts; load sent with it would never see a 429.

Failures (4xx/5xx, including 429 with its Retry-After) are recorded as
locust failures, not raised: a rejected create is data, and client-go
itself retries a 429 after Retry-After, so ``create`` does the same within a
bound.
"""
from __future__ import annotations

import csv
import json
import os
import random
import ssl

import gevent
from locust import FastHttpUser, constant, events
from locust.stats import PERCENTILES_TO_REPORT, StatsCSV

from clusterproof.load import workers

TOKEN_FILE_ENV = "CLUSTERPROOF_KUBE_TOKEN_FILE"
CA_FILE_ENV = "CLUSTERPROOF_KUBE_CA_FILE"


@events.init_command_line_parser.add_listener
def _kube_args(parser):
    parser.add_argument("--kube-token-file", default=os.environ.get(TOKEN_FILE_ENV, ""),
                        help="file holding the bearer token (a ServiceAccount's, never an exempt admin)")
    parser.add_argument("--kube-ca-file", default=os.environ.get(CA_FILE_ENV, ""),
                        help="CA bundle of the API server (default: do not verify)")
    parser.add_argument("--kube-server", default=os.environ.get("CLUSTERPROOF_KUBE_SERVER", ""),
                        help="API server URL as this host reaches it (a worker: default the master's --host)")
    parser.add_argument("--kube-tls-server-name", default="",
                        help="name to verify the API server's certificate against, when the URL's host is not in "
                             "it (kubectl's tls-server-name), e.g. kubernetes")
    parser.add_argument("--kube-max-retries", type=int, default=5,
                        help="retries of a 429 after its Retry-After (client-go retries 429s too)")
    parser.add_argument("--kube-impersonate-user", default="",
                        help="send every request as this user (Impersonate-User; the token's identity must "
                             "be allowed to impersonate it)")
    parser.add_argument("--kube-impersonate-group", default="",
                        help="... in this group (one: a dict of headers holds one Impersonate-Group)")


_ENV = {}


@events.init.add_listener
def _remember(environment, **_kw):
    _ENV["environment"] = environment


def locust_environment():
    """The running locust Environment (set when locust starts); None before."""
    return _ENV.get("environment")


@events.quit.add_listener
def _final_csv(exit_code, **_kw):
    """Write locust's own final statistics to ``<csv>_final_stats.csv`` / ``_final_failures.csv``.

    Why: locust's periodic CSV writer runs once a second, so a burst that
    ends between two writes loses its last requests from ``<csv>_stats.csv``.
    These rows come from the same locust code (``StatsCSV``), after the run.
    """
    env = locust_environment()
    prefix = getattr(env.parsed_options, "csv_prefix", None) if env and env.parsed_options else None
    if not prefix or workers.kind(env.runner) == "worker":
        return
    writer = StatsCSV(env, PERCENTILES_TO_REPORT)
    with open(f"{prefix}_final_stats.csv", "w", newline="") as f:
        writer.requests_csv(csv.writer(f))
    with open(f"{prefix}_final_failures.csv", "w", newline="") as f:
        writer.failures_csv(csv.writer(f))


def finish_runner(environment) -> None:
    """Quit this locust process once its share of the load is done.

    A worker first sends its last statistics (its reporter only runs every
    3 s); ``quit()`` stops every user greenlet, so it runs in its own.
    """
    runner = environment.runner

    def _quit():
        if workers.kind(runner) == "worker":
            runner._send_stats()
        runner.quit()
    gevent.spawn_later(0.1, _quit)


def _read_token(opts) -> str:
    path = getattr(opts, "kube_token_file", "") if opts else os.environ.get(TOKEN_FILE_ENV, "")
    if path:
        with open(path) as f:
            return f.read().strip()
    forwarded = getattr(opts, "kube_token_value", "") if opts else ""
    if not forwarded:
        raise RuntimeError(f"no token: pass --kube-token-file or set {TOKEN_FILE_ENV}")
    return forwarded


def ssl_context(cafile: str = "", cadata: str = "", server_name: str = ""):
    """Verify the API server against its CA (a file, or the PEM the master forwarded), hostname checks on;
    against ``server_name`` instead of the URL's host when given (the certificate's name for it)."""
    ctx = ssl.create_default_context(cafile=cafile or None, cadata=cadata or None)
    if server_name:
        wrap = ctx.wrap_socket
        ctx.wrap_socket = lambda sock, *a, server_hostname=None, **kw: wrap(sock, *a, server_hostname=server_name,
                                                                           **kw)
    return ctx


class KubeApiUser(FastHttpUser):
    """Base class: JSON calls against the API server with fixed request names."""

    abstract = True
    # One request at a time per user; concurrency comes from the user count.
    concurrency = 1
    wait_time = constant(0)
    network_timeout = 60.0
    connection_timeout = 10.0

    def __init__(self, environment):
        workers.restore_local(environment)    # a rebalance's spawn message brought the master's values again
        opts = environment.parsed_options
        ca = getattr(opts, "kube_ca_file", "") if opts else ""
        pem = getattr(opts, "kube_ca_pem", "") if opts and not ca else ""
        if ca or pem:
            # Verify the server against its own CA (hostname checks stay on).
            self.insecure = False
            name = getattr(opts, "kube_tls_server_name", "")
            self.ssl_context_factory = lambda: ssl_context(ca, pem, name)
        if opts and getattr(opts, "kube_server", ""):
            self.host = opts.kube_server          # this host's way to the API server (a worker elsewhere)
        super().__init__(environment)
        token = _read_token(opts)
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                         "Accept": "application/json", **impersonation(opts)}
        self.max_retries = getattr(opts, "kube_max_retries", 5) if opts else 5
        self.rejected_429 = 0
        # Added to every Retry-After wait, uniformly 0..this (s): users started together would otherwise
        # come back together, as one herd (load/flood.py sets it; 0 keeps the wait exact).
        self.retry_jitter_s = 0.0

    def observe(self, resp) -> None:
        """Every response, before it is judged (a subclass reads its headers, e.g. APF's)."""

    def call(self, method: str, path: str, name: str, body: dict | None = None,
             ok: tuple[int, ...] = (200, 201), attempts: int | None = None,
             honour_retry_after: bool = True) -> tuple[int, dict | None]:
        """One API request as one locust event named ``name``; returns (status, decoded body).

        A 429 is recorded as a failure carrying its Retry-After; the call is
        then retried after that many seconds (at once if not
        ``honour_retry_after``: a client that ignores it), ``attempts`` times in
        all (default ``max_retries`` + 1).
        """
        data = json.dumps(body) if body is not None else None
        for _attempt in range(attempts or self.max_retries + 1):
            with self.client.request(method, path, name=name, data=data, headers=self._headers,
                                     catch_response=True) as resp:
                self.observe(resp)
                status = resp.status_code or 0
                if status in ok:
                    resp.success()
                    try:
                        return status, json.loads(resp.content) if resp.content else None
                    except ValueError:
                        return status, None
                if status == 429:
                    retry_after = resp.headers.get("Retry-After", "") if resp.headers else ""
                    # The failure text is the stats key: keep it coarse (no object names).
                    resp.failure(f"429 Too Many Requests (Retry-After: {retry_after or 'none'})")
                    self.rejected_429 += 1
                    try:
                        wait = float(retry_after)
                    except ValueError:
                        wait = 1.0
                    # APF's Retry-After is at most 32 s; yield even when retrying at once.
                    gevent.sleep(min(max(wait, 0.1), 32.0) + random.uniform(0, self.retry_jitter_s)
                                 if honour_retry_after else 0)
                    continue
                reason = _reason(resp.content) if status else str(resp.error or "no response")
                resp.failure(f"{status} {reason}" if status else reason)
                return status, None
        return 429, None


def impersonation(opts) -> dict[str, str]:
    """Impersonate-User/-Group headers from --kube-impersonate-user/-group (none by default).

    The apiserver classifies (APF) and authorizes the request as that user;
    the token's own identity needs ``impersonate`` on exactly that user and
    group. It takes several groups as repeated headers only, so one here.
    """
    user = getattr(opts, "kube_impersonate_user", "") if opts else ""
    group = getattr(opts, "kube_impersonate_group", "") if opts else ""
    if not user:
        return {}
    return {"Impersonate-User": user, **({"Impersonate-Group": group} if group else {})}


def _reason(content: bytes | None) -> str:
    """The Status reason of an API error ("AlreadyExists", "Forbidden"), not its per-object message."""
    try:
        return json.loads(content or b"{}").get("reason") or "error"
    except ValueError:
        return "error"
