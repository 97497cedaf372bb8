"""The committed bench files have one shape, and the docs' tables read only their figures (pure files).

- Every ``reports/bench/*.json`` holds a non-empty ``figures`` list whose entries load with
  ``Figure.from_json`` (each a ``bench <name>`` figure), beside its context and its ``data``.
- Those figures are what the bench's own ``figures(data)`` makes of the data beside them: one route
  from a measurement to a figure, for a file written today and for one converted from an older shape.
- ``benchtables`` renders every table from the figures and the context only: the same tables with
  every file's ``data`` removed (negative control: a table naming a figure no file has says
  "not measured").
"""
from __future__ import annotations

import json
import shutil

import pytest

from clusterproof import CHECKOUT
from clusterproof.bench import apf, bringup, burst, knee, kueue, nightly, preflight, prometheus, watch_bandwidth
from clusterproof.core.measurement import Figure
from clusterproof.report import benchtables
from clusterproof.report.allure import RUN_ENV_FILE

pytestmark = pytest.mark.unit

BENCH = CHECKOUT / "reports" / "bench"
FILES = sorted(BENCH.glob("*.json"))
# Each committed file's bench, by file name: the function that makes its figures from its data.
FIGURES = {"apf": apf.figures, "bringup": bringup.figures, "burst": burst.figures,
           "burst_workers": burst.workers_figures, "knee": knee.figures, "kueue": kueue.figures,
           "nightly": nightly.figures, "preflight": preflight.figures,
           "prometheus": prometheus.figures, "watch_bandwidth": watch_bandwidth.figures}


def _bench(path) -> str:
    return next((b for b in ("bringup", "nightly") if path.stem.startswith(b)), path.stem)


def test_every_bench_has_a_file_and_every_file_a_bench():
    """Each bench whose figures the docs' tables read has a committed file, and no file is of a bench no table
    reads (its figures would be committed for nothing)."""
    assert {_bench(p) for p in FILES} == set(FIGURES), sorted({_bench(p) for p in FILES} ^ set(FIGURES))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_bench_file_has_typed_figures(path):
    d = json.loads(path.read_text())
    assert isinstance(d.get("figures"), list) and d["figures"], f"{path.name}: no figures list"
    figs = [Figure.from_json(f) for f in d["figures"]]
    assert all(f.check == f"bench {_bench(path)}" and f.name and f.unit is not None for f in figs), path.name
    assert len({f.name for f in figs}) == len(figs), f"{path.name}: a figure name twice"
    assert isinstance(d.get("data"), dict) and (d.get("date") or d.get("measured_at")), path.name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_files_figures_are_what_its_bench_makes_of_its_data(path):
    d = json.loads(path.read_text())
    made = [f.to_json() for f in FIGURES[_bench(path)](d["data"])]
    assert made == d["figures"], f"{path.name}: its figures are not what its bench derives from its data"


def test_every_table_is_rendered_from_the_figures_only(tmp_path):
    full = benchtables.blocks(BENCH)
    bare = tmp_path / "bench"
    shutil.copytree(BENCH, bare)
    for path in bare.glob("*.json"):
        d = json.loads(path.read_text())
        d.pop("data")
        path.write_text(json.dumps(d))
    assert benchtables.blocks(bare) == full
    assert set(full) >= {"bringup", "apf", "burst", "burst_workers", "knee", "preflight", "prometheus",
                         "watch_bandwidth"}
    # Negative control: without the figure a row names, the row says so.
    knee_file = bare / "knee.json"
    d = json.loads(knee_file.read_text())
    d["figures"] = [f for f in d["figures"] if not f["name"].startswith("create_latency_p99_s[")]
    knee_file.write_text(json.dumps(d))
    assert "| create p99, locust | not measured | not measured |" in benchtables.blocks(bare)["knee"]


def test_a_cell_template_fills_formats_and_leaves_out_what_has_no_value():
    figs = {f.name: f for f in (Figure.of("b", "p99[a]", 1.5, "s", 2.0), Figure.of("b", "p99[b]", None, "s"),
                                Figure.of("b", "rss[a]", 3 * 2 ** 20, "B"), Figure.of("b", "n[a]", 1200, "pods"),
                                Figure.of("b", "ok[a]", True, "bool"), Figure.of("b", "wire[a]", 2_500_000, "B"))}
    fill = benchtables.fill
    assert fill("{p99} «peak {rss}»", figs, "a") == "1.5 s peak 3 MiB"
    assert fill("{p99} «peak {rss}»", figs, "b") == "-- "                 # rss[b] absent: its part left out
    assert fill("{n:n} of {n}; {ok}; {wire:dec}", figs, "a") == "1,200 of 1,200 pods; yes; 2.5 MB"
    assert fill("{p99[*]}", figs, None) == "1.5 s / --"
    assert fill("{nothing}", figs, "a") == benchtables.MISSING
    t = benchtables.Table("x", rows=(("p99", "{p99}"),), columns="qualifier")
    assert benchtables.render_table(t, [benchtables.BenchFile(BENCH / "x.json", {}, figs)]).splitlines() == [
        "| x | a | b |", "|---|---|---|", "| p99 (≤ 2 s) | 1.5 s | -- |"]


def _run_dir(tmp_path, modules, outcomes=("passed", "passed", "xfailed")):
    """A finished run's records as ./proof run leaves them (the fields the nightly bench reads)."""
    run = tmp_path / "run"
    (run / "allure-results").mkdir(parents=True)
    figures = {"time :: embedded cluster bring-up": {"value": 120.0}, "time :: gang_scheduling": {"value": 300.0},
               nightly.SCALE + nightly.READY: {"value": 70.0}, "other :: x": {"value": 1.0}}
    (run / "summary.json").write_text(json.dumps({
        "run": {"id": "r1", "profile": "nightly", "seconds": 1000.0, "pytest_exit": 0, "backend": "kwok",
                "nodes": 7500, "kubernetes": "v1.35.4", "simulated": True, "finished": "2026-11-28T22:00:00Z"},
        "checks": {f"c{i}": {"outcome": o} for i, o in enumerate(outcomes)}, "figures": figures}))
    (run / "api-work.json").write_text(json.dumps({"run": {}, "modules": modules}))
    (run / "allure-results" / RUN_ENV_FILE).write_text(json.dumps({"go.runtime": "kube-apiserver GOGC=400"}))
    return run


def test_the_nightly_bench_reads_a_runs_own_records(tmp_path):
    modules = [{"suite": "gang_scheduling", "seconds": 100.0,
                "cpu_s": {"kube-apiserver": 80.0, "etcd": 20.0, "harness": 20.0},
                "peak_rss_mib": {"kube-apiserver": 1000}},
               {"suite": "taint_isolation", "seconds": 200.0, "cpu_s": {"kube-apiserver": 160.0, "harness": 20.0},
                "peak_rss_mib": {"kube-apiserver": 3000, "etcd": 200}}]
    data = nightly.read_run(_run_dir(tmp_path, modules))
    assert data["go_runtime"] == "kube-apiserver GOGC=400" and data["outcomes"] == {"passed": 2, "xfailed": 1}
    assert set(data["figures"]) == {"time :: embedded cluster bring-up", "time :: gang_scheduling",
                                    nightly.SCALE + nightly.READY}
    figs = {f.name: f for f in nightly.figures({**data, "cpus": 2})}
    assert figs["suites_s"].value == 1000.0 and figs["suites_s"].verdict == "beyond"      # 15 min: 900 s
    assert figs["suite_s[gang_scheduling]"].value == 300.0 and figs["bringup_s"].value == 120.0
    assert figs["schedulable_s"].value is None and figs["checks[failed]"].value == 0
    assert figs["control_plane_cpu_s"].value == 260.0 and figs["cpu_s[harness]"].value == 40.0
    assert figs["suite_cpu_s[gang_scheduling]"].value == 120.0 and figs["suite_cpu_s[taint_isolation]"].value == 180.0
    assert figs["busy_percent"].value == pytest.approx(100 * 300 / 600)      # 300 CPU-s over 300 s on 2 cores
    # The peak of each component over the run: the largest of its modules' readings.
    assert figs["peak_rss[kube-apiserver]"].value == 3000 * 2**20 and figs["peak_rss[etcd]"].value == 200 * 2**20


def test_the_nightly_bench_refuses_a_directory_without_a_runs_records_in_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        nightly.main([str(tmp_path), "--out", str(tmp_path / "n.json")])
    assert e.value.code == 4 and not (tmp_path / "n.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a finished run" in err[0] and "out/runs/<run id>" in err[0]
