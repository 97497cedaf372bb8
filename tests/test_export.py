"""Self-tests of what a run's results carry and where they go: their origin, junit.xml, perfdash, Prometheus.

One tiny suite (the plugin, no cluster) runs once with ``--cp-export
perfdata,openmetrics`` and ``--cp-pushgateway`` pointed at a recorder here;
its files are then read by the real consumers that run on this machine:

- **summary.json, the Allure environment, junit.xml** name clusterproof's
  version and commit (the very ``git rev-parse HEAD`` of this checkout, and
  whether the tree had changes), the Kubernetes client, and the profile's
  hash (the same numbers give the same hash, one changed value another).
  An installed package says its commit is unknown.
- **Each figure is a property of its check's ``<testcase>``** in junit.xml.
- **PerfData** is read by the project's PerfData reader
  (``clusterproof.provision.toolchain.PERFDATA_READER``): a Go program decoding
  it into ``k8s.io/kubernetes/test/e2e/perftype.PerfData``, the type perfdash
  decodes ClusterLoader2's files into, built from the module proxy at the
  control plane's pinned version. perfdash itself cannot be built here: the
  proxy answers 403 "This module version is not available" for
  ``k8s.io/perf-tests`` and its ``perfdash``/``clusterloader2`` modules (at
  every version, ``@master`` too), and its parsers are in package ``main``.
- **OpenMetrics** passes ``promtool check metrics`` (Prometheus 3.16's, from
  the toolchain) and is scraped by a real Prometheus (the embedded one) from
  a static file served on 127.0.0.1 with OpenMetrics' content type, then
  queried back: the figures in base units, the run's origin.
- **The Pushgateway** gets a PUT on ``/metrics/job/clusterproof/profile/<profile>``
  whose body promtool accepts (the recorder here stands in for it: the proxy
  does not serve ``github.com/prometheus/pushgateway`` either); a gateway that
  refuses the push is one line, and the run's exit code stands.

Negative controls: broken copies of each export (a value that is not a
number, a field perfdash would drop, no version, no ``# EOF``, an OpenMetrics
type promtool does not know ...) are refused by the same consumers, so the
checks above would catch an export that broke.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import metadata
from pathlib import Path

import pytest

import clusterproof
from clusterproof.config.profile import load_profile
from clusterproof.core.waiting import wait_for
from clusterproof.prometheus.server import Limits, PromServer
from clusterproof.provision import toolchain
from clusterproof.report import export, origin

ROOT = Path(__file__).resolve().parent.parent
OPENMETRICS_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
MIB = 1048576.0

TINY = '''"""A tiny suite whose figures take every route of the exports."""


def test_measures(figures):
    """Records figures of every kind the exports map. Red: never."""
    figures.add("time to quarantine, p50", 1.5, "s")
    figures.add("time to quarantine, p99", 3.25, "s", 5.0, headline=True)
    figures.add("create pod p99, apiserver histogram", 0.2, "s", 1.0)
    figures.add("bytes per change", 21234.5, "B", 1000.0)
    figures.add("rss", 120.5, "MiB")
    figures.add("pods seen", 3, "pods")
    figures.add("create rate", 33.0, "pods/s", 10.0, op=">=")
    figures.add("not measured", None, "s")
    figures.add("plain", 7, "")


def test_without_figures():
    """Measures nothing. Red: never."""
'''


class Recorder(BaseHTTPRequestHandler):
    """A static file server and request recorder on loopback: ``server.files`` {path: (type, body)} answers
    GETs; every PUT/POST is kept in ``server.received`` and answered ``server.status``."""

    def do_GET(self):  # noqa: N802 -- http.server's name
        found = self.server.files.get(self.path)
        if found is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", found[0])
        self.send_header("Content-Length", str(len(found[1])))
        self.end_headers()
        self.wfile.write(found[1])

    def do_PUT(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.received.append((self.command, self.path, self.headers.get("Content-Type", ""), body))
        self.send_response(self.server.status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_POST = do_PUT

    def log_message(self, *args):   # quiet
        pass


@pytest.fixture(scope="module")
def http():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    server.files, server.received, server.status = {}, [], 200
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _url(server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _child_env() -> dict:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _tiny(work: Path, *args: str) -> subprocess.CompletedProcess:
    (work / "suites").mkdir(parents=True, exist_ok=True)
    (work / "suites" / "test_tiny.py").write_text(TINY)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:locust", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--cp-output-dir={work / 'out'}", *args, "suites/test_tiny.py"]
    return subprocess.run(cmd, cwd=work, env=_child_env(), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory, http) -> tuple[Path, str]:
    """(the tiny run's directory, its console): exports asked for, the push sent to the recorder."""
    work = tmp_path_factory.mktemp("export")
    proc = _tiny(work, "--cp-export", "perfdata", "--cp-export", "openmetrics", f"--cp-pushgateway={_url(http)}/")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir, = (work / "out" / "runs").iterdir()
    return run_dir, proc.stdout


def _summary(run) -> dict:
    return json.loads((run[0] / "summary.json").read_text())


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout


# --- origin ---------------------------------------------------------------------------------------

@pytest.mark.cluster
def test_the_summary_names_the_commit_the_version_the_kubernetes_client_and_the_profile_hash(run):
    facts = _summary(run)["run"]
    assert facts["clusterproof"] == clusterproof.__version__
    assert facts["commit"] == _git("rev-parse", "HEAD").strip()
    assert facts["dirty"] is bool(_git("status", "--porcelain", "--untracked-files=normal").strip())
    assert facts["kubernetes_client"] == f"kubernetes (Python client) {metadata.version('kubernetes')}"
    assert facts["profile"] == "smoke" and facts["profile_sha256"] == origin.profile_sha256(load_profile("smoke"))
    assert f"clusterproof {clusterproof.__version__}, commit {facts['commit'][:12]}" in run[1], run[1][-2000:]


@pytest.mark.control
def test_the_report_environment_and_junit_xml_carry_the_same_origin(run):
    facts = _summary(run)["run"]
    expected = {"clusterproof.version": facts["clusterproof"], "clusterproof.commit": facts["commit"],
                "clusterproof.dirty": str(facts["dirty"]).lower(), "kubernetes.client": facts["kubernetes_client"],
                "profile": "smoke", "profile.sha256": facts["profile_sha256"]}
    env = json.loads((run[0] / "allure-results" / "clusterproof-run.json").read_text())
    assert {k: env.get(k) for k in expected} == expected
    properties = (run[0] / "allure-results" / "environment.properties").read_text()
    assert f"clusterproof.commit={facts['commit']}" in properties
    suite = ET.parse(run[0] / "junit.xml").getroot().find("testsuite")
    props = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert {k: props.get(k) for k in expected} == expected


@pytest.mark.unit
def test_the_profile_hash_follows_its_values_not_its_name():
    smoke = load_profile("smoke")
    assert origin.profile_sha256(load_profile("smoke")) == origin.profile_sha256(smoke)
    assert origin.profile_sha256(load_profile("smoke", [f"nodes={smoke.nodes + 1}"])) != origin.profile_sha256(smoke)
    assert len(origin.profile_sha256(smoke)) == 64 and origin.profile_sha256(None) is None


@pytest.mark.unit
def test_an_installed_package_names_its_version_and_says_its_commit_is_unknown(tmp_path):
    installed = origin.source(None, "9.9.9")
    assert (installed.version, installed.commit, installed.dirty) == ("9.9.9", None, None)
    assert installed.commit_field == "unknown (installed package)" == installed.commit_shown()
    assert origin.shown({"clusterproof": "9.9.9", "commit": installed.commit_field}) == \
        "clusterproof 9.9.9, commit unknown (installed package)"
    assert origin.source(tmp_path).commit_field == "unknown (a source tree without .git)"


@pytest.mark.unit
def test_a_tree_with_changes_is_dirty_and_a_clean_one_is_not(tmp_path):
    """The negative control of ``dirty``: a clean commit is not, an edit and an untracked file are."""
    _git("init", "-q", cwd=tmp_path)
    (tmp_path / "a.py").write_text("x = 1\n")
    _git("add", "a.py", cwd=tmp_path)
    _git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one", cwd=tmp_path)
    clean = origin.source(tmp_path)
    assert clean.commit == _git("rev-parse", "HEAD", cwd=tmp_path).strip() and clean.dirty is False
    (tmp_path / "b.py").write_text("new\n")
    assert origin.source(tmp_path).dirty is True
    (tmp_path / "b.py").unlink()
    (tmp_path / "a.py").write_text("x = 2\n")
    edited = origin.source(tmp_path)
    assert edited.dirty is True and edited.commit_shown() == f"{clean.commit[:12]} (uncommitted changes)"


# --- junit.xml ------------------------------------------------------------------------------------

@pytest.mark.unit
def test_each_figure_is_a_property_of_its_checks_testcase(run):
    cases = {c.get("name"): c for c in ET.parse(run[0] / "junit.xml").getroot().iter("testcase")}
    props = {p.get("name"): p.get("value") for p in cases["test_measures"].find("properties")}
    assert props["figure.time to quarantine, p99"] == "3.25"
    assert props["figure.time to quarantine, p99.unit"] == "s"
    assert props["figure.time to quarantine, p99.threshold"] == "<= 5"
    assert props["figure.time to quarantine, p99.verdict"] == "within"
    assert props["figure.bytes per change.verdict"] == "beyond"
    assert props["figure.create rate.threshold"] == ">= 10" and props["figure.create rate.verdict"] == "within"
    assert props["figure.not measured"] == "n/a" and "figure.not measured.verdict" not in props
    figures = {k for k in props if not k.endswith((".unit", ".threshold", ".verdict"))}
    assert len(figures) == 9, figures
    assert cases["test_without_figures"].find("properties") is None


# --- PerfData -------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reader() -> Path:
    return toolchain.ensure(toolchain.PERFDATA_READER, progress=print).path("perfdata-reader")


def _read_perfdata(reader: Path, path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(reader), str(path)], capture_output=True, text=True, timeout=60)


@pytest.mark.cluster
def test_the_perfdata_is_read_by_the_type_perfdash_reads_clusterloader2_files_into(run, reader):
    read = _read_perfdata(reader, run[0] / "perfdata.json")
    assert read.returncode == 0, read.stderr
    data = json.loads(read.stdout)
    assert data["version"] == "v1"
    assert data["labels"]["commit"] == _summary(run)["run"]["commit"]
    items = {(i["labels"]["Check"].split("::")[-1], i["labels"]["Metric"]): i for i in data["dataItems"]}
    quarantine = items[("test_measures", "time to quarantine")]
    assert quarantine["unit"] == "ms" and quarantine["data"] == {"Perc50": 1500.0, "Perc99": 3250.0}
    assert items[("test_measures", "create pod, apiserver histogram")]["data"] == {"Perc99": 200.0}
    assert items[("test_measures", "rss")] == {"data": {"Value": 120.5}, "unit": "MiB", "labels": {
        "Suite": "tiny", "Check": "suites/test_tiny.py::test_measures", "Metric": "rss"}}
    assert items[("test_measures", "create rate")]["unit"] == "pods/s"
    assert ("test_measures", "not measured") not in items
    # every figure with a value is one data point (the suite's time too)
    measured = [f for f in _summary(run)["figures"].values() if f["value"] is not None]
    assert sum(len(i["data"]) for i in data["dataItems"]) == len(measured)
    assert "PerfData, 8 dataItems from 10 figures (1 figure(s) without a value left out)" in run[1]


BROKEN_PERFDATA = {
    "a value that is not a number": (lambda d: d["dataItems"][0]["data"].update(Perc50="1500"),
                                     "perfdash would drop this file: error parsing JSON"),
    "dataItems under another name": (lambda d: d.update(items=d.pop("dataItems")), "a field perfdash would ignore"),
    "no version": (lambda d: d.pop("version"), 'version ""'),
    "an item without data": (lambda d: d["dataItems"][1].update(data={}), "has no data"),
    "an item without labels": (lambda d: d["dataItems"][1].pop("labels"), "has no labels"),
}


@pytest.mark.parametrize("broken", list(BROKEN_PERFDATA))
@pytest.mark.cluster
def test_a_broken_perfdata_is_refused_by_the_reader(run, reader, tmp_path, broken):
    data = json.loads((run[0] / "perfdata.json").read_text())
    change, expected = BROKEN_PERFDATA[broken]
    change(data)
    path = tmp_path / "perfdata.json"
    path.write_text(json.dumps(data))
    read = _read_perfdata(reader, path)
    assert read.returncode == 1 and expected in read.stderr and len(read.stderr.strip().splitlines()) == 1, \
        read.stderr
    path.write_text((run[0] / "perfdata.json").read_text()[:200])
    assert _read_perfdata(reader, path).returncode == 1, "a truncated file must be refused too"


# --- OpenMetrics: promtool ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def prometheus_binaries() -> toolchain.Component:
    return toolchain.ensure(toolchain.PROMETHEUS, progress=print)


def _promtool(binaries: toolchain.Component, text: bytes) -> subprocess.CompletedProcess:
    return subprocess.run([str(binaries.path("promtool")), "check", "metrics"], input=text, capture_output=True,
                          timeout=60)


@pytest.mark.cluster
def test_the_openmetrics_file_passes_promtool(run, prometheus_binaries):
    text = (run[0] / "openmetrics.txt").read_bytes()
    assert text.endswith(b"# EOF\n")
    checked = _promtool(prometheus_binaries, text)
    assert checked.returncode == 0, checked.stdout + checked.stderr


BROKEN_METRICS = {
    "an unquoted label value": (b'suite="tiny"} 3.0', b"suite=tiny} 3.0", b"label value"),
    "a value that is not a number": (b'suite="tiny"} 3.0', b'suite="tiny"} three', b"expected float"),
    "an OpenMetrics info type": (b"TYPE clusterproof_run_info gauge", b"TYPE clusterproof_run_info info",
                                 b'unknown metric type "info"'),
}


@pytest.mark.parametrize("broken", list(BROKEN_METRICS))
@pytest.mark.cluster
def test_a_broken_openmetrics_file_is_refused_by_promtool(run, prometheus_binaries, broken):
    old, new, expected = BROKEN_METRICS[broken]
    text = (run[0] / "openmetrics.txt").read_bytes()
    assert old in text
    checked = _promtool(prometheus_binaries, text.replace(old, new))
    assert checked.returncode == 1 and expected in checked.stdout + checked.stderr, checked.stdout + checked.stderr


# --- OpenMetrics: a real Prometheus scrapes it ----------------------------------------------------

def _value(prom, expr: str) -> list[dict]:
    answer = prom.query(expr)
    assert answer.ok, f"{expr}: {answer}"
    return answer.data["result"]


@pytest.mark.cluster
def test_prometheus_scrapes_the_file_and_answers_with_the_figures(run, prometheus_binaries, http, tmp_path):
    """The file served as OpenMetrics (and two broken copies: no ``# EOF``, a value that is not a number);
    Prometheus takes the first and answers queries with its figures in base units, and refuses the others
    (the target is down, its last error names the fault)."""
    text = (run[0] / "openmetrics.txt").read_bytes()
    http.files.update({"/good": (OPENMETRICS_TYPE, text),
                       "/no-eof": (OPENMETRICS_TYPE, text.replace(b"# EOF\n", b"")),
                       "/bad-value": (OPENMETRICS_TYPE, text.replace(b'suite="tiny"} 3.0', b'suite="tiny"} three'))})
    target = f"127.0.0.1:{http.server_address[1]}"
    jobs = [{"job_name": name, "metrics_path": f"/{name}", "static_configs": [{"targets": [target]}]}
            for name in ("good", "no-eof", "bad-value")]
    server = PromServer(tmp_path / "prometheus", Limits("30s", 50_000_000, 4, gomaxprocs=1), jobs, 1.0)
    try:
        server.start(timeout=120)
        prom = server.client()
        ups = wait_for(lambda: {r["metric"]["job"]: r["value"][1] for r in _value(prom, "up")},
                       until=lambda u: {"good", "no-eof", "bad-value"} <= set(u), timeout=60, interval=0.5,
                       what="Prometheus scraped the three targets once")
        assert {k: v for k, v in ups.items() if k != "prometheus"} == {"good": "1", "no-eof": "0", "bad-value": "0"}, \
            ups
        p99 = _value(prom, 'clusterproof_figure_seconds{job="good",figure="time to quarantine, p99"}')
        assert [float(r["value"][1]) for r in p99] == [3.25]
        rss = _value(prom, 'clusterproof_figure_bytes{job="good",figure="rss"}')
        assert [float(r["value"][1]) for r in rss] == [120.5 * MIB]
        beyond = _value(prom, 'clusterproof_figure_within_threshold{job="good"} == 0')
        assert [r["metric"]["figure"] for r in beyond] == ["bytes per change"]
        info = _value(prom, 'clusterproof_run_info{job="good"}')
        assert [r["metric"]["commit"] for r in info] == [_summary(run)["run"]["commit"]]
        errors = {t["labels"]["job"]: t.get("lastError", "")
                  for t in prom.get("/api/v1/targets").data["activeTargets"]}
        assert "EOF" in errors["no-eof"], errors
        assert "three" in errors["bad-value"] or "float" in errors["bad-value"], errors
    finally:
        server.remove()


# --- the Pushgateway ------------------------------------------------------------------------------

@pytest.mark.cluster
def test_the_run_pushed_its_metrics_to_the_pushgateway_path_of_its_job_and_profile(run, http, prometheus_binaries):
    pushes = [r for r in http.received if r[1].startswith("/metrics/")]
    assert [(method, path) for method, path, _, _ in pushes] == [("PUT", "/metrics/job/clusterproof/profile/smoke")]
    body = pushes[0][3]
    assert b"clusterproof_figure_seconds{" in body and b"# EOF" not in body   # the text format it takes
    checked = _promtool(prometheus_binaries, body)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"pushed to the Pushgateway {_url(http)} (job clusterproof, profile smoke)" in run[1]


@pytest.mark.unit
def test_a_pushgateway_that_refuses_is_one_line_and_the_files_are_still_written(run, http, tmp_path):
    http.status = 500
    try:
        lines = export.write(_summary(run), ("perfdata",), tmp_path / "p.json", tmp_path / "o.txt", _url(http))
    finally:
        http.status = 200
    assert (tmp_path / "p.json").exists() and (tmp_path / "o.txt").exists(), lines
    assert lines[-1].startswith(f"NOT pushed to the Pushgateway {_url(http)}: ") and "500" in lines[-1], lines


@pytest.mark.parametrize("args, expected", [
    (["--cp-export", "xml"], "clusterproof: --cp-export 'xml': not a format clusterproof writes (use perfdata or "
                             "openmetrics"),
    (["--cp-pushgateway", "pushgateway:9091"], "clusterproof: --cp-pushgateway 'pushgateway:9091': give the "
                                               "Pushgateway's URL"),
], ids=["unknown format", "not a URL"])
@pytest.mark.cluster
def test_bad_export_arguments_are_one_line_and_exit_4(tmp_path, args, expected):
    proc = _tiny(tmp_path, *args)
    assert proc.returncode == 4, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and expected in lines[0], proc.stderr


@pytest.mark.unit
def test_percentile_names_group_and_other_names_stand_alone():
    assert export.percentile_of("time to quarantine, p99") == ("99", "time to quarantine")
    assert export.percentile_of("create pod p99, apiserver histogram") == ("99", "create pod, apiserver histogram")
    assert export.percentile_of("pod startup p99 (timestamps)") == ("99", "pod startup (timestamps)")
    assert export.percentile_of("p99.9 of lag") == ("99.9", "of lag")
    assert export.percentile_of("top99 pods") == (None, "top99 pods")
    assert export.metric_unit("ms") == ("seconds", 1e-3) and export.metric_unit("GPUs") == ("gpus", 1.0)
    assert export.metric_unit("pods/s") == ("pods_per_second", 1.0) and export.metric_unit("") == ("", 1.0)
