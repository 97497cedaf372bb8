"""Progress lines carry their time, reach the check's log in the report, and a long wait is never silent.

- ``clusterproof.core.progress.heartbeat`` (and ``waiting.wait_for`` through
  it) writes "waiting for <what>: <elapsed> s of <bound> s; last seen: ..."
  every ``HEARTBEAT_S`` seconds, by the clock: a wait that polls 20 times a
  second writes a line per period, not per poll; a blocked call (no polls at
  all) gets its lines too. Negative controls: disabled (period 0), or a wait
  shorter than the period, writes no line -- the counting below would see one.
- ``phase`` logs its start and its end with the duration, and tells the
  listeners (the plugin's is ``allure.step``), also when the block fails.
- End to end (a pytest run of tests/data/progress_run.py): the live log shows
  the lines with their time; each check's Allure result has a "log"
  attachment with its own lines (timestamped), not the other check's; the
  phase is a step with its start and stop.
- A URL's credentials never reach a heartbeat line.

Pure (no cluster); the end-to-end run is a pytest subprocess of a few seconds.
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
import time

import pytest

from clusterproof.core import progress
from clusterproof.core.waiting import WaitTimeout, wait_for
from tests.harness import run_pytest

BEAT = re.compile(r"^waiting for (?P<what>.+): (?P<elapsed>\d+) s of (?P<bound>[\d.]+) s(?P<rest>.*)$")


def lines(caplog, prefix: str = "waiting for ") -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name.startswith("clusterproof") and r.getMessage().startswith(prefix)]


def slow_probe(seconds: float):
    """A probe whose state counts up, and holds once ``seconds`` have passed."""
    t0, n = time.monotonic(), [0]

    def probe():
        n[0] += 1
        return {"polls": n[0], "done": time.monotonic() - t0 >= seconds}
    return probe


@pytest.mark.cluster
def test_a_long_wait_says_what_it_waits_for_and_how_far_along_every_period(caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="clusterproof")
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.5)
    state = wait_for(slow_probe(2.6), until=lambda s: s["done"], timeout=20, interval=0.05,
                     what="the widgets to be done")
    beats = lines(caplog)
    # By the clock, not per poll: ~50 polls, one line each 0.5 s.
    assert state["polls"] > 20 and 4 <= len(beats) <= 6, [r.getMessage() for r in beats]
    parsed = [BEAT.match(r.getMessage()) for r in beats]
    assert all(parsed), [r.getMessage() for r in beats]
    assert {m["what"] for m in parsed} == {"the widgets to be done"} and {m["bound"] for m in parsed} == {"20"}
    assert all("last seen: {'polls': " in m["rest"] for m in parsed), parsed[0]["rest"]
    # Elapsed time grows with the clock; the record carries its own time (pytest's format shows it).
    assert [int(m["elapsed"]) for m in parsed] == sorted(int(m["elapsed"]) for m in parsed)
    assert int(parsed[-1]["elapsed"]) >= 2
    assert beats[-1].created - beats[0].created >= 1.4
    # The line is the caller's domain's: this module is outside the package, so clusterproof.tests.
    assert {r.name for r in beats} == {"clusterproof.tests"}


@pytest.mark.unit
def test_describe_says_the_state_in_a_few_words_and_long_states_are_cut(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")
    wait_for(slow_probe(0.5), until=lambda s: s["done"], timeout=10, interval=0.05, what="widgets",
             describe=lambda s: f"{s['polls']} polls", heartbeat_s=0.2)
    assert all(re.search(r"; last seen: \d+ polls$", r.getMessage()) for r in lines(caplog)) and lines(caplog)
    assert progress.abbreviate("x" * 500, 50) == "x" * 49 + "…"
    assert progress.abbreviate("a\n  b") == "a b"


@pytest.mark.cluster
def test_a_blocked_call_gets_heartbeats_too(caplog):
    """No polls at all (a subprocess, a sleep): the ticker thread writes the lines, with ``status()``."""
    caplog.set_level(logging.INFO, logger="clusterproof")
    with progress.heartbeat("locust to finish", timeout=60, period=0.3, status=lambda: "12 pods seen") as hb:
        time.sleep(1.1)
    beats = lines(caplog)
    assert 2 <= len(beats) <= 4 and hb.lines == len(beats), [r.getMessage() for r in beats]
    assert all(re.fullmatch(r"waiting for locust to finish: \d+ s of 60 s; 12 pods seen", r.getMessage())
               for r in beats)
    assert {r.threadName for r in beats} == {"clusterproof heartbeat"}


@pytest.mark.unit
def test_without_a_bound_the_line_says_how_long_so_far(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")
    with progress.heartbeat("a build", period=0.2):
        time.sleep(0.5)
    assert lines(caplog) and all(re.fullmatch(r"waiting for a build: \d+ s so far", r.getMessage())
                                 for r in lines(caplog))


@pytest.mark.parametrize("how", ["disabled", "shorter than the period"])
@pytest.mark.cluster
def test_negative_control_no_heartbeat_no_line(caplog, how):
    """The counting above would see a line that should not be there: a disabled heartbeat, or a wait
    that ends before its first period, writes nothing (and stops writing once it ends)."""
    caplog.set_level(logging.INFO, logger="clusterproof")
    period = 0 if how == "disabled" else 5
    wait_for(slow_probe(0.8), until=lambda s: s["done"], timeout=10, interval=0.05, what="widgets",
             heartbeat_s=period)
    with progress.heartbeat("a sleep", period=period):
        time.sleep(0.5)
    time.sleep(0.4 if how == "disabled" else 0)
    assert not lines(caplog), [r.getMessage() for r in lines(caplog)]


@pytest.mark.cluster
def test_a_heartbeat_stops_with_its_block(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")
    with progress.heartbeat("a short thing", period=0.2):
        time.sleep(0.5)
    n = len(lines(caplog))
    time.sleep(0.6)
    assert n >= 1 and len(lines(caplog)) == n


@pytest.mark.unit
def test_a_timeout_still_fails_with_the_last_state(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")
    with pytest.raises(WaitTimeout, match=r"never: not reached within 0.6 s; last seen: \{'polls': \d+"):
        wait_for(slow_probe(100), until=lambda s: s["done"], timeout=0.6, interval=0.05, what="never",
                 heartbeat_s=0.2)
    assert lines(caplog)


@pytest.mark.unit
def test_credentials_in_a_state_never_reach_a_heartbeat_line(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")
    with progress.heartbeat("Prometheus", period=0.2, status=lambda: "GET http://user:s3cret@prom:9090/-/ready"):
        time.sleep(0.5)
    text = "\n".join(r.getMessage() for r in lines(caplog))
    assert "s3cret" not in text and "http://***@prom:9090" in text, text


@pytest.mark.unit
def test_a_phase_logs_its_start_and_its_duration_and_tells_the_listeners(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")
    seen = []

    @contextlib.contextmanager
    def listener(name):
        seen.append(("enter", name))
        try:
            yield
        except BaseException as e:
            seen.append(("failed", name, type(e).__name__))
            raise
        seen.append(("exit", name))
    progress.add_phase_listener(listener)
    try:
        with progress.phase("create 3 widgets") as p:
            time.sleep(0.3)
        with pytest.raises(AssertionError), progress.phase("bind them"):
            raise AssertionError("gang x is partially bound\nmore")
    finally:
        progress.remove_phase_listener(listener)
    with progress.phase("after the listener left"):
        pass
    assert seen == [("enter", "create 3 widgets"), ("exit", "create 3 widgets"), ("enter", "bind them"),
                    ("failed", "bind them", "AssertionError")]
    assert 0.3 <= p.seconds < 2
    said = [r.getMessage() for r in caplog.records if r.name == "clusterproof.tests"]
    assert said[0] == "[create 3 widgets] started"
    assert re.fullmatch(r"\[create 3 widgets\] done in 0\.[3-9] s|\[create 3 widgets\] done in 1\.\d s", said[1])
    assert said[3] == "[bind them] ended after 0.0 s: AssertionError: gang x is partially bound", said[3]


@pytest.mark.unit
def test_a_failing_listener_never_breaks_the_phase(caplog):
    caplog.set_level(logging.INFO, logger="clusterproof")

    def broken(name):
        raise RuntimeError("no reporter here")
    progress.add_phase_listener(broken)
    try:
        with progress.phase("measure") as p:
            pass
    finally:
        progress.remove_phase_listener(broken)
    assert p.seconds is not None
    assert any("phase listener failed: RuntimeError: no reporter here" in r.getMessage() for r in caplog.records)


@pytest.mark.unit
def test_say_logs_on_the_callers_domain_logger():
    assert progress.logger("clusterproof.gang.gangs").name == "clusterproof.gang"
    assert progress.logger("clusterproof.suites.test_gang_scheduling").name == "clusterproof.suites"
    assert progress.logger("suites.test_gang_scheduling").name == "clusterproof.suites"
    assert progress.logger("__main__").name == "clusterproof"
    assert progress.caller_logger(0).name == "clusterproof.tests"
    # A bench run with ``python -m clusterproof.bench.knee`` is __main__, and logs as the bench it is.
    from types import SimpleNamespace
    g = {"__name__": "__main__", "__spec__": SimpleNamespace(name="clusterproof.bench.knee"), "progress": progress}
    exec("name = progress.caller_logger(0).name", g)
    assert g["name"] == "clusterproof.bench"


@pytest.mark.cluster
def test_each_checks_log_in_the_report_carries_its_own_timestamped_lines_and_its_phases(tmp_path):
    """End to end, as a user runs it: the live log and the Allure results of tests/data/progress_run.py."""
    run = run_pytest(["tests/data/progress_run.py", "-p", "no:randomly"], tmp_path, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    # The live log: the lines with their time of day (pytest.ini's log_cli_format).
    live = r"^\d\d:\d\d:\d\d INFO clusterproof\.progress_run: "
    assert re.search(live + r"first check: its own line$", run.output, re.M), run.output[-3000:]
    assert re.search(live + r"waiting for 25 widgets: \d+ s of 30 s; last seen: \d+ widgets$", run.output, re.M), \
        run.output[-3000:]
    results = {}
    for f in (tmp_path / "allure").glob("*-result.json"):
        r = json.loads(f.read_text())
        results[r["fullName"].rsplit("#", 1)[-1]] = r
    first, second = results["test_first_check_with_a_phase_and_a_wait"], results["test_second_check"]

    def log_of(result) -> str:
        [a] = [a for a in result.get("attachments", []) if a["name"] == "log"]
        return (tmp_path / "allure" / a["source"]).read_text()
    stamp = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d INFO clusterproof\.progress_run: "
    one, two = log_of(first), log_of(second)
    assert re.search(stamp + r"first check: its own line$", one, re.M), one
    assert re.search(stamp + r"\[create 3 widgets\] done in \d+\.\d s$", one, re.M), one
    assert re.search(stamp + r"waiting for 25 widgets: \d+ s of 30 s", one, re.M), one
    assert "second check" not in one and "first check" not in two, two
    assert re.search(stamp + r"second check: its own line$", two, re.M), two
    # A library's warnings: in the check's log, not in the terminal (its errors in both).
    three = log_of(results["test_third_check_where_a_library_warns"])
    assert three.count("Connection pool is full") == 3 and "WARNING urllib3.connectionpool" in three, three
    assert "Connection pool is full" not in run.output, run.output[-3000:]
    assert re.search(r"^\d\d:\d\d:\d\d ERROR urllib3\.connectionpool: a library's error", run.output, re.M)
    assert re.search(live + r"third check: its own line$", run.output, re.M), run.output[-3000:]
    [step] = [s for s in first.get("steps", []) if s["name"] == "create 3 widgets"]
    assert step["status"] == "passed" and step["stop"] - step["start"] >= 1000, step   # ms: 25 polls x 50 ms


@pytest.mark.unit
def test_the_live_log_shows_our_lines_and_a_librarys_errors_only():
    def record(name, level):
        return logging.LogRecord(name, level, __file__, 1, "m", None, None)
    own = progress.OwnLines()
    assert own.filter(record("clusterproof", logging.INFO)) and own.filter(record("clusterproof.gang", logging.INFO))
    assert own.filter(record("urllib3.connectionpool", logging.ERROR))
    # Negative controls: a library's warning and info, and a name that only starts like ours.
    assert not own.filter(record("urllib3.connectionpool", logging.WARNING))
    assert not own.filter(record("kubernetes.client.rest", logging.INFO))
    assert not own.filter(record("clusterproofish", logging.INFO))


@pytest.mark.unit
def test_the_checkouts_pytest_ini_and_the_plugins_defaults_say_the_same():
    """pytest.ini (the checkout) and the plugin (an installed run, no pytest.ini) show the same lines."""
    import configparser
    from types import SimpleNamespace

    from clusterproof.fixtures.cluster import live_log_defaults
    from tests.harness import ROOT
    ini = configparser.ConfigParser(interpolation=None)
    ini.read(ROOT / "pytest.ini")
    p = ini["pytest"]
    assert p["log_cli"] == "true" and p["log_cli_level"] == "INFO"
    assert (p["log_cli_format"], p["log_cli_date_format"]) == (progress.FORMAT, progress.DATE_FORMAT)
    assert (p["log_format"], p["log_date_format"]) == (progress.FORMAT, progress.REPORT_DATE_FORMAT)

    def config(inicfg=(), override=None, level=None):
        names = ("log_cli_format", "log_cli_date_format", "log_format", "log_date_format")
        return SimpleNamespace(inicfg=dict.fromkeys(inicfg, "x"), option=SimpleNamespace(
            override_ini=override, log_cli_level=level, **dict.fromkeys(names)))
    bare = config()
    live_log_defaults(bare)
    assert bare.option.log_cli_level == "INFO" and bare.option.log_cli_format == progress.FORMAT
    assert bare.option.log_date_format == progress.REPORT_DATE_FORMAT
    # Negative controls: what the user's configuration says is left alone.
    for said in (config(inicfg=["log_cli"]), config(override=["log_cli=false"]), config(level="WARNING")):
        before = said.option.log_cli_level
        live_log_defaults(said)
        assert said.option.log_cli_level == before
    fmt = config(inicfg=["log_format"])
    live_log_defaults(fmt)
    assert fmt.option.log_format is None and fmt.option.log_cli_format == progress.FORMAT


@pytest.mark.cluster
def test_negative_control_a_level_the_user_asks_for_shows_a_librarys_warnings(tmp_path):
    """The absence asserted above is the filter's doing: at a level the user asks for, the same run shows them."""
    run = run_pytest(["tests/data/progress_run.py", "-p", "no:randomly", "-k", "library",
                      "--log-cli-level", "WARNING"], tmp_path, timeout=120)
    assert run.returncode == 0, run.output[-3000:]
    assert run.output.count("Connection pool is full") == 3, run.output[-3000:]
