"""Credentials neither leave a run nor outlive it.

- A password in a URL (``--cp-prometheus-url http://user:pass@...``, a
  kubeconfig's ``server:``) is used, and shown nowhere: not in skip reasons,
  failure messages, progress lines, the junit XML, the Allure results or the
  Allure environment. The Prometheus here is a tiny local server that answers
  only with the right basic-auth credentials (so the run proves they were
  sent) and runs with looser limits than the profile (so a check fails and
  its message names the server).
- The copy of an existing cluster's API token that the embedded Prometheus
  scrapes with (``apiserver.token``) goes at the end of its run, and a run
  killed with SIGKILL leaves it only until the next run on this machine --
  any run, also one that starts no Prometheus.
"""
from __future__ import annotations

import base64
import http.server
import json
import os
import re
import shutil
import stat
import threading
import xml.etree.ElementTree as ET

import pytest
import yaml

from clusterproof.core import redact
from clusterproof.core.errors import HarnessError
from clusterproof.kube.access import HOME
from clusterproof.prometheus.client import Prom
from clusterproof.prometheus.server import runs_root
from clusterproof.provision import toolchain
from tests import guest
from tests.harness import background_pytest, ended_early, kill_run, private_cache, run_pytest
from tests.test_prometheus_bad_input import assert_nowhere
from tests.test_prometheus_cleanup import running_prometheus

PROM_SUITE = "suites/test_prometheus_limits.py"
SCALE = "suites/test_cluster_scale.py"
PROM_PASSWORD = "prom-pass-not-a-real-one"
KUBE_PASSWORD = "kube-pass-not-a-real-one"


class _BasicAuthPrometheus(http.server.BaseHTTPRequestHandler):
    """A Prometheus API that answers only ``user:PROM_PASSWORD`` (401 otherwise): build info, flags
    looser than any profile, and empty query results."""
    authorized: list[bool] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        want = "Basic " + base64.b64encode(f"user:{PROM_PASSWORD}".encode()).decode()
        ok = self.headers.get("Authorization") == want
        self.authorized.append(ok)
        path = self.path.split("?")[0]
        if not ok:
            status, body = 401, {"status": "error", "errorType": "unauthorized", "error": "credentials, please"}
        elif path == "/api/v1/status/buildinfo":
            status, body = 200, {"status": "success", "data": {"version": "0.0.0-fake"}}
        elif path == "/api/v1/status/flags":
            status, body = 200, {"status": "success", "data": {"query.timeout": "10m", "query.max-samples": "1",
                                                                "query.max-concurrency": "1000"}}
        elif path in ("/api/v1/query", "/api/v1/query_range"):
            status, body = 200, {"status": "success", "data": {"resultType": "vector", "result": []}}
        else:
            status, body = 404, {"status": "error", "errorType": "not_found", "error": path}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def basic_auth_prometheus():
    _BasicAuthPrometheus.authorized = []
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BasicAuthPrometheus)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield srv.server_address[1]
    finally:
        srv.shutdown()


def _with_password_in_server_url(cluster, directory):
    """The session cluster's kubeconfig, its server URL carrying user:KUBE_PASSWORD@ (which the
    kubernetes client ignores: the client certificate still authenticates)."""
    cfg = yaml.safe_load(cluster.kubeconfig.read_text())
    for c in cfg["clusters"]:
        c["cluster"]["server"] = c["cluster"]["server"].replace("https://", f"https://admin:{KUBE_PASSWORD}@", 1)
    directory.mkdir()
    path = directory / "kubeconfig-with-password"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _skip_reasons(run_dir) -> list[str]:
    return [s.get("message", "") for s in ET.parse(run_dir / "junit.xml").getroot().iter("skipped")]


@pytest.mark.cluster
def test_passwords_in_urls_are_used_but_never_shown(cluster, basic_auth_prometheus, tmp_path):
    port = basic_auth_prometheus
    kubeconfig = _with_password_in_server_url(cluster, tmp_path / "input")
    out = tmp_path / "run"     # everything the run writes: junit XML, Allure results, summary
    out.mkdir()
    run = run_pytest([PROM_SUITE, "--cp-kubeconfig", str(kubeconfig), "--cp-profile", cluster.profile.name,
                      "--cp-prometheus-url", f"http://user:{PROM_PASSWORD}@127.0.0.1:{port}/", "-rs",
                      "-k", "profile_query_limits or seed_query_is_cut or latency_by_promql"], out, timeout=600)
    # The run got past the configure-time check (credentials sent as basic auth) and reached the checks:
    assert any(_BasicAuthPrometheus.authorized), run.output[-3000:]
    assert all(_BasicAuthPrometheus.authorized), "a request went to Prometheus without its credentials"
    # ... where a failure, two kinds of skip reason and the report's environment name the servers:
    limits = run.failed("test_prometheus_runs_with_the_profile_query_limits")
    assert limits and f"at http://127.0.0.1:{port} runs with looser limits" in next(iter(limits.values())), \
        run.output[-3000:]
    reasons = _skip_reasons(out)
    heavy = f"sends the seed's pathological queries to the Prometheus at http://***@127.0.0.1:{port}/, which"
    assert any(r.startswith(heavy) for r in reasons), reasons
    assert any(r.startswith(f"the Prometheus at http://127.0.0.1:{port} holds no") for r in reasons), reasons
    env = (out / "allure" / "environment.properties").read_text()
    assert "api.server=https://***@127.0.0.1:" in env, env
    assert "using existing cluster at https://***@127.0.0.1:" in run.output, run.output[-3000:]
    for secret in (PROM_PASSWORD, KUBE_PASSWORD):
        assert_nowhere(secret, run, out)


@pytest.fixture
def token_kubeconfig(cluster, run_id, tmp_path):
    """A kubeconfig of this session's cluster that authenticates with a bearer token (a ServiceAccount
    bound to cluster-admin): what the embedded Prometheus copies to ``apiserver.token``."""
    sa = f"cp-token-{run_id[-4:]}"
    docs = [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": HOME}},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": sa},
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
             "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": HOME}]}]
    with guest.applied(cluster.api, docs):
        yield guest.kubeconfig_for(cluster.api, tmp_path, name=sa)


@pytest.mark.parametrize("end", ["normal-end", "sigkill"])
@pytest.mark.cluster
def test_the_copy_of_the_api_token_never_outlives_its_run(end, cluster, token_kubeconfig, api_guard, tmp_path):
    path, token = token_kubeconfig
    run_id = f"tok-{os.urandom(2).hex()}"
    # The run and "the next run" share a cache of their own: no run of another parallel worker sweeps first.
    cache = private_cache(tmp_path)
    env = {"CLUSTERPROOF_CACHE": str(cache)}
    directory = cache / runs_root().relative_to(toolchain.cache_root()) / f"cp-{run_id}"
    copy = directory / "apiserver.token"
    args = [PROM_SUITE, "--cp-kubeconfig", str(path), "--cp-profile", cluster.profile.name, "--cp-run-id", run_id,
            "-k", "test_a_cheap_query_answers"]
    for d in ("run", "next"):
        (tmp_path / d).mkdir()
    try:
        with background_pytest(args, tmp_path / "run", env=env) as proc:
            running_prometheus(proc, directory)
            ended_early(proc)
            assert copy.read_text() == token, "the embedded Prometheus does not scrape with the run's token"
            assert stat.S_IMODE(copy.stat().st_mode) == 0o600, oct(copy.stat().st_mode)
            if end == "sigkill":
                kill_run(proc, api_guard)
            out, _ = proc.communicate(timeout=300)
        if end == "normal-end":
            assert proc.returncode == 0, out[-3000:]
            assert not directory.exists(), f"{directory} left behind by a run that ended normally:\n{out[-2000:]}"
            return
        assert copy.exists(), "SIGKILL cannot clean up: the copy should still be there"
        # The next run on this machine: one that starts no Prometheus at all.
        nxt = run_pytest([SCALE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", cluster.profile.name,
                          "-k", "test_every_planned_node_is_registered"], tmp_path / "next", timeout=600, env=env)
        assert nxt.returncode == 0, nxt.output[-3000:]
        assert not directory.exists(), f"the next run left the killed run's token copy in {directory}"
        swept = rf"swept \d+ abandoned Prometheus director\(ies\).*cp-{run_id}"
        assert re.search(swept, nxt.output), nxt.output[-3000:]
        assert token not in nxt.output
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("given,shown", [
    pytest.param("http://user:secret@prom:9090/x", "http://***@prom:9090/x", id="basic-auth"),
    pytest.param("https://u:p@ss@h:9/x?q=a@b", "https://***@h:9/x?q=a@b", id="at-sign-in-password"),
    pytest.param("https://token@h", "https://***@h", id="user-only"),
    pytest.param("http://h:9/p@x", "http://h:9/p@x", id="at-sign-in-path-only"),
    pytest.param("user:secret@prom:9090", "***@prom:9090", id="no-scheme"),
    pytest.param("cannot reach http://a:b@h/ (see https://c:d@e)", "cannot reach http://***@h/ (see https://***@e)",
                 id="urls-in-text"),
])
@pytest.mark.unit
def test_a_urls_userinfo_is_masked_wherever_it_is_shown(given, shown):
    assert redact.url(given) == shown
    if "://" in given:   # a one-line error masks every URL in it (free text has no schemeless URLs)
        assert str(HarnessError(f"cannot reach {given}")) == f"cannot reach {shown}"


@pytest.mark.cluster
def test_the_prometheus_client_sends_url_credentials_as_basic_auth_and_keeps_a_clean_url():
    prom = Prom("http://us%40er:se%3Acret@127.0.0.1:9/")
    assert prom.url == "http://127.0.0.1:9"
    assert prom.session.auth == ("us@er", "se:cret") and prom.clone().session.auth == ("us@er", "se:cret")
    assert Prom("http://127.0.0.1:9").session.auth is None
