"""Self-tests of where runs write (clusterproof.core.outputs): one directory per run, out of the source tree.

The path logic is pure and tested here with temporary directories; then two
real pytest runs (a trivial check, no cluster) started together must write
into two directories of their own, with Allure's results where the plugin put
them, and ``latest`` must name one of them.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clusterproof.core import outputs
from clusterproof.core.errors import HarnessError
from tests.harness import run_pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.unit
def test_the_output_directory_is_the_option_else_the_environment_else_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(outputs.ENV, raising=False)
    assert outputs.root() == tmp_path / "out"
    monkeypatch.setenv(outputs.ENV, str(tmp_path / "env"))
    assert outputs.root() == tmp_path / "env"
    assert outputs.root(tmp_path / "given") == tmp_path / "given"
    run = outputs.for_run("20260101-120000-ab12")
    assert run.dir == tmp_path / "env" / "runs" / "20260101-120000-ab12"
    assert (run.allure_results.name, run.summary.name, run.comparison.name) == (
        "allure-results", "summary.json", "comparison.json")
    assert run.allure_results.parent == run.summary.parent == run.dir


@pytest.mark.parametrize("bad", ["../etc", "a/b", "", "UPPER", "x" * 40])
@pytest.mark.unit
def test_a_run_id_is_never_a_path(bad):
    with pytest.raises(HarnessError, match="is not a run id"):
        outputs.for_run(bad, "/tmp/never")


@pytest.mark.unit
def test_latest_names_the_last_marked_run_and_pick_says_what_exists(tmp_path):
    with pytest.raises(HarnessError, match="no run in .*runs: run the suites first"):
        outputs.pick(None, tmp_path)
    a = outputs.for_run("run-a", tmp_path).create()
    b = outputs.for_run("run-b", tmp_path).create()
    os.utime(a.dir, (1_000_000, 1_000_000))           # a older than b
    outputs.mark_latest(a)
    assert outputs.pick(None, tmp_path) == a
    outputs.mark_latest(b)
    assert outputs.latest(tmp_path) == b and os.readlink(tmp_path / "latest") == "runs/run-b"
    assert outputs.pick("run-a", tmp_path) == a
    with pytest.raises(HarnessError, match=r"no run run-c in .*\(the newest: run-b, run-a\)"):
        outputs.pick("run-c", tmp_path)
    (tmp_path / "latest").unlink()          # no link (a killed run before it marked, a copy): the newest dir
    assert outputs.latest(tmp_path) == b


@pytest.mark.unit
def test_concurrent_marks_leave_one_whole_latest_and_no_scratch(tmp_path):
    runs = [outputs.for_run(f"run-{i}", tmp_path).create() for i in range(8)]
    threads = [threading.Thread(target=lambda r=r: [outputs.mark_latest(r) for _ in range(50)]) for r in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outputs.latest(tmp_path) in runs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest", "runs"]


@pytest.mark.unit
def test_the_makefile_helper_prints_one_path_or_one_line(tmp_path):
    env = {**os.environ, outputs.ENV: str(tmp_path)}
    cmd = [sys.executable, "-m", "clusterproof.core.outputs", "run-dir"]
    none = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert none.returncode == 4 and none.stdout == "" and len(none.stderr.splitlines()) == 1, none.stderr
    outputs.mark_latest(outputs.for_run("run-a", tmp_path).create())
    ok = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == str(tmp_path / "runs" / "run-a")


@pytest.mark.unit
def test_bench_figures_stay_in_a_checkout_and_go_to_the_outputs_otherwise(tmp_path, monkeypatch):
    monkeypatch.setenv(outputs.ENV, str(tmp_path))
    assert outputs.bench_dir(ROOT) == ROOT / "reports" / "bench"
    assert outputs.bench_dir(None) == tmp_path / "bench"


@pytest.mark.cluster
def test_two_runs_started_together_never_share_a_file(tmp_path):
    """Two pytest runs (the plugin, no cluster) at once: two run directories, each with its own Allure
    results, the path printed at the start and at the end, and ``latest`` naming one of them."""
    (tmp_path / "test_trivial.py").write_text("def test_one():\n    assert True\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    env.pop(outputs.ENV, None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:locust", "-p", "no:cacheprovider", "-p", "no:randomly",
           f"--cp-output-dir={out}", "test_trivial.py"]
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    texts = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], texts
    dirs = sorted((out / "runs").iterdir())
    assert len(dirs) == 2, texts
    for d, text in zip(dirs, sorted(texts, key=lambda t: t.split("out/runs/")[1][:40])):
        results = list((d / "allure-results").glob("*-result.json"))
        assert len(results) == 1, list(d.rglob("*"))
        lines = [ln for ln in text.splitlines() if ln.startswith("clusterproof: this run's results: ")]
        assert len(lines) == 2 and all(f"out/runs/{d.name}/ (allure-results" in ln for ln in lines), text
    assert outputs.latest(out).dir in dirs
    assert not (tmp_path / "reports").exists() and not (tmp_path / "allure-results").exists()


@pytest.mark.cluster
def test_parallel_workers_write_into_one_run_each_with_its_own_cluster(tmp_path):
    """pytest-xdist (./proof test's self-tests): two workers, a module each. One run directory (the
    controller's) holds every result; each worker ran on an embedded cluster of its own, under a run id
    derived from the controller's; neither cluster remains."""
    where = tmp_path / "where"
    where.mkdir()
    run = run_pytest(["-n", "2", "--dist", "loadfile", "tests/poison/on_a_worker.py",
                      "tests/poison/on_another_worker.py", "--cp-profile", "smoke",
                      "--cp-run-id", "xdist-parent"], tmp_path, timeout=600, env={"CLUSTERPROOF_WHERE_DIR": str(where)})
    assert run.returncode == 0, run.output[-3000:]
    seen = {p.stem: json.loads(p.read_text()) for p in where.glob("*.json")}
    assert sorted(seen) == ["gw0", "gw1"], (seen, run.output[-2000:])
    assert {s["run_id"] for s in seen.values()} == {"xdist-parent-gw0", "xdist-parent-gw1"}, seen
    assert len({s["cluster"] for s in seen.values()}) == 2, seen
    assert not [s["dir"] for s in seen.values() if Path(s["dir"]).exists()], seen
    assert [p.name for p in (tmp_path / "out" / "runs").iterdir()] == ["xdist-parent"]
    assert len(run.passed) == 2, run.output[-2000:]


@pytest.mark.cluster
def test_suites_are_refused_on_parallel_workers_in_one_line(tmp_path):
    """Negative control: the suites share one cluster and its measurements; -n with them is bad input."""
    run = run_pytest(["-n", "2", "suites/test_cluster_scale.py", "--cp-profile", "smoke"], tmp_path, timeout=120)
    assert run.returncode == 4, run.output[-2000:]
    assert "-n/--numprocesses runs the self-tests (tests/) in parallel" in run.output, run.output[-2000:]
    assert "Traceback" not in run.output, run.output[-2000:]
