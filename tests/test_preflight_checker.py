"""The preflight checker, run with the real pynvml binding against the project-built NVML library.

No monkeypatched Python: every case runs ``python -m preflight check`` as a
fresh process whose ``LD_LIBRARY_PATH`` puts the mock ``libnvidia-ml.so.1``
(clusterproof/preflight/checker/mocknvml: go-nvml's mock DGX machines) first, with a fault file
saying what is wrong with which simulated machine. Every injected fault must
fail the machine with its reason (a fault the checker misses is a failure
here), every benign condition must pass, and every way NVML can be unusable
(no library, driver/library mismatch, driver not loaded, a fault file that
does not parse, bad arguments) is one line on stderr and exit 4.
"""
from __future__ import annotations

import json
import time

import pytest

from clusterproof.preflight.mock_nvml import BENIGN, FAULTS, FaultFile, checker_env, library_dir, run_checker

EVERY_CHECK = {"gpu-lost", "gpu-count", "xid", "ecc-uncorrectable", "row-remap-failed", "row-remap-pending",
               "nvlink-down", "pcie-degraded", "temperature", "clock-throttle"}


@pytest.fixture(scope="module")
def lib():
    return library_dir()


def _faults(tmp_path, machines: dict) -> object:
    p = tmp_path / "faults.json"
    p.write_text(json.dumps({"machines": machines}))
    return p


def _run(lib, faults, machines=None, *args):
    return run_checker(machines, checker_env(faults, lib), "--expect-gpus", "8", "--xid-window-ms", "0", *args)


def _one_line(run, expected: str):
    assert run.returncode == 4, (run.returncode, run.stderr, run.verdicts)
    assert not run.verdicts
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith("preflight: "), run.stderr
    assert expected in run.stderr, run.stderr
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("model,name", [pytest.param("dgxh100", "NVIDIA H100 80GB HBM3", id="dgxh100"),
                                        pytest.param("dgxa100", "Mock NVIDIA A100-SXM4-40GB", id="dgxa100")])
@pytest.mark.cluster
def test_healthy_machine_passes_every_check(lib, tmp_path, model, name):
    run = _run(lib, _faults(tmp_path, {"n1": {"model": model}}), ["n1"])
    assert run.returncode == 0, run.stderr
    v = run.verdicts["n1"]
    assert v["ok"] and not v["reasons"] and v["code"] == ""
    assert v["checks"] == {c: "pass" for c in EVERY_CHECK}, v["checks"]   # none skipped: every query answered
    assert [g["index"] for g in v["gpus"]] == list(range(8))
    links = 18 if model == "dgxh100" else 12
    for g in v["gpus"]:
        assert g["name"] == name and g["uuid"].startswith("GPU-") and g["bus_id"]
        assert g["nvlinks_up"] == g["nvlinks"] == links
        assert g["ecc_uncorrected"] == 0 and g["clock_events"] == ["gpu_idle"]
    assert v["driver"] == "550.54.15" and "libnvidia-ml.so.1" in v["library"] and str(lib) in v["library"]


def _one_machine(lib, tmp_path, kind: str, *args):
    """(run, verdict) of one machine with fault (or benign) ``kind``."""
    ff = FaultFile(tmp_path / "faults.json")
    ff.set({"m": kind})
    run = _run(lib, ff.path, ["m"], *args)
    return run, run.verdicts["m"]


@pytest.mark.parametrize("kind", list(FAULTS))
@pytest.mark.cluster
def test_every_injected_fault_fails_the_machine_with_its_reason(lib, tmp_path, kind):
    run, v = _one_machine(lib, tmp_path, kind)
    assert run.returncode == 1 and not v["ok"], f"the checker missed {FAULTS[kind].what}: {v}"
    assert v["code"] == FAULTS[kind].code, (FAULTS[kind].what, v["reasons"])
    checks = [r["check"] for r in v["reasons"]]
    assert len(checks) == len(set(checks)), f"more than one reason for a check: {checks}"
    assert v["checks"][checks[0]] == "fail"
    gpu = next(iter(FAULTS[kind].gpus))
    if kind != "gpu-missing":
        assert f"GPU {gpu}" in v["reasons"][0]["message"], v["reasons"]


@pytest.mark.parametrize("kind", list(BENIGN))
@pytest.mark.cluster
def test_benign_conditions_pass(lib, tmp_path, kind):
    run, v = _one_machine(lib, tmp_path, kind)
    assert run.returncode == 0 and v["ok"], f"{BENIGN[kind].what} failed the machine: {v['reasons']}"


@pytest.mark.cluster
def test_one_process_checks_many_machines_each_with_its_own_faults(lib, tmp_path):
    """The batch mode the agent relies on at scale: one process, the machine chosen per init."""
    ff = FaultFile(tmp_path / "faults.json")
    kinds = {f"m-{k}": k for k in [*FAULTS, *BENIGN]}
    ff.set(kinds)
    names = [*kinds, "m-healthy-a", "m-healthy-b"]
    t0 = time.monotonic()
    run = _run(lib, ff.path, names)
    took = time.monotonic() - t0
    assert run.returncode == 1 and set(run.verdicts) == set(names), run.stderr
    for name in names:
        assert run.verdicts[name]["code"] == ff.expected_code(name), (name, run.verdicts[name]["reasons"])
    # Distinct machines have distinct GPUs; the same machine the same ones in every process.
    uuids = {n: run.verdicts[n]["gpus"][0]["uuid"] for n in ("m-healthy-a", "m-healthy-b")}
    assert len(set(uuids.values())) == 2
    again = _run(lib, ff.path, ["m-healthy-a"])
    assert again.verdicts["m-healthy-a"]["gpus"][0]["uuid"] == uuids["m-healthy-a"]
    assert took < 30, f"{len(names)} machines took {took:.1f} s"


@pytest.mark.cluster
def test_several_faults_give_one_reason_per_failed_check(lib, tmp_path):
    faults = _faults(tmp_path, {"multi": {"gpus": {
        "1": {"xid": [79], "ecc_uncorrected": 1}, "3": {"xid": [13, 48]}, "6": {"nvlink_down": [0], "pcie_width": 4}}}})
    v = _run(lib, faults, ["multi"]).verdicts["multi"]
    assert [r["check"] for r in v["reasons"]] == ["xid", "ecc-uncorrectable", "nvlink-down", "pcie-degraded"]
    xid = v["reasons"][0]
    assert xid["gpus"] == [1, 3] and xid["code"] == "xid-79", xid
    assert "XID 48" in xid["message"] and "XID 13" not in xid["message"], xid
    assert v["gpus"][3]["xids"] == [13, 48]


@pytest.mark.cluster
def test_pcie_generation_below_max_fails_only_under_load(lib, tmp_path):
    faults = _faults(tmp_path, {"busy": {"gpus": {"2": {"pcie_gen": 3, "clock_events": ["sw_power_cap"]}}},
                                "idle": {"gpus": {"2": {"pcie_gen": 3}}}})
    run = _run(lib, faults, ["busy", "idle"])
    assert run.verdicts["idle"]["ok"]
    busy = run.verdicts["busy"]
    assert busy["code"] == "pcie-degraded" and "gen3 instead of gen5 under load" in busy["reasons"][0]["message"]


@pytest.mark.cluster
def test_ignored_xid_is_what_lets_a_broken_agent_release_a_node(lib, tmp_path):
    """The negative control's agent ignores XID 79 this way; the checker then passes the machine."""
    assert _one_machine(lib, tmp_path, "xid-79", "--ignore-xids", "13,31,43,45,68,109,79")[1]["ok"]


@pytest.mark.cluster
def test_expected_gpu_count_is_checked(lib, tmp_path):
    v = _run(lib, None, ["n"], "--expect-gpus", "4").verdicts["n"]
    assert v["code"] == "gpu-count" and "NVML sees 8 GPU(s), expected 4" in v["reasons"][0]["message"]


@pytest.mark.cluster
def test_xid_window_is_waited_out_like_the_real_library(lib, tmp_path):
    t0 = time.monotonic()
    run = run_checker(["n"], checker_env(None, lib), "--xid-window-ms", "700")
    assert run.returncode == 0 and time.monotonic() - t0 >= 0.7


# --- NVML unusable: one line, exit 4 ------------------------------------------------------

@pytest.mark.unit
def test_no_nvml_library_is_one_line(tmp_path):
    _one_line(run_checker(None, checker_env(None, None)), "NVMLError_LibraryNotFound")


@pytest.mark.cluster
def test_driver_library_mismatch_is_one_line(lib, tmp_path):
    _one_line(_run(lib, _faults(tmp_path, {"old": {"driver": "mismatch"}}), ["old"]),
              "NVML library and kernel driver do not match (NVMLError_LibRmVersionMismatch")


@pytest.mark.cluster
def test_driver_not_loaded_is_one_line(lib, tmp_path):
    _one_line(_run(lib, _faults(tmp_path, {"n": {"driver": "not-loaded"}}), ["n"]), "NVMLError_DriverNotLoaded")


@pytest.mark.parametrize("text,expected", [
    pytest.param('{"machines": {"a": {', "does not parse: unexpected EOF", id="truncated"),
    pytest.param('{"machines": {"a": {"gpus": {"3": {"xdi": [79]}}}}}', 'unknown field "xdi"', id="typo"),
    pytest.param('{"machines": {"a": {"gpus": {"9": {"lost": true}}}}}', 'gpu "9" is not an index 0-7',
                 id="no-such-gpu"),
    pytest.param('{"machines": {"a": {"model": "dgx1"}}}', 'unknown model "dgx1"', id="unknown-model"),
])
@pytest.mark.cluster
def test_fault_file_that_does_not_parse_is_one_line(lib, tmp_path, text, expected):
    p = tmp_path / "faults.json"
    p.write_text(text)
    run = _run(lib, p, ["a"])
    _one_line(run, f"fault file {p}")
    assert expected in run.stderr


@pytest.mark.parametrize("args,expected", [
    pytest.param(["--expect-gpus", "x"], "argument --expect-gpus: invalid int value: 'x'", id="not-a-number"),
    pytest.param(["--expect-gpus", "0"], "--expect-gpus must be >= 1", id="zero-gpus"),
    pytest.param(["--ignore-xids", "79,x"], "must be comma-separated XID numbers", id="bad-xid-list"),
    pytest.param(["--xid-window-ms", "-5"], "--xid-window-ms must be >= 0", id="negative-window"),
])
@pytest.mark.cluster
def test_bad_arguments_are_one_line(lib, args, expected):
    _one_line(run_checker(None, checker_env(None, lib), *args), expected)
