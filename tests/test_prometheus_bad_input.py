"""A wrong ``--cp-prometheus-url`` ends the run before any test: one readable line, exit 4.

No cluster is needed (the check runs at configure time). The endpoints that
are not a Prometheus are tiny local HTTP servers (a web page, one that
wants credentials); the bearer token given must never be printed, nor the
password of a URL that carries one (``http://user:pass@...``): not on the
terminal, not in the junit XML, not in any Allure result file.
"""
from __future__ import annotations

import http.server
import socket
import threading

import pytest

from tests.harness import run_pytest
from tests.test_bad_input import assert_one_line_error

pytestmark = pytest.mark.control
SUITE = "suites/test_prometheus_limits.py"
SECRET = "not-a-real-token"


class _Page(http.server.BaseHTTPRequestHandler):
    status, body = 200, b"<html><body>Welcome to the dashboard</body></html>"

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.send_response(self.status)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


class _Unauthorized(_Page):
    status, body = 401, b'{"message":"Unauthorized"}'


@pytest.fixture
def serve():
    servers = []

    def start(handler) -> str:
        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"
    yield start
    for srv in servers:
        srv.shutdown()


def _token(tmp_path) -> str:
    p = tmp_path / "token"
    p.write_text(SECRET)
    return str(p)


def _closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def assert_nowhere(secret: str, run, tmp_path) -> None:
    """``secret`` is in neither the run's output nor any file it wrote (junit XML, Allure results)."""
    assert secret not in run.output, run.output[-2000:]
    files = [f for f in tmp_path.rglob("*") if f.is_file() and f.name not in ("token",)]
    leaked = [str(f) for f in files if secret.encode() in f.read_bytes()]
    assert not leaked, f"{secret!r} written to {leaked}"


@pytest.mark.parametrize("url,expected", [
    pytest.param("http://[::1", "does not parse as a URL (Invalid IPv6 URL)", id="unclosed-ipv6"),
    pytest.param("ftp://x", "has scheme 'ftp', not http or https", id="not-http"),
    pytest.param("not a url", "has no scheme, not http or https", id="not-a-url"),
    pytest.param("http://127.0.0.1:99999", "does not parse as a URL (Port out of range", id="bad-port"),
    pytest.param("http://user:not-a-real-token@[::1", "'http://***@[::1' does not parse as a URL",
                 id="unparseable-with-credentials"),
])
def test_a_prometheus_url_that_does_not_parse(url, expected, tmp_path):
    run = run_pytest([SUITE, "--cp-prometheus-url", url], tmp_path, timeout=120)
    assert_one_line_error(run, expected)
    assert "e.g. http://prometheus:9090" in run.output
    assert_nowhere(SECRET, run, tmp_path)


def test_the_password_of_an_unreachable_prometheus_url_is_never_shown(tmp_path):
    port = _closed_port()
    run = run_pytest([SUITE, "--cp-prometheus-url", f"http://user:{SECRET}@127.0.0.1:{port}"], tmp_path, timeout=120)
    assert_one_line_error(run, f"cannot reach Prometheus at http://127.0.0.1:{port}")
    assert_nowhere(SECRET, run, tmp_path)


def test_unreachable_prometheus_url(tmp_path):
    run = run_pytest([SUITE, "--cp-prometheus-url", "http://127.0.0.1:1", "--cp-prometheus-token-file",
                      _token(tmp_path)], tmp_path, timeout=120)
    assert_one_line_error(run, "cannot reach Prometheus at http://127.0.0.1:1")


def test_an_endpoint_that_is_not_prometheus(serve, tmp_path):
    url = serve(_Page)
    run = run_pytest([SUITE, "--cp-prometheus-url", url], tmp_path, timeout=120)
    assert_one_line_error(run, f"{url} is not a Prometheus API (GET /api/v1/status/buildinfo answered 200")


def test_refused_credentials(serve, tmp_path):
    url = serve(_Unauthorized)
    run = run_pytest([SUITE, "--cp-prometheus-url", url, "--cp-prometheus-token-file", _token(tmp_path)], tmp_path,
                     timeout=120)
    assert_one_line_error(run, f"Prometheus at {url} answered 401 (unauthorized)")
    assert SECRET not in run.output


@pytest.mark.parametrize("args,expected", [
    pytest.param(["--cp-prometheus-ca-file", "/nonexistent/ca.crt"], "need --cp-prometheus-url", id="ca-without-url"),
    pytest.param(["--cp-prometheus-url", "http://127.0.0.1:1", "--cp-prometheus-token-file", "/nonexistent/token"],
                 "--cp-prometheus-token-file /nonexistent/token", id="missing-token-file"),
    pytest.param(["--cp-set", "prometheus_query_timeout=soon"], "prometheus_query_timeout 'soon' is not a Prometheus "
                 "duration", id="bad-timeout"),
    pytest.param(["--cp-set", "prometheus_backfill_minutes=500"], "prometheus_backfill_minutes must be <= 118",
                 id="history-longer-than-a-block"),
])
def test_bad_prometheus_options(args, expected, tmp_path):
    assert_one_line_error(run_pytest([SUITE, *args], tmp_path, timeout=120), expected)
