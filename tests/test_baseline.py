"""Self-tests of the baseline comparison (clusterproof.report.compare, clusterproof.report.summary), both ways.

Pure helpers first (two made-up summaries: what regresses, what is noise,
what has no direction, what flipped, a folder's median, a bad baseline).
Then the real thing: the scale suite run twice against the session's
embedded cluster -- once with its own earlier summary as the baseline (no
regression, exit 0) and once with a baseline doctored to be much faster
(the figure is named and the run exits 6 although every check passed).
"""
from __future__ import annotations

import json

import pytest

from clusterproof import cli
from clusterproof.core.measurement import better_of
from clusterproof.report import compare
from clusterproof.report.compare import Row, Tolerance
from tests.harness import NOT_JUDGED_SLO_S, run_pytest

SCALE = "suites/test_cluster_scale.py"


def _summary(figures: dict, checks: dict | None = None, run_id="r1", finished="2026-11-23T10:00:00Z") -> dict:
    return {"schema": compare.SCHEMA,
            "run": {"id": run_id, "profile": "smoke", "kubernetes": "v1.35.4", "finished": finished},
            "checks": {k: {"title": k, "outcome": v} for k, v in (checks or {}).items()},
            "figures": {k: {"value": v, "unit": u, "better": b} for k, (v, u, b) in figures.items()}}


TOL = Tolerance(pct=20, min_change={"s": 0.5})


@pytest.mark.unit
def test_a_figure_that_moved_the_wrong_way_beyond_tolerance_is_a_regression():
    c = compare.compare(_summary({"startup p99": (2.0, "s", "lower")}),
                        _summary({"startup p99": (3.0, "s", "lower")}), TOL)
    assert c.regressed and [r.key for r in c.regressions] == ["startup p99"]
    assert c.rows[0].change_pct == pytest.approx(50.0)
    assert "startup p99 2 -> 3 s (+50.0 %)" in c.headline()


@pytest.mark.parametrize("base,now,better,verdict", [
    (2.0, 2.3, "lower", "within tolerance"),     # +15 %: noise
    (0.05, 0.09, "lower", "within tolerance"),   # +80 % but 0.04 s: below the unit's smallest change
    (2.0, 1.0, "lower", "improved"),
    (100.0, 50.0, "higher", "regressed"),        # a throughput halved
    (100.0, 150.0, "higher", "improved"),
    (5.0, 50.0, "none", "not judged"),           # no direction: shown, never judged
    (None, 1.0, "lower", "new"),
    (1.0, None, "lower", "gone"),
], ids=["noise", "below-min-change", "faster", "throughput-halved", "throughput-up", "no-direction", "new",
        "gone"])
@pytest.mark.unit
def test_each_figure_is_judged_by_its_direction_tolerance_and_smallest_change(base, now, better, verdict):
    unit = "s" if better != "higher" else "pods/s"
    r = compare.judge(Row("x", unit, better, base, now), TOL)
    assert r.verdict == verdict


@pytest.mark.unit
def test_a_per_figure_override_and_a_change_from_zero_are_judged():
    tol = Tolerance(pct=20, overrides={"time ::": 60}, min_change={"": 1})
    assert compare.judge(Row("time :: burst", "s", "lower", 10.0, 15.0), tol).verdict == "within tolerance"
    assert compare.judge(Row("burst :: 5xx responses", "", "lower", 0.0, 3.0), tol).verdict == "regressed"
    assert compare.judge(Row("burst :: 5xx responses", "", "lower", 0.0, 1.0), tol).verdict == "within tolerance"


@pytest.mark.unit
def test_a_check_that_passed_in_the_baseline_and_fails_now_is_listed_first_and_regresses():
    base = _summary({"a": (1.0, "s", "lower")}, {"suites/t.py::test_fixed": "failed", "suites/t.py::test_b": "passed"})
    now = _summary({"a": (1.0, "s", "lower")}, {"suites/t.py::test_fixed": "passed", "suites/t.py::test_b": "failed"})
    c = compare.compare(base, now, TOL)
    assert c.regressed and not c.regressions
    assert [(f.check, f.regressed) for f in c.flips] == [("suites/t.py::test_b", True),
                                                         ("suites/t.py::test_fixed", False)]
    table = compare.text_report(c)
    assert table.index("test_b") < table.index("test_fixed") and "REGRESSED: 1 check(s) now failing" in table


@pytest.mark.unit
def test_a_folder_of_baselines_is_their_median_and_the_newest_outcomes(tmp_path):
    for i, (v, outcome) in enumerate([(1.0, "failed"), (9.0, "failed"), (2.0, "passed")]):
        (tmp_path / f"night{i}").mkdir()
        (tmp_path / f"night{i}" / "summary.json").write_text(json.dumps(
            _summary({"p99": (v, "s", "lower")}, {"c": outcome}, f"r{i}", f"2026-11-2{i}T00:00:00Z")))
    (tmp_path / "unrelated.json").write_text("{}")
    base = compare.load(tmp_path)
    assert base["figures"]["p99"]["value"] == 2.0 and base["checks"]["c"]["outcome"] == "passed"
    assert base["run"]["id"] == "median of 3 runs"


@pytest.mark.parametrize("content,expected", [
    (None, "does not exist"),
    ("{not json", "cannot read baseline"),
    ('{"figures": {}}', "is not a clusterproof summary"),
], ids=["missing", "malformed", "not-a-summary"])
@pytest.mark.unit
def test_a_bad_baseline_is_one_line_naming_the_file(tmp_path, content, expected):
    path = tmp_path / "base.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(compare.SummaryError, match=expected):
        compare.load(path)


@pytest.mark.unit
def test_the_direction_of_a_figure_comes_from_its_threshold_or_its_unit():
    assert better_of("s", 5.0, "<=") == "lower"
    assert better_of("pods", 100, ">=") == "none"      # "every planned pod": a verdict, not a figure
    assert better_of("", 1, ">=") == "none"           # "at least one 429"
    assert better_of("", 0, "<=") == "lower"          # "no 5xx"
    assert better_of("pods/s", 20, ">=") == "higher"
    assert better_of("MiB", None, "<=") == "lower"
    assert better_of("pods/s", None, "<=") == "higher"
    assert better_of("", None, "<=") == "none"
    assert better_of("calls", 3, "==") == "none"


@pytest.mark.unit
def test_the_command_line_comparison_exits_6_on_a_regression_and_0_otherwise(tmp_path, capsys):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_summary({"startup p99": (2.0, "s", "lower")})))
    b.write_text(json.dumps(_summary({"startup p99": (4.0, "s", "lower")})))
    assert cli.main(["compare", str(a), str(b), "--json", str(tmp_path / "c.json")]) == compare.REGRESSION_EXIT
    assert "REGRESSED" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["regressed"] is True
    assert cli.main(["compare", str(a), str(a)]) == 0
    assert cli.main(["compare", str(a), str(tmp_path / "nope.json")]) == 4
    assert "does not exist" in capsys.readouterr().err


# --- the real thing: the scale suite against the session's embedded cluster ----------------------------

def _scale(cluster, profile, *extra):
    return [SCALE, "--cp-kubeconfig", str(cluster.kubeconfig), "--cp-profile", profile.name, *extra]


@pytest.mark.cluster
def test_a_rerun_against_its_own_summary_passes_and_a_much_faster_baseline_fails_naming_the_figure(
        cluster, profile, tmp_path):
    first = run_pytest(_scale(cluster, profile), tmp_path / "first")
    assert first.returncode == 0, first.output[-3000:]
    base = json.loads((tmp_path / "first" / "summary.json").read_text())
    assert base["schema"] == compare.SCHEMA and base["checks"], base
    assert all(c["outcome"] == "passed" for c in base["checks"].values()), base["checks"]
    assert "time :: cluster_scale" in base["figures"]
    worst = [f for f in base["figures"].values() if f["name"].startswith("LIST latency, worst p99")]
    assert worst and worst[0]["threshold"] == NOT_JUDGED_SLO_S and worst[0]["verdict"] == "within", worst
    assert "clusterproof summary" in first.output and "cluster_scale" in first.output

    # Way one: the same cluster, unchanged -- compared with the first run, nothing regressed. (The
    # suite takes seconds here, so its time's noise is wide: the tolerance is the mechanism's, not
    # a claim about the figure -- docs/baselines.md has the noise of whole runs.)
    same = run_pytest(_scale(cluster, profile, f"--cp-baseline={tmp_path / 'first' / 'summary.json'}",
                             "--cp-set=baseline_tolerance_overrides={'time ::': 1000}"), tmp_path / "same")
    assert same.returncode == 0, same.output[-3000:]
    assert "OK: no regression against the baseline" in same.output
    assert json.loads((tmp_path / "same" / "comparison.json").read_text())["regressed"] is False

    # Way two: a baseline in which the suite took a tenth of the time -- the run regressed. (No
    # smallest change for seconds: the suite may take under a second here; so the apiserver's p99s,
    # bucket bounds that may jump a bucket between two runs, are given a tolerance they cannot break.)
    base["figures"]["time :: cluster_scale"]["value"] /= 10
    doctored = tmp_path / "doctored.json"
    doctored.write_text(json.dumps(base))
    slow = run_pytest(_scale(cluster, profile, f"--cp-baseline={doctored}", "--cp-set=baseline_min_change={'s': 0}",
                             "--cp-set=baseline_tolerance_overrides={'time ::': 50, 'p99': 100000}"),
                      tmp_path / "slow")
    assert slow.returncode == compare.REGRESSION_EXIT, slow.output[-3000:]
    assert not slow.failures, slow.failures
    assert "REGRESSED: 1 figure(s) regressed beyond tolerance, first: time :: cluster_scale" in slow.output
    results = [json.loads(p.read_text()) for p in (tmp_path / "slow" / "allure").glob("*-result.json")]
    verdict = [r for r in results if r.get("historyId") == "clusterproof-baseline-comparison"]
    assert verdict and verdict[0]["status"] == "failed", [r.get("name") for r in results]
    assert "time :: cluster_scale" in verdict[0]["statusDetails"]["message"]


@pytest.mark.cluster
def test_a_bad_baseline_ends_the_run_before_it_starts_with_one_line(profile, tmp_path):
    run = run_pytest([SCALE, "--cp-profile", profile.name, f"--cp-baseline={tmp_path / 'nope.json'}"], tmp_path)
    assert run.returncode == 4, run.output[-2000:]
    assert f"clusterproof: baseline {tmp_path / 'nope.json'} does not exist" in run.output
    assert "Traceback" not in run.output


@pytest.mark.unit
def test_a_comparison_read_back_from_its_json_prints_the_same_table():
    c = compare.compare(_summary({"p99": (2.0, "s", "lower")}, {"c": "passed"}),
                        _summary({"p99": (3.0, "s", "lower")}, {"c": "failed"}), TOL)
    back = compare.Comparison.from_json(json.loads(json.dumps(c.to_json())))
    assert compare.text_report(back) == compare.text_report(c) and back.regressed


@pytest.mark.cluster
def test_a_long_key_keeps_the_figure_name_and_the_test_parameters():
    key = ("suites/test_gpu_preflight.py::test_faulty_nodes_stay_quarantined_with_their_reason_and_healthy_ones"
           "_are_released[p] :: time to quarantine, p99")
    short = compare.short_key(key, 70)
    assert (len(short) == 70 and short.startswith("test_gpu_preflight::")
            and short.endswith("[p] :: time to quarantine, p99"))
    long_name = "x :: " + "projected egress at 7,500 nodes: Endpoints, protobuf, truncated at 1,000 (today)"
    assert compare.short_key(long_name, 40) == long_name[5:42] + "..."
    assert compare.short_key("suites/test_a.py::test_b :: c", 90) == "test_a::test_b :: c"


@pytest.mark.unit
def test_a_check_green_on_one_version_and_skipped_on_the_other_is_listed_first_with_its_reason():
    """The pre-upgrade table (make upgrade-check): a check that passed at FROM and is skipped at TO comes before
    every figure, with the skip's own line."""
    base = _summary({"p99": (1.0, "s", "lower")}, {"gang[native]": "passed"})
    now = _summary({"p99": (1.0, "s", "lower")}, {"gang[native]": "skipped"})
    now["checks"]["gang[native]"]["message"] = "native gang scheduling not served: discovery lists no Workload"
    c = compare.compare(base, now, TOL)
    [flip] = c.flips
    assert (flip.baseline, flip.now) == ("passed", "skipped") and "not served" in flip.reason
    text = compare.text_report(compare.Comparison.from_json(json.loads(json.dumps(c.to_json()))))
    assert text.index("checks that flipped") < text.index("p99") and "(native gang scheduling not served" in text
    assert "not served" in compare.html_report(c)
