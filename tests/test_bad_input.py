"""Bad input ends the run before any test with one readable line and exit 4.

Each case runs pytest as a user would; none of them needs a cluster, and none
may print a traceback.
"""
from __future__ import annotations

import os
import shutil

import pytest
import yaml

from tests.harness import assert_one_line, run_pytest

pytestmark = pytest.mark.control
SUITE = "suites/test_cluster_scale.py"


def _kubeconfig(tmp_path, server="https://127.0.0.1:1", contexts=("only",), cluster=None, user=None):
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": contexts[0],
           "clusters": [{"name": "c", "cluster": cluster or {"server": server, "insecure-skip-tls-verify": True}}],
           "users": [{"name": "u", "user": {"token": "not-a-real-token", **(user or {})}}],
           "contexts": [{"name": n, "context": {"cluster": "c", "user": "u"}} for n in contexts]}
    p = tmp_path / "kubeconfig"
    p.write_text(yaml.safe_dump(cfg))
    return p


def assert_one_line_error(run, expected: str):
    assert_one_line(run, expected)
    assert "not-a-real-token" not in run.output


# Not base64: decoders skip "-" and "!", which leaves 13 characters -- no whole number of bytes. It is
# also the "token" assert_one_line_error looks for: the value must never be printed.
BAD_BASE64 = "not-a-real-token!"

CASES = [
    pytest.param(lambda t: ["--cp-kubeconfig", str(t / "nope")], "does not exist", id="missing-kubeconfig"),
    pytest.param(lambda t: ["--cp-kubeconfig", str(_garbage(t))], "cannot be parsed", id="malformed-kubeconfig"),
    pytest.param(lambda t: ["--cp-kubeconfig", str(_kubeconfig(t)), "--cp-context", "other"],
                 "context 'other' is not in", id="unknown-context"),
    pytest.param(lambda t: ["--cp-kubeconfig", str(_kubeconfig(t))],
                 "cannot reach the API server at https://127.0.0.1:1", id="unreachable-server"),
    pytest.param(lambda t: ["--cp-profile", "nope"], "unknown profile 'nope'", id="unknown-profile"),
    pytest.param(lambda t: ["--cp-profile", str(_bad_profile(t))], "is not valid YAML", id="malformed-profile"),
    pytest.param(lambda t: ["--cp-set", "nodes=many"], "nodes must be int", id="bad-override"),
    pytest.param(lambda t: ["--cp-set", "teams=a,b,c,d", "--cp-set", "nodes=2"], "would get no nodes",
                 id="team-without-nodes"),
    # A *-data field that is not base64 (the value, which may be a private key, is never shown).
    pytest.param(lambda t: ["--cp-kubeconfig", str(_kubeconfig(t, cluster={
        "server": "https://127.0.0.1:1", "certificate-authority-data": BAD_BASE64}))],
        "certificate-authority-data of cluster 'c' is not valid base64", id="ca-data-not-base64"),
    pytest.param(lambda t: ["--cp-kubeconfig", str(_kubeconfig(t, user={"client-certificate-data": BAD_BASE64}))],
                 "client-certificate-data of user 'u' is not valid base64", id="client-cert-data-not-base64"),
    pytest.param(lambda t: ["--cp-kubeconfig", str(_kubeconfig(t, user={"client-key-data": BAD_BASE64}))],
                 "client-key-data of user 'u' is not valid base64", id="client-key-data-not-base64"),
    pytest.param(lambda t: ["--cp-profile", str(_latin1_profile(t))], "is not UTF-8 text", id="profile-not-utf8"),
    pytest.param(lambda t: ["--cp-as-real-cluster"], "as-real-cluster needs --", id="as-real-without-cluster"),
    # Credentials in the kubeconfig's server URL are masked in the line that names the server.
    pytest.param(lambda t: ["--cp-kubeconfig", str(_kubeconfig(t, server="https://admin:not-a-real-token@127.0.0.1:1"))],
                 "cannot reach the API server at https://***@127.0.0.1:1", id="server-url-with-credentials"),
]


def _garbage(t):
    p = t / "garbage"
    p.write_text("{{{ this is : not : yaml")
    return p


def _latin1_profile(t):
    p = t / "latin1.yaml"
    p.write_bytes("# Équipe réseau\nnodes: 100\n".encode("latin-1"))
    return p


def _bad_profile(t):
    p = t / "bad.yaml"
    p.write_text("nodes: [1,\n")
    return p


@pytest.mark.parametrize("args,expected", CASES)
def test_bad_input_gives_one_readable_line(args, expected, tmp_path):
    assert_one_line_error(run_pytest([SUITE, *args(tmp_path)], tmp_path, timeout=120), expected)


def test_missing_toolchain_gives_one_readable_line(tmp_path):
    """No cached binaries and no Go: the embedded cluster cannot be built."""
    go_dir = os.path.dirname(shutil.which("go") or "/nonexistent/go")
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep)
                           if d != go_dir and not os.path.exists(f"{d}/go"))
    run = run_pytest([SUITE], tmp_path, timeout=120,
                     env={"PATH": path, "CLUSTERPROOF_CACHE": str(tmp_path / "empty-cache")})
    assert_one_line_error(run, "Go is not installed")


def test_unbuildable_toolchain_gives_one_readable_line(tmp_path):
    """Go is there but cannot fetch modules (no proxy): the build error names its log."""
    run = run_pytest([SUITE], tmp_path, timeout=120,
                     env={"CLUSTERPROOF_CACHE": str(tmp_path / "empty-cache"),
                          "GOMODCACHE": str(tmp_path / "empty-modcache"), "GOPROXY": "off"})
    assert_one_line_error(run, "building kwok v0.8.0 failed")
    assert "full log:" in run.output


def test_a_harness_error_inside_a_check_is_one_line_not_a_traceback(tmp_path):
    """Mid-run (a node written over by something else ten times in a row, say): the check fails with
    the error's one line, "clusterproof: ...", which the report files under harness errors."""
    run = run_pytest(["tests/data/harness_error_run.py"], tmp_path, timeout=120)
    assert run.returncode == 1, run.output[-2000:]
    [message] = run.failures.values()
    assert message.strip() == "clusterproof: node n1 could not be written: 10 write conflicts in a row (self-test)" \
        or message.startswith("clusterproof: node n1 could not be written"), message
    assert "Traceback" not in run.output and "raise HarnessError" not in run.output, run.output[-2000:]
